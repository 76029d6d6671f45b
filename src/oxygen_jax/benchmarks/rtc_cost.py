"""What real-time chunking costs on the action path: guided and conditioned against plain denoising, same
batch.

Plain, guided and conditioned calls alternate on the same prefix cache and noise, so a shared machine's
load hits them alike; each batch reports the median of its calls. The issue's target: guidance adds at
most 1.5x the plain denoise time (`added_over_plain` <= 1.5). Conditioning (`guidance.conditioned_denoise`,
for a model trained with a clean prefix) runs here on the same weights with `max_clean_prefix` = H/2: its
cost does not depend on what the weights learned.
"""

import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from oxygen_jax.benchmarks.spec import observation
from oxygen_jax.engine import api, guidance
from oxygen_jax.engine.compile_counter import CompileCounter
from oxygen_jax.engine.engine import Engine
from oxygen_jax.models import inputs, pi05


@dataclasses.dataclass(frozen=True)
class Setting:
    batches: tuple[int, ...] = (1, 4)
    reps: int = 20
    num_steps: int = 10
    layout: str = "libero"
    seed: int = 0


def _seconds(fn) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def observation_batch(engine: Engine, batch: int, layout: str) -> pi05.Observation:
    rows = [observation(engine.config, layout, i) for i in range(batch)]
    arrays = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
    return inputs.observation_from_arrays(arrays, engine.config)


def _guidance(engine: Engine, batch: int, seed: int) -> list[api.ChunkGuidance]:
    """Every row guided: a random previous chunk, delay H/4, blending up to H/2 (exp schedule)."""
    horizon, action_dim = engine.config.action_horizon, engine.config.action_dim
    rng = np.random.default_rng(seed)
    return [
        api.ChunkGuidance(rng.standard_normal((horizon, action_dim), np.float32), horizon // 4, horizon // 2)
        for _ in range(batch)
    ]


def step_programs(
    engine: Engine, cache: pi05.PrefixCache, noise: jax.Array, rows: list
) -> dict[str, jax.stages.Lowered]:
    """One plain and one guided flow step (a velocity, and a guided velocity with its vjp) on this cache,
    lowered with the weights and the cache as arguments: closed over, they would become constants of the
    program, gigabytes at full size, which XLA then folds and the compilation cache serializes."""
    batch, horizon, action_dim = noise.shape
    columns = {k: jnp.asarray(v) for k, v in api.guidance_columns(rows, batch, horizon, action_dim).items()}
    mid_flow = jnp.float32(0.5)

    def velocity(params, cache, x, t):
        return pi05.predict_velocity(params, engine.config, cache, x, jnp.broadcast_to(t, (batch,)))

    def plain_step(params, cache, x):
        return velocity(params, cache, x, mid_flow)

    def guided_step(params, cache, x, columns):
        return guidance.guided_velocity(
            lambda x, t: velocity(params, cache, x, t),
            x,
            mid_flow,
            columns["prev_chunk"],
            columns["weights"],
            columns["max_guidance_weight"],
        )

    return {
        "plain": jax.jit(plain_step).lower(engine.params, cache, noise),
        "guided": jax.jit(guided_step).lower(engine.params, cache, noise, columns),
    }


def step_flops(engine: Engine, cache: pi05.PrefixCache, noise: jax.Array, rows: list) -> dict[str, float]:
    """XLA's FLOP count of one plain and one guided flow step, from the programs as lowered (nothing is
    compiled): how much more work guidance is, apart from how fast the backend runs it."""

    def flops(lowered: jax.stages.Lowered) -> float:
        analysis = lowered.cost_analysis()
        return float((analysis[0] if isinstance(analysis, list) else analysis)["flops"])

    plain, guided = (flops(p) for p in step_programs(engine, cache, noise, rows).values())
    return {"plain_step_flops": plain, "guided_step_flops": guided, "guided_over_plain_flops": guided / plain}


def measure_batch(engine: Engine, batch: int, setting: Setting) -> dict:
    """Median plain and guided denoise ms at `batch` rows (both compiled first), and their ratio."""
    cache = engine.prefill(observation_batch(engine, batch, setting.layout))
    noise = engine.noise(jax.random.key(setting.seed), batch)
    guided_rows = _guidance(engine, batch, setting.seed)
    conditioned_config = dataclasses.replace(
        engine.config, max_clean_prefix=engine.config.action_horizon // 2
    )
    columns = api.guidance_columns(guided_rows, *noise.shape)
    rows_in = guidance.Guidance(**{k: jnp.asarray(v) for k, v in columns.items()})
    conditioned = jax.jit(guidance.conditioned_denoise, static_argnames=("config", "num_steps"))
    calls = {
        "plain": lambda: engine.denoise(cache, noise, setting.num_steps),
        "guided": lambda: engine.denoise(cache, noise, setting.num_steps, guided_rows),
        "conditioned": lambda: conditioned(
            params=engine.params,
            config=conditioned_config,
            cache=cache,
            noise=noise,
            num_steps=setting.num_steps,
            guidance=rows_in,
        ),
    }
    for call in calls.values():
        jax.block_until_ready(call())
    times = {name: [] for name in calls}
    with CompileCounter() as counter:
        for _ in range(setting.reps):
            for name, call in calls.items():
                times[name].append(_seconds(call))
    plain, guided, conditioned_ms = (statistics.median(times[name]) * 1e3 for name in calls)
    return {
        "batch": batch,
        "plain_ms": plain,
        "guided_ms": guided,
        "guided_over_plain": guided / plain,
        "added_over_plain": (guided - plain) / plain,
        "conditioned_ms": conditioned_ms,
        "conditioned_over_plain": conditioned_ms / plain,
        **{f"{name}_ms_all": [t * 1e3 for t in times[name]] for name in calls},
        "compiles_while_measuring": counter.count,
        **step_flops(engine, cache, noise, guided_rows),
    }
