"""Real-time chunking (RTC): denoising guided to agree with the chunk the robot is still executing.

While the next chunk is computed the robot executes `delay` more actions of its previous chunk. Each
flow step is corrected (one `jax.vjp` of the one-step denoised estimate) so the new chunk keeps those
actions and blends into the previous chunk up to `horizon`; from `horizon` on it is free. Math and
float32 order follow Physical-Intelligence/real-time-chunking-kinetix (`get_prefix_weights`,
`FlowPolicy.realtime_action`) in openpi's time convention: t from 1 (noise) to 0 (data), tau = 1 - t,
v = noise - actions. Every setting is per row (the prefix weights are data), so robots with different
delays, schedules and weights share one compiled program; a row whose weights are all 0 gets the plain
program's actions bit for bit (and a batch with no guided row runs the plain program).

A model trained with a clean prefix (`Pi05Config.max_clean_prefix` > 0) needs no guidance: its
`conditioned_denoise` enters the `delay` actions the robot executes meanwhile as they are (flow time 0 on
their tokens) and samples the rest of the chunk given them, at a plain step's cost.
"""

import math

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from oxygen_jax.models import pi05

# How the weights fall from 1 to 0 over [delay, horizon).
SCHEDULES = ("exp", "linear", "ones", "zeros")


@flax.struct.dataclass
class Guidance:
    """Per-row guidance inputs. prev_chunk [B, H, A] float32: the previous chunk in model space, aligned so
    that prev_chunk[b, i] is what the robot executes at the new chunk's index i; weights [B, H] float32
    (`prefix_weights`; all 0: the row's plain actions); max_guidance_weight [B] float32 (beta); frozen
    [B, H] bool: the row's first `delay` indices, which `conditioned_denoise` takes from prev_chunk."""

    prev_chunk: jax.Array
    weights: jax.Array
    max_guidance_weight: jax.Array
    frozen: jax.Array


def prefix_weights(delay: int, horizon: int, total: int, schedule: str = "exp") -> np.ndarray:
    """W [total] float32: 1 on [0, delay), a ramp from 1 to 0 over [delay, horizon) shaped by `schedule`,
    0 from horizon on (delay is clamped to horizon).

    Host-side numpy: XLA turns a division by a broadcast value into a multiplication by its reciprocal,
    which moves the ramp by an ulp from the reference's; numpy divides exactly. `exp` weights are within an
    ulp of the reference's; the frozen actions get exactly 1 (the reference's expm1 gives 0.99999994 there,
    and numpy's expm1 differs between CPUs).
    """
    index = np.arange(total)
    start = min(delay, horizon)
    ramp = np.float32(start - 1 - index) / np.float32(horizon - start + 1) + np.float32(1)
    ramp = np.clip(ramp, np.float32(0), np.float32(1))
    weights = {
        "exp": lambda: np.where(index < start, np.float32(1), ramp * np.expm1(ramp) / np.float32(math.e - 1)),
        "linear": lambda: ramp,
        "ones": lambda: np.ones(total, np.float32),
        "zeros": lambda: (index < start).astype(np.float32),
    }[schedule]()
    return np.where(index >= horizon, np.float32(0), weights).astype(np.float32)


def guidance_weight(time: jax.Array, max_guidance_weight: jax.Array) -> jax.Array:
    """Per-row weight of the correction at flow time t (scalar): min(c (tau^2 + (1 - tau)^2) / (1 - tau)^2,
    beta) with tau = 1 - t and c = (1 - tau) / tau (beta at tau = 0)."""
    tau = 1 - time
    inv_r2 = (tau**2 + (1 - tau) ** 2) / (1 - tau) ** 2
    c = (1 - tau) / tau
    c = jnp.where(jnp.isposinf(c), max_guidance_weight, c)
    return jnp.minimum(c * inv_r2, max_guidance_weight)


def guided_velocity(velocity, x_t: jax.Array, time: jax.Array, target: jax.Array, weights: jax.Array, beta):
    """v - w J^T[(target - x̂) W] with x̂(x_t) = x_t - t v(x_t, t) and J = dx̂/dx_t (rows are independent,
    so one vjp over the batch is a vjp per row). velocity(x_t, t) -> v [B, H, A]; weights [B, H].

    v is the vjp's own forward: one forward and one backward per step (2x a plain step's FLOPs). Only x_t is
    differentiated; params, the prefix cache and t are closed over, so no cotangent is computed for them.
    That forward rounds as the plain program's does (`gemma.RMSNorm` writes its rsqrt out for this), and a
    row with zero weights gets a correction of exactly 0, hence exactly the plain velocity.
    """

    def denoised(x):
        v = velocity(x, time)
        return x - time * v, v

    x_hat, pullback, v = jax.vjp(denoised, x_t, has_aux=True)
    (correction,) = pullback((target - x_hat) * weights[:, :, None])
    return v - guidance_weight(time, beta)[:, None, None] * correction


def guided_denoise(
    params: dict,
    config: pi05.Pi05Config,
    cache: pi05.PrefixCache,
    noise: jax.Array,
    num_steps: int,
    guidance: Guidance,
) -> jax.Array:
    """`pi05.denoise` with every step's velocity guided towards `guidance.prev_chunk` (num_steps static, the
    conditioning computed before the loop). Actions [B, H, A]."""

    def guided(x_t, time, condition):
        return guided_velocity(
            lambda x, _time: pi05.velocity(params, config, cache, x, condition),
            x_t,
            time,
            guidance.prev_chunk,
            guidance.weights,
            guidance.max_guidance_weight,
        )

    return pi05.integrate_flow(guided, noise, num_steps, _conditions(params, config), config.kernels)


def conditioned_denoise(
    params: dict,
    config: pi05.Pi05Config,
    cache: pi05.PrefixCache,
    noise: jax.Array,
    num_steps: int,
    guidance: Guidance,
) -> jax.Array:
    """`pi05.denoise` for a model trained with a clean prefix: every step sees each row's frozen actions as
    `guidance.prev_chunk` has them, at time 0, and the other actions at the step's time; the chunk returned
    keeps the frozen actions exactly. Rows freeze at most `config.max_clean_prefix` actions (what training
    covered; a longer delay conditions on that many). A row with none frozen gets the plain actions, to
    float32 rounding (its conditioning is taken per token). num_steps static; the conditioning at the
    steps' times and at time 0 is computed before the loop. Actions [B, H, A]."""
    frozen = guidance.frozen & (jnp.arange(config.action_horizon) < config.max_clean_prefix)
    at_zero = jax.tree.map(lambda c: c[0], pi05.flow_conditions(params, config, jnp.zeros(1, jnp.float32)))

    def conditioned(x_t, _time, condition):
        x_in = jnp.where(frozen[..., None], guidance.prev_chunk, x_t)
        per_token = jax.tree.map(lambda zero, c: jnp.where(frozen[..., None], zero, c), at_zero, condition)
        return pi05.velocity(params, config, cache, x_in, per_token)

    x_0 = pi05.integrate_flow(conditioned, noise, num_steps, _conditions(params, config), config.kernels)
    return jnp.where(frozen[..., None], guidance.prev_chunk, x_0)


def _conditions(params: dict, config: pi05.Pi05Config):
    return lambda times: pi05.flow_conditions(params, config, times)
