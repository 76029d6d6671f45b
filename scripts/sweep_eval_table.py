"""The closed-loop sweep on the detour task: sync, naive and rtc at every delay d from 0 to H/2.

  python scripts/sweep_eval_table.py --episodes=50 --seed=0 --out=benchmarks/results/cpu-2core/closed_loop

Writes OUT/<mode>_d<d>/results.json (as scripts/eval_table.py), OUT/sweep.json and OUT/closed_loop.png
(success, control steps to success and mean switch jump against d, one line per mode).
"""

import pathlib

from absl import flags

from oxygen_jax import config
from oxygen_jax.client import simulated
from oxygen_jax.evaluation import closed_loop, closed_loop_sweep
from oxygen_jax.robots import trial
from oxygen_jax.tools import cli

_CONFIG = flags.DEFINE_string(
    "config", "pi05_detour", "Config of the policy (its own checkpoint by default)."
)
_CHECKPOINT = flags.DEFINE_string("checkpoint_dir", None, "Checkpoint (default: the config's shipped one).")
_DELAYS = flags.DEFINE_list("delays", None, "Delays d to run (default: 0 ... H/2).")
_EPISODES = flags.DEFINE_integer("episodes", 50, "Held-out scenes per mode and delay.", lower_bound=1)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the scenes and the action noise.")
_GUIDANCE = cli.define_closed_loop_guidance_flags()
_OUT = flags.DEFINE_string("out", None, "Folder for the results and the plot.", required=True)


def main(_):
    model = config.load_config(_CONFIG.value).model
    horizon = model.action_horizon
    delays = [int(d) for d in _DELAYS.value] if _DELAYS.value else list(range(horizon // 2 + 1))
    execution_horizon = simulated.default_execution_horizon(horizon)
    guidance = trial.GuidanceSettings(*_GUIDANCE.values())
    # naive's and rtc's bounds, which include sync's
    guidance.check(model, execution="rtc", delays=delays, execution_horizon=execution_horizon)
    out = pathlib.Path(_OUT.value)
    out.mkdir(parents=True, exist_ok=True)
    policy = closed_loop.load_policy(_CONFIG.value, _CHECKPOINT.value)
    rows = closed_loop_sweep.sweep(
        policy,
        out,
        delays=delays,
        episodes=_EPISODES.value,
        seed=_SEED.value,
        execution_horizon=execution_horizon,
        guidance=guidance,
    )
    for row in rows:
        print(
            f"{row['execution']:>5} d={row['delay_steps']}: success {row['success_rate']:.2f}"
            f" steps {row['mean_steps']} jump {row['switch_jump_mean']} max {row['switch_jump_max']}"
        )
    print(f"wrote {out / 'sweep.json'} and {out / 'closed_loop.png'}")


if __name__ == "__main__":
    cli.run(main)
