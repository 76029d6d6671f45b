"""Language decoding from the shared prefix cache, against upstream openpi and the OxyGen reference."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import GOLDEN, golden_inputs

from oxygen_jax.engine import kernels
from oxygen_jax.engine.engine import Engine
from oxygen_jax.models import inputs, pi05

ATOL_LOGPROBS = 1e-4
STEPS = 24


@pytest.fixture(scope="module")
def text_openpi():
    return np.load(GOLDEN / "text_io_openpi.npz")


@pytest.fixture(scope="module")
def text_oxygen():
    return np.load(GOLDEN / "text_io.npz")


@pytest.fixture(scope="module")
def engine(golden_params, tiny_config):
    return Engine(golden_params, tiny_config, eos_id=-1)  # the golden decodes never stop early


def _full_logprobs(engine, cache, tokens):
    """Full-vocabulary log-probs [B, N, V] of each step when `tokens` are fed (teacher forcing)."""
    cfg = engine.config
    positions = cache.length[:, None] + jnp.arange(tokens.shape[1] - 1)[None]
    hidden, _ = pi05.text_forward(
        engine.params, cfg, tokens[:, :-1], positions, (cache.k, cache.v), cache.mask
    )
    hidden = jnp.concatenate([cache.last_hidden[:, None], hidden], axis=1)
    return jax.nn.log_softmax(pi05.text_logits(engine.params, cfg, hidden), axis=-1)


def _rows(obs: pi05.Observation, rows) -> pi05.Observation:
    return jax.tree.map(lambda x: np.asarray(x)[rows], obs)


def test_first_token_from_last_valid_prefix_column(engine, golden_obs, text_openpi):
    cache = engine.prefill(golden_obs)
    np.testing.assert_array_equal(pi05.last_valid_index(cache.mask), text_openpi["prefix/last_valid_index"])
    np.testing.assert_allclose(cache.last_hidden, text_openpi["prefix/h_first"], rtol=0, atol=2e-5)
    first = jax.nn.log_softmax(pi05.text_logits(engine.params, engine.config, cache.last_hidden))
    np.testing.assert_allclose(first, text_openpi["first/logprobs"], rtol=0, atol=ATOL_LOGPROBS)


def test_bidirectional_greedy_matches_openpi(engine, golden_obs, text_openpi):
    out = engine.generate(engine.prefill(golden_obs), STEPS)
    expected_tokens = text_openpi["greedy/tokens"]
    np.testing.assert_array_equal(out.tokens, expected_tokens)
    emitted = np.take_along_axis(text_openpi["greedy/logprobs"], expected_tokens[..., None], -1)[..., 0]
    np.testing.assert_allclose(out.logprobs, emitted, rtol=0, atol=ATOL_LOGPROBS)
    np.testing.assert_array_equal(out.lengths, [STEPS, STEPS])


def test_bidirectional_teacher_forcing_matches_openpi(engine, golden_obs, text_openpi):
    cache = engine.prefill(golden_obs)
    tf_tokens = text_openpi["in/tf_tokens"]
    np.testing.assert_allclose(
        engine.score(cache, tf_tokens), text_openpi["tf/token_logprobs"], rtol=0, atol=ATOL_LOGPROBS
    )
    # Every step's full distribution: tf/logprobs[:, i] predicts tf_tokens[:, i + 1].
    full = _full_logprobs(engine, cache, jnp.asarray(tf_tokens))
    np.testing.assert_allclose(full[:, 1:], text_openpi["tf/logprobs"][:, :-1], rtol=0, atol=ATOL_LOGPROBS)


@pytest.mark.integration
@pytest.mark.parametrize("case", ["elem0", "elem0_subtask_prompt"])
@pytest.mark.parametrize("matvec_split", [1, 4])
def test_causal_text_matches_oxygen_reference(
    golden_params, tiny_config, model_io, text_oxygen, case, matvec_split
):
    """One request decoded alone; with matvec_split > 1 its one-row matmuls run split over that many
    cores (`KernelPolicy.matmul`), which must not change the text."""
    causal = Engine(
        golden_params,
        dataclasses.replace(tiny_config, prefix_attention="causal_text"),
        eos_id=-1,
        kernel_policy=kernels.KernelPolicy(matvec_split=matvec_split),
    )
    arrays = {k: v[:1] for k, v in golden_inputs(model_io).items()}
    if case == "elem0_subtask_prompt":
        arrays["tokenized_prompt"] = text_oxygen[f"{case}/tokenized_prompt"]
        arrays["tokenized_prompt_mask"] = text_oxygen[f"{case}/tokenized_prompt_mask"]
    cache = causal.prefill(inputs.observation_from_arrays(arrays, causal.config))
    out = causal.generate(cache, STEPS)
    expected = text_oxygen[f"{case}/tokens"]
    np.testing.assert_array_equal(out.tokens, expected)
    reference = text_oxygen[f"{case}/logprobs_all_steps"]
    full = _full_logprobs(causal, cache, jnp.asarray(expected))
    np.testing.assert_allclose(full, reference, rtol=0, atol=ATOL_LOGPROBS)
    emitted = np.take_along_axis(reference, expected[..., None], -1)[..., 0]
    np.testing.assert_allclose(out.logprobs, emitted, rtol=0, atol=ATOL_LOGPROBS)


@pytest.mark.integration
def test_masked_camera_is_invisible(engine, golden_params, tiny_config, golden_obs, text_openpi):
    """Row 1 masks its right wrist camera: same text as a model that never had that camera's tokens."""
    masked = _rows(golden_obs, [1])
    two_cameras = dataclasses.replace(tiny_config, image_keys=tiny_config.image_keys[:2])
    compact = Engine(golden_params, two_cameras, eos_id=-1)
    compact_obs = dataclasses.replace(
        masked,
        images={k: masked.images[k] for k in two_cameras.image_keys},
        image_masks={k: masked.image_masks[k] for k in two_cameras.image_keys},
    )
    cache_masked, cache_compact = engine.prefill(masked), compact.prefill(compact_obs)
    np.testing.assert_array_equal(cache_masked.length, cache_compact.length)
    out_masked, out_compact = engine.generate(cache_masked, STEPS), compact.generate(cache_compact, STEPS)
    np.testing.assert_array_equal(out_masked.tokens, out_compact.tokens)
    np.testing.assert_allclose(out_masked.logprobs, out_compact.logprobs, rtol=0, atol=ATOL_LOGPROBS)
    np.testing.assert_array_equal(out_compact.tokens, text_openpi["compact_elem1/greedy_tokens"])
    first = jax.nn.log_softmax(pi05.text_logits(compact.params, compact.config, cache_compact.last_hidden))
    np.testing.assert_allclose(first, text_openpi["compact_elem1/first_logprobs"], rtol=0, atol=ATOL_LOGPROBS)


