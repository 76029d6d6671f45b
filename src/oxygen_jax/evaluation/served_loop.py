"""The detour task in closed loop against a running `oxygen-serve`: the same scenes, executor modes and
figures as `closed_loop`, but with real time. The robot-side `client.Executor` runs on a monotonic clock
at `control_hz`, the world advancing one action per tick, and its requests travel over a websocket on a
background thread; the delay d is whatever the server's latency is at that rate, measured per reply.
"""

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tqdm

from oxygen_jax.client import protocol, simulated
from oxygen_jax.client.executor import Executor, ExecutorConfig, MonotonicClock, ThreadedRequests
from oxygen_jax.evaluation import closed_loop
from oxygen_jax.policies import rtc_defaults
from oxygen_jax.robots import trial
from oxygen_jax.table_task import detour

_QUANTILES = (0.1, 0.5, 0.9)


def evaluate(
    infer: Callable[[dict], Mapping[str, Any]],
    model: Any,
    config_name: str,
    *,
    execution: str,
    episodes: int,
    seed: int,
    execution_horizon: int,
    control_hz: float,
    fresh_samples: int = 1,
    max_steps: int = closed_loop.MAX_STEPS,
) -> dict[str, Any]:
    """`episodes` held-out scenes (those `closed_loop.evaluate` runs for `seed`) driven by `infer` (openpi's
    `WebsocketClientPolicy.infer` on the server of `model`, the config's `Pi05Config`) in real time;
    results.json's fields, with the measured latencies in control steps. `delay_steps` is their median,
    rounded up: the d to run the simulated loop at for comparison. fresh_samples: the chunks a request
    that continues no chunk asks the server for (`samples`; the densest is kept), as the simulated loop's
    requests draw them."""
    infer = with_samples(infer, fresh_samples)
    requests = ThreadedRequests(infer)  # one thread for every episode: one request at a time on the socket
    stream = detour.scenes(detour.HELD_OUT_SEED + seed)
    # A server that is still compiling answers its first request late: that wait is not an episode's.
    infer(closed_loop.DetourWorld(next(detour.scenes(detour.HELD_OUT_SEED + seed))).observe())
    runs, latencies, fresh, ticks, fresh_ticks = [], [], [], [], []
    for _ in tqdm.trange(episodes, desc=f"served {execution} at {control_hz:g} Hz", unit="episode"):
        world = closed_loop.DetourWorld(next(stream))
        config = ExecutorConfig(control_hz=control_hz, execution_horizon=execution_horizon, mode=execution)
        executor = Executor(config, world, requests=requests, clock=MonotonicClock())
        runs.append(closed_loop.episode(world, simulated.drive(world, executor, max_steps)))
        executor.wait_in_flight()  # the next episode starts with the socket free, as a simulated one does
        # With rtc an episode's first request continues no chunk and draws the fresh samples: its latency
        # is left out of d and measured apart. With sync and naive every request is such a one.
        stats = executor.stats
        continuing, first = (slice(1, None), slice(0, 1)) if execution == "rtc" else (slice(None),) * 2
        latencies += stats.latencies_s[continuing]
        ticks += stats.latency_ticks[continuing]
        fresh += stats.latencies_s[first]
        fresh_ticks += stats.latency_ticks[first]
    steps = np.asarray(latencies) * control_hz
    return {
        "config": config_name,
        "task": "detour",  # the served loop runs the static detour task only (eval_table refuses others)
        "execution": execution,
        "delay_steps": math.ceil(float(np.median(steps)) - 1e-6) if len(steps) else None,
        "action_horizon": model.action_horizon,
        "execution_horizon": execution_horizon,
        "episodes": episodes,
        "seed": seed,
        "max_steps": max_steps,
        "rtc_method": rtc_defaults.method(model.max_clean_prefix),
        **trial.GuidanceSettings(fresh_samples=fresh_samples).fields(),  # the rest are the server's
        "latency_jitter": "measured",
        "delay_estimate": None,  # the executor's: the longest of its last 3 latencies, rounded up
        "fresh_delay_steps": None,  # measured: fresh_latency_*
        "latencies_from": None,
        **closed_loop.summarize(runs),
        "control_hz": control_hz,
        **latency_fields(steps),
        "latency_ticks_histogram": _histogram(ticks),
        **latency_fields(np.asarray(fresh) * control_hz, prefix="fresh_latency"),
        "fresh_latency_ticks_histogram": _histogram(fresh_ticks),
    }


def with_samples(
    infer: Callable[[dict], Mapping[str, Any]], samples: int
) -> Callable[[dict], Mapping[str, Any]]:
    """`infer` whose requests without `rtc` ask for `samples` chunks (a request with `rtc` continues the
    robot's chunk and draws one)."""
    if samples == 1:
        return infer
    return lambda obs: infer(obs if protocol.continues_chunk(obs) else {**obs, "samples": samples})


def latency_fields(steps: np.ndarray, prefix: str = "latency") -> dict[str, Any]:
    """The measured latencies in control steps: their count, mean, spread, quantiles and how many replies
    took each whole number of steps (rounded up, the d the robot advanced)."""
    if not len(steps):
        return {f"{prefix}_replies": 0}
    return {
        f"{prefix}_replies": len(steps),
        f"{prefix}_steps_mean": float(steps.mean()),
        f"{prefix}_steps_std": float(steps.std()),
        **{f"{prefix}_steps_p{round(q * 100)}": float(np.quantile(steps, q)) for q in _QUANTILES},
        f"{prefix}_steps_max": float(steps.max()),
        f"{prefix}_steps_histogram": _histogram(np.ceil(steps - 1e-6).astype(int)),
    }


def _histogram(values: Sequence[int] | np.ndarray) -> dict[str, int]:
    """How many of `values` (whole control steps or ticks) there are of each."""
    whole, counts = np.unique(np.asarray(values, int), return_counts=True)
    return {str(k): int(n) for k, n in zip(whole, counts, strict=True)}
