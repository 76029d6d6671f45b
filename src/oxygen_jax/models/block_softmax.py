"""Attention's softmax and value product over key blocks that are never concatenated, with a vjp that
reduces over the head dim instead of the key columns.

Attention runs over [prefix cache | new tokens] as two blocks (`gemma.Attention`). Guided denoising
(engine/guidance.py) differentiates every flow step through this, and autodiff's softmax backward
sum_s dP_s P_s reduces over every key column of every query row. The same sum is dO . O (the output's
cotangent times the output, as FlashAttention computes it), a reduction over the head dim: on the
`pi05_cpu` action expert that reduction was the single largest op of a guided step.
"""

import functools

import jax
import jax.numpy as jnp


@jax.custom_vjp
def attend(logits: list[jax.Array], values: list[jax.Array]) -> jax.Array:
    """softmax over all blocks' columns together, times the values: logits[i] [B, K, M, S_i] float32 (masked
    columns already at a large negative value), values[i] [B, K, S_i, H] -> [B, K, M, H] in the values'
    dtype. The same float32 operations as `jax.nn.softmax` over the concatenated columns, except that the
    denominator sums per block, then across blocks."""
    return _forward(logits, values)[0]


def _forward(logits, values):
    peak = functools.reduce(jnp.maximum, [jnp.max(b, axis=-1, keepdims=True) for b in logits])
    exps = [jnp.exp(b - peak) for b in logits]
    total = functools.reduce(jnp.add, [jnp.sum(e, axis=-1, keepdims=True) for e in exps])
    probs = [e / total for e in exps]
    encoded = functools.reduce(
        jnp.add,
        [jnp.einsum("BKMS,BKSH->BKMH", p.astype(v.dtype), v) for p, v in zip(probs, values, strict=True)],
    )
    # float32 probabilities for the backward, as autodiff of jax.nn.softmax keeps its float32 output.
    return encoded, (probs, values, encoded)


def _backward(residuals, d_encoded):
    probs, values, encoded = residuals
    row = jnp.sum(d_encoded.astype(jnp.float32) * encoded.astype(jnp.float32), axis=-1, keepdims=True)
    d_logits, d_values = [], []
    for p, v in zip(probs, values, strict=True):
        d_probs = jnp.einsum("BKMH,BKSH->BKMS", d_encoded, v, preferred_element_type=jnp.float32)
        d_logits.append(p * (d_probs - row))
        # A constant block's value cotangent (the prefix cache's, in guided denoising) is unused: XLA
        # drops it.
        d_values.append(jnp.einsum("BKMS,BKMH->BKSH", p.astype(v.dtype), d_encoded))
    return d_logits, d_values


attend.defvjp(_forward, _backward)
