"""The kernel policy: backend execution choices outside the model, equal to the plain dots."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from oxygen_jax.engine import kernels, sampling
from oxygen_jax.engine.engine import Engine
from oxygen_jax.models import gemma, pi05

PLAIN = gemma.PlainKernels()


@pytest.mark.parametrize("split", [1, 2, 3, 4])
def test_one_row_matmul_splits_its_contraction_over_cores(split):
    """A single row runs as a matmul batched over gcd(K, split) slices of K and sums to the plain
    product; more rows are left alone."""
    policy = kernels.KernelPolicy(matvec_split=split)
    x = jax.random.normal(jax.random.key(0), (1, 1, 64))  # one row
    w = jax.random.normal(jax.random.key(1), (64, 48))
    np.testing.assert_allclose(policy.matmul(x, w), PLAIN.matmul(x, w), rtol=0, atol=1e-5)
    parts = np.gcd(64, split)
    jaxpr = str(jax.make_jaxpr(policy.matmul)(x, w))
    if parts == 1:
        assert "reduce_sum" not in jaxpr
    else:  # one product per slice of K, then their sum
        assert f"f32[{parts},1,48] = dot_general" in jaxpr and "reduce_sum" in jaxpr
    assert "reduce_sum" not in str(jax.make_jaxpr(policy.matmul)(jnp.ones((3, 64)), w))


@pytest.mark.parametrize("rows", [1, 3])
def test_split_logits_and_paired_gating_equal_the_plain_dots(rows):
    """The vocabulary split (one row) and the pair-batched GeGLU input dot give the plain einsums'
    values (float32, to summation order)."""
    policy = kernels.KernelPolicy(matvec_split=4)
    hidden = jax.random.normal(jax.random.key(0), (rows, 32))
    table = jax.random.normal(jax.random.key(1), (96, 32))
    np.testing.assert_allclose(
        policy.tied_logits(hidden, table), PLAIN.tied_logits(hidden, table), rtol=0, atol=1e-5
    )
    w = jax.random.normal(jax.random.key(2), (2, 32, 40))
    np.testing.assert_allclose(policy.gating(hidden, w), PLAIN.gating(hidden, w), rtol=0, atol=1e-5)
    assert policy.gating(hidden, w).shape == (2, rows, 40)


def test_policy_is_part_of_the_static_model_config(tiny_config):
    """Configs that differ only in their policy are different jit cache keys and trace different
    graphs: nothing hidden picks the graph."""
    split = dataclasses.replace(tiny_config, kernels=kernels.KernelPolicy(matvec_split=4))
    plain = dataclasses.replace(tiny_config, kernels=kernels.KernelPolicy())
    assert split != plain and hash(split) != hash(plain)
    params = pi05.param_shapes(tiny_config)
    hidden = jnp.ones((1, tiny_config.paligemma.width))

    def logits_jaxpr(config):
        return str(jax.make_jaxpr(lambda p, h: pi05.text_logits(p, config, h))(params, hidden))

    assert "f32[4,1," in logits_jaxpr(split) and "f32[4,1," not in logits_jaxpr(plain)


def test_policy_for_each_backend():
    """CPU: one-row matmuls split over this process's cores and Eigen dots for decode where XLA has the
    option; other backends: plain dots and XLA's defaults."""
    assert kernels.for_backend("gpu") == kernels.KernelPolicy()
    cpu = kernels.for_backend("cpu")
    assert cpu.matvec_split == len(os.sched_getaffinity(0))
    assert cpu.decode_options == (("xla_cpu_experimental_ynn_fusion_type", ""),)
    assert kernels._supported((("xla_cpu_no_such_option", ""),)) == ()  # an older XLA keeps defaults


def test_batched_decode_compiles_with_eigen_dots_on_cpu(golden_params, tiny_config):
    """The batch state's decode runs Eigen's GEMMs (faster at small M), everything else XLA's default
    YNNPACK dots."""
    engine = Engine(golden_params, tiny_config)
    state = engine.init_state(4, 8, engine.config.prefix_len)
    decode = engine._decode.lower(
        params=engine.params,
        config=engine.config,
        state=state,
        num_steps=1,
        eos_id=engine.eos_id,
        mode=sampling.GREEDY,
    )
    matvec = jax.jit(jnp.dot).lower(jnp.ones((4, 64)), jnp.ones((64, 64)))
    assert "__ynn_fusion" not in decode.compile().as_text()
    assert "__ynn_fusion" in matvec.compile().as_text()  # the check above can fail: YNNPACK is the default
