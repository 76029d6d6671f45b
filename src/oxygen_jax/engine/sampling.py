"""Next-token choice per row: greedy at temperature 0, else temperature + nucleus (top-p) sampling."""

import jax
import jax.numpy as jnp


def top_p_filter(logits: jax.Array, top_p: jax.Array) -> jax.Array:
    """Masks logits [S, V] outside each row's smallest set of tokens with probability >= top_p [S]."""
    sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]
    cumulative = jnp.cumsum(jax.nn.softmax(sorted_logits, axis=-1), axis=-1)
    # The k-th largest logit stays if the mass before it is still below top_p (the top one always stays).
    keep_sorted = (cumulative - jax.nn.softmax(sorted_logits, axis=-1)) < top_p[:, None]
    threshold = jnp.min(jnp.where(keep_sorted, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(logits >= threshold, logits, -jnp.inf)


def sample_tokens(logits: jax.Array, keys: jax.Array, temperature: jax.Array, top_p: jax.Array) -> jax.Array:
    """logits [S, V] float32, keys [S] PRNG keys, temperature/top_p [S] -> token ids [S] int32."""
    greedy = jnp.argmax(logits, axis=-1)
    scaled = logits / jnp.maximum(temperature, 1e-6)[:, None]
    filtered = top_p_filter(scaled, top_p)
    sampled = jax.vmap(jax.random.categorical)(keys, filtered)
    return jnp.where(temperature > 0, sampled, greedy).astype(jnp.int32)
