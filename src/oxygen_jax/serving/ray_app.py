"""A fleet of servers on Ray Serve: each replica is one whole server (policy, runtime, session) on its
own device, behind Ray Serve's FastAPI ingress.

Each replica builds its server from a `ServerConfig` exactly as `oxygen-serve` does, warms it up (Ray
starts routing to the replica once its constructor returns, and `check_health` fails unless warm-up is
done), and runs the same websocket server (`websocket_server.BackgroundServer`) on its node's address on a
port of its own. A robot reaches that server directly: the ingress answers its websocket handshake (`/`)
with HTTP 307 to a replica's server address (`ws://host:port/`, the replicas taken in turn from a
directory actor, `ReplicaDirectory`, skipping one that does not accept a TCP connection), which openpi's
client (`websockets`) follows, so its frames cross no proxy. With an API key the ingress checks the
header itself and puts a short-lived ticket in the redirect (`serving/tickets.py`), since the client drops
the header on a redirect to another origin. An autoscaling fleet (or `relay_robots=True`, or a proxy
without the ASGI `websocket.http.response` extension) relays instead: the robot's websocket is joined
frame for frame to a connection to the server of the replica the proxy picked (`relay.join`), so the
connection counts as an ongoing request for its life, which is what the autoscaler scales on.
`GET /healthz`, `/readyz` and `/metrics` are forwarded to the server with the request's `Authorization`
header. So the openpi protocol, the limits and every check stay one implementation, and a connection stays
on one replica for its life (its language requests and chunk state live there). The metadata a robot
receives on connect names that replica (`replica_id`), and
`oxygen_server_info{replica_id=...}` labels each replica's `/metrics` (a scrape through the proxy reaches
one replica). A `/text` subscriber receives every replica's text: each replica lists its server in the
directory, and the replica a subscriber reaches merges every server's `/text` (`relay.fan_in`).

A relayed robot connection is one ongoing request for as long as it is open, so `max_ongoing_requests`
(the replica's language slots, plus room for a `/text` subscriber and a probe) bounds the robots a replica
holds, and Ray's autoscaler scales on connected robots (`target_ongoing_requests`); a redirected robot is
bounded by its server's `max_connections`. A replica reserves one
GPU when the cluster has any (JAX then sees that one), else `replica_cpus` CPUs.
"""

import asyncio
import dataclasses
import logging
import signal
from typing import Any

import ray
from fastapi import FastAPI, Request, Response, WebSocket
from fastapi.responses import PlainTextResponse, RedirectResponse
from ray import serve

from oxygen_jax.runtime.runtime import RuntimeConfig
from oxygen_jax.serving import relay, tickets
from oxygen_jax.serving.flow_control import AddressThrottle, RefusalHold
from oxygen_jax.serving.policy_backend import settle_heap
from oxygen_jax.serving.server_config import ServerConfig
from oxygen_jax.serving.websocket_server import (
    FAILED_KEY_BURST,
    FAILED_KEY_RATE,
    KEYS_THROTTLED,
    MAX_HELD_REFUSALS,
    REFUSAL_HOLD_S,
    TEXT_PATH,
    BackgroundServer,
    ServerLimits,
)

logger = logging.getLogger(__name__)

APP_NAME = "oxygen"
# Ongoing requests a replica takes beyond its robots: a /text subscriber and a health or metrics probe.
EXTRA_REQUESTS = 2
DIRECTORY = f"{APP_NAME}-replicas"
# The ASGI extension that lets a websocket route answer its handshake with an HTTP response.
HTTP_RESPONSE = "websocket.http.response"
# How long the ingress waits for a replica's server to accept a TCP connection before it tries the next.
PROBE_TIMEOUT_S = 1.0

ingress = FastAPI()


class ReplicaDirectory:
    """The replicas' server addresses (host:port), by replica id: one named actor per application. A
    replica adds itself when it starts and again at each health check (so one dropped by mistake comes
    back), and removes itself when it stops."""

    def __init__(self) -> None:
        self._addresses: dict[str, str] = {}
        self._turn = 0

    def add(self, replica_id: str, address: str) -> None:
        self._addresses[replica_id] = address

    def remove(self, replica_id: str) -> None:
        self._addresses.pop(replica_id, None)

    def addresses(self) -> list[str]:
        return list(self._addresses.values())

    def in_turn(self) -> list[tuple[str, str]]:
        """Every (replica id, address), starting one further each call: the order robots are sent in."""
        replicas = list(self._addresses.items())
        if not replicas:
            return []
        self._turn = (self._turn + 1) % len(replicas)
        return replicas[self._turn :] + replicas[: self._turn]


def directory() -> Any:
    """The application's `ReplicaDirectory` actor (created by the first replica; it outlives replicas)."""
    actor = ray.remote(ReplicaDirectory).options(
        name=DIRECTORY, namespace="serve", get_if_exists=True, lifetime="detached", num_cpus=0
    )
    return actor.remote()


