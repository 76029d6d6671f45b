"""The flow loop of compile-time length (`pi05.integrate_flow`) against openpi's while loop on a float
time with the conditioning computed in every step, which it replaced: the same actions bit for bit on
CPU float32 for plain, guided and conditioned denoising (golden tiny model and inputs)."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import GOLDEN

from oxygen_jax.engine import api, guidance, kernels
from oxygen_jax.engine.api import ChunkGuidance
from oxygen_jax.engine.compile_counter import CompileCounter
from oxygen_jax.engine.engine import Engine
from oxygen_jax.models import pi05

STEPS = (1, 3, 10)


@pytest.fixture(scope="module")
def rtc_io():
    return np.load(GOLDEN / "rtc_io.npz")


@pytest.fixture(scope="module")
def engine(golden_params, tiny_config):
    return Engine(golden_params, dataclasses.replace(tiny_config, max_clean_prefix=5))


@pytest.fixture(scope="module")
def cache(engine, golden_obs):
    return engine.prefill(golden_obs)


@functools.partial(jax.jit, static_argnames=("step_velocity",))
def _while_loop_reference(step_velocity, inputs, noise, num_steps):
    """openpi's loop as this repository ran it before: a while loop on the float32 time, dt computed on the
    device from a traced num_steps, step_velocity(inputs, x_t, t) computing the time MLP and adaRMS in
    every step. inputs (params, cache, ...) are arguments, as the engine passes them: closed over, they
    would be constants that XLA folds into other roundings."""
    dt = (-1.0 / jnp.asarray(num_steps, jnp.float32)).astype(jnp.float32)

    def step(carry):
        x_t, time = carry
        return x_t + dt * step_velocity(inputs, x_t, time), time + dt

    return jax.lax.while_loop(lambda c: c[1] >= -dt / 2, step, (noise, jnp.float32(1.0)))[0]


def _per_step(config, inputs, x, t):
    """The velocity with the conditioning from t in every step, one time per row."""
    params, cache = inputs[:2]
    return pi05.predict_velocity(params, config, cache, x, jnp.broadcast_to(t, x.shape[:1]))


def _rows(rtc_io) -> list[ChunkGuidance]:
    prev = rtc_io["in/prev_chunk_aligned"]
    return [ChunkGuidance(prev[0], 3, 7, "exp", 5.0), ChunkGuidance(prev[1], 2, 5, "linear", 5.0)]


def _columns(rtc_io, rows) -> dict:
    return {k: jnp.asarray(v) for k, v in api.guidance_columns(rows, *rtc_io["in/noise"].shape).items()}


@pytest.mark.parametrize("num_steps", [1, 2, 3, 7, 10, 16, 50])
def test_flow_times_are_openpis(num_steps):
    """The host's times are those a float32 while loop steps through on the device, count included."""

    @jax.jit
    def device_times(n):
        dt = (-1.0 / jnp.asarray(n, jnp.float32)).astype(jnp.float32)
        times = jnp.full(64, jnp.nan, jnp.float32)

        def step(c):
            i, t, ts = c
            return i + 1, t + dt, ts.at[i].set(t)

        return jax.lax.while_loop(lambda c: c[1] >= -dt / 2, step, (0, jnp.float32(1.0), times))

    count, _, times = device_times(num_steps)
    np.testing.assert_array_equal(pi05.flow_times(num_steps), np.asarray(times)[: int(count)])
    assert len(pi05.flow_times(num_steps)) == num_steps


@pytest.mark.parametrize("num_steps", STEPS)
def test_plain_denoise_equals_the_per_step_while_loop(engine, cache, rtc_io, num_steps):
    plain = dataclasses.replace(engine.config, max_clean_prefix=0)
    velocity = functools.partial(_per_step, plain)
    want = _while_loop_reference(velocity, (engine.params, cache), rtc_io["in/noise"], num_steps)
    np.testing.assert_array_equal(engine.denoise(cache, rtc_io["in/noise"], num_steps), want)
    # pi05.denoise with a traced step count is that while loop.
    traced = jax.jit(pi05.denoise, static_argnames="config")(
        engine.params, plain, cache, rtc_io["in/noise"], num_steps
    )
    np.testing.assert_array_equal(traced, want)


@pytest.mark.parametrize("num_steps", STEPS)
def test_guided_denoise_equals_the_per_step_while_loop(engine, cache, rtc_io, num_steps):
    config = dataclasses.replace(engine.config, max_clean_prefix=0)
    columns = _columns(rtc_io, _rows(rtc_io))

    def guided(inputs, x, t):
        rows = inputs[2]
        return guidance.guided_velocity(
            lambda x, t: _per_step(config, inputs, x, t),
            x,
            t,
            rows["prev_chunk"],
            rows["weights"],
            rows["max_guidance_weight"],
        )

    want = _while_loop_reference(guided, (engine.params, cache, columns), rtc_io["in/noise"], num_steps)
    program = jax.jit(guidance.guided_denoise, static_argnames=("config", "num_steps"))
    got = program(
        params=engine.params,
        config=config,
        cache=cache,
        noise=rtc_io["in/noise"],
        num_steps=num_steps,
        guidance=guidance.Guidance(**columns),
    )
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("num_steps", STEPS)
def test_conditioned_denoise_equals_the_per_step_while_loop(engine, cache, rtc_io, num_steps):
    rows = [_rows(rtc_io)[0], None]  # row 1 freezes nothing: its plain actions
    columns = _columns(rtc_io, rows)
    frozen = columns["frozen"] & (np.arange(engine.config.action_horizon) < engine.config.max_clean_prefix)
    prev = columns["prev_chunk"]

    def conditioned(inputs, x, t):
        params, cache, frozen, prev = inputs
        x_in = jnp.where(frozen[..., None], prev, x)
        return pi05.predict_velocity(params, engine.config, cache, x_in, jnp.where(frozen, 0.0, t))

    x_0 = _while_loop_reference(
        conditioned, (engine.params, cache, frozen, prev), rtc_io["in/noise"], num_steps
    )
    want = jnp.where(frozen[..., None], prev, x_0)
    np.testing.assert_array_equal(engine.denoise(cache, rtc_io["in/noise"], num_steps, rows), want)


def test_unrolled_loop_gives_the_same_actions(golden_params, tiny_config, engine, cache, rtc_io):
    policy = dataclasses.replace(kernels.for_backend(), unroll_loops=True)
    unrolled = Engine(golden_params, tiny_config, kernel_policy=policy)
    for num_steps in (1, 3):
        np.testing.assert_array_equal(
            unrolled.denoise(cache, rtc_io["in/noise"], num_steps),
            engine.denoise(cache, rtc_io["in/noise"], num_steps),
        )


def test_denoise_compiles_once_per_batch_and_step_count(engine, cache, rtc_io):
    noise = rtc_io["in/noise"]
    with CompileCounter() as first:
        for num_steps in (4, 5):
            engine.denoise(cache, noise, num_steps)
    with CompileCounter() as again:
        for num_steps in (4, 5, 4, 5):
            engine.denoise(cache, noise + 1, num_steps)
    assert (first.count, again.count) == (2, 0)
