"""A tiny synthetic training set, so the trainer runs and can be tested without a dataset on disk.

Each example is a random observation (`models.inputs.synthetic_arrays`), a random action chunk and a
text loss mask on the last prompt tokens; `synthetic_batches` draws batches from this fixed set, so a
few steps of training visibly fit it.
"""

from collections.abc import Iterator

import numpy as np

from oxygen_jax.models import inputs
from oxygen_jax.models.pi05 import Pi05Config

TEXT_TOKENS = 3  # prompt tokens per example under the text loss mask


def synthetic_dataset(config: Pi05Config, size: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
    """`size` training examples in `training.batch` keys (model-level arrays, actions, loss mask)."""
    prompt_len = min(8, config.max_token_len)
    arrays = inputs.synthetic_arrays(config, batch=size, prompt_len=prompt_len, seed=seed)
    arrays["tokenized_prompt_mask"] = np.broadcast_to(
        arrays["tokenized_prompt_mask"], (size, config.max_token_len)
    )
    rng = np.random.default_rng(seed + 1)
    shape = (size, config.action_horizon, config.action_dim)
    arrays["actions"] = rng.uniform(-1, 1, shape).astype(np.float32)
    positions = np.arange(config.max_token_len)[None, :]
    arrays["token_loss_mask"] = (positions >= prompt_len - TEXT_TOKENS) & arrays["tokenized_prompt_mask"]
    return arrays


def synthetic_batches(dataset: dict[str, np.ndarray], batch_size: int, seed: int = 0) -> Iterator[dict]:
    """Endless batches of rows drawn without replacement within each pass over the set."""
    size = len(dataset["actions"])
    if not 0 < batch_size <= size:
        raise ValueError(f"batch size {batch_size} must lie in [1, {size}] (the synthetic set's size)")
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(size)
        for start in range(0, size - batch_size + 1, batch_size):
            rows = order[start : start + batch_size]
            yield {key: value[rows] for key, value in dataset.items()}
