"""Real-time chunking in the engine against upstream openpi with the kinetix reference's guidance
(golden rtc_io.npz: tiny model, float32, the observation batch of model_io.npz)."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import GOLDEN

from oxygen_jax.engine import guidance
from oxygen_jax.engine.api import ChunkGuidance
from oxygen_jax.engine.compile_counter import CompileCounter
from oxygen_jax.engine.engine import Engine
from oxygen_jax.errors import InvalidArgumentError

CASES = json.loads((GOLDEN / "rtc_io.json").read_text())["cases"]
SCHEDULE_KEY = "schedule (prefix_attention_schedule)"


@pytest.fixture(scope="module")
def rtc_io():
    return np.load(GOLDEN / "rtc_io.npz")


@pytest.fixture(scope="module")
def engine(golden_params, tiny_config):
    return Engine(golden_params, tiny_config)


@pytest.fixture(scope="module")
def cache(engine, golden_obs):
    return engine.prefill(golden_obs)


def _case_rows(rtc_io, case: str) -> list[ChunkGuidance]:
    return [
        ChunkGuidance(
            prev_chunk=rtc_io["in/prev_chunk_aligned"][b],
            delay=int(rtc_io[f"case_{case}/d"][b]),
            horizon=int(rtc_io[f"case_{case}/s"][b]),
            schedule=CASES[case][SCHEDULE_KEY],
            max_guidance_weight=float(rtc_io[f"case_{case}/beta"]),
        )
        for b in range(2)
    ]


@pytest.mark.parametrize("case", ["A", "B", "C"])
def test_prefix_weights_equal_the_reference(rtc_io, case):
    """Within one float32 ulp of 1 (the reference's `exp` uses XLA's expm1, numpy's is correctly rounded);
    the `linear` ramp (case C) bit for bit."""
    weights = np.stack(
        [
            guidance.prefix_weights(int(d), int(s), 10, CASES[case][SCHEDULE_KEY])
            for d, s in zip(rtc_io[f"case_{case}/d"], rtc_io[f"case_{case}/s"], strict=True)
        ]
    )
    want = rtc_io[f"case_{case}/weights"]
    np.testing.assert_allclose(weights, want, rtol=0, atol=1.2e-7)
    np.testing.assert_array_equal(weights == 0, want == 0)
    if CASES[case][SCHEDULE_KEY] == "linear":
        np.testing.assert_array_equal(weights, want)


@pytest.mark.parametrize("case", ["A", "B", "C"])
def test_guidance_weight_per_step_equals_the_reference(rtc_io, case):
    beta = jnp.full(2, rtc_io[f"case_{case}/beta"], jnp.float32)
    got = [guidance.guidance_weight(jnp.float32(t), beta) for t in rtc_io[f"case_{case}/times"]]
    want = np.repeat(rtc_io[f"case_{case}/guidance_weight"][:, None], 2, axis=1)
    np.testing.assert_allclose(np.array(got), want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("case", ["A", "B", "C"])
def test_guided_actions_match_openpi_with_the_reference_guidance(engine, cache, rtc_io, case):
    actions = engine.denoise(cache, rtc_io["in/noise"], 10, guidance=_case_rows(rtc_io, case))
    np.testing.assert_allclose(actions, rtc_io[f"case_{case}/actions"], rtol=0, atol=1e-4)
    # Guidance really acted: the frozen actions moved far towards the previous chunk.
    frozen = int(rtc_io[f"case_{case}/d"][1])
    plain = rtc_io["ref/actions_plain"][1, :frozen]
    target = rtc_io["in/prev_chunk_aligned"][1, :frozen]
    assert np.abs(actions[1, :frozen] - target).mean() < 0.5 * np.abs(plain - target).mean()


def test_row_without_weights_in_a_guided_batch_gets_exactly_the_plain_actions(engine, cache, rtc_io):
    """Case B row 0 (delay = horizon = 0) and a row passed as None, beside a guided row, in the guided
    program: the plain program's actions bit for bit (the vjp's forward rounds as the plain forward does;
    `gemma.RMSNorm`). The guided row itself moves far."""
    plain = np.asarray(engine.denoise(cache, rtc_io["in/noise"], 10))
    zero_weights = engine.denoise(cache, rtc_io["in/noise"], 10, guidance=_case_rows(rtc_io, "B"))
    no_guidance = engine.denoise(cache, rtc_io["in/noise"], 10, guidance=[None, _case_rows(rtc_io, "B")[1]])
    np.testing.assert_array_equal(zero_weights[0], plain[0])
    np.testing.assert_array_equal(no_guidance[0], plain[0])
    assert np.abs(zero_weights[1] - plain[1]).max() > 0.1
    np.testing.assert_allclose(plain, rtc_io["ref/actions_plain"], rtol=0, atol=1e-5)


def test_batch_without_guided_rows_gets_exactly_the_plain_actions(engine, cache, rtc_io):
    """No row with a non-zero weight (None, or delay = horizon = 0): the plain program runs, bit for bit."""
    plain = np.asarray(engine.denoise(cache, rtc_io["in/noise"], 10))
    unguided = [None, ChunkGuidance(rtc_io["in/prev_chunk_aligned"][1], delay=0, horizon=0)]
    np.testing.assert_array_equal(engine.denoise(cache, rtc_io["in/noise"], 10, guidance=unguided), plain)


def _mixed_rows(rtc_io) -> list[ChunkGuidance | None]:
    prev = rtc_io["in/prev_chunk_aligned"]
    return [
        ChunkGuidance(prev[0], delay=2, horizon=6),
        None,
        ChunkGuidance(prev[1], delay=4, horizon=8, schedule="linear", max_guidance_weight=1.0),
        ChunkGuidance(prev[0][::-1], delay=1, horizon=10, schedule="ones", max_guidance_weight=3.0),
    ]


def test_mixed_batch_equals_each_row_alone(engine, cache, rtc_io):
    """Four rows (three guided with different delay, horizon, schedule and beta, one plain) in one batch
    give what each row gives in a batch of its own."""
    rows = np.array([0, 1, 1, 0])
    batch_cache = engine.select_rows(cache, rows)
    noise = rtc_io["in/noise2"][rows] + rtc_io["in/noise"][rows[::-1]]
    mixed = engine.denoise(batch_cache, noise, 10, guidance=_mixed_rows(rtc_io))
    for i, row in enumerate(_mixed_rows(rtc_io)):
        alone = engine.denoise(
            engine.select_rows(cache, rows[i : i + 1]), noise[i : i + 1], 10, guidance=[row]
        )
        np.testing.assert_allclose(mixed[i], alone[0], rtol=0, atol=1e-5, err_msg=f"row {i}")


def test_rtc_rows_joining_and_leaving_never_recompile(engine, cache, rtc_io):
    noise = rtc_io["in/noise"]
    prev = rtc_io["in/prev_chunk_aligned"]
    engine.denoise(cache, noise, 10)
    engine.denoise(cache, noise, 10, guidance=_case_rows(rtc_io, "A"))
    patterns = [
        [ChunkGuidance(prev[0], 3, 7)],
        [None, ChunkGuidance(prev[1], 0, 4, "zeros", 2.0)],
        (),
        _case_rows(rtc_io, "C"),
        [None, None],
        [ChunkGuidance(prev[1], 5, 5, "ones"), ChunkGuidance(prev[0], 1, 9, "linear", 0.5)],
    ]
    with CompileCounter() as counter:
        for rows in patterns:
            np.asarray(engine.denoise(cache, noise, 10, guidance=rows))
    assert counter.count == 0


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (dict(delay=-1, horizon=4), "0 <= delay <= horizon <= 10"),
        (dict(delay=5, horizon=3), "0 <= delay <= horizon <= 10"),
        (dict(delay=2, horizon=11), "0 <= delay <= horizon <= 10"),
        (dict(delay=2.5, horizon=6), "RTC delay and horizon must be ints, got 2.5, 6"),
        (dict(delay=2, horizon=6, schedule="cosine"), "unknown RTC schedule 'cosine'"),
        (dict(delay=2, horizon=6, max_guidance_weight=0.0), "max_guidance_weight must be > 0"),
        (dict(delay=2, horizon=6, prev_chunk=np.zeros((10, 7))), r"prev_chunk has shape \(10, 7\)"),
        (dict(delay=2, horizon=6, prev_chunk=np.full((10, 32), np.nan)), "non-finite"),
    ],
)
def test_bad_guidance_is_a_one_line_error(engine, cache, rtc_io, row, message):
    row = {"prev_chunk": rtc_io["in/prev_chunk_aligned"][0], **row}
    with pytest.raises(InvalidArgumentError, match=message) as error:
        engine.denoise(cache, rtc_io["in/noise"], 10, guidance=[ChunkGuidance(**row)])
    assert "\n" not in str(error.value)


def test_more_guidance_rows_than_the_batch_is_an_error(engine, cache, rtc_io):
    with pytest.raises(ValueError, match="3 guidance rows for a batch of 2"):
        engine.denoise(cache, rtc_io["in/noise"], 10, guidance=[None] * 3)
