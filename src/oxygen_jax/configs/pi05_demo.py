"""The demo model: a small pi0.5 trained on the rendered table task (oxygen_jax.evaluation.table_scenes).

It says which cube it reaches for and where ("reach the red cube on the left") and moves its gripper
there; its trained checkpoint ships in the package (oxygen_jax/assets/pi05_demo), so every tool that
runs `--config=pi05_demo` shows true sentences without a download.
"""

import ml_collections

from oxygen_jax import config


def get_config():
    c = config.base_config()
    c.name = "pi05_demo"
    c.model.paligemma = ml_collections.ConfigDict(
        dict(width=128, depth=4, mlp_dim=512, num_heads=4, num_kv_heads=1, head_dim=32)
    )
    c.model.action_expert = ml_collections.ConfigDict(
        dict(width=64, depth=4, mlp_dim=256, num_heads=4, num_kv_heads=1, head_dim=32)
    )
    # One top camera, 8x8 patches of 28 pixels: 64 image tokens.
    c.model.vision = "mu/28"
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
    c.data = ml_collections.ConfigDict()
    # Raw observation key -> LeRobot column ("key=column" pairs), the action column, the subtask column.
    c.data.repack = ("observation/image=observation.image", "observation/state=observation.state")
    c.data.actions = "action"
    c.data.subtask = "subtask"
    # Share of train examples that carry their subtask text (the others train actions on the prompt alone).
    c.data.text_fraction = 0.5
    return c
