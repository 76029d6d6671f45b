"""Serve a pi0.5 policy to openpi clients over websocket: actions, and language from the same prefill.

  oxygen-serve --config=pi05_demo --max_text_tokens=12     # the shipped demo model, nothing to download
  oxygen-serve --env=libero --checkpoint_dir=pi05_libero --max_text_tokens=24 --k=2
  oxygen-serve policy:checkpoint --policy.config=pi05_libero --policy.dir=DIR   # openpi's syntax

Default config: pi05_libero, the robot's: pi05_<env> for --env (default libero), as openpi serves an env
(docs/cli.md). The tokenizer, the checkpoint and the port are checked before the model loads.

`--env` takes openpi's environment names in any case (`LIBERO`, `DROID`, `ALOHA`, `ALOHA_SIM`). It picks
the config `pi05_<env>` unless `--config` is given, and an explicit `--env` with `--config` sets that
config's robot transforms; `--config.x=...` overrides apply either way. An observation without a prompt
gets `--default_prompt`, else the robot's as openpi's configs have it (`ALOHA_SIM`: "Transfer cube").
`--record` saves each request and reply as openpi's `serve_policy.py --record` does.
`--checkpoint_dir=default` serves openpi's default checkpoint for the env (downloaded into openpi's cache,
as openpi does); without `--checkpoint_dir` the model is random-initialized (for smoke tests only).

By default (`--language=stream`) several robots are served at once by one device loop: observations
from different connections that arrive within `--gather_ms` (or as soon as every connected robot has one
in) are prefilled together, up to `--max_batch`, and each reply leaves as soon as its actions are ready.
Each robot's language request (`--max_text_tokens` > 0) decodes in a batch of `--max_slots` requests:
with `--loop=async` (default) in chunks whenever no observation waits, each chunk short enough that an
arriving observation waits at most `--max_action_delay_ms` (and `--k` tokens between two batches when
robots call back to back); with `--loop=frame` (the paper's frame loop)
`--k` tokens per frame (or as many as `--target_hz` leaves time for) before the frame's replies. Replies
carry the text (`text`, `text_tokens`, `text_done`, `text_request_id`), and websocket clients of `/text`
on the same port receive every robot's tokens as they are produced. The server compiles every shape
as it starts (a request that arrives earlier waits). `--language=inline` instead answers one request at
a time and decodes its text to completion within it.

No client can stall or lock out the others: robot connections and `/text` subscribers have caps of their
own (`--max_connections`, `--max_text_subscribers`, `--max_connections_per_ip`), idle ones are closed after
`--idle_timeout_s`, a message must arrive whole within `--receive_timeout_s`, and SIGTERM answers every
request received before it (refusing later ones in one line) before closing, within `--drain_timeout_s`.
What a client can make the server hold or do is bounded: its unread requests in bytes
(`--max_pending_mb`, `--max_pending_total_mb`: past them the server stops reading it), its requests a
second (`--max_requests_per_s`), new connections a second (`--max_handshakes_per_s`), a large message's
bytes a second (`--max_receive_mb_per_s`) and failed API keys per address. `--api_key` (or
$OXYGEN_API_KEY) makes robots and `/text` send `Authorization: Api-Key <key>` (openpi-client's `api_key`);
`GET /healthz` and `GET /readyz` stay open (docs/serving.md).

Operations endpoints on the same port: `GET /healthz` (alive), `GET /readyz` (200 once the warm-up that
starts with the server compiled every program; 503 before, while draining and while every robot slot
is taken) and `GET /metrics`
(Prometheus; `--metrics=false` turns it off).

`--ray --replicas=2` serves the same server as replicas of a Ray Serve application (`serving/ray_app.py`):
on a local Ray cluster, or on a running one with `--ray_address=auto`; robots connect to `--port` of the Ray
proxy, unchanged, which redirects each to its replica's own server (`--relay_robots` relays through the
proxy instead). `--max_replicas` above `--min_replicas` autoscales on connected robots instead (relayed).
"""

import os
import sys
import threading

from absl import flags, logging

from oxygen_jax import config, errors, preflight
from oxygen_jax.runtime.runtime import RuntimeConfig
from oxygen_jax.serving import openpi_args, policy_backend, recorder, websocket_server
from oxygen_jax.serving.server_config import ServerConfig
from oxygen_jax.tools import cli

