"""The prefill leaves the same `PrefixCache` when its last layer computes attention and MLP for the last
valid column only (`pi05.prefill`) as the full prefix pass (`pi05.prefix_forward`) does: keys, values,
mask, positions and length bit for bit (every layer's keys/values come from the same inputs), last_hidden
to float32 rounding (one query row instead of all: the dots' shapes, hence their summation order, differ)."""

import dataclasses

import jax
import numpy as np
import pytest

from oxygen_jax.engine import kernels
from oxygen_jax.models import pi05


@pytest.mark.parametrize("layout", ["openpi", "runtime", "fused"])
def test_prefill_cache_equals_the_full_prefix_pass(golden_params, tiny_config, golden_obs, layout):
    config = dataclasses.replace(
        tiny_config,
        scan_layers=layout == "openpi",
        fused_qkv=layout == "fused",
        kernels=kernels.for_backend(),
    )
    params = {
        "openpi": lambda p: p,
        "runtime": pi05.runtime_layout,
        "fused": lambda p: pi05.fused_layout(pi05.runtime_layout(p)),
    }[layout](golden_params)
    full, hidden = jax.jit(pi05.prefix_forward, static_argnums=1)(params, config, golden_obs)
    cache = jax.jit(pi05.prefill, static_argnums=1)(params, config, golden_obs)
    assert len(set(np.asarray(cache.length))) > 1  # rows with different last valid columns
    for field in ("k", "v", "mask", "positions", "length"):
        np.testing.assert_array_equal(getattr(cache, field), getattr(full, field), err_msg=field)
    np.testing.assert_allclose(cache.last_hidden, full.last_hidden, rtol=1e-6, atol=1e-6)
    last = np.asarray(pi05.last_valid_index(full.mask))
    np.testing.assert_array_equal(full.last_hidden, np.asarray(hidden)[np.arange(len(last)), last])
