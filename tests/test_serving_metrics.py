"""The server's operations endpoints: /readyz after warm-up, Prometheus /metrics whose counters equal what
the clients sent and got."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import (
    MAX_TEXT_TOKENS,
    OPENPI_CLIENT_WARNING,
    client_observation,
    http_get,
    metric_samples,
    openpi_client,
    raw_observation,
    serve_script,
    text_budget,
    websocket,
)

from oxygen_jax.robots.robots import Robots
from oxygen_jax.runtime.runtime import RuntimeConfig
from oxygen_jax.serving.policy_backend import PolicyServerBackend, SessionServerBackend
from oxygen_jax.serving.websocket_server import BackgroundServer

pytest.importorskip("openpi_client.websocket_client_policy")

pytestmark = [pytest.mark.timeout(180), OPENPI_CLIENT_WARNING]

CLIENTS = 2
REQUESTS = 6
SLOTS = 4


def session_backend(policy) -> SessionServerBackend:
    config = RuntimeConfig(
        max_slots=SLOTS, max_new_tokens=MAX_TEXT_TOKENS, max_prefill_batch=2, gather_s=0.005
    )
    return SessionServerBackend(Robots(policy, config, rtc=False))


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    """/metrics: (sample name, labels) -> value."""
    return {(sample.name, frozenset(sample.labels.items())): sample.value for sample in metric_samples(port)}


def value(metrics: dict, name: str, **labels: str) -> float:
    return metrics[(name, frozenset(labels.items()))]


def test_readyz_answers_503_until_warm_up_compiled_every_program_then_200(policy):
    backend = session_backend(policy)
    with BackgroundServer(backend) as server:
        assert http_get(server.port, "/healthz")[0] == 200
        assert http_get(server.port, "/readyz")[0] == 503
        assert value(scrape(server.port), "oxygen_ready") == 0
        backend.warmup()
        assert http_get(server.port, "/readyz") == (200, "ready\n")
        assert value(scrape(server.port), "oxygen_ready") == 1
    backend.close()


def test_metrics_count_every_request_batch_token_and_error_and_no_compilation_after_warm_up(policy):
    backend = session_backend(policy)
    backend.warmup(raw_observation())
    manager = backend._session.runtime.manager
    with BackgroundServer(backend) as server:
        connections = [openpi_client(server.port) for _ in range(CLIENTS)]

        def robot(client: int) -> list[dict]:
            obs = client_observation(client) | {"max_text_tokens": text_budget(client)}
            return [connections[client].infer(obs) for _ in range(REQUESTS)]

        with ThreadPoolExecutor(CLIENTS) as pool:
            replies = list(pool.map(robot, range(CLIENTS)))
        with websocket(server.port) as bad:
            bad.recv()  # metadata
            bad.send("not msgpack")
            assert bad.recv(timeout=10).startswith("Bad request")
        deadline = time.monotonic() + 30
        while (manager.active or manager.queued) and time.monotonic() < deadline:
            time.sleep(0.01)  # the robots stay connected until their language requests finish
        metrics = scrape(server.port)
    backend.close()

    sent = CLIENTS * REQUESTS
    started = [sum(reply["text_request_started"] is not None for reply in robot) for robot in replies]
    assert value(metrics, "oxygen_requests_total", robot="libero") == sent + 1
    assert value(metrics, "oxygen_action_latency_seconds_count", robot="libero") == sent
    assert value(metrics, "oxygen_errors_total", kind="bad_request") == 1
    assert value(metrics, "oxygen_queue_wait_seconds_count") == sent
    assert value(metrics, "oxygen_prefill_batch_size_sum") == sent
    batches = value(metrics, "oxygen_prefill_denoise_seconds_count")
    assert sent / 2 <= batches <= sent  # at most two observations per batch
    assert value(metrics, "oxygen_prefill_batch_size_count") == batches
    # The tiny model's greedy text never ends early: each request makes its whole budget.
    assert value(metrics, "oxygen_text_requests_finished_total", reason="length") == sum(started)
    tokens = sum(n * text_budget(client) for client, n in enumerate(started))
    assert value(metrics, "oxygen_text_tokens_total") == tokens
    assert value(metrics, "oxygen_decode_steps_total") > 0
    assert value(metrics, "oxygen_compilations_after_warmup_total") == 0
    assert value(metrics, "oxygen_connected_robots") == CLIENTS
    assert value(metrics, "oxygen_slots_max") == SLOTS
    assert value(metrics, "oxygen_slots_in_use") == 0
    assert value(metrics, "oxygen_observations_waiting") == 0
    assert 0 < value(metrics, "oxygen_device_busy_fraction") <= 1


def test_the_inline_backend_is_ready_after_warm_up_and_metrics_off_answers_404(policy):
    backend = PolicyServerBackend(policy)
    silent = PolicyServerBackend(policy, metrics=False)
    assert not backend.ready
    backend.warmup()
    assert backend.ready
    with BackgroundServer(backend) as server, BackgroundServer(silent) as quiet:
        openpi_client(server.port).infer(raw_observation())
        assert value(scrape(server.port), "oxygen_action_latency_seconds_count", robot="libero") == 1
        assert http_get(quiet.port, "/metrics")[0] == 404


@pytest.mark.integration
def test_serve_script_turns_ready_after_its_start_up_warm_up_and_metrics_off_with_the_flag(tmp_path):
    with serve_script(tmp_path) as (_, port), serve_script(tmp_path, "--metrics=false") as (_, quiet):
        deadline = time.monotonic() + 120
        while http_get(port, "/readyz")[0] != 200:
            assert time.monotonic() < deadline, "serve.py never became ready"
            time.sleep(0.2)
        assert value(scrape(port), "oxygen_compilations_after_warmup_total") == 0
        assert http_get(quiet, "/metrics")[0] == 404
