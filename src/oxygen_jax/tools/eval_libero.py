"""LIBERO evaluation of a local or served pi0.5 policy: success per task and suite, videos, text.

  oxygen-eval-libero --config=pi05_libero --checkpoint_dir=CKPT \
      --suites=libero_spatial,libero_10 --episodes=50 --out=DIR
  oxygen-eval-libero --policy=remote --port=8000 --suites=libero_goal --task_ids=0,3 --episodes=5

Default config: pi05_libero, the robot's (docs/cli.md).
Needs `pip install "oxygen_jax[libero]"` and an offscreen GL (EGL, or `apt-get install -y libosmesa6`).
"""

import pathlib

from absl import flags

from oxygen_jax.evaluation import libero_sim, policies, recording
from oxygen_jax.tools import cli

_POLICY = cli.define_policy_flags("pi05_libero")
_SUITES = flags.DEFINE_list(
    "suites", ["libero_spatial"], f"Task suites: {sorted(libero_sim.SUITE_MAX_STEPS)}."
)
_TASK_IDS = flags.DEFINE_list("task_ids", [], "Task ids within each suite (all when empty).")
_EPISODES = flags.DEFINE_integer(
    "episodes", 50, "Episodes per task (one fixed initial state each).", lower_bound=1
)
_SEED = flags.DEFINE_integer("seed", 7, "Environment seed (object placement).")
_REPLAN = flags.DEFINE_integer(
    "replan_steps", 5, "Actions executed from each chunk before replanning.", lower_bound=1
)
_MAX_STEPS = flags.DEFINE_integer(
    "max_steps", None, "Policy steps per episode (per-suite default).", lower_bound=1
)
_SETTLE = flags.DEFINE_integer(
    "settle_steps", 10, "No-op steps after reset while objects settle.", lower_bound=0
)
_VIDEO = flags.DEFINE_bool("save_video", True, "Write videos/<suite>/taskNN_trialNN_<outcome>.mp4.")
_OUT = cli.define_out_flag("eval_results/libero", "Folder for results.json and videos.")


def main(_):
    if not all(t.isdigit() for t in _TASK_IDS.value):
        cli.fail(f"--task_ids must be non-negative integers, got {_TASK_IDS.value}")
    out_dir = pathlib.Path(_OUT.value)
    settings = libero_sim.Settings(
        suites=tuple(_SUITES.value),
        task_ids=tuple(int(t) for t in _TASK_IDS.value),
        episodes_per_task=_EPISODES.value,
        seed=_SEED.value,
        replan_steps=_REPLAN.value,
        max_steps=_MAX_STEPS.value,
        settle_steps=_SETTLE.value,
        save_video=_VIDEO.value,
    )
    libero_sim.import_libero()
    _POLICY.preflight(_OUT.value)
    recorder = recording.recorder_for(_POLICY.record_dir.value, libero_sim.CONTROL_HZ, "libero")
    policy = policies.policy_for("libero", **_POLICY.settings())
    results = libero_sim.evaluate(policy, settings, out_dir, _POLICY.description(), recorder)
    print(libero_sim.summary_table(results["summary"]))
    print(f"control {results['summary']['total']['control_hz']:.1f} Hz; wrote {out_dir / 'results.json'}")


def run() -> None:
    """The `oxygen-eval-libero` command."""
    cli.run(main)


if __name__ == "__main__":
    run()
