"""A fleet on Ray Serve (a local cluster on 127.0.0.1 started here): two CPU replicas of the tiny model
behind the Ray proxy, with an API key, reached by unmodified openpi clients (redirected by the ingress to
their replica's own server); one cluster serves every test of the module
(on 2 cores: Ray starts in ~5 s, Serve's proxy in ~1 s, the two replicas load and warm up in ~30 s)."""

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import (
    GOLDEN,
    MAX_TEXT_TOKENS,
    OPENPI_CLIENT_WARNING,
    TOKENIZER,
    VARIANTS,
    answers_alone,
    client_observation,
    free_port,
    http_get,
    metric_samples,
    openpi_client,
    text_budget,
    websocket,
)
from websockets.exceptions import InvalidStatus

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
pytest.importorskip("openpi_client.websocket_client_policy")

from oxygen_jax.runtime.runtime import RuntimeConfig  # noqa: E402
from oxygen_jax.serving import msgpack_numpy, ray_app  # noqa: E402
from oxygen_jax.serving.server_config import ServerConfig  # noqa: E402
from oxygen_jax.serving.websocket_server import FAILED_KEY_BURST, ServerLimits  # noqa: E402

pytestmark = [pytest.mark.timeout(600), OPENPI_CLIENT_WARNING]

REPLICAS = 2
CLIENTS = 4
REQUESTS = 50
NOISES = 3
API_KEY = "s3cret"
KEYED = {"Authorization": f"Api-Key {API_KEY}"}
SERVER = ServerConfig(
    "pi05_tiny",
    str(GOLDEN / "checkpoint"),
    {"model.discrete_state_input": VARIANTS["dsi0"], "asset_id": "physical-intelligence/libero"},
    tokenizer_path=TOKENIZER,
    max_text_tokens=MAX_TEXT_TOKENS,
    runtime=RuntimeConfig(max_slots=CLIENTS, max_new_tokens=MAX_TEXT_TOKENS, max_prefill_batch=2),
    rtc=False,
    limits=ServerLimits(api_key=API_KEY),
)


@pytest.fixture(scope="module")
def fleet():
    """The Ray proxy's port, with both replicas warm."""
    port = free_port()
    ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=4)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        fleet = ray_app.FleetConfig(replicas=REPLICAS, replica_cpus=1.0, port=port)
        serve.run(ray_app.application(SERVER, fleet), name=ray_app.APP_NAME, route_prefix="/")
        yield port
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def noises() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((NOISES, 10, 32)).astype(np.float32)


@pytest.fixture(scope="module")
def alone(policy, noises):
    """What `Policy.infer` answers each client's observation with each noise, and its text alone."""
    return answers_alone(policy, noises, CLIENTS)


class Robot:
    """An openpi client that reconnects (to whichever replica the proxy picks) when its connection drops."""

    def __init__(self, port: int):
        self.port = port
        self.errors = 0
        self.replicas: list[str] = []
        self._connect()

    def _connect(self) -> None:
        self.connection = openpi_client(self.port, api_key=API_KEY)
        self.replicas.append(self.connection.get_server_metadata()["replica_id"])

    def infer(self, obs: dict) -> dict:
        deadline = time.monotonic() + 120
        while True:
            try:
                return self.connection.infer(obs)
            except Exception:
                self.errors += 1
                assert time.monotonic() < deadline, "no replica took the robot back"
                time.sleep(0.5)
                with contextlib.suppress(Exception):  # else retried with the request
                    self._connect()


def run_robot(robot: Robot, client: int, noises: np.ndarray, requests: int, pause_s: float = 0.0) -> list:
    """`requests` observations of `client`, each with the next noise: (noise index, reply) per request."""
    replies = []
    for request in range(requests):
        which = (client + request) % len(noises)
        obs = client_observation(client) | {
            "noise": noises[which],
            "max_text_tokens": text_budget(client),
            "robot_id": f"client-{client}",
        }
        replies.append((which, robot.infer(obs)))
        time.sleep(pause_s)
    return replies