_ENV = flags.DEFINE_enum(
    "env",
    "libero",
    ["libero", "droid", "aloha", "aloha_sim"],
    "Robot (openpi's env names, any case); picks config pi05_<env>.",
    case_sensitive=False,
)
_MODEL = cli.define_model_flags(
    "pi05_libero",
    checkpoint_help="openpi checkpoint: a path, a name in openpi's cache, a gs:// URL, or 'default' "
    "(openpi's default for --env); random init when absent.",
)
_MAX_TEXT = cli.define_max_text_tokens()
_DECODE = cli.define_decode_step_flags()
_PORT = flags.DEFINE_integer("port", 8000, "Port to serve on.", lower_bound=0, upper_bound=65535)
_HOST = flags.DEFINE_string("host", "0.0.0.0", "Interface to bind.")
_PROMPT = flags.DEFINE_string(
    "default_prompt", None, "Prompt for observations that carry none (default: the robot's, if any)."
)
_RECORD = flags.DEFINE_bool("record", False, "Save each request and reply (openpi's policy records).")
_RECORD_DIR = flags.DEFINE_string("record_dir", recorder.DEFAULT_RECORD_DIR, "Where --record writes.")
_LANGUAGE = flags.DEFINE_enum(
    "language", "stream", ["stream", "inline"], "Stream text across frames, or decode it within each request."
)
_LOOP = flags.DEFINE_enum(
    "loop",
    "async",
    ["async", "frame"],
    "async: language decodes whenever no observation waits; frame: --k tokens per frame, before its replies.",
)
_MAX_DELAY_MS = flags.DEFINE_float(
    "max_action_delay_ms",
    None,
    "Async loop: longest an arriving observation waits behind a decode chunk (default: 10% of the "
    "measured action path).",
    lower_bound=0,
)
_MAX_SLOTS = flags.DEFINE_integer(
    "max_slots", None, "Language requests decoded together (config's).", lower_bound=1
)
_MAX_TEXT_TASKS = flags.DEFINE_integer(
    "max_text_tasks",
    0,
    "Stream mode: most text_tasks a request may carry (0: none; >0 compiles more at warm-up).",
    lower_bound=0,
)
_RTC = flags.DEFINE_bool(
    "rtc", True, "Stream mode: take real-time-chunking requests (warm-up also compiles the guided denoiser)."
)
_MAX_SAMPLES = flags.DEFINE_integer(
    "max_samples",
    None,
    "Stream mode: most action chunks a request may draw (`samples`; default: the config's rtc.samples; "
    ">1 compiles more at warm-up).",
    lower_bound=1,
)
_MAX_BATCH = flags.DEFINE_integer(
    "max_batch", 4, "Observations prefilled together in one frame.", lower_bound=1
)
_GATHER_MS = flags.DEFINE_float(
    "gather_ms", 5.0, "How long a frame waits for other robots' requests.", lower_bound=0
)
_MAX_MESSAGE_MB = cli.positive(
    flags.DEFINE_float(
        "max_message_mb", 16.0, "Largest request accepted (MiB); bigger ones close the connection (1009)."
    )
)
_MAX_CONNECTIONS = flags.DEFINE_integer(
    "max_connections", 64, "Open robot connections; more get HTTP 503.", lower_bound=1
)
_MAX_TEXT_SUBSCRIBERS = flags.DEFINE_integer(
    "max_text_subscribers",
    64,
    "Open /text subscribers (a cap of their own); more get HTTP 503.",
    lower_bound=0,
)
_MAX_CONNECTIONS_PER_IP = flags.DEFINE_integer(
    "max_connections_per_ip",
    0,
    "Open connections from one address (0: no cap; behind a proxy all share one).",
    lower_bound=0,
)
_IDLE_TIMEOUT_S = flags.DEFINE_float(
    "idle_timeout_s",
    300.0,
    "Close a robot connection that sends nothing, or a /text subscriber sent and sending nothing, this "
    "long (0: never).",
    lower_bound=0,
)
_RECEIVE_TIMEOUT_S = flags.DEFINE_float(
    "receive_timeout_s",
    30.0,
    "A message must arrive whole this soon after its first frame (0: no limit).",
    lower_bound=0,
)
_DRAIN_TIMEOUT_S = flags.DEFINE_float(
    "drain_timeout_s",
    30.0,
    "On SIGTERM, longest wait to answer the requests received or buffered.",
    lower_bound=0,
)
_MAX_PENDING_MB = flags.DEFINE_float(
    "max_pending_mb",
    4.0,
    "Requests one connection sent that the server has not answered yet (MiB; a robot waits for each "
    "reply, so it has one); past it the server stops reading that connection until it catches up (0: no "
    "bound).",
    lower_bound=0,
)
_MAX_PENDING_TOTAL_MB = flags.DEFINE_float(
    "max_pending_total_mb",
    256.0,
    "The same, summed over all connections; past it every connection with pending requests waits (0: no "
    "bound).",
    lower_bound=0,
)
_MAX_REQUESTS_PER_S = flags.DEFINE_float(
    "max_requests_per_s",
    500.0,
    "Requests one connection may send a second, in bursts of as many; past it a request is refused in one "
    "line, unread (0: no limit).",
    lower_bound=0,
)
_MAX_HANDSHAKES_PER_S = flags.DEFINE_float(
    "max_handshakes_per_s",
    100.0,
    "New websocket connections admitted a second, a twentieth of them at once; more wait their turn (up "
    "to 5 s, then HTTP 503) (0: no limit).",
    lower_bound=0,
)
_MAX_RECEIVE_MB_PER_S = flags.DEFINE_float(
    "max_receive_mb_per_s",
    200.0,
    "MiB a second one connection may send of a message of 1 MiB or more (above a 1 Gbit/s link); ahead of "
    "it, reading pauses (0: no limit).",
    lower_bound=0,
)
API_KEY_ENV = "OXYGEN_API_KEY"
_API_KEY = flags.DEFINE_string(
    "api_key",
    None,
    f"Robots and /text must send 'Authorization: Api-Key <key>' (openpi-client's api_key); default: "
    f"${API_KEY_ENV}, else no key.",
)
_DEBUG_ERRORS = flags.DEFINE_bool("debug_errors", False, "Send tracebacks to clients, not only to the log.")
_METRICS = flags.DEFINE_bool("metrics", True, "Serve Prometheus metrics at GET /metrics.")
_RAY = flags.DEFINE_bool("ray", False, "Serve replicas of this server on Ray Serve (the [ray] extra).")
_RAY_ADDRESS = flags.DEFINE_string(
    "ray_address", None, "--ray: the Ray cluster to join ('auto': the running one); default: a local one."
)
_REPLICAS = flags.DEFINE_integer(
    "replicas", 1, "--ray: replicas, each a whole server on its own device.", lower_bound=1
)
_MIN_REPLICAS = flags.DEFINE_integer(
    "min_replicas", None, "--ray autoscaling: fewest replicas (--replicas).", lower_bound=0
)
_MAX_REPLICAS = flags.DEFINE_integer(
    "max_replicas",
    None,
    "--ray: autoscale up to this many replicas on connected robots (default: fixed).",
    lower_bound=1,
)
_TARGET_ONGOING = cli.positive(
    flags.DEFINE_float(
        "target_ongoing_requests",
        None,
        "--ray autoscaling: connected robots per replica to aim for (default max_slots/2).",
    )
)
_RELAY_ROBOTS = flags.DEFINE_bool(
    "relay_robots",
    None,
    "--ray: relay robots' frames through the proxy instead of redirecting them to their replica's server "
    "(default: relay only when autoscaling; set where robots cannot reach the replicas' nodes).",
)
_REPLICA_CPUS = cli.positive(
    flags.DEFINE_float("replica_cpus", 1.0, "--ray on CPUs: CPUs each replica reserves (fractions allowed).")
)


