"""Attack a policy server with every kind of hostile request while a healthy robot checks its replies.

  python scripts/probe_isolation.py --env=libero --out=benchmarks/results/cpu-2core
  python scripts/probe_isolation.py --server=localhost:8000 --env=libero --api_key=KEY  # already running
  python scripts/probe_isolation.py --env=libero --only=pipelined  # just the attacks named so

Without `--server`, starts `scripts/serve.py --config=pi05_tiny` (random init, language on, text tasks
on, `--api_key`, its log to a file) on a free port, serves six robots at once a few times (so that
first-time batches are made before memory is measured), probes it, then sends SIGTERM while four robots keep
sending (every request must be answered or refused in one line, and the server must exit within its
`--drain_timeout_s`), and measures the server's RSS throughout. The stall and lock-out attacks of
`stall_attacks.py` and the byte and rate attacks of `bound_attacks.py` follow the malformed requests
(`--scale` sizes them; 1: a 15 MB message). The attacking threads run at `--attacker_nice` (10), so the
server and the healthy robot, which share the machine with them, come first: the figures are the server's
share, as if the attacker ran elsewhere. Prints one row per hostile kind, the summary and a table per
stall attack (the healthy robot's worst latency against its median alone,
its errors, the server's RSS); `--out=DIR` writes `DIR/isolation.json`. Exits non-zero when any healthy
reply was affected, a robot was locked out, a request was lost at shutdown or the drain overran, a keyless
client was served or an attacker got anything but a one-line refusal, a normal reply or a closed
connection.
"""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import bound_attacks  # scripts/bound_attacks.py, beside this script
import hostile_probe  # scripts/hostile_probe.py, beside this script
import stall_attacks  # scripts/stall_attacks.py, beside this script
from absl import app, flags
from tqdm import tqdm

from oxygen_jax.policies import aloha, droid, libero
from oxygen_jax.serving import msgpack_numpy

_SERVER = flags.DEFINE_string("server", None, "host:port of a running server (default: start one).")
_ENV = flags.DEFINE_enum("env", "libero", ["libero", "droid", "aloha"], "Robot whose inputs to attack.")
_CONFIG = flags.DEFINE_string("config", "pi05_tiny", "Config of the server this script starts.")
_MAX_TEXT = flags.DEFINE_integer("max_text_tokens", 8, "Language per request on the started server.")
_OUT = flags.DEFINE_string("out", None, "Directory for isolation.json.")
_API_KEY = flags.DEFINE_string("api_key", "probe-key", "API key of the server (the started one gets it).")
_SCALE = flags.DEFINE_float("scale", 1.0, "Size of the stall attacks (1: a 15 MB message).")
_RECEIVE_TIMEOUT_S = flags.DEFINE_float("receive_timeout_s", 5.0, "The started server's receive deadline.")
_DRAIN_TIMEOUT_S = flags.DEFINE_float("drain_timeout_s", 30.0, "The started server's drain deadline.")
_ONLY = flags.DEFINE_string(
    "only", None, "Run only the attacks whose name contains this (and SIGTERM under load if it matches)."
)
_ATTACKER_NICE = flags.DEFINE_integer(
    "attacker_nice", 10, "Niceness of the attacking threads (on a machine shared with the server they yield)."
)

SPECS = {"libero": libero.RAW_SPEC, "droid": droid.RAW_SPEC, "aloha": aloha.RAW_SPEC}
ACCEPTABLE = {"refused", "answered", "closed"}
SHUTDOWN = "SIGTERM while four robots keep sending"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_server(port: int, log: pathlib.Path) -> subprocess.Popen:
    serve = pathlib.Path(__file__).with_name("serve.py")
    command = [
        sys.executable, str(serve), f"--config={_CONFIG.value}", f"--env={_ENV.value}", f"--port={port}",
        "--host=127.0.0.1", f"--max_text_tokens={_MAX_TEXT.value}",
        "--params_dtype=float32", "--max_text_tasks=4", f"--receive_timeout_s={_RECEIVE_TIMEOUT_S.value}",
        f"--drain_timeout_s={_DRAIN_TIMEOUT_S.value}",
    ]  # fmt: skip
    env = os.environ | {"JAX_PLATFORMS": "cpu", "OXYGEN_API_KEY": _API_KEY.value}
    server = subprocess.Popen(command, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"serve.py exited with {server.returncode} before it was ready")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1)  # warmed up
            return server
        except OSError:
            time.sleep(0.5)
    server.kill()
    raise SystemExit("serve.py was not ready after 300 s")


