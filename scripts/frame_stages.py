"""Where the oxygen frame's time goes: each stage of `Runtime.step` timed with a device sync after it.

  python scripts/frame_stages.py --frames=30      # quick's spec: pi05_cpu, LIBERO, S=10, N=30, k=5

The benchmark's oxygen mode runs its frames with the engine's and the manager's entry points wrapped by
timers (the syncs add nothing a frame does not already wait for: every stage's result is read before the
frame ends). Prints the mean ms of each stage next to the roofline's phase (best of repeats, alone), the
numbers BENCHMARKS.md compares with the cost model.
"""

import functools
import time

import jax
import numpy as np
from absl import app, flags

from oxygen_jax import config
from oxygen_jax.benchmarks import modes, roofline, sweeps
from oxygen_jax.benchmarks.spec import observation
from oxygen_jax.benchmarks.worker import build_engine

_FRAMES = flags.DEFINE_integer("frames", 30, "Measured frames (after the fill frames).", lower_bound=1)
_CONFIG = flags.DEFINE_string("config", "pi05_cpu", "Config (random init, as the benchmark).")


def _timed(obj: object, name: str, seconds: dict[str, list[float]], sync: bool) -> None:
    """Replaces `obj.name` by a call that records its seconds (until its result is on the device)."""
    call = getattr(obj, name)

    @functools.wraps(call)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        result = call(*args, **kwargs)
        if sync:
            jax.block_until_ready(result if result is not None else obj.state)
        seconds.setdefault(name, []).append(time.perf_counter() - start)
        return result

    setattr(obj, name, timed)


def main(_):
    spec = next(s for s in sweeps.quick(_FRAMES.value) if s.mode == "oxygen")
    engine = build_engine(config.load_config(_CONFIG.value), spec)
    oxygen = modes.build("oxygen", engine, spec)
    oxygen.warmup(observation(engine.config, spec.layout, 0), spec.schedule())
    phases = roofline.measure(engine, spec)["phase_ms"]
    seconds: dict[str, list[float]] = {}
    for name in ("prefill", "denoise"):
        _timed(engine, name, seconds, sync=True)
    _timed(oxygen.manager, "admit", seconds, sync=True)
    _timed(oxygen.manager, "decode", seconds, sync=True)
    _timed(oxygen.manager, "harvest", seconds, sync=False)
    schedule, frames = spec.schedule(), []
    for frame in range(spec.fill + _FRAMES.value):
        start = time.perf_counter()
        oxygen.step(observation(engine.config, spec.layout, frame), schedule[frame % len(schedule)])
        frames.append(time.perf_counter() - start)
        if frame == spec.fill - 1:
            seconds.clear()
            frames.clear()
    alone = {"prefill": phases["prefill"], "denoise": phases["denoise"], "decode": phases["decode_k_slots"]}
    print(f"{'stage':<10} {'in the loop ms':>15} {'alone ms':>10}")
    for name, values in seconds.items():
        shown = f"{alone[name]:.1f}" if name in alone else "-"
        print(f"{name:<10} {1e3 * np.mean(values):>15.1f} {shown:>10}")
    model = phases["prefill"] + phases["denoise"] + phases["decode_k_slots"]
    print(f"{'frame':<10} {1e3 * np.mean(frames):>15.1f} {model:>10.1f}")


if __name__ == "__main__":
    app.run(main)
