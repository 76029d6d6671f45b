"""Several language tasks on one observation through Policy.infer: one prefill, one text per task."""

import numpy as np
import pytest
from conftest import E2E, make_policy, raw_observation

from oxygen_jax.policies.policy import MAX_TASK_TOKENS

pytestmark = pytest.mark.timeout(120)
TASKS = {
    "subtask": "what is the next subtask",
    "narration": {"instruction": "describe what you are doing", "max_text_tokens": 3},
    "memory": {"instruction": "where is the bowl", "max_text_tokens": 5, "temperature": 0.0},
}


@pytest.fixture(scope="module")
def policy():
    return make_policy("dsi0", "float32", max_text_tokens=8)


def test_each_task_gets_its_text_from_one_prefill(policy):
    before = policy.engine.stats.prefill_calls
    out = policy.infer(raw_observation(), noise=E2E["in/noise"], text_tasks=TASKS)
    assert policy.engine.stats.prefill_calls == before + 1
    assert list(out["texts"]) == list(TASKS) and list(out["texts_tokens"]) == list(TASKS)
    assert len(out["texts_tokens"]["narration"]) <= 3 and len(out["texts_tokens"]["memory"]) <= 5
    assert "text" not in out


def test_task_text_equals_single_task_request(policy):
    """A task's greedy text does not depend on which other tasks share the observation, and equals
    decoding from the prefix extended by that task alone."""
    together = policy.infer(raw_observation(), noise=E2E["in/noise"], text_tasks=TASKS)
    for name, spec in TASKS.items():
        alone = policy.infer(raw_observation(), noise=E2E["in/noise"], text_tasks={name: spec})
        np.testing.assert_array_equal(alone["texts_tokens"][name], together["texts_tokens"][name])


@pytest.mark.parametrize("count", [1, 3])
def test_actions_unchanged_by_tasks(policy, count):
    tasks = {f"t{i}": f"instruction number {i}" for i in range(count)}
    with_tasks = policy.infer(raw_observation(), noise=E2E["in/noise"], text_tasks=tasks)
    without = policy.infer(raw_observation(), noise=E2E["in/noise"], prompt_for_text=False)
    np.testing.assert_array_equal(with_tasks["actions"], without["actions"])


@pytest.mark.parametrize(
    ("tasks", "named"),
    [
        ({"empty": "  "}, "non-empty 'instruction'"),
        ({"long": "word " * 200}, f"at most {MAX_TASK_TOKENS}"),
        ({"odd": {"instruction": "hi", "colour": "red"}}, "unknown option"),
        ({"big": {"instruction": "hi", "max_text_tokens": 99}}, "max_text_tokens must lie"),
        ([{"instruction": "no name"}], "names must be non-empty"),
        ({}, "no task"),
    ],
)
def test_bad_task_is_one_line_error(policy, tasks, named):
    with pytest.raises(ValueError, match=named) as error:
        policy.infer(raw_observation(), text_tasks=tasks)
    assert "\n" not in str(error.value)
    assert "actions" in policy.infer(raw_observation())  # the policy still serves the next request


@pytest.mark.parametrize(
    ("tasks", "named"),
    [
        ({"huge": "a" * 1_000_000}, "instruction is 1000000 characters, at most 1000"),
        ({"n" * 2**20: "what next"}, "text task names: at most 64 characters, got 1048576"),
    ],
)
def test_task_sizes_are_refused_before_anything_is_tokenized(policy, monkeypatch, tasks, named):
    tokenized = []
    monkeypatch.setattr(policy, "task_suffix", tokenized.append)
    monkeypatch.setattr(policy, "model_inputs", tokenized.append)
    with pytest.raises(ValueError, match=named) as error:
        policy.infer(raw_observation(), text_tasks=tasks)
    assert len(str(error.value)) < 200 and not tokenized


@pytest.mark.parametrize(
    ("option", "value", "problem"),
    [
        ("max_text_tokens", "5", "expected an integer, got str '5'"),
        ("max_text_tokens", 2.7, "expected an integer, got float 2.7"),
        ("max_text_tokens", True, "expected an integer, got bool True"),
        ("temperature", "0.5", "expected a number, got str '0.5'"),
        ("temperature", float("inf"), "expected a finite number, got inf"),
    ],
)
def test_task_options_are_checked_as_request_options(policy, option, value, problem):
    """The same value is refused with the same words at the request's top and inside a task."""
    with pytest.raises(ValueError, match="'" + option + "': " + problem) as at_top:
        policy.infer(raw_observation(), **{option: value})
    task = {"t": {"instruction": "what next", option: value}}
    with pytest.raises(ValueError, match="'text task t: " + option + "': " + problem) as in_task:
        policy.infer(raw_observation(), text_tasks=task)
    assert str(in_task.value).replace("text task t: ", "") == str(at_top.value)