def main(_):
    server, log = None, None
    if _SERVER.value:
        address = _SERVER.value
    else:
        port = _free_port()
        log = pathlib.Path(tempfile.mkdtemp(prefix="probe_isolation_")) / "serve.log"
        server = _start_server(port, log)
        address = f"127.0.0.1:{port}"
    url, spec = f"ws://{address}", SPECS[_ENV.value]
    rss = None if server is None else stall_attacks.RssSampler(server.pid)
    stalls: list[str] = []
    signalled: list[float] = []  # when SIGTERM was sent: a second one would kill the server mid-drain

    def more(base: dict) -> dict:
        attacks = stall_attacks.stall_attacks(base, scale=_SCALE.value)
        attacks |= bound_attacks.bound_attacks(base, scale=_SCALE.value, log=log)
        stalls.extend(attacks)
        return attacks

    def stop() -> None:
        signalled.append(time.perf_counter())
        server.send_signal(signal.SIGTERM)

    try:
        headers = hostile_probe.auth_headers(_API_KEY.value)
        bound_attacks.warm_crowd(url, headers, msgpack_numpy.packb(hostile_probe.valid_observation(spec)))
        if rss is not None:
            rss.start()
        report = hostile_probe.probe(
            url,
            spec,
            api_key=_API_KEY.value,
            more=more,
            progress=lambda names: tqdm(names, desc="hostile kinds", unit="kind"),
            attacker_nice=_ATTACKER_NICE.value,
            only=_ONLY.value,
        )
        table = stall_attacks.stall_table(report, stalls, rss)
        if server is not None and (_ONLY.value is None or _ONLY.value in SHUTDOWN):
            shutdown = bound_attacks.kept_sending_at_shutdown(
                url, headers, hostile_probe.valid_observation(spec), stop
            )
            server.wait(timeout=_DRAIN_TIMEOUT_S.value + 60)
            exit_s, drain = time.perf_counter() - signalled[0], _DRAIN_TIMEOUT_S.value
            if exit_s > drain:
                shutdown = hostile_probe.Outcome("overran", shutdown.detail)
            shutdown.detail += f"; the server exited {exit_s:.1f} s after SIGTERM (drain timeout {drain:g} s)"
            report.outcomes[SHUTDOWN] = shutdown
            table.append({"attack": SHUTDOWN, "attacker got": shutdown.detail})
    finally:
        if rss is not None:
            rss.stop()
        if server is not None:
            if not signalled:
                server.send_signal(signal.SIGTERM)
            server.wait(timeout=_DRAIN_TIMEOUT_S.value + 60)
    for name, outcome in report.outcomes.items():
        print(f"{name:40s} {outcome.kind:10s} {outcome.detail[:90]}")
    summary = report.summary()
    print(json.dumps(summary, indent=1))
    print(stall_attacks.markdown(table))
    if _OUT.value:
        out = pathlib.Path(_OUT.value)
        out.mkdir(parents=True, exist_ok=True)
        record = {
            "command": " ".join(["python", *sys.argv]),
            "summary": summary,
            "outcomes": {name: vars(outcome) for name, outcome in report.outcomes.items()},
            "healthy_errors": report.healthy_errors,
            "stall_table": table,
            **_timeline(report),
        }
        (out / "isolation.json").write_text(json.dumps(record, indent=1) + "\n")
    bad = [name for name, outcome in report.outcomes.items() if outcome.kind not in ACCEPTABLE]
    if "no API key" in report.outcomes and report.outcomes["no API key"].kind != "refused":
        bad.append("no API key")
    if bad or report.healthy_affected:
        affected = report.healthy_affected
        raise SystemExit(f"isolation broken: attackers got {bad}; healthy replies affected: {affected}")


def _timeline(report: hostile_probe.ProbeReport) -> dict:
    """The healthy robot's replies ([seconds since its first, latency ms]) and each attack's window on
    the same clock: where a slow reply fell."""
    if not report.healthy_times:
        return {}
    t0 = report.healthy_times[0][0]
    return {
        "healthy_timeline": [
            [round(sent - t0, 4), round((got - sent) * 1000, 2)] for sent, got, _ in report.healthy_times
        ],
        "attack_windows": {
            name: [round(a - t0, 3), round(b - t0, 3)] for name, (a, b) in report.windows.items()
        },
    }


if __name__ == "__main__":
    app.run(main)
