"""The hot programs as XLA:GPU gets them: no device-side branch, no loop bound read from the device.

XLA:GPU copies a `stablehlo.while` predicate to the host every iteration unless it compares the loop
counter with a constant, and a `stablehlo.case`/`if` predicate before the branch. The programs are lowered
for CUDA here, on the CPU (no GPU needed), and their StableHLO text is checked. Also here: the static
sampling modes choose exactly the tokens the device-side conditions chose, and a decode of k steps run as
power-of-two programs equals k single steps.
"""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from oxygen_jax.engine import api, batch_state, kernels, sampling
from oxygen_jax.engine.compile_counter import CompileCounter
from oxygen_jax.engine.engine import Engine


@pytest.fixture(scope="module")
def engine(golden_params, tiny_config):
    return Engine(golden_params, tiny_config)


def _while_conditions(text: str) -> list[str]:
    """The text of every `stablehlo.while` condition region."""
    return re.findall(r"stablehlo\.while.*?\n\s*cond \{\n(.*?)\n\s*\} do \{", text, re.DOTALL)


def _assert_host_free(text: str) -> None:
    assert "stablehlo.case" not in text and "stablehlo.if" not in text
    for cond in _while_conditions(text):
        constants = set(re.findall(r"(%\w+) = stablehlo\.constant", cond))
        (compare,) = re.findall(r"stablehlo\.compare\s+\w+,\s*(%\w+),\s*(%\w+)", cond)
        assert constants & set(compare), f"a loop bound read from the device:\n{cond}"
    assert text.count("stablehlo.while") == len(_while_conditions(text))


def _cuda_text(fn, **kwargs) -> str:
    return fn.trace(**kwargs).lower(lowering_platforms=("cuda",)).as_text()


def test_the_checker_sees_a_traced_bound_and_a_branch():
    traced = jax.jit(lambda x, n: jax.lax.fori_loop(0, n, lambda _, s: s + 1, x))
    with pytest.raises(AssertionError, match="loop bound"):
        _assert_host_free(_cuda_text(traced, x=jnp.float32(0), n=jnp.int32(3)))
    branch = jax.jit(lambda x: jax.lax.cond(x > 0, jnp.sin, jnp.cos, x))
    with pytest.raises(AssertionError):
        _assert_host_free(_cuda_text(branch, x=jnp.float32(0)))


@pytest.mark.parametrize("mode", sampling.MODES)
@pytest.mark.parametrize("num_steps", [1, 5])
def test_decode_lowers_for_cuda_without_host_round_trips(engine, mode, num_steps):
    state = engine.init_state(4, 8)
    text = _cuda_text(
        engine._decode,
        params=engine.params,
        config=engine.config,
        state=state,
        num_steps=num_steps,
        eos_id=engine.eos_id,
        mode=mode,
    )
    _assert_host_free(text)
    assert len(_while_conditions(text)) == 1  # the steps; the model's layers are unrolled
    assert ("stablehlo.sort" in text) == mode.top_p  # the vocabulary sort only where a row asks for it


def test_prefill_lowers_for_cuda_without_host_round_trips(engine, golden_obs):
    obs, pad = engine.cut_prompt(golden_obs)
    assert pad  # the golden prompts fit a shorter bucket: the cache is padded back in the program
    text = _cuda_text(
        engine._prefill, params=engine.params, config=engine.config, obs=obs, skip_cameras=(), pad=pad
    )
    _assert_host_free(text)


@pytest.mark.parametrize("denoiser", ["plain", "guided"])
def test_act_lowers_for_cuda_without_branches(engine, golden_obs, denoiser):
    """The fused action program has no device-side branch, and every loop in it (the flow steps) runs a
    constant number of times."""
    obs, pad = engine.cut_prompt(golden_obs)
    config = engine.config
    rows = None
    if denoiser == "guided":
        chunk = api.ChunkGuidance(np.zeros((config.action_horizon, config.action_dim), np.float32), 2, 6)
        denoiser, rows = engine._denoiser([chunk, None], (2, config.action_horizon, config.action_dim))
    text = _cuda_text(
        engine._act,
        params=engine.params,
        config=config,
        obs=obs,
        noise=np.zeros((2, config.action_horizon, config.action_dim), np.float32),
        num_steps=10,
        skip_cameras=(),
        pad=pad,
        denoiser=denoiser,
        guidance=rows,
    )
    _assert_host_free(text)
    assert _while_conditions(text)  # the flow steps are a loop (not unrolled by default): checked above


def _sample_with_conds(logits, keys, temperature, top_p):
    """The token choice as it was decided on the device (two `lax.cond`s), for comparison."""

    def sample(logits, keys, temperature, top_p):
        scaled = logits / jnp.maximum(temperature, 1e-6)[:, None]
        scaled = jax.lax.cond(jnp.any(top_p < 1.0), sampling.top_p_filter, lambda x, _: x, scaled, top_p)
        sampled = jax.vmap(jax.random.categorical)(keys, scaled)
        return jnp.where(temperature > 0, sampled, jnp.argmax(logits, axis=-1))

    greedy = lambda x, *_: jnp.argmax(x, axis=-1)  # noqa: E731
    tokens = jax.lax.cond(jnp.any(temperature > 0), sample, greedy, logits, keys, temperature, top_p)
    return tokens.astype(jnp.int32)


