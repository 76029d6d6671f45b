"""models/block_softmax.attend against the formulation it replaces: jax.nn.softmax over the concatenated
key blocks times the concatenated values, values and vjp (what guided denoising differentiates)."""

import jax
import jax.numpy as jnp
import numpy as np

from oxygen_jax.models import block_softmax
from oxygen_jax.models.gemma import MASKED_LOGIT

_SHAPE = (2, 1, 12, 8)  # B, K, M (query rows), H
_BLOCKS = (37, 6)  # key columns of a cache block and of the new tokens


def _inputs(seed: int, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    batch, kv_heads, rows, head_dim = _SHAPE
    logits = [rng.normal(0, 3, (batch, kv_heads, rows, s)).astype(np.float32) for s in _BLOCKS]
    logits[0][0, :, :, 30:] = MASKED_LOGIT  # padding columns of row 0's cache
    values = [rng.normal(0, 1, (batch, kv_heads, s, head_dim)).astype(np.float32) for s in _BLOCKS]
    return [jnp.asarray(x) for x in logits], [jnp.asarray(v, dtype) for v in values]


def _concatenated(logits, values):
    probs = jax.nn.softmax(jnp.concatenate(logits, axis=-1), axis=-1)
    return jnp.einsum("BKMS,BKSH->BKMH", probs.astype(values[0].dtype), jnp.concatenate(values, axis=2))


def test_values_equal_the_softmax_over_the_concatenated_blocks():
    logits, values = _inputs(0)
    np.testing.assert_allclose(
        block_softmax.attend(logits, values), _concatenated(logits, values), rtol=0, atol=1e-6
    )


def test_vjp_equals_autodiff_of_the_concatenated_softmax():
    """Cotangents w.r.t. every logit block and value block, for a random output cotangent; the masked
    columns get zero gradient in both."""
    logits, values = _inputs(1)
    d_out = jnp.asarray(np.random.default_rng(2).normal(size=_SHAPE).astype(np.float32))
    _, pullback = jax.vjp(block_softmax.attend, logits, values)
    _, reference = jax.vjp(_concatenated, logits, values)
    got, want = pullback(d_out), reference(d_out)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=2e-5 * float(jnp.abs(w).max()))
    assert not np.any(np.asarray(got[0][0])[0, :, :, 30:])


def test_bfloat16_values_keep_their_dtype_through_the_vjp():
    """The GPU's compute dtype: probabilities and value cotangents in bfloat16, logit cotangents float32."""
    dtype = jnp.bfloat16
    logits, values = _inputs(3, dtype)
    out, pullback = jax.vjp(block_softmax.attend, logits, values)
    d_logits, d_values = pullback(jnp.ones_like(out))
    assert out.dtype == dtype and all(d.dtype == dtype for d in d_values)
    assert all(d.dtype == jnp.float32 for d in d_logits)
    np.testing.assert_allclose(
        out.astype(np.float32), _concatenated(logits, values).astype(np.float32), rtol=0, atol=2e-2
    )
