"""Write the demo table task's training data as a LeRobot dataset (what `pi05_demo` is trained on).

  oxygen-make-demo-dataset --out=data/table_demo
  oxygen-train --config=pi05_demo --dataset=data/table_demo --run_dir=runs/pi05_demo

Each scene is one episode: the gripper moving straight to the cube the prompt names, with the true
subtask ("reach the red cube on the left") on every frame (see oxygen_jax.table_task.scenes).
`--task=detour` writes the detour task's demonstrations instead (what `pi05_detour` is trained on: the
gripper going around a block on a random side, see oxygen_jax.table_task.detour); `--task=detour_recovery`
adds recovery episodes to them, a third of all (what `pi05_detour_prefix` is trained on: after going
straight on past the point where the others turn, back beside the block); `--task=detour_moving` writes
the moving detour task's, recovery ones included (what `pi05_detour_moving` is trained on: the cube
slides sideways behind the block and the gripper pursues it, see oxygen_jax.table_task.moving_detour).
With `--rollouts_from=CKPT[,CKPT...]` (detour_moving only), each `pi05_detour_moving` checkpoint named runs
real-time chunking on `--rollout_episodes` training scenes, and every request its robot made below the
block adds an episode: the stale actions it executed while it waited, then the pursuit from there (see
oxygen_jax.evaluation.rtc_rollouts; `shipped` names the packaged checkpoint). Without it no model is
loaded: there is no default config.
"""

from absl import flags

from oxygen_jax import preflight
from oxygen_jax.evaluation import closed_loop, rtc_rollouts
from oxygen_jax.table_task import dataset, detour_dataset, scenes
from oxygen_jax.tools import cli

# task: (default episodes, the recorder taking root, episodes and seed)
_RECORDERS = {
    "table": (dataset.TRAIN_SCENES, dataset.record_dataset),
    "detour": (detour_dataset.TRAIN_SCENES, detour_dataset.record_dataset),
    "detour_recovery": (detour_dataset.RECOVERY_TRAIN_SCENES, detour_dataset.record_recovery_dataset),
    "detour_moving": (detour_dataset.MOVING_TRAIN_SCENES, detour_dataset.record_moving_dataset),
}
_OUT = cli.define_out_flag(None, "New folder for the dataset.")
flags.mark_flag_as_required("out")
_TASK = flags.DEFINE_enum(
    "task",
    "table",
    list(_RECORDERS),
    "table (pi05_demo), detour (pi05_detour), detour_recovery (pi05_detour_prefix) or detour_moving "
    "(pi05_detour_moving).",
)
_EPISODES = flags.DEFINE_integer(
    "episodes", None, "Episodes, one scene each (default: the task's shipped model's).", lower_bound=1
)
_SEED = flags.DEFINE_integer("seed", scenes.TRAIN_SEED, "Scene seed (held-out scenes use another).")
_ROLLOUTS_FROM = flags.DEFINE_list(
    "rollouts_from",
    [],
    "detour_moving: pi05_detour_moving checkpoints (or `shipped`) whose rtc rollouts add episodes; the k-th "
    "runs the rollout scenes of seed k.",
)
_ROLLOUT_EPISODES = flags.DEFINE_integer(
    "rollout_episodes", 600, "rtc episodes per checkpoint of --rollouts_from.", lower_bound=1
)
_ROLLOUT_CONFIG = "pi05_detour_moving"


def main(_):
    default_episodes, record_dataset = _RECORDERS[_TASK.value]
    num_scenes = _EPISODES.value or default_episodes
    if _ROLLOUTS_FROM.value and _TASK.value != "detour_moving":
        cli.fail(f"--rollouts_from is for --task=detour_moving, not --task={_TASK.value}")
    checkpoints = [None if name == "shipped" else name for name in _ROLLOUTS_FROM.value]
    for checkpoint in checkpoints:
        preflight.checkpoint(checkpoint)
    preflight.writable(_OUT.value, folder=True)
    stale = [
        episode
        for seed, checkpoint in enumerate(checkpoints)
        for rollout in rtc_rollouts.collect(
            closed_loop.load_policy(_ROLLOUT_CONFIG, checkpoint), _ROLLOUT_EPISODES.value, seed
        )
        for episode in rtc_rollouts.stale_episodes(rollout)
    ]
    try:
        if stale:
            root = detour_dataset.record_moving_dataset(_OUT.value, num_scenes, _SEED.value, stale)
        else:
            root = record_dataset(_OUT.value, num_scenes, _SEED.value)
    except FileExistsError as error:
        cli.fail(str(error))
    print(f"wrote {num_scenes + len(stale)} episodes to {root} ({len(stale)} from rtc rollouts)")


def run() -> None:
    """The `oxygen-make-demo-dataset` command."""
    cli.run(main)


if __name__ == "__main__":
    run()
