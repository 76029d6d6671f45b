"""Real-time chunking by conditioning: a model trained with a clean prefix (`max_clean_prefix`) takes the
actions the robot executes meanwhile as they are, at flow time 0, and samples the rest of the chunk given
them (`guidance.conditioned_denoise`); its training loss (`loss.compute_loss`) gives the same prefix clean
and trains the rest. On the golden tiny model and inputs (rtc_io.npz, train_io.npz), whose weights were
not trained this way: these tests check the mechanics, the shipped `pi05_detour_prefix` the behaviour."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import GOLDEN

from oxygen_jax import config as config_lib
from oxygen_jax.engine.api import ChunkGuidance
from oxygen_jax.engine.compile_counter import CompileCounter
from oxygen_jax.engine.engine import Engine
from oxygen_jax.models import pi05
from oxygen_jax.training import batch as train_batch
from oxygen_jax.training import loss

pytestmark = pytest.mark.integration

MAX_CLEAN = 5


@pytest.fixture(scope="module")
def rtc_io():
    return np.load(GOLDEN / "rtc_io.npz")


@pytest.fixture(scope="module")
def conditioned_config(tiny_config):
    return dataclasses.replace(tiny_config, max_clean_prefix=MAX_CLEAN)


@pytest.fixture(scope="module")
def engine(golden_params, conditioned_config):
    return Engine(golden_params, conditioned_config)


@pytest.fixture(scope="module")
def cache(engine, golden_obs):
    return engine.prefill(golden_obs)


def test_one_time_per_token_equal_across_tokens_is_the_plain_velocity(engine, cache, rtc_io):
    """time [B, H] with every token at the row's time gives the velocity of time [B] (openpi's), to
    float32 rounding: the per-token path changes nothing for a row with nothing frozen."""
    x_t, time = jnp.asarray(rtc_io["in/noise"]), jnp.array([0.7, 0.2], jnp.float32)
    plain = pi05.predict_velocity(engine.params, engine.config, cache, x_t, time)
    per_token = pi05.predict_velocity(
        engine.params, engine.config, cache, x_t, jnp.broadcast_to(time[:, None], x_t.shape[:2])
    )
    np.testing.assert_allclose(per_token, plain, rtol=0, atol=1e-6)


def test_frozen_actions_are_the_previous_chunks_and_the_rest_depends_on_them(engine, cache, rtc_io):
    noise, prev = rtc_io["in/noise"], rtc_io["in/prev_chunk_aligned"]
    rows = [ChunkGuidance(prev[0], delay=3, horizon=3), ChunkGuidance(prev[1], delay=5, horizon=8)]
    actions = np.asarray(engine.denoise(cache, noise, 10, guidance=rows))
    np.testing.assert_array_equal(actions[0, :3], prev[0, :3])
    np.testing.assert_array_equal(actions[1, :5], prev[1, :5])
    plain = np.asarray(engine.denoise(cache, noise, 10))
    assert np.abs(actions[:, 5:] - plain[:, 5:]).max() > 1e-3  # the free actions see the frozen ones
    # Only the frozen actions of prev_chunk count (not its later ones, nor the noise under the frozen).
    later_changed = [
        ChunkGuidance(np.concatenate([prev[0, :3], -prev[0, 3:]]), delay=3, horizon=10),
        ChunkGuidance(np.concatenate([prev[1, :5], prev[0, 5:]]), delay=5, horizon=5),
    ]
    other_noise = noise.copy()
    other_noise[0, :3] = noise[1, :3]
    other_noise[1, :5] = -noise[1, :5]
    again = engine.denoise(cache, other_noise, 10, guidance=later_changed)
    np.testing.assert_allclose(again, actions, rtol=0, atol=1e-6)


def test_row_with_nothing_frozen_gets_the_plain_actions(engine, cache, rtc_io):
    """Beside a conditioned row: a row passed as None, and one with delay 0 (nothing frozen; its guidance
    horizon has no meaning here); a batch with no frozen action runs the plain program, bit for bit."""
    noise, prev = rtc_io["in/noise"], rtc_io["in/prev_chunk_aligned"]
    plain = np.asarray(engine.denoise(cache, noise, 10))
    for row in (None, ChunkGuidance(prev[0], delay=0, horizon=6)):
        mixed = engine.denoise(cache, noise, 10, guidance=[row, ChunkGuidance(prev[1], 4, 4)])
        np.testing.assert_allclose(mixed[0], plain[0], rtol=0, atol=1e-6)
    no_frozen = [ChunkGuidance(prev[0], delay=0, horizon=6), None]
    np.testing.assert_array_equal(engine.denoise(cache, noise, 10, guidance=no_frozen), plain)


def test_delay_beyond_training_conditions_on_the_trained_prefix(engine, cache, rtc_io):
    """The model saw at most MAX_CLEAN clean actions: a longer delay conditions on that many."""
    noise, prev = rtc_io["in/noise"], rtc_io["in/prev_chunk_aligned"]
    longer = engine.denoise(cache, noise, 10, guidance=[ChunkGuidance(prev[0], 8, 9), None])
    trained = engine.denoise(cache, noise, 10, guidance=[ChunkGuidance(prev[0], MAX_CLEAN, 9), None])
    np.testing.assert_array_equal(longer, trained)


def _mixed_rows(prev: np.ndarray) -> list[ChunkGuidance | None]:
    return [
        ChunkGuidance(prev[0], 2, 6),
        None,
        ChunkGuidance(prev[1], 4, 4),
        ChunkGuidance(prev[0][::-1], 1, 1),
    ]


def test_mixed_batch_equals_each_row_alone(engine, cache, rtc_io):
    rows = np.array([0, 1, 1, 0])
    batch_cache = engine.select_rows(cache, rows)
    noise = rtc_io["in/noise2"][rows] + rtc_io["in/noise"][rows[::-1]]
    guidance = _mixed_rows(rtc_io["in/prev_chunk_aligned"])
    mixed = engine.denoise(batch_cache, noise, 10, guidance=guidance)
    for i, row in enumerate(guidance):
        alone = engine.denoise(
            engine.select_rows(cache, rows[i : i + 1]), noise[i : i + 1], 10, guidance=[row]
        )
        np.testing.assert_allclose(mixed[i], alone[0], rtol=0, atol=1e-5, err_msg=f"row {i}")


def test_conditioned_rows_joining_and_leaving_never_recompile(engine, cache, rtc_io):
    noise, prev = rtc_io["in/noise"], rtc_io["in/prev_chunk_aligned"]
    engine.denoise(cache, noise, 10)
    engine.denoise(cache, noise, 10, guidance=[ChunkGuidance(prev[0], 1, 1)])
    patterns = [
        [ChunkGuidance(prev[0], 3, 7)],
        [None, ChunkGuidance(prev[1], 5, 5)],
        (),
        [ChunkGuidance(prev[1], 9, 9), ChunkGuidance(prev[0], 0, 4)],
        [None, None],
    ]
    with CompileCounter() as counter:
        for rows in patterns:
            np.asarray(engine.denoise(cache, noise, 10, guidance=rows))
    assert counter.count == 0


def test_max_clean_prefix_must_leave_an_action_to_sample(tiny_config):
    with pytest.raises(ValueError, match=r"max_clean_prefix must lie in \[0, 9\], got 10"):
        dataclasses.replace(tiny_config, max_clean_prefix=10)


# --- training ---


@pytest.fixture(scope="module")
def train_arrays():
    train_io = np.load(GOLDEN / "train_io.npz")
    return {k[3:]: train_io[k] for k in train_io.files if k.startswith("in/")}


def test_clean_prefix_draw_covers_every_delay_up_to_the_maximum():
    clean = np.asarray(loss.sample_clean_prefix(jax.random.key(0), 4000, 10, MAX_CLEAN))
    delays = clean.sum(axis=1)
    np.testing.assert_array_equal(clean, np.arange(10)[None, :] < delays[:, None])  # a prefix per row
    counts = np.bincount(delays, minlength=10)
    assert counts[MAX_CLEAN + 1 :].sum() == 0
    assert counts[: MAX_CLEAN + 1].min() > 4000 / (MAX_CLEAN + 1) * 0.85  # ~uniform over 0..MAX_CLEAN


def test_least_clean_prefix_raises_each_rows_draw_and_leaves_the_others_as_drawn():
    """Rows with a least clean prefix draw d from it up to the maximum (one above it: the maximum); a batch
    whose minimums are all 0 draws what a batch without them draws (trainings without the column are
    unchanged)."""
    rng = jax.random.key(0)
    minimum = jnp.asarray(np.tile([0, 3, 5, 7], 1000), jnp.int32)
    delays = np.asarray(loss.sample_clean_prefix(rng, 4000, 10, MAX_CLEAN, minimum)).sum(axis=1)
    for least in (0, 3, 5, 7):
        rows = delays[np.tile([0, 3, 5, 7], 1000) == least]
        low = min(least, MAX_CLEAN)
        assert rows.min() == low and rows.max() == MAX_CLEAN
        assert set(np.unique(rows)) == set(range(low, MAX_CLEAN + 1))
    zeros = loss.sample_clean_prefix(rng, 64, 10, MAX_CLEAN, jnp.zeros(64, jnp.int32))
    np.testing.assert_array_equal(zeros, loss.sample_clean_prefix(rng, 64, 10, MAX_CLEAN))


def test_batch_carries_each_examples_least_clean_prefix(train_arrays, conditioned_config):
    batch = train_batch.batch_from_arrays(
        {**train_arrays, "min_clean_prefix": np.array([2, 5])}, conditioned_config
    )
    np.testing.assert_array_equal(batch.min_clean_prefix, [2, 5])
    assert train_batch.batch_from_arrays(train_arrays, conditioned_config).min_clean_prefix is None
    with pytest.raises(ValueError, match="'min_clean_prefix': expected int"):
        train_batch.batch_from_arrays(
            {**train_arrays, "min_clean_prefix": np.array([2.0, 5.0])}, conditioned_config
        )


def test_flow_loss_never_trains_an_action_under_the_least_clean_prefix(
    golden_params, conditioned_config, train_arrays
):
    """With every row's least clean prefix at the maximum, the loss does not depend on the noise under it,
    whatever d the rng draws: those actions are only ever given, never taught."""
    compute = jax.jit(loss.compute_loss, static_argnums=(1, 4))
    actions_only = loss.LossConfig(text_loss_weight=0.0)
    noise = train_arrays["noise"]
    under = np.where((np.arange(10) < MAX_CLEAN)[None, :, None], noise[::-1] * 3, noise)
    least = np.full(2, MAX_CLEAN)

    def flow(noise, rng):
        arrays = {**train_arrays, "noise": noise, "min_clean_prefix": least}
        batch = train_batch.batch_from_arrays(arrays, conditioned_config)
        return np.asarray(compute(golden_params, conditioned_config, batch, rng, actions_only).loss_flow)

    for seed in range(3):
        np.testing.assert_array_equal(flow(under, jax.random.key(seed)), flow(noise, jax.random.key(seed)))


def test_flow_loss_trains_the_free_actions_given_the_clean_ones(
    golden_params, conditioned_config, train_arrays
):
    """With the clean prefix drawn from the rng, the loss does not depend on the noise under it (those
    tokens get the clean actions), and does on the noise of the free actions; with max_clean_prefix = 0 the
    same call is openpi's loss."""
    compute = jax.jit(loss.compute_loss, static_argnums=(1, 4))
    actions_only = loss.LossConfig(text_loss_weight=0.0)
    rng = jax.random.key(3)
    clean = np.asarray(loss.sample_clean_prefix(rng, 2, 10, MAX_CLEAN))
    assert clean.any() and (~clean).any()

    def flow(noise, config):
        arrays = {**train_arrays, "noise": noise}
        batch = train_batch.batch_from_arrays(arrays, config)
        return np.asarray(compute(golden_params, config, batch, rng, actions_only).loss_flow)

    noise = train_arrays["noise"]
    base = flow(noise, conditioned_config)
    under_clean = np.where(clean[..., None], noise[::-1] * 3, noise)
    np.testing.assert_array_equal(flow(under_clean, conditioned_config), base)
    under_free = np.where(clean[..., None], noise, noise[::-1] * 3)
    assert np.all(np.abs(flow(under_free, conditioned_config) - base) > 1e-4)
    plain_config = dataclasses.replace(conditioned_config, max_clean_prefix=0)
    assert np.abs(flow(under_clean, plain_config) - flow(noise, plain_config)).max() > 1e-4


def test_shipped_prefix_config_is_the_wide_model_with_half_the_horizon_clean():
    cfg = config_lib.load_config("pi05_detour_prefix")
    wide = config_lib.load_config("pi05_detour_wide")
    assert cfg.model.max_clean_prefix == cfg.model.action_horizon // 2 == 5
    assert cfg.model.action_expert == wide.model.action_expert
    assert config_lib.model_config(cfg).max_clean_prefix == 5
