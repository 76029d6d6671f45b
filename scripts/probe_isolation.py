"""Attack a policy server with every kind of hostile request while a healthy robot checks its replies.

  python scripts/probe_isolation.py --env=libero --out=benchmarks/results/cpu-2core
  python scripts/probe_isolation.py --server=localhost:8000 --env=libero   # a server already running

Without `--server`, starts `scripts/serve.py --config=pi05_tiny` (random init, language on) on a free port,
probes it and shuts it down with SIGTERM. Prints one row per hostile kind and the summary; `--out=DIR`
writes `DIR/isolation.json`. Exits non-zero when any healthy reply was affected or an attacker got
anything but a one-line refusal, a normal reply or a closed connection.
"""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import hostile_probe  # scripts/hostile_probe.py, beside this script
from absl import app, flags
from tqdm import tqdm

from oxygen_jax.policies import aloha, droid, libero

_SERVER = flags.DEFINE_string("server", None, "host:port of a running server (default: start one).")
_ENV = flags.DEFINE_enum("env", "libero", ["libero", "droid", "aloha"], "Robot whose inputs to attack.")
_CONFIG = flags.DEFINE_string("config", "pi05_tiny", "Config of the server this script starts.")
_MAX_TEXT = flags.DEFINE_integer("max_text_tokens", 8, "Language per request on the started server.")
_OUT = flags.DEFINE_string("out", None, "Directory for isolation.json.")

SPECS = {"libero": libero.RAW_SPEC, "droid": droid.RAW_SPEC, "aloha": aloha.RAW_SPEC}
ACCEPTABLE = {"refused", "answered", "closed"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_server(port: int) -> subprocess.Popen:
    serve = pathlib.Path(__file__).with_name("serve.py")
    command = [
        sys.executable, str(serve), f"--config={_CONFIG.value}", f"--env={_ENV.value}", f"--port={port}",
        "--host=127.0.0.1", f"--max_text_tokens={_MAX_TEXT.value}",
        "--params_dtype=float32",
    ]  # fmt: skip
    server = subprocess.Popen(command, env=os.environ | {"JAX_PLATFORMS": "cpu"}, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"serve.py exited with {server.returncode} before it was ready")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return server
        except OSError:
            time.sleep(0.5)
    server.kill()
    raise SystemExit("serve.py was not ready after 300 s")


def main(_):
    server = None
    if _SERVER.value:
        address = _SERVER.value
    else:
        port = _free_port()
        server = _start_server(port)
        address = f"127.0.0.1:{port}"
    try:
        report = hostile_probe.probe(
            f"ws://{address}",
            SPECS[_ENV.value],
            progress=lambda names: tqdm(names, desc="hostile kinds", unit="kind"),
        )
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)
    for name, outcome in report.outcomes.items():
        print(f"{name:34s} {outcome.kind:10s} {outcome.detail[:90]}")
    summary = report.summary()
    print(json.dumps(summary, indent=1))
    if _OUT.value:
        out = pathlib.Path(_OUT.value)
        out.mkdir(parents=True, exist_ok=True)
        record = {
            "command": " ".join(["python", *sys.argv]),
            "summary": summary,
            "outcomes": {name: vars(outcome) for name, outcome in report.outcomes.items()},
            "healthy_errors": report.healthy_errors,
        }
        (out / "isolation.json").write_text(json.dumps(record, indent=1) + "\n")
    bad = [name for name, outcome in report.outcomes.items() if outcome.kind not in ACCEPTABLE]
    if bad or report.healthy_affected:
        affected = report.healthy_affected
        raise SystemExit(f"isolation broken: attackers got {bad}; healthy replies affected: {affected}")


if __name__ == "__main__":
    app.run(main)
