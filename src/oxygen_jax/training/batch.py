"""One training batch: a model-level observation, the target actions and the text loss mask.

Keys of `batch_from_arrays` are the golden `train_io.npz` `in/...` names without the prefix:
`image/<cam>`, `image_mask/<cam>`, `tokenized_prompt`, `tokenized_prompt_mask` (as inference),
`actions` [B, horizon, action_dim] (normalized, padded to the model's action_dim), optionally
`token_loss_mask` [B, L] bool (the prompt tokens whose prediction the text loss trains; absent: none,
the actions-only loss), `min_clean_prefix` [B] int (each example's least clean prefix, `training/loss.py`;
absent: 0) and `noise` [B, horizon, action_dim] / `time` [B] to replace the draw from the
step's rng (parity checks, `scripts/train.py --loss_on`).
"""

from collections.abc import Mapping

import flax.struct
import jax
import numpy as np

from oxygen_jax.models import inputs
from oxygen_jax.models.pi05 import Observation, Pi05Config


@flax.struct.dataclass
class TrainBatch:
    observation: Observation
    actions: jax.Array
    token_loss_mask: jax.Array
    noise: jax.Array | None = None
    time: jax.Array | None = None
    min_clean_prefix: jax.Array | None = None

    @property
    def size(self) -> int:
        return self.actions.shape[0]


def batch_from_arrays(arrays: Mapping[str, np.ndarray], config: Pi05Config) -> TrainBatch:
    """Validates training arrays (one-line InputError naming the key) and packs them."""
    obs = inputs.observation_from_arrays(arrays, config)
    batch, length = obs.tokenized_prompt.shape
    action_shape = (batch, config.action_horizon, config.action_dim)
    actions = inputs.require_array(arrays, "actions")
    inputs.check_array("actions", actions, action_shape, "f", "float [B, horizon, action_dim]")
    loss_mask = np.asarray(arrays.get("token_loss_mask", np.zeros((batch, length), bool)))
    inputs.check_array("token_loss_mask", loss_mask, (batch, length), "b", "bool [B, L]")
    if (loss_mask & ~obs.tokenized_prompt_mask).any():
        raise inputs.InputError("'token_loss_mask': True on a padding token (tokenized_prompt_mask False)")
    noise = inputs.noise_from_arrays(arrays, config, batch)
    time = arrays.get("time")
    if (noise is None) != (time is None):
        raise inputs.InputError("'noise' and 'time' go together: give both or neither")
    if time is not None:
        time = np.asarray(time)
        inputs.check_array("time", time, (batch,), "f", "float flow time [B] in (0, 1]")
        time = time.astype(np.float32)
    min_clean_prefix = arrays.get("min_clean_prefix")
    if min_clean_prefix is not None:
        min_clean_prefix = np.asarray(min_clean_prefix)
        inputs.check_array("min_clean_prefix", min_clean_prefix, (batch,), "i", "int [B]")
        min_clean_prefix = min_clean_prefix.astype(np.int32)
    return TrainBatch(
        observation=obs,
        actions=actions.astype(np.float32),
        token_loss_mask=loss_mask,
        noise=noise,
        time=time,
        min_clean_prefix=min_clean_prefix,
    )
