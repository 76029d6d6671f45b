"""The detour model: `pi05_demo`'s architecture trained on the detour task (oxygen_jax.table_task.detour),
actions only. Its demonstrations go around a block on either side, so its action chunks are bimodal: the
model real-time chunking is measured on in closed loop (`scripts/eval_table.py`). Its trained checkpoint
ships in the package (oxygen_jax/assets/pi05_detour)."""

import pathlib

from oxygen_jax.configs import pi05_demo


def get_config():
    c = pi05_demo.get_config()
    c.name = "pi05_detour"
    c.asset_id = "table_detour"
    c.engine.max_new_tokens = 0
    # The gripper position also reaches the model as text (pi0.5's discrete state), with the prompt.
    c.model.discrete_state_input = True
    c.model.max_token_len = 32
    c.checkpoint_dir = str(pathlib.Path(__file__).resolve().parents[1] / "assets" / "pi05_detour")
    # Actions only (no subtask text): openpi's flow loss, over all 32 model action dims (the padding
    # included, whose target is 0), so the model predicts ~0 on the padding dims as openpi's do: real-time
    # chunking's guidance covers every dim (docs/rtc.md).
    t = c.training
    t.text_loss_weight = 0.0
    t.real_action_dim = 0
    # The shipped checkpoint is this run resumed to 6000 steps with decay_steps=6000 (docs/training.md).
    t.num_train_steps = 3000
    t.decay_steps = 3000
    c.data.subtask = None
    c.data.text_fraction = 1.0
    return c
