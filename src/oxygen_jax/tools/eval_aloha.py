"""ALOHA sim evaluation (gym-aloha) of a local or served pi0.5 policy: results JSON, videos, text.

  oxygen-eval-aloha --config=pi05_aloha --checkpoint_dir=CKPT --episodes=10 --out=DIR
  oxygen-eval-aloha --policy=remote --port=8000 --task=AlohaInsertion-v0 --out=DIR

Default config: pi05_aloha, the robot's (docs/cli.md).
Needs `pip install "oxygen_jax[aloha]"` and an offscreen GL (EGL, or `apt-get install -y libosmesa6`).
"""

import pathlib

from absl import flags

from oxygen_jax import cli
from oxygen_jax.evaluation import aloha_sim, policies, recording

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
_OUT = cli.define_out_flag("eval_results/aloha", "Folder for results.json and videos.")


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
    _POLICY.preflight(_OUT.value)
    recorder = recording.recorder_for(_POLICY.record_dir.value, aloha_sim.CONTROL_HZ, "aloha")
    policy = policies.policy_for("aloha", **_POLICY.settings())
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
