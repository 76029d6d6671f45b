"""One optimizer step against openpi's recipe (golden train_io.npz), frozen params and LoRA."""

import jax
import numpy as np
import pytest
from conftest import GOLDEN
from flax import traverse_util

from oxygen_jax import config
from oxygen_jax.training import lora, optimizer, train_step
from oxygen_jax.training.batch import batch_from_arrays
from oxygen_jax.training.loss import LossConfig

STEP_ATOL = 2.5e-7  # train_io.json: ~2 float32 ulps of |p| <= 1


@pytest.fixture(scope="module")
def train_io():
    return np.load(GOLDEN / "train_io.npz")


@pytest.fixture(scope="module")
def causal_config():
    cfg = config.load_config("pi05_tiny")
    cfg.model.prefix_attention = "causal_text"
    return config.model_config(cfg)


@pytest.fixture(scope="module")
def golden_batch(train_io, causal_config):
    return batch_from_arrays(
        {k[3:]: train_io[k] for k in train_io.files if k.startswith("in/")}, causal_config
    )


def _flat(tree) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in traverse_util.flatten_dict(tree, sep="/").items()}


@pytest.mark.integration
def test_one_step_matches_openpi_recipe(golden_params, causal_config, golden_batch, train_io):
    """clip 1.0 + AdamW(0.9, 0.95, 1e-8, wd 1e-10), warmup-cosine (5e-5, 10, 100, 5e-6), EMA 0.999."""
    spec = train_step.TrainSpec(
        model=causal_config,
        loss=LossConfig(real_action_dim=int(train_io["in/real_action_dim"])),
        optimizer=optimizer.OptimizerConfig(peak_lr=5e-5, warmup_steps=10, decay_steps=100, decay_lr=5e-6),
        ema_decay=0.999,
    )
    state = train_step.init_train_state(golden_params, spec, jax.random.key(0))
    state, metrics = train_step.train_step(state, golden_batch, jax.random.key(1), spec=spec)
    assert int(state.step) == 1
    np.testing.assert_allclose(metrics["lr"], train_io["step/lr"], rtol=1e-7)
    np.testing.assert_allclose(metrics["loss"], train_io["out/loss_mean"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(metrics["grad_norm"], train_io["out/grad_norm"], rtol=1e-4)
    new, ema = _flat(state.trainable), _flat(state.ema)
    recorded = [k.removeprefix("step/new/") for k in train_io.files if k.startswith("step/new/")]
    assert len(recorded) == 5
    for path in recorded:
        np.testing.assert_allclose(
            new[path], train_io[f"step/new/{path}"], rtol=0, atol=STEP_ATOL, err_msg=path
        )
        np.testing.assert_allclose(
            ema[path], train_io[f"step/ema/{path}"], rtol=0, atol=STEP_ATOL, err_msg=path
        )


@pytest.mark.integration
def test_frozen_params_stay_bit_identical_while_lora_trains(golden_params, causal_config, golden_batch):
    """LoRA on the action expert (openpi freezes its base weights) plus a frozen vision tower."""
    spec = train_step.TrainSpec(
        model=causal_config,
        optimizer=optimizer.OptimizerConfig(peak_lr=1e-3, warmup_steps=0),
        lora=lora.LoraConfig(action_expert_rank=2),
        freeze="PaliGemma/img/.*",
        ema_decay=0.99,
    )
    state = train_step.init_train_state(golden_params, spec, jax.random.key(0))
    frozen, trainable = _flat(state.frozen), _flat(state.trainable)
    assert all(k.startswith("PaliGemma/img/") or ("llm" in k and "_1" in k) for k in frozen)
    assert "PaliGemma/llm/layers/attn/q_einsum_1/w" in frozen
    assert "PaliGemma/llm/final_norm_1/Dense_0/kernel" in frozen
    assert "PaliGemma/llm/layers/attn/q_einsum/w" in trainable  # expert 0 has no LoRA: it trains
    lora_paths = [k for k in trainable if "lora" in k]
    assert len(lora_paths) == 10  # A and B of q, kv, attn_vec, gating, linear
    assert trainable["PaliGemma/llm/layers/mlp_1/gating_einsum_lora_a"].shape == (4, 2, 64, 2)
    assert {str(v.dtype) for v in frozen.values()} == {"bfloat16"}

    for i in range(2):
        state, _ = train_step.train_step(state, golden_batch, jax.random.key(i), spec=spec)
    after = _flat(state.frozen)
    assert after.keys() == frozen.keys()
    for path, value in frozen.items():
        np.testing.assert_array_equal(after[path], value, err_msg=path)
    moved = _flat(state.trainable)
    assert all(not np.array_equal(moved[k], trainable[k]) for k in lora_paths)
    serving = _flat(train_step.serving_params(state, spec))
    assert not any("lora" in k for k in serving)
    assert serving.keys() == _flat(golden_params).keys()


def test_lora_merge_computes_openpi_low_rank_branches(golden_params):
    """x W' equals openpi's x W + (x A) B per layer, with the output projection's B summed over heads
    (openpi's `BTL,NLD->BTD`)."""
    config = lora.LoraConfig(action_expert_rank=2)
    tree = lora.add_lora(golden_params, config, jax.random.key(0))
    adapted = tree["PaliGemma"]["llm"]["layers"]
    merged = lora.merge_lora(tree, config)["PaliGemma"]["llm"]["layers"]
    assert "lora_a" not in merged["attn"]["q_einsum_1"]
    rng = np.random.default_rng(0)
    out, mlp = adapted["attn"]["attn_vec_einsum_1"], adapted["mlp_1"]
    q = adapted["attn"]["q_einsum_1"]
    for layer in range(out["w"].shape[0]):
        x = rng.normal(size=(7, *out["w"].shape[1:3])).astype(np.float32)
        low_rank = np.einsum("TNH,NHL->TL", x, out["lora_a"][layer])
        want = np.einsum("TNH,NHD->TD", x, out["w"][layer]) + np.einsum(
            "TL,NLD->TD", low_rank, out["lora_b"][layer]
        )
        got = np.einsum("TNH,NHD->TD", x, merged["attn"]["attn_vec_einsum_1"]["w"][layer])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        x = rng.normal(size=(7, q["w"].shape[2])).astype(np.float32)
        low_rank = np.einsum("TD,NDL->TNL", x, q["lora_a"][layer])
        want = np.einsum("TD,NDH->TNH", x, q["w"][layer]) + np.einsum(
            "TNL,NLH->TNH", low_rank, q["lora_b"][layer]
        )
        got = np.einsum("TD,NDH->TNH", x, merged["attn"]["q_einsum_1"]["w"][layer])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        h = rng.normal(size=(7, mlp["linear"].shape[1])).astype(np.float32)
        want = h @ mlp["linear"][layer] + (h @ mlp["linear_lora_a"][layer]) @ mlp["linear_lora_b"][layer]
        np.testing.assert_allclose(h @ merged["mlp_1"]["linear"][layer], want, rtol=1e-5, atol=1e-5)


def test_everything_frozen_is_refused(golden_params, causal_config):
    spec = train_step.TrainSpec(model=causal_config, freeze=".*")
    with pytest.raises(ValueError, match="nothing to train"):
        train_step.init_train_state(golden_params, spec, jax.random.key(0))
