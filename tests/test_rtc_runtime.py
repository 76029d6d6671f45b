"""Real-time chunking through the batched runtime: per-row guidance from `FrameInput` to the denoiser.

The fake engine shows which program each batch runs (`guided_denoise` only when some row is guided) and
what each row gets; the tiny golden model shows that a guided row's actions equal `Engine.denoise` of
that row alone with the same guidance, and that after warm-up guided robots join and leave without
compiling, with guidance and with conditioning alike.
"""

import concurrent.futures
import dataclasses

import numpy as np
import pytest
from conftest import golden_inputs
from fake_engine import FakeEngine

from oxygen_jax.engine.api import ChunkGuidance
from oxygen_jax.engine.compile_counter import CompileCounter
from oxygen_jax.engine.engine import Engine
from oxygen_jax.models import inputs
from oxygen_jax.runtime import runtime
from oxygen_jax.runtime.device_loop import ObservationWork
from oxygen_jax.runtime.runtime import RuntimeConfig
from oxygen_jax.runtime.scheduler import FrameInput

NUM_STEPS = 3


def _noise(config, seed: int) -> np.ndarray:
    shape = (1, config.action_horizon, config.action_dim)
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _guidance(config, seed: int, delay: int) -> ChunkGuidance:
    prev = np.random.default_rng(100 + seed).standard_normal((config.action_horizon, config.action_dim))
    return ChunkGuidance(prev.astype(np.float32), delay, config.action_horizon)


def _serve(rt, frame_inputs: list[FrameInput]) -> list[np.ndarray]:
    """Submits the inputs together (one batch) to a served runtime; their actions in input order."""
    futures = [concurrent.futures.Future() for _ in frame_inputs]
    pairs = enumerate(zip(frame_inputs, futures, strict=True))
    rt.submit(*(ObservationWork(item, future.set_result, sender=i) for i, (item, future) in pairs))
    replies = [future.result(timeout=120) for future in futures]
    for reply in replies:
        assert reply.error is None, reply.error
        assert reply.batch == len(frame_inputs)
    return [reply.actions for reply in replies]


@pytest.fixture
def fake_runtime(tiny_config):
    engine = FakeEngine(tiny_config)
    config = RuntimeConfig(
        max_slots=0, max_new_tokens=0, num_steps=NUM_STEPS, max_prefill_batch=4, gather_s=5.0, guided=True
    )
    rt = runtime.build(engine, config, expected_senders=lambda: 3)
    yield engine, rt
    rt.stop()


def test_a_batch_mixing_guided_and_plain_rows_runs_the_guided_program_once(fake_runtime):
    """Three robots in one batch (padded to 4), the middle one guided: one guided denoise over the padded
    batch; the guided row keeps its previous chunk's first `delay` actions, the others get noise + steps."""
    engine, rt = fake_runtime
    config = engine.config
    guidance = _guidance(config, 1, delay=3)
    frame_inputs = [
        FrameInput(inputs.synthetic_arrays(config, prompt_len=4), _noise(config, i), guidance=g)
        for i, g in enumerate([None, guidance, None])
    ]
    actions = _serve(rt, frame_inputs)
    assert engine.calls == [("prefill", 4), ("guided_denoise", 4)]
    for i, item in enumerate(frame_inputs):
        want = item.noise[0] + NUM_STEPS
        if item.guidance is not None:
            want[:3] = guidance.prev_chunk[:3]
        np.testing.assert_array_equal(actions[i], want)


def test_a_batch_without_guided_rows_keeps_the_plain_program(fake_runtime):
    engine, rt = fake_runtime
    config = engine.config
    frame_inputs = [
        FrameInput(inputs.synthetic_arrays(config, prompt_len=4), _noise(config, i)) for i in range(3)
    ]
    actions = _serve(rt, frame_inputs)
    assert engine.calls == [("prefill", 4), ("denoise", 4)]
    for item, got in zip(frame_inputs, actions, strict=True):
        np.testing.assert_array_equal(got, item.noise[0] + NUM_STEPS)


def test_guided_warm_up_runs_the_guided_program_at_every_prefill_size(tiny_config):
    engine = FakeEngine(tiny_config)
    example = inputs.synthetic_arrays(tiny_config, prompt_len=4)
    for guided, want in [(False, []), (True, [1, 2, 4])]:
        config = RuntimeConfig(max_slots=0, max_new_tokens=0, loop=None, max_prefill_batch=4, guided=guided)
        engine.calls.clear()
        runtime.build(engine, config).warmup(example)
        assert [batch for name, batch in engine.calls if name == "guided_denoise"] == want


@pytest.fixture(scope="module", params=[0, 5], ids=["guided", "conditioned"])
def engine(request, golden_params, tiny_config):
    """The golden engine, guiding (openpi's model) or conditioning (`max_clean_prefix` = 5: the RTC rows run
    `guidance.conditioned_denoise`)."""
    return Engine(golden_params, dataclasses.replace(tiny_config, max_clean_prefix=request.param))


@pytest.fixture(scope="module")
def example(model_io):
    arrays = golden_inputs(model_io)
    return {k: v[:1] for k, v in arrays.items() if k != "noise"}


def _alone(engine, example, noise: np.ndarray, guidance: ChunkGuidance | None) -> np.ndarray:
    """`Engine.denoise` of one observation alone, guided as given."""
    cache = engine.prefill(inputs.observation_from_arrays(example, engine.config))
    return np.asarray(engine.denoise(cache, noise, NUM_STEPS, [guidance]))[0]


def test_guided_robots_join_and_leave_without_compiling_and_match_the_engine_alone(engine, example):
    """After a guided warm-up, batches of 1 to 3 robots with and without guidance (a guided robot that
    joins, two guided, the guided ones leaving) compile nothing; every row equals `Engine.denoise` of that
    observation alone with its guidance (guided rows to 2e-5: batching changes float32 reductions)."""
    config = RuntimeConfig(
        max_slots=0, max_new_tokens=0, num_steps=NUM_STEPS, max_prefill_batch=4, gather_s=5.0, guided=True
    )
    senders = [1]
    rt = runtime.build(engine, config, expected_senders=lambda: senders[0])
    rt.warmup(example)
    h, a = engine.config.action_horizon, engine.config.action_dim
    rows = {
        "plain": None,
        "guided": _guidance(engine.config, 1, delay=2),
        "guided late": ChunkGuidance(_guidance(engine.config, 2, 0).prev_chunk, 4, h - 1, "linear"),
    }
    batches = [["plain"], ["plain", "guided"], ["guided", "plain", "guided late"], ["plain", "plain"]]
    batch_inputs = [
        [
            FrameInput(example, _noise(engine.config, 10 * b + i), guidance=rows[name])
            for i, name in enumerate(names)
        ]
        for b, names in enumerate(batches)
    ]
    # The references run the engine's separate prefill and denoise programs, which the runtime (one
    # action program a frame) never compiles: computed before counting.
    wants = [[_alone(engine, example, item.noise, item.guidance) for item in items] for items in batch_inputs]
    try:
        with CompileCounter() as compiles:
            for frame_inputs, batch_wants in zip(batch_inputs, wants, strict=True):
                senders[0] = len(frame_inputs)
                for got, want in zip(_serve(rt, frame_inputs), batch_wants, strict=True):
                    assert got.shape == (h, a)
                    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
        assert compiles.count == 0
    finally:
        rt.stop()
