"""Several text tasks per observation through the streaming server: one prefill, one text per task."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import (
    MAX_TEXT_TOKENS,
    OPENPI_CLIENT_WARNING,
    client_observation,
    raw_observation,
    run_client,
    text_budget,
)

from oxygen_jax.engine.compile_counter import CompileCounter
from oxygen_jax.policies.request_options import RequestOptions
from oxygen_jax.robots.robot import RobotRequest
from oxygen_jax.robots.robots import Robots
from oxygen_jax.runtime.runtime import RuntimeConfig
from oxygen_jax.serving.policy_backend import SessionServerBackend
from oxygen_jax.serving.websocket_server import BackgroundServer

pytest.importorskip("openpi_client.websocket_client_policy")

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600), OPENPI_CLIENT_WARNING]

N_ROBOTS = 4
N_REQUESTS = 8
TASKS = {
    "subtask": "what is the next subtask",
    "narration": {"instruction": "describe what you are doing", "max_text_tokens": 4},
    "memory": {"instruction": "where is the cup", "max_text_tokens": 2},
}


@pytest.fixture(scope="module")
def session(policy):
    config = RuntimeConfig(
        max_slots=len(TASKS) * N_ROBOTS,
        max_new_tokens=MAX_TEXT_TOKENS,
        loop="async",
        max_prefill_batch=4,
        gather_s=0.005,
    )
    session = Robots(policy, config, max_text_tasks=len(TASKS))
    session.warmup(raw_observation())
    yield session
    session.stop()


@pytest.fixture(scope="module")
def served(policy, session):
    """Each robot's replies to requests that all carry the three tasks (the request's `max_text_tokens`
    is the budget of a task without its own), and each robot's texts alone."""
    noises = np.random.default_rng(3).standard_normal((4, 10, 32)).astype(np.float32)
    alone = {
        robot: policy.infer(
            client_observation(robot),
            noise=noises[robot],
            text_tasks=TASKS,
            max_text_tokens=text_budget(robot),
        )
        for robot in range(N_ROBOTS)
    }
    with (
        CompileCounter() as compiles,
        BackgroundServer(SessionServerBackend(session)) as server,
        ThreadPoolExecutor(N_ROBOTS) as pool,
    ):
        replies = list(
            pool.map(
                lambda robot: run_client(robot, server.port, noises, N_REQUESTS, text_tasks=TASKS),
                range(N_ROBOTS),
            )
        )
    return {"replies": replies, "alone": alone, "noises": noises, "compiles": compiles.count}


def test_every_robot_gets_one_text_per_task_equal_to_policy_infer(served):
    for robot, replies in enumerate(served["replies"]):
        alone = served["alone"][robot]
        done = [reply for _, reply in replies if reply.get("text_done")]
        # How many texts finish within N_REQUESTS depends on the device's idle time (machine load).
        assert len(done) >= 1 and [len(replies)] == [N_REQUESTS]
        for reply in done:
            assert list(reply["texts"]) == list(TASKS) and "text" not in reply
            assert reply["texts"] == alone["texts"]
            for name in TASKS:
                np.testing.assert_array_equal(reply["texts_tokens"][name], alone["texts_tokens"][name])
        for which, reply in replies:
            if which == robot:  # the noise Policy.infer used
                np.testing.assert_allclose(reply["actions"], alone["actions"], atol=1e-5, rtol=0)


def test_task_request_ids_are_the_robots_own(served):
    owners: dict[int, int] = {}
    for robot, replies in enumerate(served["replies"]):
        for _, reply in replies:
            for request_id in reply.get("text_request_ids", {}).values():
                assert owners.setdefault(request_id, robot) == robot


def test_nothing_compiles_after_warmup(served):
    assert served["compiles"] == 0


@pytest.mark.parametrize(
    ("tasks", "named"),
    [
        ({"empty": ""}, "non-empty 'instruction'"),
        ({"a": "x", "b": "y", "c": "z", "d": "w"}, "at most 3 tasks"),
    ],
)
def test_a_bad_task_refuses_its_request_only(session, tasks, named):
    good, bad = session.step(
        [
            RobotRequest("good", raw_observation(), RequestOptions(text_tasks=TASKS)),
            RobotRequest("bad", raw_observation(), RequestOptions(text_tasks=tasks)),
        ]
    )
    assert isinstance(bad, ValueError) and named in str(bad) and "\n" not in str(bad)
    assert good["actions"].shape == (10, 7) and set(good["texts"]) == set(TASKS)
