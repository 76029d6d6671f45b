"""Next-token choice per row: greedy at temperature 0, else temperature + nucleus (top-p) sampling.

The sampling path (a sort over the vocabulary for top-p, Gumbel noise) only runs when some row samples,
so all-greedy batches pay for one argmax.
"""

import jax
import jax.numpy as jnp


def top_p_filter(logits: jax.Array, top_p: jax.Array) -> jax.Array:
    """Masks logits [S, V] outside each row's smallest set of tokens with probability >= top_p [S]."""
    sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    # The k-th largest logit stays if the mass before it is still below top_p (the top one always stays).
    keep_sorted = (jnp.cumsum(probs, axis=-1) - probs) < top_p[:, None]
    threshold = jnp.min(jnp.where(keep_sorted, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(logits >= threshold, logits, -jnp.inf)


def _sample(logits: jax.Array, keys: jax.Array, temperature: jax.Array, top_p: jax.Array) -> jax.Array:
    scaled = logits / jnp.maximum(temperature, 1e-6)[:, None]
    scaled = jax.lax.cond(jnp.any(top_p < 1.0), top_p_filter, lambda x, _: x, scaled, top_p)
    sampled = jax.vmap(jax.random.categorical)(keys, scaled)
    return jnp.where(temperature > 0, sampled, jnp.argmax(logits, axis=-1))


def sample_tokens(logits: jax.Array, keys: jax.Array, temperature: jax.Array, top_p: jax.Array) -> jax.Array:
    """logits [S, V] float32, keys [S] PRNG keys, temperature/top_p [S] -> token ids [S] int32."""
    tokens = jax.lax.cond(
        jnp.any(temperature > 0),
        _sample,
        lambda x, *_: jnp.argmax(x, axis=-1),
        logits,
        keys,
        temperature,
        top_p,
    )
    return tokens.astype(jnp.int32)
