"""The coordinator: starts a run's worker processes, steps them frame by frame, aggregates the results.

The coordinator never touches the accelerator. A frame ends when every worker finished it (for the
parallel baseline: both the action and the language process). Fill frames run first and are not
measured; warm-up (compilation) happens inside the workers before the first frame.
"""

import dataclasses
import multiprocessing
import multiprocessing.connection
import os

import ml_collections

from oxygen_jax.benchmarks import energy, modes, worker
from oxygen_jax.benchmarks.metrics import RunStats
from oxygen_jax.benchmarks.spec import RunSpec
from oxygen_jax.runtime.scheduler import FrameResult

# Workers share one device: no process may grab most of its memory up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


class WorkerError(RuntimeError):
    pass


class _Worker:
    def __init__(self, ctx, cfg: ml_collections.ConfigDict, spec: RunSpec, role: str, cache_dir: str | None):
        self.role = role
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=worker.serve, args=(child, cfg, spec, role, cache_dir), daemon=True)
        self.process.start()
        child.close()

    def recv(self):
        while not self.conn.poll(1.0):
            if not self.process.is_alive():
                raise WorkerError(f"{self.role} worker exited with code {self.process.exitcode}")
        try:
            return self.conn.recv()
        except EOFError as e:
            self.process.join(5)
            raise WorkerError(f"{self.role} worker exited with code {self.process.exitcode}") from e

    def close(self) -> None:
        self.conn.close()
        self.process.join(30)
        if self.process.is_alive():
            self.process.kill()


def _start(cfg, spec: RunSpec, roles: tuple[str, ...], cache_dir: str | None) -> list[_Worker]:
    ctx = multiprocessing.get_context("spawn")
    return [_Worker(ctx, cfg, spec, role, cache_dir) for role in roles]


def run_task(cfg: ml_collections.ConfigDict, spec: RunSpec, task: str, cache_dir: str | None) -> dict:
    """A one-shot worker task (roofline, full_forward) in its own process."""
    load_start = os.getloadavg()[0]
    (w,) = _start(cfg, spec, (task,), cache_dir)
    try:
        result = w.recv()
    finally:
        w.close()
    return {"config": cfg.name, **result, "load_avg": [load_start, os.getloadavg()[0]]}


def _merge(results: list[FrameResult]) -> FrameResult:
    """Parallel's frame: the action process's chunk, the language process's text, the later finish."""
    if len(results) == 1:
        return results[0]
    act, text = results
    return dataclasses.replace(
        text, actions=act.actions, action_s=act.action_s, total_s=max(act.total_s, text.total_s)
    )


def run(cfg: ml_collections.ConfigDict, spec: RunSpec, cache_dir: str | None = None) -> dict:
    """Runs one spec; returns its JSON record (spec, metrics, memory, compilations, energy if reported)."""
    load_start = os.getloadavg()[0]
    workers = _start(cfg, spec, modes.roles(spec.mode), cache_dir)
    try:
        infos = [w.recv() for w in workers]
        meter, stats = energy.EnergyMeter(), RunStats()
        joules_start = None
        for frame in range(spec.fill + spec.frames):
            if frame == spec.fill:
                joules_start = meter.read()
            for w in workers:
                w.conn.send(frame)
            result = _merge([w.recv() for w in workers])
            if frame >= spec.fill:
                stats.add(result)
        joules_end = meter.read()
        for w in workers:
            w.conn.send(None)
        ends = [w.recv() for w in workers]
    finally:
        for w in workers:
            w.close()
    record = {
        "name": spec.name,
        "config": cfg.name,
        "spec": dataclasses.asdict(spec),
        "slots": spec.slots if spec.mode == "oxygen" else None,
        "processes": len(workers),
        **{key: infos[0][key] for key in ("backend", "device_kind", "dtype")},
        **stats.summary(),
        "compiles_after_warmup": sum(e["compiles_after_warmup"] for e in ends),
        "peak_memory_bytes": sum(e["peak_memory_bytes"] for e in ends),
        "live_bytes_peak": sum(e["live_bytes_peak"] for e in ends),
        "mesh": cfg.engine.mesh,
        "device_bytes": [e["device_bytes"] for e in ends],  # per process, per device
        "param_bytes": sum(i["param_bytes"] for i in infos),
        "state_bytes": sum(i.get("state_bytes", 0) for i in infos),
        # 1-minute load average at start and end: other jobs on the machine distort CPU timings.
        "load_avg": [load_start, os.getloadavg()[0]],
    }
    if joules_start is not None and joules_end is not None:
        record["energy_j"] = joules_end - joules_start
        if stats.completed:
            record["energy_per_request_j"] = record["energy_j"] / stats.completed
        record["energy_per_frame_j"] = record["energy_j"] / max(spec.frames, 1)
    return record