@pytest.mark.parametrize(
    ("temperature", "top_p", "mode"),
    [
        ([0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], sampling.GREEDY),
        ([0.0, 0.0, 0.0, 0.0], [0.5, 1.0, 0.9, 1.0], sampling.GREEDY),  # top_p alone samples nothing
        ([0.0, 1.0, 0.7, 0.0], [1.0, 1.0, 1.0, 1.0], sampling.SamplingMode(sample=True)),
        ([0.0, 1.0, 2.0, 0.5], [1.0, 0.9, 1.0, 0.3], sampling.SamplingMode(sample=True, top_p=True)),
    ],
)
def test_static_modes_choose_the_tokens_the_device_conditions_chose(temperature, top_p, mode):
    temperature, top_p = np.array(temperature, np.float32), np.array(top_p, np.float32)
    assert sampling.SamplingMode.of(temperature, top_p) == mode
    logits = jax.random.normal(jax.random.key(0), (4, 97)) * 3
    for seed in range(8):
        keys = jax.random.split(jax.random.key(seed), 4)
        expected = _sample_with_conds(logits, keys, temperature, top_p)
        tokens = sampling.sample_tokens(logits, keys, temperature, top_p, mode)
        np.testing.assert_array_equal(tokens, expected)


def test_step_chunks_are_binary_digits_over_the_compiled_counts():
    assert batch_state.step_chunks(10) == [8, 2] and batch_state.step_chunks(0) == []
    assert batch_state.compiled_steps(8) == [1, 2, 4, 8] and batch_state.compiled_steps(7) == [1, 2, 4]
    for k in range(1, 65):
        assert sum(batch_state.step_chunks(k)) == k
        assert set(batch_state.step_chunks(k)) <= set(batch_state.compiled_steps(k))


def _host(state: batch_state.BatchState) -> list[np.ndarray]:
    return jax.tree.leaves(jax.device_get(state.replace(keys=jax.random.key_data(state.keys))))


def _mixed_state(engine, golden_obs, max_new: int = 8):
    """Three requests on the golden prefixes: greedy, sampled, sampled with top-p; one slot left free."""
    cache = engine.select_rows(engine.prefill(golden_obs), np.array([0, 1, 0, 1]))
    rows = [
        api.SamplingParams(),
        api.SamplingParams(temperature=1.0, seed=3),
        api.SamplingParams(temperature=0.8, top_p=0.9, seed=4),
    ]
    inserts = [api.SlotInsert(slot, max_new, params) for slot, params in enumerate(rows)]
    state = engine.insert(engine.init_state(4, max_new), cache, inserts)
    return state, sampling.SamplingMode.of([r.temperature for r in rows], [r.top_p for r in rows])


@pytest.mark.integration
def test_k_steps_as_power_of_two_programs_equal_k_single_steps(engine, golden_obs):
    state, mode = _mixed_state(engine, golden_obs)
    assert mode == sampling.SamplingMode(sample=True, top_p=True)
    single = []
    for _ in range(8):
        state = engine.decode(state, 1, mode)
        single.append(_host(state))
    assert np.asarray(state.done[:3]).all()  # every request ran its 8 tokens
    # 7 = 4 + 2 + 1; and 100 steps stop at the state's 8 tokens (more would change nothing).
    for steps, expected in ((7, single[6]), (100, single[7])):
        chunked = _host(engine.decode(_mixed_state(engine, golden_obs)[0], steps, mode))
        for a, b in zip(chunked, expected, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.integration
def test_each_decode_program_compiles_once(engine, golden_obs):
    state, mode = _mixed_state(engine, golden_obs)
    state = engine.decode(state, 3, mode)  # compiles steps 2 and 1
    with CompileCounter() as counter:
        for k in (1, 2, 3, 3, 1):
            state = engine.decode(state, k, mode)
    assert counter.count == 0


def test_compiler_options_reach_every_hot_program(golden_params, tiny_config, golden_obs):
    """An option XLA does not know fails each hot program's compilation: the policy's options reach it.
    The GPU preset's options are all per-compile options this XLA accepts (ignored on the CPU)."""
    for options in kernels.GPU_COMPILER_OPTIONS:
        jax.jit(jnp.sin, compiler_options=dict([options])).lower(jnp.ones(2)).compile()
    policy = dataclasses.replace(kernels.for_backend(), compiler_options=(("xla_no_such_option", True),))
    engine = Engine(golden_params, tiny_config, kernel_policy=policy)
    noise = np.zeros((2, tiny_config.action_horizon, tiny_config.action_dim), np.float32)
    calls = [
        lambda: engine.prefill(golden_obs),
        lambda: engine.act(golden_obs, noise, 10),
        lambda: engine.decode(engine.init_state(2, 4), 1, sampling.GREEDY),
    ]
    for call in calls:
        with pytest.raises(Exception, match="xla_no_such_option"):
            call()
