"""A benchmark worker process: its own model copy on the device, warmed up, then frames on request.

The coordinator sends frame indices over a pipe and gets FrameResults back; observations and request
schedules are rebuilt here from the spec, so nothing heavy crosses the pipe. One-shot tasks (roofline,
full-size forward) run the same way and send one dict.
"""

import collections
import contextlib
import multiprocessing.connection
import pathlib
import time

import jax
import ml_collections

from oxygen_jax import config
from oxygen_jax.benchmarks import metrics, modes, roofline
from oxygen_jax.benchmarks.spec import RunSpec, observation
from oxygen_jax.engine import mesh
from oxygen_jax.engine.compile_counter import CompileCounter
from oxygen_jax.engine.engine import Engine
from oxygen_jax.models import inputs, pi05

TASKS = ("roofline", "full_forward")


def setup_jax(cache_dir: str | None) -> None:
    """Persistent compilation cache: every process compiles the same executables, so later ones load them.
    A cache hit still counts as a compilation (the counter listens around both)."""
    if cache_dir:
        jax.config.update("jax_compilation_cache_dir", cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def build_engine(cfg: ml_collections.ConfigDict, spec: RunSpec) -> Engine:
    """Random-initialized params, created directly in the compute dtype (no float32 copy on the device).

    eos_id=-1: no request stops early, so every mode serves exactly the requested tokens.
    """
    model_config = config.model_config(cfg)
    params = pi05.init_params(
        model_config, jax.random.key(spec.seed), stacked=False, dtype=model_config.dtype
    )
    params = jax.block_until_ready(params)  # init's time and memory end here
    return Engine(
        params,
        model_config,
        eos_id=-1,
        skip_masked_cameras=spec.skip_masked_cameras,
        mesh=mesh.mesh_from_spec(cfg.engine.mesh),
    )


def reset_peak_rss() -> None:
    """Restarts the process's peak-RSS counter (Linux), so CPU peaks after it leave out init and
    compilation. Device peaks (GPU) are not affected."""
    with contextlib.suppress(OSError):
        pathlib.Path("/proc/self/clear_refs").write_text("5")


def live_bytes() -> int:
    """Device bytes held by live arrays (params, caches, the batch state) between frames."""
    return sum(a.nbytes for a in jax.live_arrays())


def device_bytes() -> dict[str, dict[str, int]]:
    """Per device: bytes of the live array shards it holds (params, caches, σ̂: what a mesh splits) and,
    where the backend reports them (GPU), its allocator's in-use and peak bytes."""
    held = collections.Counter()
    for array in jax.live_arrays():
        for shard in array.addressable_shards:
            held[shard.device] += shard.data.nbytes
    out = {}
    for device in jax.local_devices():
        stats = device.memory_stats() or {}
        out[str(device)] = {"live_bytes": held[device]} | {
            key: stats[key] for key in ("bytes_in_use", "peak_bytes_in_use") if key in stats
        }
    return out


def serve(
    conn: multiprocessing.connection.Connection,
    cfg: ml_collections.ConfigDict,
    spec: RunSpec,
    role: str,
    cache_dir: str | None,
) -> None:
    setup_jax(cache_dir)
    start = time.perf_counter()
    engine = build_engine(cfg, spec)
    device = jax.devices()[0]
    info = {"backend": jax.default_backend(), "device_kind": device.device_kind, "dtype": engine.config.dtype}
    info["init_s"] = time.perf_counter() - start
    info["param_bytes"] = sum(x.nbytes for x in jax.tree.leaves(engine.params))
    if role in TASKS:
        task = roofline.measure if role == "roofline" else action_chunk
        conn.send(info | task(engine, spec))
        return
    runner = modes.build(role, engine, spec)
    schedule = spec.schedule()
    runner.warmup(observation(engine.config, spec.layout, 0), schedule)
    if isinstance(runner, modes.Oxygen):
        info["state_bytes"] = runner.manager.state_bytes
    conn.send(info)
    reset_peak_rss()
    peak_live = 0
    with CompileCounter() as counter:
        while (frame := conn.recv()) is not None:
            arrays = observation(engine.config, spec.layout, frame + 1)
            result = runner.step(arrays, schedule[frame])
            peak_live = max(peak_live, live_bytes())
            conn.send(result)
    conn.send(
        {
            "compiles_after_warmup": counter.count,
            "peak_memory_bytes": metrics.peak_memory_bytes(),
            "live_bytes_peak": peak_live,
            "device_bytes": device_bytes(),
        }
    )


def action_chunk(engine: Engine, spec: RunSpec) -> dict:
    """One action chunk (prefill + denoise, `Engine.act`): a first call (with compilation), then a
    compiled one; the peak memory of init, of the first call and of the compiled call alone."""
    obs = inputs.observation_from_arrays(observation(engine.config, spec.layout, 0), engine.config)
    noise = engine.noise(jax.random.key(spec.seed), 1)
    out = {"init_peak_memory_bytes": metrics.peak_memory_bytes()}
    for call in ("first_call", "chunk"):
        reset_peak_rss()
        start = time.perf_counter()
        jax.block_until_ready(engine.act(obs, noise, spec.num_steps))
        out[f"{call}_s"] = time.perf_counter() - start
        out[f"{call}_peak_memory_bytes"] = metrics.peak_memory_bytes()
    return out
