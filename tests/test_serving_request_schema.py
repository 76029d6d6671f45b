"""The request schema (`serving/request_schema.py`): every field declared once, a whole request checked
before any work, and the server faults the generated requests of test_serving_request_fuzz.py found, each
now a one-line refusal."""

import copy
import dataclasses
import pathlib
import re

import numpy as np
import pytest
from conftest import make_policy, raw_observation
from fake_engine import FakeEngine

from oxygen_jax.errors import InvalidRequest
from oxygen_jax.policies import aloha, libero
from oxygen_jax.policies.request_options import RequestOptions
from oxygen_jax.robots.robot import Robot
from oxygen_jax.serving.request_schema import FIELD_NAMES, FIELDS, RequestSchema, observation_fields

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "serving.md"


@pytest.fixture(scope="module")
def policy():
    """The tiny LIBERO policy's robot I/O and options over the fake engine."""
    policy = copy.copy(make_policy("dsi0", "float32", max_text_tokens=4))
    policy.engine = FakeEngine(policy.engine.config)
    return policy


@pytest.fixture(scope="module")
def schema(policy) -> RequestSchema:
    return RequestSchema(policy)


def served_checks(schema: RequestSchema, request: dict, max_text_tasks: int = 2) -> None:
    """What a server checks of a request before any work: the schema's fields, then a robot's and its
    policy's checks (`Robot.prepare`), which end in the transforms once everything passed."""
    checked = schema.check(request)
    robot = Robot(schema.policy, "robot-0")
    robot.prepare(checked.obs, checked.options, checked.rtc, max_tasks=max_text_tasks)


def refusal(schema: RequestSchema, **fields) -> str:
    with pytest.raises(InvalidRequest) as refused:
        served_checks(schema, raw_observation() | fields)
    assert "\n" not in str(refused.value)
    return str(refused.value)


def test_a_valid_request_splits_into_its_observation_options_robot_id_and_rtc(schema):
    noise = np.zeros((10, 32), np.float32)
    tasks = {"memory": "where is the bowl"}
    rtc = {"executed": 2, "delay": 1}
    request = schema.check(
        raw_observation() | {"noise": noise, "robot_id": "arm-1", "text_tasks": tasks, "rtc": rtc}
    )
    assert set(request.obs) == set(raw_observation())
    assert request.options == RequestOptions(noise=noise, text_tasks=tasks)
    assert (request.robot_id, request.rtc) == ("arm-1", rtc)


def test_a_request_is_checked_whole_before_its_observation_is_transformed(policy):
    """A bad noise was checked only after the robot transforms and tokenizing had run."""
    transformed = []
    watched = copy.copy(policy)
    pipeline = dataclasses.replace(policy.io.pipeline, inputs=transformed.append)
    watched.io = dataclasses.replace(policy.io, pipeline=pipeline)
    bad_noise = np.zeros((10, 7), np.float32)
    with pytest.raises(InvalidRequest, match="'noise'"):
        served_checks(RequestSchema(watched), raw_observation() | {"noise": bad_noise})
    assert transformed == []


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        # numpy raised its own ValueError making an array of a ragged list: a server fault.
        ({"observation/state": [[0.0] * 4, [0.0] * 3]}, "'observation/state': expected 8 numbers, got list"),
        ({"noise": [[1.0, 2.0], [3.0]]}, "'noise'"),
        # Sorting option keys of mixed types raised TypeError.
        (
            {"text_tasks": {"t": {"instruction": "say", 1: "x", "colour": "red"}}},
            r"unknown option\(s\) \['1', 'colour'\]",
        ),
        # Task names appear in every /text event and in logs, as robot ids do.
        ({"text_tasks": {"line\nbreak": "say"}}, "text task names must be printable"),
        ({"rtc": {"executed": 1, "delya": 2}}, r"rtc: unknown field\(s\) \['delya'\]"),
        # An array's repr spans lines; the refusal names its type instead.
        ({"rtc": {"executed": np.zeros((4, 4))}}, "rtc.executed must be an int, got ndarray$"),
        ({"rtc": {"executed": 11}}, "rtc.executed 11 is beyond the last chunk's 10 actions"),
        ({"text_tasks": {"a": "x", "b": "y", "c": "z"}}, "text_tasks: at most 2 tasks, got 3"),
        ({"robot_id": "a" * 65}, "'robot_id': expected a printable string of 1 to 64 characters"),
        ({"max_text_tokens": np.timedelta64(2)}, "'max_text_tokens': expected an integer, got timedelta64"),
        ({"top_p": 0.0}, r"top_p must lie in \(0, 1\]"),
    ],
)
def test_each_bad_field_is_a_one_line_refusal(schema, fields, named):
    assert re.search(named, refusal(schema, **fields))


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_a_state_too_large_to_normalize_is_refused(policy):
    """A finite state that normalizes to inf reached the model (its actions inf); the transforms find it."""
    with pytest.raises(InvalidRequest, match="'state': values too large"):
        policy.prepare(raw_observation() | {"observation/state": np.full(8, 1e308)})


def test_a_server_without_rtc_refuses_it_with_its_own_line(policy):
    schema = RequestSchema(policy, rtc_refusal="rtc: not here")
    assert refusal(schema, rtc={"executed": 0}) == "rtc: not here"


def test_the_schema_declares_every_field_and_the_docs_list_each(schema):
    assert FIELD_NAMES == (
        "noise",
        "samples",
        "max_text_tokens",
        "temperature",
        "top_p",
        "text_tasks",
        "robot_id",
        "rtc",
    )
    names = [field.name for field in observation_fields(libero.RAW_SPEC)]
    assert names == ["observation/image", "observation/wrist_image", "observation/state", "prompt"]
    section = DOCS.read_text().split("## Request schema", 1)[1].split("\n## ", 1)[0]
    for field in FIELDS:
        assert f"| `{field.name}` |" in section


def test_a_trimmed_request_keeps_what_the_server_reads_and_only_the_names_of_the_rest(schema, policy):
    """The server trims each request as soon as it is decoded: an extra 15 MB array is not held while the
    request waits, and a request missing a key still says which keys it got."""
    noise, junk = np.zeros((10, 32), np.float32), np.zeros(16, np.uint8)
    request = raw_observation() | {"noise": noise, "robot_id": "arm-1", "junk": junk, b"bytes key": junk}
    assert schema.trimmed(request) == raw_observation() | {
        "noise": noise,
        "robot_id": "arm-1",
        "junk": None,
        b"bytes key": None,
    }
    missing = dict(raw_observation(), wrist=junk)
    del missing["observation/wrist_image"]
    with pytest.raises(InvalidRequest, match=r"got keys .*'wrist'"):
        policy.prepare(schema.check(schema.trimmed(missing)).obs)
    nested = copy.copy(policy)
    nested.io = dataclasses.replace(policy.io, spec=aloha.RAW_SPEC)
    aloha_request = {"images": {"cam_high": junk, "extra": junk}, "state": junk, "prompt": "fold"}
    trimmed = RequestSchema(nested).trimmed(aloha_request | {"actions": junk})
    assert trimmed == {
        "images": {"cam_high": junk, "extra": None},
        "state": junk,
        "prompt": "fold",
        "actions": None,
    }
    assert RequestSchema(nested).trimmed({"images": "not a map"}) == {"images": "not a map"}
