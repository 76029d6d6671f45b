"""`pi05_detour_wide` trained to continue a chunk whose first actions are given: real-time chunking by
conditioning instead of guidance.

Each training example gives the model its first d ~ U{0..5} actions clean (flow time 0 on their tokens)
and trains the flow on the rest (`training/loss.py`), so at inference the d actions the robot executes
while the chunk is computed enter the model as they are and the rest of the chunk is sampled given them
(`engine/guidance.py`, `conditioned_denoise`): up to d = H/2, and at no cost over plain denoising. It is
trained on the detour demonstrations with recovery ones (`oxygen-make-demo-dataset --task=detour_recovery`):
a continuation inherits the old chunk's path, and they show how to get back from having gone straight on
past the split point. Its trained checkpoint ships in the package (oxygen_jax/assets/pi05_detour_prefix);
docs/rtc.md compares it with guidance.
"""

import pathlib

from oxygen_jax.configs import pi05_detour_wide


def get_config():
    c = pi05_detour_wide.get_config()
    c.name = "pi05_detour_prefix"
    c.model.max_clean_prefix = c.model.action_horizon // 2
    c.checkpoint_dir = str(pathlib.Path(__file__).resolve().parents[1] / "assets" / "pi05_detour_prefix")
    # One run of 24000 steps, four times `pi05_detour_wide`'s: its first chunk, sampled at the start, picks
    # no side in 26 % of the scenes at 6000 steps, 8 % at 12000 and 4 % at 24000, and rtc executes that
    # chunk further than sync (docs/rtc.md).
    # Its first chunk kept among 8 samples: with it rtc reaches every held-out cube at d = H/4 and H/2
    # (docs/rtc.md, "A first chunk inside one motion").
    c.rtc.samples = 8
    c.training.num_train_steps = 24000
    c.training.decay_steps = 24000
    return c
