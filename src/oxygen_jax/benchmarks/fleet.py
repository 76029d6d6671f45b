"""The plain server against Ray Serve fleets of it, at the same load, each started as `oxygen-serve` does.

For each server (plain, then `--ray --replicas=N` for each N) it starts `oxygen-serve` in a subprocess,
waits for `/readyz`, and runs R closed-loop robots (openpi clients in threads, back to back, no think
time) for a few seconds per R: replies per second, action latency (client send to reply) p50 / p99,
errors and the replicas that served. Memory is each server process's (each replica's) resident set, read
from `/metrics` (`process_resident_memory_bytes`). The Ray proxy's cost per request: a one-replica
fleet's p50 at one robot (no queueing) connected through the proxy (which redirects it to the replica's
server, or relays it with `--relay_robots`), minus the same replica's p50 reached directly (its own
server's address, asked through a `DeploymentHandle`), measured one after the other.
"""

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from oxygen_jax import config
from oxygen_jax.policies import policy


@dataclasses.dataclass(frozen=True)
class FleetLoad:
    """What each server is measured under."""

    robots: tuple[int, ...] = (1, 4)
    seconds: float = 15.0
    replica_cpus: float = 1.0
    start_timeout_s: float = 900.0


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, ""


@contextlib.contextmanager
def _server(command: list[str], port: int, timeout_s: float, log_path: str) -> Iterator[None]:
    """`command` in a subprocess until it answers /readyz 200; SIGINT (then a kill) at the end."""
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(OSError):
                if _get(port, "/readyz")[0] == 200:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not become ready; see {log_path}")
            time.sleep(0.5)
        yield
    finally:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _drive(port: int, robots: int, seconds: float, obs: dict, host: str = "127.0.0.1") -> dict:
    """R robots sending back to back for `seconds`."""
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    latencies: list[list[float]] = [[] for _ in range(robots)]
    errors = [0] * robots
    replicas: set[str] = set()
    stop = threading.Event()

    def robot(index: int) -> None:
        client = WebsocketClientPolicy(host=host, port=port)
        replicas.add(str(client.get_server_metadata().get("replica_id")))
        while not stop.is_set():
            start = time.perf_counter()
            try:
                client.infer(obs)
            except Exception:
                errors[index] += 1
                continue
            latencies[index].append(time.perf_counter() - start)
        client._ws.close()  # openpi's client has no close; the proxy then counts this robot gone

    threads = [threading.Thread(target=robot, args=(i,), daemon=True) for i in range(robots)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # connected and past each robot's first request
    for per_robot in latencies:
        per_robot.clear()
    start = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    wall = time.perf_counter() - start
    for thread in threads:
        thread.join(60)
    flat = [s for per_robot in latencies for s in per_robot]
    return {
        "robots": robots,
        "replies": len(flat),
        "replies_per_s": len(flat) / wall,
        "p50_ms": float(np.percentile(flat, 50) * 1e3),
        "p99_ms": float(np.percentile(flat, 99) * 1e3),
        "errors": sum(errors),
        "replicas_serving": len(replicas),
        "replica_ids": sorted(replicas),
    }


def _memory_mb(port: int, replicas: int) -> dict[str, float]:
    """Resident memory (MiB) of each server process, by replica id ("" for a plain server)."""
    found: dict[str, float] = {}
    time.sleep(2.0)  # the robots' connections are closed
    for _ in range(50 * replicas):
        samples = {
            sample.name: sample
            for family in text_string_to_metric_families(_get(port, "/metrics")[1])
            for sample in family.samples
        }
        replica = samples["oxygen_server_info"].labels.get("replica_id", "")
        found[replica] = samples["process_resident_memory_bytes"].value / 2**20
        if len(found) >= replicas:
            break
        time.sleep(0.1)
    return found


def run(
    config_name: str,
    replicas: list[int],
    load: FleetLoad,
    out_dir: str,
    replica_address: Callable[[], tuple[str, int]],
) -> dict:
    """Plain server, then a fleet per entry of `replicas`: each measured at every robot count.
    replica_address(): (host, port) of a one-replica fleet's own server (`ray_app.replica_address`)."""
    obs = policy.robot(config.load_config(config_name)).raw_spec.example()
    base = [sys.executable, "-m", "oxygen_jax.tools.serve", f"--config={config_name}", "--max_text_tokens=0"]
    variants = [("plain", 1, [])] + [
        (f"ray_{n}", n, ["--ray", f"--replicas={n}", f"--replica_cpus={load.replica_cpus}"]) for n in replicas
    ]
    results: dict = {"config": config_name, "cpus": os.cpu_count(), "seconds": load.seconds, "servers": {}}
    for name, count, flags in variants:
        port = _free_port()
        log = os.path.join(out_dir, f"fleet_{config_name}_{name}.log")
        with _server([*base, f"--port={port}", *flags], port, load.start_timeout_s, log):
            runs = [_drive(port, robots, load.seconds, obs) for robots in load.robots]
            server = {"replicas": count, "loads": runs, "memory_mb": _memory_mb(port, count)}
            if flags and count == 1:
                proxied = _drive(port, 1, load.seconds, obs)
                host, direct_port = replica_address()
                direct = _drive(direct_port, 1, load.seconds, obs, host)
                server |= {"proxied_one_robot": proxied, "direct_one_robot": direct}
                server["proxy_p50_added_ms"] = proxied["p50_ms"] - direct["p50_ms"]
        results["servers"][name] = server
    return results


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def table(results: dict) -> str:
    """A markdown table of one config's results."""
    lines = [
        "| server | robots | replies/s | p50 ms | p99 ms | errors | replicas serving | RSS MiB per process |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, server in results["servers"].items():
        memory = ", ".join(f"{mb:.0f}" for mb in server["memory_mb"].values())
        for load in server["loads"]:
            lines.append(
                f"| {name} | {load['robots']} | {load['replies_per_s']:.1f} | {load['p50_ms']:.1f} | "
                f"{load['p99_ms']:.1f} | {load['errors']} | {load['replicas_serving']} | {memory} |"
            )
        if "proxy_p50_added_ms" in server:
            proxied, direct = server["proxied_one_robot"], server["direct_one_robot"]
            lines.append(
                f"| {name}: one robot through the proxy / straight to the replica | 1 | "
                f"{proxied['replies_per_s']:.1f} / {direct['replies_per_s']:.1f} | "
                f"{proxied['p50_ms']:.1f} / {direct['p50_ms']:.1f} | "
                f"{proxied['p99_ms']:.1f} / {direct['p99_ms']:.1f} | "
                f"{proxied['errors'] + direct['errors']} | 1 | {memory} |"
            )
    return "\n".join(lines)