def assert_equal_to_alone(replies: list, client: int, alone: tuple[dict, dict]) -> None:
    actions, texts = alone
    for which, reply in replies:
        np.testing.assert_allclose(reply["actions"], actions[client, which], atol=1e-5, rtol=0)
        if reply.get("text_done"):
            np.testing.assert_array_equal(reply["text_tokens"], texts[client]["text_tokens"])
            assert reply["text"] == texts[client]["text"]


@contextlib.contextmanager
def text_subscriber(port: int):
    """A `/text` subscriber on the Ray port; yields the robot ids of the finished texts it received so far
    (a function)."""
    with websocket(port, "/text", additional_headers=KEYED) as subscriber:
        finished: list[str] = []

        def received() -> set[str]:
            with contextlib.suppress(TimeoutError):
                while True:
                    event = msgpack_numpy.unpackb(subscriber.recv(timeout=1))
                    if event["done"]:
                        finished.append(event["robot_id"])
            return set(finished)

        time.sleep(1.5)  # the subscriber's replica connects to every replica's /text
        yield received


def test_an_openpi_client_through_the_ray_proxy_is_served_by_a_named_replica_as_policy_infer(
    fleet, noises, alone
):
    assert http_get(fleet, "/healthz", timeout_s=30)[0] == 200
    assert http_get(fleet, "/readyz", timeout_s=30) == (200, "ready\n")
    robot = Robot(fleet)
    with text_subscriber(fleet) as finished_texts:
        replies = run_robot(robot, 0, noises, 2 * NOISES)
        assert finished_texts() == {"client-0"}
    assert robot.errors == 0 and robot.replicas[0]
    assert_equal_to_alone(replies, 0, alone)
    assert any(reply.get("text_done") for _, reply in replies)
    assert "oxygen_action_latency_seconds" in http_get(fleet, "/metrics", timeout_s=30, headers=KEYED)[1]


@pytest.mark.integration
def test_robots_are_redirected_to_their_replicas_own_server_in_turn_and_a_wrong_key_gets_401(
    fleet, noises, alone
):
    robots = [Robot(fleet) for _ in range(REPLICAS)]
    ports = {robot.connection._ws.remote_address[1] for robot in robots}
    assert fleet not in ports and len(ports) == REPLICAS  # straight to each replica's server, one each
    assert len({robot.replicas[0] for robot in robots}) == REPLICAS
    assert_equal_to_alone(run_robot(robots[0], 0, noises, NOISES), 0, alone)
    for headers in ({}, {"Authorization": "Api-Key wrong"}):
        with pytest.raises(InvalidStatus, match="401"):
            websocket(fleet, "/", additional_headers=headers)
    statuses = []  # the ingress throttles an address's failed keys as a server does (each replica its own)
    for _ in range(REPLICAS * FAILED_KEY_BURST + 2):
        with pytest.raises(InvalidStatus) as refused:
            websocket(fleet, "/", additional_headers={"Authorization": "Api-Key wrong"})
        statuses.append(refused.value.response.status_code)
    assert set(statuses) == {401, 429}, statuses
    time.sleep(1.5)  # the address may present a key again: later tests connect from it


def replica_requests(port: int) -> dict[str, float]:
    """Requests each replica counted, scraping /metrics through the proxy until both replicas answered."""
    counted: dict[str, float] = {}
    for _ in range(60):
        samples = metric_samples(port, timeout_s=30, headers=KEYED)
        (replica,) = [item.labels["replica_id"] for item in samples if item.name == "oxygen_server_info"]
        counted[replica] = sum(sample.value for sample in samples if sample.name == "oxygen_requests_total")
        if len(counted) == REPLICAS:
            return counted
    raise AssertionError(f"only replicas {sorted(counted)} answered /metrics")


