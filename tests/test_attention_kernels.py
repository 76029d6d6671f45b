"""`Kernels.attention` choices: the two-block softmax (CPU) and openpi's concatenated buffer (GPU) compute
the same attention, fully masked rows included (`gemma.MASKED_LOGIT`: they average every value)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from oxygen_jax.engine import kernels
from oxygen_jax.models import gemma


def _inputs(seed: int, heads: int, kv_heads: int, lengths: tuple[int, ...], dtype=jnp.float32):
    keys = jax.random.split(jax.random.key(seed), 2 * len(lengths) + 2)
    batch, queries, head_dim = 2, 5, 8
    q = jax.random.normal(keys[0], (batch, queries, heads, head_dim), dtype)
    k_blocks = [
        jax.random.normal(keys[1 + i], (batch, s, kv_heads, head_dim), dtype) for i, s in enumerate(lengths)
    ]
    v_blocks = [
        jax.random.normal(keys[1 + len(lengths) + i], (batch, s, kv_heads, head_dim), dtype)
        for i, s in enumerate(lengths)
    ]
    mask = jax.random.bernoulli(keys[-1], 0.7, (batch, queries, sum(lengths)))
    mask = mask.at[1, 2].set(False)  # one fully masked row
    return q, k_blocks, v_blocks, mask


@pytest.mark.parametrize(("heads", "kv_heads", "lengths"), [(4, 1, (7, 5)), (4, 2, (6,)), (2, 2, (3, 4))])
def test_blocks_and_concat_are_the_same_attention(heads, kv_heads, lengths):
    q, k_blocks, v_blocks, mask = _inputs(0, heads, kv_heads, lengths)
    blocks = kernels.KernelPolicy(attention_impl="blocks").attention(q, k_blocks, v_blocks, mask)
    concat = kernels.KernelPolicy().attention(q, k_blocks, v_blocks, mask)
    assert blocks.shape == concat.shape == q.shape
    # The denominators sum per block, then across blocks: float32 rounding apart.
    np.testing.assert_allclose(blocks, concat, rtol=0, atol=2e-6)
    np.testing.assert_array_equal(concat, gemma.PLAIN_KERNELS.attention(q, k_blocks, v_blocks, mask))
    # The fully masked row attends every column evenly, as openpi's finite fill makes it.
    values = jnp.concatenate(v_blocks, axis=1)[1].mean(axis=0)
    expected = jnp.repeat(values, heads // kv_heads, axis=0)
    np.testing.assert_allclose(concat[1, 2], expected, rtol=0, atol=2e-6)


def test_the_backend_picks_the_attention():
    assert kernels.for_backend("cpu").attention_impl == "blocks"
    assert kernels.for_backend("gpu").attention_impl == "concat"
    with pytest.raises(ValueError, match="attention_impl"):
        kernels.KernelPolicy(attention_impl="flash")
