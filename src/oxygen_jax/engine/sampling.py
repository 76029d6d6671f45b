"""Next-token choice per row: greedy at temperature 0, else temperature + nucleus (top-p) sampling.

Which paths a batch needs is known on the host when its requests are inserted, so it is a static
`SamplingMode` and no program branches on the device (a device-side condition costs XLA:GPU a copy of
the predicate to the host): an all-greedy batch compiles to one argmax, and the sort over the vocabulary
for top-p only runs in programs where some row asks for it.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class SamplingMode:
    """The token paths one decode compiles: `sample` when some row has temperature > 0, and with it
    `top_p` when some row has top_p < 1 (the filter then runs over every row, as one batched sort)."""

    sample: bool = False
    top_p: bool = False

    @classmethod
    def of(cls, temperature, top_p) -> "SamplingMode":
        """The mode of rows with these host-side temperatures and top-p values (scalars or sequences)."""
        sample = bool((np.asarray(temperature) > 0).any())
        return cls(sample, sample and bool((np.asarray(top_p) < 1.0).any()))


GREEDY = SamplingMode()
MODES = (GREEDY, SamplingMode(sample=True), SamplingMode(sample=True, top_p=True))


def top_p_filter(logits: jax.Array, top_p: jax.Array) -> jax.Array:
    """Masks logits [S, V] outside each row's smallest set of tokens with probability >= top_p [S]."""
    sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    # The k-th largest logit stays if the mass before it is still below top_p (the top one always stays).
    keep_sorted = (jnp.cumsum(probs, axis=-1) - probs) < top_p[:, None]
    threshold = jnp.min(jnp.where(keep_sorted, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(logits >= threshold, logits, -jnp.inf)


def sample_tokens(
    logits: jax.Array, keys: jax.Array, temperature: jax.Array, top_p: jax.Array, mode: SamplingMode
) -> jax.Array:
    """logits [S, V] float32, keys [S] PRNG keys, temperature/top_p [S] -> token ids [S] int32; rows at
    temperature 0 take the argmax whatever the mode."""
    greedy = jnp.argmax(logits, axis=-1)
    if not mode.sample:
        return greedy.astype(jnp.int32)
    scaled = logits / jnp.maximum(temperature, 1e-6)[:, None]
    if mode.top_p:
        scaled = top_p_filter(scaled, top_p)
    sampled = jax.vmap(jax.random.categorical)(keys, scaled)
    return jnp.where(temperature > 0, sampled, greedy).astype(jnp.int32)
