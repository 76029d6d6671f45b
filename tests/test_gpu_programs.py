"""The programs a GPU runs, lowered for CUDA on this CPU (the tiny model, the GPU kernel policy): no
data-dependent control flow (no `stablehlo.case`/`stablehlo.if`), and every loop's trip count is a
compile-time constant (its condition compares the counter with a constant), so XLA:GPU never copies a
predicate to the host between iterations; with `unroll_loops` the flow loop is gone altogether."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import pytest

from oxygen_jax.engine import guidance, kernels
from oxygen_jax.models import pi05

GPU_POLICY = kernels.KernelPolicy(attention_impl="concat")
DENOISE_STATIC = ("config", "num_steps")
_WHILE = re.compile(r"stablehlo\.while\(.*?\n\s*cond \{\n(.*?)\n\s*\} do \{", re.S)


def _config(tiny_config, **policy) -> pi05.Pi05Config:
    """The engine's config on one GPU: runtime layout, q/k/v fused."""
    return dataclasses.replace(
        tiny_config,
        kernels=dataclasses.replace(GPU_POLICY, **policy),
        scan_layers=False,
        fused_qkv=True,
        max_clean_prefix=4,
    )


def _lowered_text(fn, static_argnames, **kwargs) -> str:
    traced = jax.jit(fn, static_argnames=static_argnames).trace(**kwargs)
    return traced.lower(lowering_platforms=("cuda",)).as_text()


def _loop_conditions(text: str) -> list[str]:
    assert "stablehlo.case" not in text and "stablehlo.if" not in text
    conditions = _WHILE.findall(text)
    assert len(conditions) == text.count("stablehlo.while("), "a loop condition the pattern missed"
    return conditions


def _is_constant_bound(condition: str) -> bool:
    """The condition is `counter < constant`: one compare, one operand a constant defined in it."""
    constants = set(re.findall(r"(%\w+) = stablehlo\.constant dense<-?\d+>", condition))
    compares = re.findall(r"stablehlo\.compare\s+\w+, (%[\w#]+), (%[\w#]+)", condition)
    return len(compares) == 1 and any(operand in constants for operand in compares[0])


def _inputs(tiny_config, golden_obs, config):
    params = pi05.param_shapes(config, stacked=False)
    cache = jax.eval_shape(lambda p, o: pi05.prefill(p, config, o), params, golden_obs)
    batch = golden_obs.tokenized_prompt.shape[0]
    noise = jax.ShapeDtypeStruct((batch, config.action_horizon, config.action_dim), jnp.float32)
    rows = guidance.Guidance(
        prev_chunk=noise,
        weights=jax.ShapeDtypeStruct(noise.shape[:2], jnp.float32),
        max_guidance_weight=jax.ShapeDtypeStruct((batch,), jnp.float32),
        frozen=jax.ShapeDtypeStruct(noise.shape[:2], jnp.bool_),
    )
    return params, cache, noise, rows


def _denoise_programs(tiny_config, golden_obs, num_steps: int, **policy) -> dict[str, str]:
    config = _config(tiny_config, **policy)
    params, cache, noise, rows = _inputs(tiny_config, golden_obs, config)
    common = dict(params=params, config=config, cache=cache, noise=noise, num_steps=num_steps)
    return {
        "plain": _lowered_text(pi05.denoise, DENOISE_STATIC, **common),
        "guided": _lowered_text(guidance.guided_denoise, DENOISE_STATIC, **common, guidance=rows),
        "conditioned": _lowered_text(guidance.conditioned_denoise, DENOISE_STATIC, **common, guidance=rows),
    }


def test_prefill_has_only_constant_bound_loops(tiny_config, golden_obs):
    config = _config(tiny_config)
    text = _lowered_text(
        pi05.prefill,
        ("config", "skip_cameras"),
        params=pi05.param_shapes(config, stacked=False),
        config=config,
        obs=golden_obs,
        skip_cameras=(),
    )
    assert all(_is_constant_bound(c) for c in _loop_conditions(text))


@pytest.mark.parametrize("num_steps", [1, 10])
def test_denoise_loops_a_constant_number_of_steps(tiny_config, golden_obs, num_steps):
    for name, text in _denoise_programs(tiny_config, golden_obs, num_steps).items():
        conditions = _loop_conditions(text)
        assert conditions, name  # the flow loop is a loop
        assert all(_is_constant_bound(c) for c in conditions), name
        assert any(f"dense<{num_steps}>" in c for c in conditions), name


def test_unrolled_denoise_has_no_loop(tiny_config, golden_obs):
    for name, text in _denoise_programs(tiny_config, golden_obs, 3, unroll_loops=True).items():
        assert _loop_conditions(text) == [], name


def test_the_checks_catch_a_float_time_loop():
    """The former flow loop (a while on the float time) fails the constant-bound check."""

    def float_time_loop(x, num_steps):
        dt = -1.0 / num_steps
        return jax.lax.while_loop(lambda c: c[1] >= -dt / 2, lambda c: (c[0] + dt, c[1] + dt), (x, 1.0))[0]

    text = _lowered_text(float_time_loop, (), x=jnp.ones(2), num_steps=jnp.float32(10))
    assert not any(_is_constant_bound(c) for c in _loop_conditions(text))
