"""Prompt-length buckets: a prefill of the prompt columns a batch uses gives what the padded width gives."""

import numpy as np
import pytest

from oxygen_jax.engine import prompt_buckets
from oxygen_jax.engine.compile_counter import CompileCounter
from oxygen_jax.engine.engine import Engine

ATOL = 1e-5


@pytest.fixture(scope="module")
def engines(golden_params, tiny_config):
    """(bucketed, unbucketed): the tiny config's 48 prompt columns cut to 32 for the golden prompts."""
    bucketed = Engine(golden_params, tiny_config, eos_id=-1)
    return bucketed, Engine(golden_params, tiny_config, eos_id=-1, prompt_buckets=())


def test_default_buckets_and_widths():
    assert prompt_buckets.default_buckets(200) == (32, 64, 128, 200)
    assert prompt_buckets.default_buckets(48) == (32, 48)
    assert prompt_buckets.default_buckets(24) == (24,)
    mask = np.zeros((2, 200), bool)
    mask[0, :20], mask[1, 40] = True, True  # the last valid column counts, not the number of tokens
    assert prompt_buckets.width(mask, (32, 64, 128, 200)) == 64
    assert prompt_buckets.width(mask[:1], (32, 64, 128, 200)) == 32
    assert prompt_buckets.width(mask, ()) == 200
    assert prompt_buckets.width(mask[:, :48], (32, 64, 128, 200)) == 48  # no bucket below the width


def test_golden_prompts_prefill_32_of_48_columns(engines, golden_obs):
    bucketed, _ = engines
    cut, pad = bucketed.cut_prompt(golden_obs)
    assert (cut.tokenized_prompt.shape[1], pad) == (32, 16)


@pytest.mark.integration
def test_bucketed_prefill_gives_the_unbucketed_cache_actions_and_text(engines, golden_obs):
    pairs = [(engine, engine.prefill(golden_obs)) for engine in engines]
    a, b = (engine.to_host(cache) for engine, cache in pairs)
    assert a.k.shape == b.k.shape  # padded back: every program downstream sees the shapes it always saw
    np.testing.assert_array_equal(a.mask, b.mask)
    np.testing.assert_array_equal(a.positions, b.positions)
    np.testing.assert_array_equal(a.length, b.length)
    np.testing.assert_allclose(a.last_hidden, b.last_hidden, rtol=0, atol=ATOL)
    valid = a.mask[None, :, :, None, None]
    np.testing.assert_allclose(np.where(valid, a.k, 0), np.where(valid, b.k, 0), rtol=0, atol=ATOL)
    np.testing.assert_allclose(np.where(valid, a.v, 0), np.where(valid, b.v, 0), rtol=0, atol=ATOL)
    noise = np.random.default_rng(0).standard_normal((2, 10, 32)).astype(np.float32)
    actions = [engine.to_host(engine.denoise(cache, noise, 10)) for engine, cache in pairs]
    np.testing.assert_allclose(actions[0], actions[1], rtol=0, atol=ATOL)
    texts = [engine.generate(cache, 12) for engine, cache in pairs]
    np.testing.assert_array_equal(texts[0].tokens, texts[1].tokens)
    np.testing.assert_allclose(texts[0].logprobs, texts[1].logprobs, rtol=0, atol=ATOL)


@pytest.mark.integration
def test_one_prefill_program_per_bucket(engines, golden_obs):
    bucketed, _ = engines
    bucketed.prefill(golden_obs)
    with CompileCounter() as counter:
        longer = golden_obs.replace(tokenized_prompt_mask=np.arange(48)[None].repeat(2, 0) < 30)
        bucketed.prefill(longer)  # still the 32 bucket
    assert counter.count == 0


@pytest.mark.integration
def test_act_is_prefill_then_denoise_in_one_program(engines, golden_obs):
    engine = engines[0]
    noise = np.random.default_rng(1).standard_normal((2, 10, 32)).astype(np.float32)
    cache, actions = engine.act(golden_obs, noise, 10)
    reference = engine.prefill(golden_obs)
    np.testing.assert_allclose(actions, engine.denoise(reference, noise, 10), rtol=0, atol=ATOL)
    a, b = engine.to_host(cache), engine.to_host(reference)
    np.testing.assert_array_equal(a.mask, b.mask)
    np.testing.assert_array_equal(a.positions, b.positions)
    valid = a.mask[None, :, :, None, None]
    np.testing.assert_allclose(np.where(valid, a.k, 0), np.where(valid, b.k, 0), rtol=0, atol=ATOL)
    with CompileCounter() as counter:
        other = golden_obs.replace(tokenized_prompt_mask=np.arange(48)[None].repeat(2, 0) < 20)
        engine.act(other, noise + 1, 10)  # another prompt in the same bucket, other noise
    assert counter.count == 0
