"""ALOHA sim evaluation (gym-aloha) of a local or served pi0.5 policy: results JSON, videos, text.

  oxygen-eval-aloha --config=pi05_aloha --checkpoint_dir=CKPT --episodes=10 --out=DIR
  oxygen-eval-aloha --policy=remote --port=8000 --task=AlohaInsertion-v0 --out=DIR
  oxygen-eval-aloha --config=pi05_tiny --robot=aloha_sim --execution=rtc --delay_steps=5 --out=DIR

With --execution the arms run `client.Executor` (sync, naive or rtc) on a simulated clock: while a chunk
is inferred they execute d control steps of the old one (naive, rtc) or hold still (sync); results.json
then has eval_table's fields (switch_jump_mean, jerk_mean, ...) instead of the replanning loop's.

Default config: pi05_aloha, the robot's (docs/cli.md).
Needs `pip install "oxygen_jax[aloha]"` and an offscreen GL (EGL, or `apt-get install -y libosmesa6`).
"""

import pathlib

from absl import flags

from oxygen_jax.client import MODES, simulated
from oxygen_jax.evaluation import aloha_latency, aloha_sim, policies, recording
from oxygen_jax.robots import trial
from oxygen_jax.tools import cli

_POLICY = cli.define_policy_flags("pi05_aloha")
_TASK = flags.DEFINE_enum("task", "AlohaTransferCube-v0", sorted(aloha_sim.TASKS), "gym-aloha task.")
_EPISODES = flags.DEFINE_integer("episodes", 10, "Episodes to run.", lower_bound=1)
_MAX_STEPS = flags.DEFINE_integer("max_steps", 300, "Control steps per episode (50 Hz).", lower_bound=1)
_REPLAN = flags.DEFINE_integer(
    "replan_steps", 10, "Actions executed from each chunk before replanning.", lower_bound=1
)
_SEED = flags.DEFINE_integer("seed", 0, "Episode i resets the env with seed + i.")
_PROMPT = flags.DEFINE_string("prompt", None, "Task prompt (the task's training prompt when absent).")
_VIDEO = flags.DEFINE_bool("save_video", True, "Write videos/episode_NNN.mp4 under --out.")
_ROBOT = flags.DEFINE_enum(
    "robot",
    "aloha",
    ["aloha", "aloha_sim"],
    "The policy's transforms: aloha (openpi's pi05_aloha, delta joints) or aloha_sim (absolute joints).",
)
_EXECUTION = flags.DEFINE_enum(
    "execution", None, list(MODES), "Run the executor in this mode on a simulated clock (default: replan)."
)
_DELAY = flags.DEFINE_integer(
    "delay_steps", None, "--execution: control steps one inference takes (d).", lower_bound=0
)
_LATENCY = flags.DEFINE_float(
    "latency_ms", None, "--execution: inference latency; d = ceil(latency * 50 Hz).", lower_bound=0
)
_HORIZON = flags.DEFINE_integer(
    "execution_horizon",
    None,
    "--execution: actions left when the next chunk is asked for (default H/2 + 1).",
    lower_bound=0,
)
_GUIDANCE = cli.define_closed_loop_guidance_flags()
_OUT = cli.define_out_flag("eval_results/aloha", "Folder for results.json and videos.")


def _delay_steps() -> int:
    if (_DELAY.value is None) == (_LATENCY.value is None):
        cli.fail("--execution needs exactly one of --delay_steps and --latency_ms")
    if _LATENCY.value is not None:
        return simulated.delay_from_latency(_LATENCY.value, aloha_sim.CONTROL_HZ)
    return _DELAY.value


def _check_execution_flags() -> None:
    """The --execution flags' combinations, checked before anything loads."""
    if _EXECUTION.value is None:
        if any(f.value is not None for f in (_DELAY, _LATENCY, _HORIZON)):
            cli.fail("--delay_steps, --latency_ms and --execution_horizon need --execution")
        return
    if _POLICY.kind.value != "local":
        cli.fail("--execution runs the policy in-process on the simulated clock: use --policy=local")


def _run_executor(settings: aloha_sim.Settings, out_dir: pathlib.Path) -> None:
    """The executor loop under simulated latency (--execution)."""
    delay = _delay_steps()
    model = _POLICY.model.config.value.model
    horizon = model.action_horizon
    execution_horizon = (
        simulated.default_execution_horizon(horizon) if _HORIZON.value is None else _HORIZON.value
    )
    guidance = trial.GuidanceSettings(*_GUIDANCE.values())
    guidance.check(model, execution=_EXECUTION.value, delays=[delay], execution_horizon=execution_horizon)
    policy = policies.policy_for(_ROBOT.value, **_POLICY.settings())
    results = aloha_latency.evaluate(
        policy,
        settings,
        out_dir,
        _POLICY.description(),
        execution=_EXECUTION.value,
        delay_steps=delay,
        execution_horizon=execution_horizon,
        guidance=guidance,
    )
    print(
        f"{settings.task} {results['execution']} d={results['delay_steps']}: "
        f"success {results['success_rate']:.2f}, "
        f"switch jump mean {results['switch_jump_mean']} max {results['switch_jump_max']}, "
        f"jerk {results['jerk_mean']:.4f}"
    )
    print(f"wrote {out_dir / 'results.json'}")


def main(_):
    settings = aloha_sim.Settings(
        task=_TASK.value,
        episodes=_EPISODES.value,
        max_steps=_MAX_STEPS.value,
        replan_steps=_REPLAN.value,
        seed=_SEED.value,
        prompt=_PROMPT.value,
        save_video=_VIDEO.value,
    )
    out_dir = pathlib.Path(_OUT.value)
    aloha_sim.check_simulator()
    _check_execution_flags()
    _POLICY.preflight(_OUT.value)
    if _EXECUTION.value is not None:
        return _run_executor(settings, out_dir)
    recorder = recording.recorder_for(_POLICY.record_dir.value, aloha_sim.CONTROL_HZ, "aloha")
    policy = policies.policy_for(_ROBOT.value, **_POLICY.settings())
    results = aloha_sim.evaluate(policy, settings, out_dir, _POLICY.description(), recorder)
    s = results["summary"]
    print(
        f"{settings.task}: {s['successes']}/{s['episodes']} successes ({s['success_rate']:.0%}), "
        f"mean max reward {s['mean_max_reward']:.2f}, control {s['control_hz']:.1f} Hz"
    )
    print(f"wrote {out_dir / 'results.json'}")


def run() -> None:
    """The `oxygen-eval-aloha` command."""
    cli.run(main)


if __name__ == "__main__":
    run()