@dataclasses.dataclass(frozen=True)
class FleetConfig:
    """How many replicas, what each reserves and where the Ray proxy listens.

    replicas: a fixed count, or the fewest with autoscaling (`max_replicas` above it; `min_replicas`
    overrides the fewest); target_ongoing_requests: connected robots per replica the autoscaler aims for
    (default half a replica's robots); num_gpus: per replica (None: 1 when the cluster has a GPU, else 0);
    ray_address: the cluster to join (None: start a local one on 127.0.0.1); relay_robots: relay robots'
    frames through the ingress instead of redirecting them to their replica's server (None: relay when
    autoscaling, whose signal is the relayed connections; set True where robots cannot reach the
    replicas' node addresses).
    """

    replicas: int = 1
    min_replicas: int | None = None
    max_replicas: int | None = None
    target_ongoing_requests: float | None = None
    replica_cpus: float = 1.0
    num_gpus: float | None = None
    ray_address: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    relay_robots: bool | None = None

    def __post_init__(self) -> None:
        """A one-line ValueError for counts no fleet can have."""
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        fewest = self.replicas if self.min_replicas is None else self.min_replicas
        if fewest < 0 or (self.max_replicas is not None and self.max_replicas < max(fewest, 1)):
            raise ValueError(f"need 0 <= min_replicas <= max_replicas, got {fewest} and {self.max_replicas}")
        if self.replica_cpus <= 0:
            raise ValueError(f"replica_cpus must be > 0, got {self.replica_cpus}")

    def deployment_options(self, server: ServerConfig, gpus: bool) -> dict[str, Any]:
        """Ray Serve deployment options for replicas of `server`."""
        num_gpus = (1 if gpus else 0) if self.num_gpus is None else self.num_gpus
        options: dict[str, Any] = {
            "max_ongoing_requests": server.max_robots + EXTRA_REQUESTS,
            "ray_actor_options": {"num_cpus": 0 if num_gpus else self.replica_cpus, "num_gpus": num_gpus},
        }
        if self.max_replicas is None:
            options["num_replicas"] = self.replicas
        else:
            target = self.target_ongoing_requests or max(server.max_robots / 2, 1)
            options["autoscaling_config"] = {
                "min_replicas": self.replicas if self.min_replicas is None else self.min_replicas,
                "initial_replicas": self.replicas,
                "max_replicas": self.max_replicas,
                "target_ongoing_requests": target,
            }
        return options

    @property
    def relays_robots(self) -> bool:
        return self.max_replicas is not None if self.relay_robots is None else self.relay_robots


async def _accepts(address: str) -> bool:
    """Whether a server listens at host:port (a TCP connection opens within `PROBE_TIMEOUT_S`). Defined
    before the replica class, which Serve's ingress serializes with the globals it sees then."""
    host, port = address.rsplit(":", 1)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), PROBE_TIMEOUT_S)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


@serve.deployment(name="ServerReplica")
@serve.ingress(ingress)
class ServerReplica:
    """One whole server behind the ingress (see the module docstring)."""

    def __init__(self, server: ServerConfig, relay_robots: bool = False) -> None:
        self._api_key = server.limits.api_key
        self._failed_keys = AddressThrottle(FAILED_KEY_RATE, FAILED_KEY_BURST)  # this ingress's, per address
        self._holds = RefusalHold(MAX_HELD_REFUSALS, REFUSAL_HOLD_S)
        self._relay_robots = relay_robots
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self._backend = server.build_backend(replica_id=self.replica_id)
        host = ray.util.get_node_ip_address()  # other replicas' /text subscribers read it too
        self._server = BackgroundServer(self._backend, host, 0, limits=server.limits).start()
        self._backend.warmup()
        settle_heap()
        self._url = f"{host}:{self._server.port}"
        self._directory = directory()
        ray.get(self._directory.add.remote(self.replica_id, self._url))
        logger.info("replica %s serves on ws://%s", self.replica_id, self._url)

    def address(self) -> str:
        """host:port of this replica's own server: one replica reached past the proxy (through a
        `DeploymentHandle`, e.g. to measure what the proxy adds)."""
        return self._url

    def check_health(self) -> None:
        """Ray's health check: raises unless warm-up is done and the server runs."""
        if not self._backend.ready:
            raise RuntimeError(f"replica {self.replica_id} is not warmed up")
        self._server.port  # noqa: B018  (raises once the server stopped)
        self._directory.add.remote(self.replica_id, self._url)

    def __del__(self) -> None:
        replicas = getattr(self, "_directory", None)
        if replicas is not None:
            replicas.remove.remote(self.replica_id)
        server = getattr(self, "_server", None)
        if server is not None:
            server.stop()
        close = getattr(getattr(self, "_backend", None), "close", None)
        if close is not None:
            close()

    @ingress.websocket("/")
    async def robot(self, client: WebSocket) -> None:
        if self._relay_robots or HTTP_RESPONSE not in client.scope.get("extensions", {}):
            await relay.join(client, f"ws://{self._url}/")
            return
        key = self._api_key
        address = client.client.host if client.client else "?"
        if key is not None and self._failed_keys.throttled(address):
            await self._holds.hold(self._failed_keys.wait_s(address))
            retry = {"Retry-After": self._failed_keys.retry_after(address)}
            await client.send_denial_response(PlainTextResponse(KEYS_THROTTLED + "\n", 429, retry))
            return
        if key is not None and not tickets.header_carries_key(client.headers.getlist("authorization"), key):
            self._failed_keys.offended(address)
            unauthorized = f"Unauthorized: send {tickets.AUTH_HEADER}\n"
            await client.send_denial_response(PlainTextResponse(unauthorized, status_code=401))
            return
        query = "" if key is None else f"?{tickets.TICKET_PARAM}={tickets.mint(key)}"
        location = f"ws://{await self._robot_address()}/{query}"
        await client.send_denial_response(RedirectResponse(location, status_code=307))

    @ingress.websocket(TEXT_PATH)
    async def text(self, client: WebSocket) -> None:
        query = f"?{client.url.query}" if client.url.query else ""

        async def sources() -> list[str]:
            return [
                f"ws://{address}{TEXT_PATH}{query}" for address in await self._directory.addresses.remote()
            ]

        await relay.fan_in(client, sources)

    @ingress.get("/healthz")
    async def healthz(self, request: Request) -> Response:
        return await self._forward(request)

    @ingress.get("/readyz")
    async def readyz(self, request: Request) -> Response:
        return await self._forward(request)

    @ingress.get("/metrics")
    async def metrics(self, request: Request) -> Response:
        return await self._forward(request)

    async def _robot_address(self) -> str:
        """The next replica's server address in turn that accepts a TCP connection (one that does not is
        dropped from the directory until its next health check), else this replica's."""
        for replica_id, address in await self._directory.in_turn.remote():
            if address == self._url or await _accepts(address):
                return address
            logger.warning("replica %s at %s does not answer: skipped", replica_id, address)
            self._directory.remove.remote(replica_id)
        return self._url

    async def _forward(self, request: Request) -> Response:
        status, body, content_type = await relay.forward_get(request, f"http://{self._url}")
        return Response(body, status_code=status, media_type=content_type)


