"""Prefix extension: task suffixes appended to a shared prefix cache decode as one prefill would."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import GOLDEN

from oxygen_jax.engine.compile_counter import CompileCounter
from oxygen_jax.engine.engine import Engine
from oxygen_jax.models import pi05

ATOL_LOGPROBS = 1e-4
ATOL_HIDDEN = 2e-5
STEPS = 12
# Task t extends prefix row ROWS[t] with SUFFIXES[t]; row 1 masks its right wrist camera.
ROWS = [0, 1, 0]
SUFFIXES = [[17, 250, 3, 99, 4], [600], [42, 43, 44, 45, 46, 47, 48, 49, 50, 51]]


@pytest.fixture(scope="module")
def text_openpi():
    return np.load(GOLDEN / "text_io_openpi.npz")


def _engine(params, config, mode):
    return Engine(params, dataclasses.replace(config, prefix_attention=mode), eos_id=-1)


def _single_prefill(engine, obs, rows, suffixes, width):
    """The reference: one pass over [images, prompt, suffix] per task, suffix causal (ar_mask True)
    after the prefix in the config's prefix-attention mode, suffix padded to `width` columns."""
    params, cfg = engine.params, engine.config
    tokens, mask, ar_mask = pi05.embed_prefix(params, cfg, obs)
    tokens, mask = tokens[np.array(rows)], mask[np.array(rows)]
    suffix = np.zeros((len(rows), width), np.int32)
    suffix_mask = np.zeros((len(rows), width), bool)
    for t, s in enumerate(suffixes):
        suffix[t, : len(s)], suffix_mask[t, : len(s)] = s, True
    llm = pi05.Pi05(cfg).bind({"params": params}).PaliGemma.llm
    tokens = jnp.concatenate([tokens, llm.embed(suffix)], axis=1)
    mask = jnp.concatenate([mask, suffix_mask], axis=1)
    ar_mask = jnp.concatenate([ar_mask, jnp.ones(width, bool)])
    positions = jnp.cumsum(mask, axis=1) - 1
    attn = pi05.make_attn_mask(mask, ar_mask)
    (hidden, _), (k, v) = llm([tokens, None], positions, attn)
    k, v = jnp.stack(k), jnp.stack(v)
    last = jnp.take_along_axis(hidden, pi05.last_valid_index(mask)[:, None, None], axis=1)[:, 0]
    return pi05.PrefixCache(k=k, v=v, mask=mask, positions=positions, length=mask.sum(1), last_hidden=last)


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["bidirectional", "causal_text"])
def test_extension_equals_single_prefill_with_causal_suffix(golden_params, tiny_config, golden_obs, mode):
    """Three tasks on two observations (one with a masked camera): the extended rows' valid K/V, next
    position and first-token state equal a single prefill of [images, prompt, suffix], and so do the
    greedy text and the teacher-forced log-probs of every continuation step decoded from them."""
    engine = _engine(golden_params, tiny_config, mode)
    extended = engine.extend(engine.prefill(golden_obs), np.array(ROWS), SUFFIXES)
    n = len(SUFFIXES)
    width = extended.mask.shape[1] - engine.config.prefix_len
    assert extended.mask.shape[0] == 4 and width == 16  # 3 tasks padded to 4, 10 tokens to 16 columns
    extended = engine.select_rows(extended, np.arange(n))
    reference = _single_prefill(engine, golden_obs, ROWS, SUFFIXES, width)

    np.testing.assert_array_equal(extended.mask, reference.mask)
    np.testing.assert_array_equal(extended.length, reference.length)
    valid = np.asarray(reference.mask)
    np.testing.assert_array_equal(
        np.asarray(extended.positions)[valid], np.asarray(reference.positions)[valid]
    )
    for got, want in ((extended.k, reference.k), (extended.v, reference.v)):
        np.testing.assert_allclose(
            np.asarray(got)[:, valid], np.asarray(want)[:, valid], rtol=0, atol=ATOL_HIDDEN
        )
    np.testing.assert_allclose(extended.last_hidden, reference.last_hidden, rtol=0, atol=ATOL_HIDDEN)

    out, expected = engine.generate(extended, STEPS), engine.generate(reference, STEPS)
    np.testing.assert_array_equal(out.tokens, expected.tokens)
    np.testing.assert_allclose(out.logprobs, expected.logprobs, rtol=0, atol=ATOL_LOGPROBS)
    forced = np.random.default_rng(0).integers(4, engine.config.vocab_size, (n, STEPS))
    np.testing.assert_allclose(
        engine.score(extended, forced), engine.score(reference, forced), rtol=0, atol=ATOL_LOGPROBS
    )


def test_extension_matches_openpi_teacher_forcing(golden_params, tiny_config, golden_obs, text_openpi):
    """Upstream openpi's incremental decode fed tf_tokens: extending the prefix by the first m of
    them leaves exactly the state openpi had after m steps, so the next distribution and the
    log-probs of the remaining tokens are openpi's (both rows, one with a masked camera)."""
    engine = _engine(golden_params, tiny_config, "bidirectional")
    tf_tokens, m = text_openpi["in/tf_tokens"], 7
    extended = engine.extend(engine.prefill(golden_obs), np.array([0, 1]), [list(r[:m]) for r in tf_tokens])
    extended = engine.select_rows(extended, np.arange(2))
    first = jax.nn.log_softmax(pi05.text_logits(engine.params, engine.config, extended.last_hidden))
    np.testing.assert_allclose(first, text_openpi["tf/logprobs"][:, m - 1], rtol=0, atol=ATOL_LOGPROBS)
    np.testing.assert_allclose(
        engine.score(extended, tf_tokens[:, m:]),
        text_openpi["tf/token_logprobs"][:, m:],
        rtol=0,
        atol=ATOL_LOGPROBS,
    )


def test_extension_compiles_once_per_bucket(golden_params, tiny_config, golden_obs):
    """Frames with 3 or 4 tasks (one bucket of 4), different suffix lengths and contents reuse the
    compiled call; a fixed suffix_len keeps it at one for any suffix that fits."""
    engine = _engine(golden_params, tiny_config, "bidirectional")
    cache = engine.prefill(golden_obs)
    engine.extend(cache, np.array([0, 1, 1]), [[5, 6], [7], [8, 9, 10]], suffix_len=16)  # warm-up
    with CompileCounter() as compiles:
        for tasks in ([[1, 2, 3, 4], [5], [6], [7]], [[11] * 16, [12], [13, 14]], [[20], [21], [22], [23]]):
            rows = np.arange(len(tasks)) % 2
            jax.block_until_ready(engine.extend(cache, rows, tasks, suffix_len=16))
    assert compiles.count == 0


@pytest.mark.parametrize("suffixes", [[[]], [[1] * 17]])
def test_bad_suffix_is_one_line_error(golden_params, tiny_config, golden_obs, suffixes):
    engine = _engine(golden_params, tiny_config, "bidirectional")
    with pytest.raises(ValueError, match="suffix"):
        engine.extend(engine.prefill(golden_obs), np.array([0]), suffixes, suffix_len=16)
