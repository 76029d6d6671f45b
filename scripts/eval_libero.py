"""LIBERO evaluation of a local or served pi0.5 policy: success per task and suite, videos, text.

  python scripts/eval_libero.py --config=pi05_libero --checkpoint_dir=CKPT \
      --suites=libero_spatial,libero_10 --trials=50 --out_dir=DIR
  python scripts/eval_libero.py --policy=remote --port=8000 --suites=libero_goal --task_ids=0,3 --trials=5

Needs `pip install -e '.[libero]'` and an offscreen GL (EGL, or `apt-get install -y libosmesa6`).
"""

import pathlib

from absl import app, flags

from oxygen_jax import cli
from oxygen_jax.evaluation import common, libero_sim

common.define_policy_flags("pi05_libero")
_SUITES = flags.DEFINE_list(
    "suites", ["libero_spatial"], f"Task suites: {sorted(libero_sim.SUITE_MAX_STEPS)}."
)
_TASK_IDS = flags.DEFINE_list("task_ids", [], "Task ids within each suite (all when empty).")
_TRIALS = flags.DEFINE_integer("trials", 50, "Trials per task (one fixed initial state each).", lower_bound=1)
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
_OUT = flags.DEFINE_string("out_dir", "eval_results/libero", "Where results.json and videos go.")


def main(_):
    if not all(t.isdigit() for t in _TASK_IDS.value):
        cli.fail(f"--task_ids must be non-negative integers, got {_TASK_IDS.value}")
    out_dir = pathlib.Path(_OUT.value)
    try:
        settings = libero_sim.Settings(
            suites=tuple(_SUITES.value),
            task_ids=tuple(int(t) for t in _TASK_IDS.value),
            trials=_TRIALS.value,
            seed=_SEED.value,
            replan_steps=_REPLAN.value,
            max_steps=_MAX_STEPS.value,
            settle_steps=_SETTLE.value,
            save_video=_VIDEO.value,
        )
        libero_sim.import_libero()
        policy = common.policy_from_flags("libero")
        recorder = common.recorder_from_flags(libero_sim.CONTROL_HZ, "libero")
        info = common.policy_description_from_flags()
        results = libero_sim.evaluate(policy, settings, out_dir, info, recorder)
    except common.SetupError as error:
        cli.fail(str(error))
    print(libero_sim.summary_table(results["summary"]))
    print(f"control {results['summary']['total']['control_hz']:.1f} Hz; wrote {out_dir / 'results.json'}")


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
