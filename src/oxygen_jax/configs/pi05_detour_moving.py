"""`pi05_detour_prefix` fine-tuned on the moving detour task (oxygen_jax.table_task.moving_detour): the cube
slides sideways behind the block, so a robot that stands still while a chunk is computed falls behind it.

Trained as `pi05_detour_prefix` (clean prefix: real-time chunking by conditioning), from its shipped
checkpoint, on `oxygen-make-demo-dataset --task=detour_moving` (recovery episodes included), 6000 steps;
then 2000 more on that data plus the episodes of where that model's rtc robot went
(`--rollouts_from`, `evaluation/rtc_rollouts.py`), whose stale actions each frame's least clean prefix
covers (`data.min_clean_prefix`). The second checkpoint ships in the package
(oxygen_jax/assets/pi05_detour_moving); `oxygen-eval-table --config=pi05_detour_moving` runs it on the
moving task (docs/rtc.md, "A world that moves"; the recipe: docs/training.md).
"""

import pathlib

from oxygen_jax.configs import pi05_detour_prefix


def get_config():
    c = pi05_detour_prefix.get_config()
    c.name = "pi05_detour_moving"
    c.table_task = "detour_moving"
    c.checkpoint_dir = str(pathlib.Path(__file__).resolve().parents[1] / "assets" / "pi05_detour_moving")
    c.data.min_clean_prefix = "min_clean_prefix"  # the column the moving task's datasets carry
    c.training.num_train_steps = 6000
    c.training.decay_steps = 6000
    return c
