"""The demo model: a small pi0.5 trained on the rendered table task (oxygen_jax.table_task).

It says which cube it reaches for and where ("reach the red cube on the left") and moves its gripper
there; its trained checkpoint ships in the package (oxygen_jax/assets/pi05_demo), so every tool that
runs `--config=pi05_demo` shows true sentences without a download.
"""

import pathlib

import ml_collections

from oxygen_jax import config


def get_config():
    c = config.base_config()
    c.name = "pi05_demo"
    c.model.paligemma = ml_collections.ConfigDict(
        dict(width=64, depth=3, mlp_dim=256, num_heads=4, num_kv_heads=1, head_dim=16)
    )
    c.model.action_expert = ml_collections.ConfigDict(
        dict(width=32, depth=3, mlp_dim=128, num_heads=4, num_kv_heads=1, head_dim=16)
    )
    # One top camera in 4x4 patches of 56 pixels: 16 image tokens.
    c.model.vision = "mu/56"
    c.model.image_keys = ("base_0_rgb",)
    c.model.vocab_size = 1024
    c.model.action_horizon = 10
    c.model.max_token_len = 24
    c.model.dtype = "float32"
    # Text is trained (and generated) causally after the prompt, as the OxyGen reference.
    c.model.prefix_attention = "causal_text"
    c.model.discrete_state_input = False
    c.tokenizer_path = "standin"
    c.robot = "table"
    c.asset_id = "table_demo"
    c.engine.max_new_tokens = 12
    # The trained model shipped in the package; tools load it when no --checkpoint_dir is given.
    c.checkpoint_dir = str(pathlib.Path(__file__).resolve().parents[1] / "assets" / "pi05_demo")
    # Trained from scratch (no openpi checkpoint fits this size): a higher learning rate, a short run,
    # the subtask text loss on, the flow loss over the table robot's 2 action dims.
    t = c.training
    t.batch_size = 32
    t.num_train_steps = 3500
    t.peak_lr = 1.5e-3
    t.warmup_steps = 200
    t.decay_steps = 3500
    t.decay_lr = 1e-4
    t.ema_decay = None
    t.text_loss_weight = 1.0
    t.real_action_dim = 2
    t.log_interval = 50
    t.save_interval = 200
    t.keep_period = 0
    c.data.repack = ("observation/image=observation.image", "observation/state=observation.state")
    c.data.actions = "action"
    c.data.subtask = "subtask"
    c.data.text_fraction = 0.5
    # The demo dataset is small: decode its images once instead of every epoch.
    c.data.keep_decoded = True
    return c
