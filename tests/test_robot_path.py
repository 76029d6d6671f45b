"""One request followed call by call, from the websocket handler to the engine and back, on both servers:
it enters `policies/` twice (`Policy.prepare`, `Policy.finish`) and reaches the engine only from
`runtime/` (the shared runtime's device loop, or the inline runtime), on the tiny golden model."""

import functools
import sys
import threading

import numpy as np
import pytest
from conftest import OPENPI_CLIENT_WARNING, make_policy, openpi_client, raw_observation

from oxygen_jax.client import protocol
from oxygen_jax.policies.policy import Policy
from oxygen_jax.robots.robots import Robots
from oxygen_jax.runtime.runtime import RuntimeConfig
from oxygen_jax.serving.policy_backend import PolicyServerBackend, SessionServerBackend
from oxygen_jax.serving.websocket_server import BackgroundServer

pytest.importorskip("openpi_client.websocket_client_policy")

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300), OPENPI_CLIENT_WARNING]

POLICY_CALLS = ("prepare", "finish", "check_options", "model_inputs", "infer", "warmup")
ENGINE_CALLS = ("act", "prefill", "denoise", "select_rows", "generate", "extend", "insert", "decode", "noise")


class CallLog:
    """Records (what was called, the calling module) for a policy's and its engine's entry points."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def wrap(self, owner: object, name: str, label: str) -> None:
        method = getattr(owner, name)

        @functools.wraps(method)
        def logged(*args, **kwargs):
            with self._lock:
                self.calls.append((f"{label}.{name}", sys._getframe(1).f_globals["__name__"]))
            return method(*args, **kwargs)

        setattr(owner, name, logged)

    def take(self) -> list[tuple[str, str]]:
        with self._lock:
            calls, self.calls = self.calls, []
        return calls


@pytest.fixture(scope="module")
def logged_policy() -> tuple[Policy, CallLog]:
    policy, log = make_policy("dsi0", "float32"), CallLog()
    for name in POLICY_CALLS:
        log.wrap(policy, name, "policy")
    for name in ENGINE_CALLS:
        log.wrap(policy.engine, name, "engine")
    return policy, log


def _requests() -> list[dict]:
    return [raw_observation(), raw_observation() | {protocol.RTC: {"executed": 3, "delay": 2}}]


def _check_path(calls: list[tuple[str, str]], *, inline: bool) -> None:
    policy_calls = [(name, caller) for name, caller in calls if name.startswith("policy.")]
    entries = [
        (name, caller) for name, caller in policy_calls if not caller.startswith("oxygen_jax.policies")
    ]
    assert entries == [
        ("policy.prepare", "oxygen_jax.robots.robot"),
        ("policy.finish", "oxygen_jax.robots.robot"),
    ]
    engine_callers = {caller for name, caller in calls if name.startswith("engine.")}
    assert engine_callers, "the request reached no engine call"
    assert all(caller.startswith("oxygen_jax.runtime.") for caller in engine_callers), engine_callers
    assert ("oxygen_jax.runtime.inline" in engine_callers) == inline


def test_a_streamed_request_enters_the_policy_twice_and_the_engine_only_from_the_runtime(logged_policy):
    policy, log = logged_policy
    robots = Robots(policy, RuntimeConfig(max_slots=0, max_new_tokens=0, max_prefill_batch=1))
    robots.warmup(raw_observation())
    with BackgroundServer(SessionServerBackend(robots, metrics=False)) as server:
        client = openpi_client(server.port)
        client.infer(raw_observation())  # the robot's first chunk
        for request in _requests():
            log.take()
            reply = client.infer(request)
            _check_path(log.take(), inline=False)
            assert np.isfinite(reply["actions"]).all()
    robots.stop()


def test_an_inline_request_enters_the_policy_twice_and_the_engine_only_from_the_runtime(logged_policy):
    policy, log = logged_policy
    backend = PolicyServerBackend(policy, metrics=False)
    with BackgroundServer(backend) as server:
        client = openpi_client(server.port)
        client.infer(raw_observation())
        for request in _requests():
            log.take()
            reply = client.infer(request)
            _check_path(log.take(), inline=True)
            assert np.isfinite(reply["actions"]).all()
    backend.close()


def test_the_check_fails_on_a_path_that_calls_the_engine_from_elsewhere():
    calls = [
        ("policy.prepare", "oxygen_jax.robots.robot"),
        ("engine.act", "oxygen_jax.policies.policy"),
        ("policy.finish", "oxygen_jax.robots.robot"),
    ]
    with pytest.raises(AssertionError):
        _check_path(calls, inline=True)