# The checkpoints openpi's serve_policy.py serves for each env by default (`--checkpoint_dir=default`).
# Its ALOHA_SIM default is a pi0 model (pi0_aloha_sim), which a pi0.5 server cannot load.
_OPENPI_DEFAULT_CHECKPOINTS = {
    "libero": "gs://openpi-assets/checkpoints/pi05_libero",
    "droid": "gs://openpi-assets/checkpoints/pi05_droid",
    "aloha": "gs://openpi-assets/checkpoints/pi05_base",
}


def checkpoint_dir() -> str | None:
    """--checkpoint_dir, with 'default' as openpi's default checkpoint for --env."""
    if _MODEL.checkpoint_dir.value != "default":
        return _MODEL.checkpoint_dir.value
    if _ENV.value not in _OPENPI_DEFAULT_CHECKPOINTS:
        cli.fail(
            f"--env={_ENV.value} has no pi0.5 default checkpoint (openpi serves the pi0 model pi0_aloha_sim);"
            " pass --checkpoint_dir"
        )
    return _OPENPI_DEFAULT_CHECKPOINTS[_ENV.value]


def server_config() -> ServerConfig:
    """The server the flags describe."""
    name = _MODEL.config_name() if flags.FLAGS[_MODEL.config.name].present else f"pi05_{_ENV.value}"
    overrides = _MODEL.config_overrides()
    if flags.FLAGS["env"].present:  # an explicit --env also picks the robot transforms of another config
        overrides = {"robot": _ENV.value, **overrides}
    cfg = config.load_config(name)
    cfg.update_from_flattened_dict(overrides)
    max_text = cli.max_text_tokens(_MAX_TEXT, cfg)
    preflight.model(cfg, checkpoint_dir(), _MODEL.tokenizer_path.value)
    preflight.port_free(_HOST.value, _PORT.value)
    if _RECORD.value:
        preflight.writable(_RECORD_DIR.value, folder=True)
    runtime_config = None
    if _LANGUAGE.value == "stream":
        try:
            runtime_config = RuntimeConfig(
                max_slots=_MAX_SLOTS.value or cfg.engine.max_slots,
                max_new_tokens=max_text,
                loop=_LOOP.value,
                k=_DECODE.k.value,
                target_hz=_DECODE.target_hz.value if _LOOP.value == "frame" else None,
                max_delay_s=None if _MAX_DELAY_MS.value is None else _MAX_DELAY_MS.value / 1e3,
                owed_k=_DECODE.k.value if _LOOP.value == "async" else None,
                max_prefill_batch=_MAX_BATCH.value,
                gather_s=_GATHER_MS.value / 1e3,
            )
        except ValueError as error:
            cli.fail(str(error))
    limits = websocket_server.ServerLimits(
        max_message_mb=_MAX_MESSAGE_MB.value,
        max_connections=_MAX_CONNECTIONS.value,
        max_text_subscribers=_MAX_TEXT_SUBSCRIBERS.value,
        max_connections_per_ip=_MAX_CONNECTIONS_PER_IP.value or None,
        idle_timeout_s=_IDLE_TIMEOUT_S.value or None,
        receive_timeout_s=_RECEIVE_TIMEOUT_S.value or None,
        drain_timeout_s=_DRAIN_TIMEOUT_S.value,
        max_pending_mb=_MAX_PENDING_MB.value or None,
        max_pending_total_mb=_MAX_PENDING_TOTAL_MB.value or None,
        max_requests_per_s=_MAX_REQUESTS_PER_S.value or None,
        max_handshakes_per_s=_MAX_HANDSHAKES_PER_S.value or None,
        max_receive_mb_per_s=_MAX_RECEIVE_MB_PER_S.value or None,
        api_key=_API_KEY.value or os.environ.get(API_KEY_ENV) or None,
        debug_errors=_DEBUG_ERRORS.value,
    )
    return ServerConfig(
        config_name=name,
        checkpoint_dir=checkpoint_dir(),
        overrides=overrides,
        tokenizer_path=_MODEL.tokenizer_path.value,
        max_text_tokens=max_text,
        default_prompt=_PROMPT.value,
        num_steps=_MODEL.num_steps.value,
        params_dtype=_MODEL.params_dtype_value(),
        runtime=runtime_config,
        max_text_tasks=_MAX_TEXT_TASKS.value,
        rtc=_RTC.value,
        max_samples=_MAX_SAMPLES.value,
        limits=limits,
        metrics=_METRICS.value,
        record_dir=_RECORD_DIR.value if _RECORD.value else None,
    )