@pytest.mark.slow
def test_four_clients_over_both_replicas_get_policy_infer_answers_and_each_replica_counts_its_own(
    fleet, noises, alone
):
    before = replica_requests(fleet)
    robots = [Robot(fleet) for _ in range(CLIENTS)]
    with text_subscriber(fleet) as finished_texts, ThreadPoolExecutor(CLIENTS) as pool:
        replies = list(pool.map(lambda c: run_robot(robots[c], c, noises, REQUESTS), range(CLIENTS)))
        assert finished_texts() == {f"client-{client}" for client in range(CLIENTS)}  # from both replicas
    assert [robot.errors for robot in robots] == [0] * CLIENTS
    assert len({robot.replicas[0] for robot in robots}) == REPLICAS  # both replicas served
    for client, client_replies in enumerate(replies):
        assert len(client_replies) == REQUESTS
        assert_equal_to_alone(client_replies, client, alone)
        assert any(reply.get("text_done") for _, reply in client_replies)
    after = replica_requests(fleet)
    for replica in after:
        served = REQUESTS * sum(robot.replicas[0] == replica for robot in robots)
        assert after[replica] - before.get(replica, 0) == served


def test_a_serve_config_files_args_describe_the_server_and_fleet_and_size_each_replica():
    args = {
        "config_name": "pi05_libero",
        "checkpoint_dir": "gs://openpi-assets/checkpoints/pi05_libero",
        "max_text_tokens": 24,
        "runtime": {"max_slots": 8, "max_new_tokens": 24, "k": 2},
        "limits": {"max_connections": 32},
        "fleet": {"replicas": 2, "max_replicas": 8},
    }
    server, fleet = ray_app.configs(args)
    assert server.runtime == RuntimeConfig(max_slots=8, max_new_tokens=24, k=2)
    assert server.limits.max_connections == 32 and server.limits.max_message_mb == 16.0
    options = fleet.deployment_options(server, gpus=True)
    assert options["max_ongoing_requests"] == 8 + ray_app.EXTRA_REQUESTS
    assert options["ray_actor_options"] == {"num_cpus": 0, "num_gpus": 1}
    assert options["autoscaling_config"] == {
        "min_replicas": 2,
        "initial_replicas": 2,
        "max_replicas": 8,
        "target_ongoing_requests": 4.0,
    }
    assert fleet.relays_robots  # autoscaling counts relayed connections
    assert not ray_app.FleetConfig(replicas=2).relays_robots
    assert ray_app.FleetConfig(replicas=2, relay_robots=True).relays_robots
    with pytest.raises(ValueError, match="min_replicas <= max_replicas"):
        ray_app.FleetConfig(replicas=3, max_replicas=2)


def kill_replica(replica_id: str) -> None:
    """Kills the Ray actor of one replica, as a crash would (Serve then starts another)."""
    (name,) = [
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["name"].endswith(f"#{replica_id}")
    ]
    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)


@pytest.mark.slow
def test_a_killed_replicas_robots_reconnect_and_finish_while_the_other_replicas_see_no_error(
    fleet, noises, alone
):
    robots = [Robot(fleet) for _ in range(CLIENTS)]
    victim = robots[0].replicas[0]
    assert len({robot.replicas[0] for robot in robots}) == REPLICAS
    with ThreadPoolExecutor(CLIENTS) as pool:
        runs = [pool.submit(run_robot, robots[c], c, noises, REQUESTS, 0.05) for c in range(CLIENTS)]
        time.sleep(2.0)  # mid-run
        kill_replica(victim)
        replies = [run.result() for run in runs]
    for client, robot in enumerate(robots):
        assert len(replies[client]) == REQUESTS
        assert_equal_to_alone(replies[client], client, alone)
        if robot.replicas[0] == victim:
            assert robot.errors > 0 and robot.replicas[-1] != victim
        else:
            assert robot.errors == 0 and robot.replicas == robot.replicas[:1]