def application(server: ServerConfig, fleet: FleetConfig, gpus: bool = False) -> serve.Application:
    """The Ray Serve application of `fleet` replicas of `server` (for `serve.run`)."""
    return ServerReplica.options(**fleet.deployment_options(server, gpus)).bind(server, fleet.relays_robots)


def configs(args: dict[str, Any]) -> tuple[ServerConfig, FleetConfig]:
    """A Serve config file's `args` as the server and fleet: `ServerConfig` fields, with `runtime` and
    `limits` as maps of `RuntimeConfig` and `ServerLimits` fields (no `runtime`: `--language=inline`) and
    `fleet` as a map of `FleetConfig` fields."""
    args = dict(args)
    fleet = FleetConfig(**args.pop("fleet", {}))
    runtime = args.pop("runtime", None)
    runtime = None if runtime is None else RuntimeConfig(**runtime)
    limits = ServerLimits(**args.pop("limits", {}))
    return ServerConfig(**args, runtime=runtime, limits=limits), fleet


def app_builder(args: dict[str, Any]) -> serve.Application:
    """What `serve run config.yaml` and a KubeRay `RayService` build (`import_path:
    oxygen_jax.serving.ray_app:app_builder`); `args` as `configs` reads them."""
    server, fleet = configs(args)
    gpus = ray.is_initialized() and ray.cluster_resources().get("GPU", 0) >= 1
    return application(server, fleet, gpus)


def replica_address(ray_address: str = "auto") -> tuple[str, int]:
    """(host, port) of the server of the running application's replica (one of them, if several), asked
    through a `DeploymentHandle` from outside the cluster's driver."""
    ray.init(address=ray_address, log_to_driver=False)
    try:
        host, port = serve.get_app_handle(APP_NAME).address.remote().result().rsplit(":", 1)
    finally:
        ray.shutdown()
    return host, int(port)


def start(server: ServerConfig, fleet: FleetConfig) -> None:
    """Joins or starts the Ray cluster, starts Serve's proxy on `fleet.host:port` and deploys the replicas;
    returns once every replica is warm."""
    if fleet.ray_address is None:
        ray.init(_node_ip_address="127.0.0.1", include_dashboard=False)
    else:
        ray.init(address=fleet.ray_address)
    gpus = ray.cluster_resources().get("GPU", 0) >= 1
    serve.start(http_options={"host": fleet.host, "port": fleet.port})
    serve.run(application(server, fleet, gpus), name=APP_NAME, route_prefix="/")


def serve_fleet(server: ServerConfig, fleet: FleetConfig) -> None:
    """`start`, then serve until SIGINT or SIGTERM; then the application is deleted (and a local cluster
    stopped)."""
    start(server, fleet)
    logger.info("Serving %s on ws://%s:%d through Ray Serve", APP_NAME, fleet.host, fleet.port)
    stopped = asyncio.Event()

    async def wait() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopped.set)
        await stopped.wait()

    try:
        asyncio.run(wait())
    finally:
        serve.delete(APP_NAME)
        ray.kill(directory())
        if fleet.ray_address is None:
            serve.shutdown()
            ray.shutdown()
