"""Closed-loop evaluation of a table policy on the detour task under simulated inference latency.

  oxygen-eval-table --execution=rtc --delay_steps=5 --episodes=50 --seed=0 --out=DIR

The gripper must reach a red cube behind a block, around either side (oxygen_jax.table_task.detour). The
robot runs `client.Executor` in the given mode on a simulated clock: while the next chunk is inferred the
world advances d control steps with the old chunk (naive, rtc) or the robot waits (sync). Writes
DIR/results.json: success_rate, mean_steps, steps_std, switch_jump_mean, switch_jump_max, jerk_mean,
execution, delay_steps, action_horizon, episodes (and config, collision_rate, left_share, switches,
execution_horizon, rtc_method (guided, or conditioned for a model trained with a clean prefix), the
guidance settings rtc_schedule, max_guidance_weight, prefix_horizon, noise_dims and fresh_samples, and
latency_jitter, delay_estimate, fresh_delay_steps and latencies_from; success_steps_histogram and
collision_steps_histogram, the steps at which episodes ended so: `closed_loop.success_within` reads the
success rate at any budget up to --max_steps from them).

  oxygen-eval-table --policy=remote --host=HOST --port=PORT --config=pi05_detour_prefix --control_hz=200 \
    --out=DIR

runs the same scenes in real time against a running `oxygen-serve` of --config (the world one action per
tick at --control_hz, requests over openpi's websocket client on a thread): d is the measured latency,
reported in control steps (latency_steps_*; delay_steps is their median rounded up; fresh_latency_steps_*
for the requests that continue no chunk); `--latency_jitter=served --latencies_from=DIR/results.json`
replays those latencies in the simulated loop.

Without method flags a model runs as its config says (`rtc_defaults`): pi05_detour_prefix conditions and
keeps its first chunk among 8 samples, its best measured setting. `--execution=bid` chooses every chunk by
bidirectional decoding among --fresh_samples samples (the baseline; policies/bid.py).

A config's `table_task` picks the task: `--config=pi05_detour_moving` runs the moving detour task (the cube
slides sideways behind the block, on every control step, those the robot waits included; its own episode
budget, oxygen_jax.table_task.moving_detour).

Default config: pi05_detour, the detour task's shipped model (docs/cli.md).
"""

import pathlib
from typing import Any

from absl import app, flags

from oxygen_jax import config, preflight
from oxygen_jax.client import latency, simulated
from oxygen_jax.evaluation import closed_loop, closed_loop_sweep, served_loop
from oxygen_jax.policies import rtc_defaults
from oxygen_jax.robots import trial
from oxygen_jax.tools import cli

_CONFIG = flags.DEFINE_string(
    "config", "pi05_detour", "Config of the policy (its own checkpoint by default)."
)
_CHECKPOINT = flags.DEFINE_string("checkpoint_dir", None, "Checkpoint (default: the config's shipped one).")
_EXECUTION = flags.DEFINE_enum(
    "execution",
    "rtc",
    list(simulated.EXECUTIONS),
    "How the robot switches between chunks (bid: as rtc, "
    "each chunk chosen among --fresh_samples samples by bidirectional decoding).",
)
_DELAY = flags.DEFINE_integer("delay_steps", None, "Control steps one inference takes (d).", lower_bound=0)
_LATENCY = flags.DEFINE_float(
    "latency_ms", None, "Inference latency; d = ceil(latency * 10 Hz).", lower_bound=0
)
_HORIZON = flags.DEFINE_integer(
    "execution_horizon",
    None,
    "Actions left in a chunk when the next is asked for (default H/2 + 1).",
    lower_bound=0,
)
_GUIDANCE = cli.define_closed_loop_guidance_flags()
_JITTER = flags.DEFINE_enum(
    "latency_jitter",
    "none",
    list(latency.JITTERS),
    "Each request's latency around d: none, uniform (+-50 %) or heavy_tail (Pareto, mean d); served: "
    "drawn from the latencies of the served run --latencies_from.",
)
_LATENCIES_FROM = flags.DEFINE_string(
    "latencies_from", None, "With --latency_jitter=served: a served run's results.json (--policy=remote)."
)
_DELAY_ESTIMATE = flags.DEFINE_integer(
    "delay_estimate", None, "The d the robot sends with rtc (default: d itself).", lower_bound=0
)
_FRESH_DELAY = flags.DEFINE_float(
    "fresh_delay_steps",
    None,
    "Nominal latency in control steps of a request that continues no chunk (it draws the first-chunk "
    "samples: each episode's first with rtc, every one with sync and naive); default: d.",
    lower_bound=0,
)
_MAX_STEPS = flags.DEFINE_integer(
    "max_steps",
    None,
    "Control steps per episode (default: the task's budget, 120 on the detour task, 42 on the moving one); "
    "results.json's histograms give the success rate at any smaller budget.",
    lower_bound=1,
)
_EPISODES = flags.DEFINE_integer("episodes", 50, "Held-out scenes to run, an episode each.", lower_bound=1)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the scenes and the action noise.")
_OUT = flags.DEFINE_string("out", None, "Folder for results.json.", required=True)
_POLICY = flags.DEFINE_enum(
    "policy",
    "local",
    ["local", "remote"],
    "In-process policy on simulated time, or an oxygen-serve server of --config in real time (d measured).",
)
_HOST, _PORT = cli.define_remote_flags()
_CONTROL_HZ = flags.DEFINE_float(
    "control_hz",
    closed_loop.CONTROL_HZ,
    "With --policy=remote: the world's ticks per second.",
    lower_bound=0.1,
)