def main(_):
    server = server_config()
    if _RAY.value:
        _serve_on_ray(server)
        return
    backend = server.build_backend()
    logging.info("serving metadata: %s", backend.metadata)
    # Compiles while the server already answers /healthz (and /readyz 503); a first request waits for it.
    threading.Thread(target=_warm_up, args=(backend,), name="warmup", daemon=True).start()
    websocket_server.serve(backend, _HOST.value, _PORT.value, limits=server.limits)
    backend.close()  # what was received is answered, then the runtime stops


def _warm_up(backend: websocket_server.PolicyBackend) -> None:
    backend.warmup()
    policy_backend.settle_heap()


def parse_flags(argv: list[str]) -> list[str]:
    """The tools' flag parser, after reading openpi's `policy:checkpoint --policy.config=...` as our flags."""
    try:
        argv, note = openpi_args.translate(argv)
    except openpi_args.OpenpiSyntaxError as error:
        cli.fail(str(error))
    if note:
        print(note, file=sys.stderr)
    return cli.parse_flags(argv)


def _serve_on_ray(server: ServerConfig) -> None:
    try:
        from oxygen_jax.serving import ray_app
    except ImportError as error:
        cli.fail(f"--ray needs the ray extra ({errors.install_hint('ray')}): {error}")
    try:
        fleet = ray_app.FleetConfig(
            replicas=_REPLICAS.value,
            min_replicas=_MIN_REPLICAS.value,
            max_replicas=_MAX_REPLICAS.value,
            target_ongoing_requests=_TARGET_ONGOING.value,
            replica_cpus=_REPLICA_CPUS.value,
            ray_address=_RAY_ADDRESS.value,
            host=_HOST.value,
            port=_PORT.value,
            relay_robots=_RELAY_ROBOTS.value,
        )
    except ValueError as error:
        cli.fail(str(error))
    ray_app.serve_fleet(server, fleet)


def run() -> None:
    """The `oxygen-serve` command."""
    cli.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    run()
