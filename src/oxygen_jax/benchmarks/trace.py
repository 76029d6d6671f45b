"""What a `jax.profiler` trace says about one phase: kernels per call, how busy the device was, and where
its time went.

`jax.profiler.trace(dir, create_perfetto_trace=True)` writes `perfetto_trace.json.gz` (Chrome trace
events) beside its xplane file; it is read here with `json`, no TensorBoard needed. On a GPU the kernels
are the complete events of the `/device:...` processes (one thread per stream). XLA:CPU has no device
process: its ops run on the `tf_XLA...` client thread of `/host:CPU`, so on CPU those op events stand in
for kernels, and the figures say `host`.
"""

import collections
import gzip
import json
import pathlib

_HOST_OP_THREAD = "tf_XLAPjRtCpuClient"


def find_trace(log_dir: str | pathlib.Path) -> pathlib.Path:
    """The newest perfetto trace under a `jax.profiler.trace` log dir."""
    traces = sorted(pathlib.Path(log_dir).glob("**/perfetto_trace.json.gz"), key=lambda p: p.stat().st_mtime)
    if not traces:
        raise FileNotFoundError(f"no perfetto_trace.json.gz under {log_dir}")
    return traces[-1]


def load_events(path: str | pathlib.Path) -> list[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def kernel_events(events: list[dict]) -> tuple[list[dict], str]:
    """The kernel events of a trace and where they ran ("device", or "host" for XLA:CPU's ops)."""
    names = {
        e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"
    }
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e["name"] == "thread_name"
    }
    complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
    device = [e for e in complete if names.get(e["pid"], "").startswith("/device:")]
    if device:
        return device, "device"
    host = [
        e
        for e in complete
        if threads.get((e["pid"], e.get("tid")), "").startswith(_HOST_OP_THREAD)
        and "::" not in e["name"]
        and not e["name"].startswith("end: ")
    ]
    return host, "host"


def _busy_us(events: list[dict]) -> float:
    """Length of the union of the events' [ts, ts + dur) intervals, in microseconds."""
    busy, end = 0.0, float("-inf")
    for start, stop in sorted((e["ts"], e["ts"] + e["dur"]) for e in events):
        if stop <= end:
            continue
        busy += stop - max(start, end)
        end = stop
    return busy


def summarize(events: list[dict], calls: int, wall_s: float, top: int = 8) -> dict:
    """Kernels per call, the busy fraction of `wall_s` (the traced calls' wall time) and the `top` kernels
    by total time (ms per call, share of kernel time)."""
    kernels, where = kernel_events(events)
    total = collections.Counter()
    for e in kernels:
        total[e["name"]] += e["dur"]
    kernel_us = sum(total.values())
    return {
        "where": where,
        "kernels_per_call": len(kernels) / calls,
        "busy_fraction": _busy_us(kernels) / (wall_s * 1e6) if wall_s > 0 else 0.0,
        "kernel_ms_per_call": kernel_us / calls / 1e3,
        "top": [
            {"name": name[:120], "ms_per_call": us / calls / 1e3, "share": us / kernel_us}
            for name, us in total.most_common(top)
        ],
    }
