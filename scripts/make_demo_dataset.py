"""Write the demo table task's training data as a LeRobot dataset (what `pi05_demo` is trained on).

  python scripts/make_demo_dataset.py --out=data/table_demo
  python scripts/train.py --config=pi05_demo --dataset=data/table_demo --run_dir=runs/pi05_demo

Each scene is one episode: the gripper moving straight to the cube the prompt names, with the true
subtask ("reach the red cube on the left") on every frame (see oxygen_jax.table_task.scenes).
"""

from absl import flags

from oxygen_jax import cli
from oxygen_jax.table_task import dataset, scenes

_OUT = flags.DEFINE_string("out", None, "New folder for the dataset.", required=True)
_SCENES = flags.DEFINE_integer(
    "scenes", dataset.TRAIN_SCENES, "Episodes, one scene each (the shipped model's).", lower_bound=1
)
_SEED = flags.DEFINE_integer("seed", scenes.TRAIN_SEED, "Scene seed (held-out scenes use another).")


def main(_):
    try:
        root = dataset.record_dataset(_OUT.value, _SCENES.value, _SEED.value)
    except FileExistsError as error:
        cli.fail(str(error))
    print(f"wrote {_SCENES.value} episodes to {root}")


if __name__ == "__main__":
    cli.run(main)