def main(_):
    if _POLICY.value == "remote":
        _main_served()
        return
    if (_DELAY.value is None) == (_LATENCY.value is None):
        cli.fail("give exactly one of --delay_steps and --latency_ms")
    delay = _DELAY.value if _LATENCY.value is None else closed_loop.delay_from_latency(_LATENCY.value)
    cfg = config.load_config(_CONFIG.value)
    horizon = cfg.model.action_horizon
    execution_horizon = (
        simulated.default_execution_horizon(horizon) if _HORIZON.value is None else _HORIZON.value
    )
    guidance = trial.GuidanceSettings(*_GUIDANCE.values())
    guidance.check(cfg.model, execution=_EXECUTION.value, delays=[delay], execution_horizon=execution_horizon)
    served = None if _LATENCIES_FROM.value is None else latency.ServedLatencies.load(_LATENCIES_FROM.value)
    latencies = latency.LatencySettings(_JITTER.value, _DELAY_ESTIMATE.value, _FRESH_DELAY.value, served)
    latencies.check(horizon)
    samples = _fresh_samples(guidance, cfg)
    if _EXECUTION.value == "bid" and samples < 2:
        cli.fail(f"--execution=bid needs --fresh_samples >= 2 (the config's is {samples})")
    preflight.model(cfg, _CHECKPOINT.value, None)
    preflight.writable(_OUT.value, folder=True)
    policy = closed_loop.load_policy(_CONFIG.value, _CHECKPOINT.value)
    results = closed_loop.evaluate(
        policy,
        execution=_EXECUTION.value,
        delay_steps=delay,
        episodes=_EPISODES.value,
        seed=_SEED.value,
        execution_horizon=execution_horizon,
        max_steps=_MAX_STEPS.value,
        guidance=guidance,
        latencies=latencies,
        task=cfg.table_task,
    )
    path = closed_loop_sweep.write_results(results, pathlib.Path(_OUT.value))
    print(f"wrote {path}")


def _main_served() -> None:
    """--policy=remote: the robot on a real clock, requests over a websocket to the server."""
    cfg = config.load_config(_CONFIG.value)
    if cfg.table_task != "detour":
        cli.fail(f"--policy=remote runs the detour task only; config {cfg.name!r} runs {cfg.table_task}")
    if _DELAY.value is not None or _LATENCY.value is not None or _FRESH_DELAY.value is not None:
        cli.fail("--policy=remote measures d (no --delay_steps, --latency_ms or --fresh_delay_steps)")
    if _EXECUTION.value == "bid":
        cli.fail("--policy=remote runs sync, naive or rtc")
    if _MAX_STEPS.value is not None:
        cli.fail("--policy=remote runs the detour task's budget (no --max_steps)")
    horizon = cfg.model.action_horizon
    execution_horizon = (
        simulated.default_execution_horizon(horizon) if _HORIZON.value is None else _HORIZON.value
    )
    preflight.writable(_OUT.value, folder=True)
    from openpi_client import websocket_client_policy

    client = websocket_client_policy.WebsocketClientPolicy(host=_HOST.value, port=_PORT.value)
    results = served_loop.evaluate(
        client.infer,
        cfg.model,
        _CONFIG.value,
        execution=_EXECUTION.value,
        episodes=_EPISODES.value,
        seed=_SEED.value,
        execution_horizon=execution_horizon,
        control_hz=_CONTROL_HZ.value,
        fresh_samples=_fresh_samples(trial.GuidanceSettings(*_GUIDANCE.values()), cfg),
    )
    path = closed_loop_sweep.write_results(results, pathlib.Path(_OUT.value))
    print(f"wrote {path}")


def _fresh_samples(guidance: trial.GuidanceSettings, cfg: Any) -> int:
    """The chunks a request that continues none draws: --fresh_samples, else the config's `rtc.samples`."""
    return guidance.fresh_samples or rtc_defaults.metadata(cfg)["rtc_samples"]


def run() -> None:
    """The `oxygen-eval-table` command."""
    cli.run(main, flags_parser=app.parse_flags_with_usage)


if __name__ == "__main__":
    run()