@pytest.mark.integration
def test_shared_prefill_feeds_actions_and_text(golden_params, tiny_config, golden_obs, model_io):
    engine = Engine(golden_params, tiny_config, eos_id=-1)
    actions, text = engine.act_and_speak(golden_obs, model_io["in/noise"], 10, STEPS)
    assert engine.stats.prefill_calls == 1
    expected = jax.jit(pi05.sample_actions, static_argnums=1)(
        golden_params, tiny_config, golden_obs, model_io["in/noise"], 10
    )
    np.testing.assert_allclose(actions, expected, rtol=0, atol=1e-6)
    alone = engine.generate(engine.prefill(golden_obs), STEPS)
    np.testing.assert_array_equal(text.tokens, alone.tokens)
    np.testing.assert_array_equal(text.logprobs, alone.logprobs)


@pytest.mark.integration
def test_batched_rows_decode_as_alone(engine, model_io, text_oxygen, golden_obs):
    """Different prompts, camera masks and stop times in one batch: each row as if decoded alone."""
    subtask = dataclasses.replace(
        _rows(golden_obs, [0]),
        tokenized_prompt=text_oxygen["elem0_subtask_prompt/tokenized_prompt"],
        tokenized_prompt_mask=text_oxygen["elem0_subtask_prompt/tokenized_prompt_mask"],
    )
    batch = jax.tree.map(lambda *x: np.concatenate(x), golden_obs, subtask)
    max_new = np.array([24, 7, 15])
    stopping = Engine(engine.params, engine.config, eos_id=962)  # the subtask row's greedy token
    out = stopping.generate(stopping.prefill(batch), STEPS, max_new=max_new)
    np.testing.assert_array_equal(out.lengths, [24, 7, 1])
    for row in range(3):
        alone = stopping.generate(stopping.prefill(_rows(batch, [row])), STEPS, max_new=max_new[row])
        np.testing.assert_array_equal(out.tokens[row], alone.tokens[0])
        np.testing.assert_allclose(out.logprobs[row], alone.logprobs[0], rtol=0, atol=1e-5)
        assert (np.asarray(out.tokens[row, out.lengths[row] :]) == 0).all()


@pytest.mark.integration
def test_sampling_is_reproducible_and_top_p_small_is_greedy(engine, golden_obs):
    cache = engine.prefill(golden_obs)
    key = 7
    a = engine.generate(cache, 8, temperature=10.0, seed=key)
    b = engine.generate(cache, 8, temperature=10.0, seed=key)
    other = engine.generate(cache, 8, temperature=10.0, seed=8)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert (np.asarray(a.tokens) != np.asarray(other.tokens)).any()
    assert (np.asarray(a.tokens) != 1001).any()  # a hot temperature leaves this model's greedy token
    nucleus = engine.generate(cache, 8, temperature=10.0, top_p=1e-6, seed=key)
    np.testing.assert_array_equal(nucleus.tokens, engine.generate(cache, 8).tokens)


@pytest.mark.integration
def test_skipping_a_camera_masked_in_every_row_changes_nothing(
    golden_params, tiny_config, golden_obs, model_io
):
    """Row 1 masks its right wrist camera; alone, that camera is left out of vision and prefill."""
    row = _rows(golden_obs, [1])
    skipping, computing = (
        Engine(golden_params, tiny_config),
        Engine(golden_params, tiny_config, skip_masked_cameras=False),
    )
    assert skipping.masked_cameras(row) == ("right_wrist_0_rgb",)
    short, full = skipping.prefill(row), computing.prefill(row)
    assert short.mask.shape[1] == full.mask.shape[1] - tiny_config.image_tokens
    noise = model_io["in/noise"][1:]
    np.testing.assert_allclose(
        skipping.denoise(short, noise), computing.denoise(full, noise), rtol=0, atol=1e-5
    )
    text_short, text_full = skipping.generate(short, STEPS), computing.generate(full, STEPS)
    np.testing.assert_array_equal(text_short.tokens, text_full.tokens)
    np.testing.assert_allclose(text_short.logprobs, text_full.logprobs, rtol=0, atol=1e-5)
