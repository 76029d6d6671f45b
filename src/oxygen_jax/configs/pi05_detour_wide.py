"""`pi05_detour` with an action expert 4x wider (width 128, MLP 512), trained on the same demonstrations.

The narrow model's actions grow imprecise along the chunk (its index-9 actions miss the demonstration by
0.21 table units at the 95th percentile, four times the clearance the demonstrations keep from the
block), so its closed-loop figures under latency mix the delay's effect with its own error. This one's
stay within 0.06 at every index; docs/rtc.md compares the two. Its trained checkpoint ships in the
package (oxygen_jax/assets/pi05_detour_wide).
"""

import pathlib

from oxygen_jax.configs import pi05_detour


def get_config():
    c = pi05_detour.get_config()
    c.name = "pi05_detour_wide"
    c.model.action_expert.width = 128
    c.model.action_expert.mlp_dim = 512
    c.checkpoint_dir = str(pathlib.Path(__file__).resolve().parents[1] / "assets" / "pi05_detour_wide")
    # One run of 6000 steps (docs/training.md).
    c.training.num_train_steps = 6000
    c.training.decay_steps = 6000
    return c
