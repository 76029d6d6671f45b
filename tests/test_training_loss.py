"""Training loss and gradients against the OxyGen fork's compute_loss (golden train_io.npz, tiny model).

Tolerances are train_io.json's recommended ones: loss terms rtol/atol 1e-5, token log-probs atol 1e-4
at valid query positions, gradients atol 1e-4 * max|grad| per leaf, grad norm rtol 1e-4.
"""

import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import optax
import pytest
from conftest import GOLDEN

from oxygen_jax import config
from oxygen_jax.models import inputs
from oxygen_jax.training import batch as train_batch
from oxygen_jax.training import loss

pytestmark = pytest.mark.integration

GRAD = "grad/"


@pytest.fixture(scope="module")
def train_io():
    return np.load(GOLDEN / "train_io.npz")


@pytest.fixture(scope="module")
def arrays(train_io):
    return {k[3:]: train_io[k] for k in train_io.files if k.startswith("in/")}


@pytest.fixture(scope="module")
def causal_config():
    cfg = config.load_config("pi05_tiny")
    cfg.model.prefix_attention = "causal_text"
    return config.model_config(cfg)


@pytest.fixture(scope="module")
def loss_config(train_io):
    return loss.LossConfig(real_action_dim=int(train_io["in/real_action_dim"]))


@pytest.fixture(scope="module")
def loss_and_grad():
    return jax.jit(jax.value_and_grad(loss.mean_loss, has_aux=True), static_argnums=(1, 4))


@pytest.fixture(scope="module")
def golden_run(golden_params, causal_config, arrays, loss_config, loss_and_grad):
    batch = train_batch.batch_from_arrays(arrays, causal_config)
    return loss_and_grad(golden_params, causal_config, batch, None, loss_config)


def _leaf(tree: dict, path: str):
    for key in path.split("/"):
        tree = tree[key]
    return np.asarray(tree)


def test_loss_terms_match_oxygen(golden_run, train_io):
    (mean, terms), _ = golden_run
    for name in ("loss", "loss_flow", "loss_ce"):
        np.testing.assert_allclose(getattr(terms, name), train_io[f"out/{name}"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mean, train_io["out/loss_mean"], rtol=1e-5, atol=1e-5)


def test_noisy_actions_and_token_logprobs_match_oxygen(golden_run, train_io, arrays):
    (_, terms), _ = golden_run
    np.testing.assert_allclose(terms.x_t, train_io["mid/x_t"], rtol=0, atol=1e-5)
    valid = arrays["tokenized_prompt_mask"][:, :-1]
    got = np.where(valid, terms.token_logprob, 0)
    np.testing.assert_allclose(got, np.where(valid, train_io["mid/target_logprob"], 0), rtol=0, atol=1e-4)


def test_gradients_match_oxygen(golden_run, train_io):
    _, grads = golden_run
    np.testing.assert_allclose(optax.tree.norm(grads), train_io["out/grad_norm"], rtol=1e-4)
    names = [k for k in train_io.files if k.startswith(GRAD)]
    assert len(names) == 5
    for name in names:
        want = train_io[name]
        got = _leaf(grads, name.removeprefix(GRAD))
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max(), err_msg=name)


def test_rng_draws_the_noise_and_time_oxygen_drew(train_io):
    rng = jax.random.wrap_key_data(train_io["in/rng_key_data"])
    noise, time = loss.sample_noise_and_time(rng, train_io["in/noise"].shape)
    np.testing.assert_array_equal(noise, train_io["in/noise"])
    np.testing.assert_array_equal(time, train_io["in/time"])


def test_empty_loss_mask_leaves_the_flow_term(
    golden_params, causal_config, arrays, loss_config, loss_and_grad, train_io
):
    """train_io's loss_flow is the same call with an all-False token_loss_mask."""
    no_text = {**arrays, "token_loss_mask": np.zeros_like(arrays["token_loss_mask"])}
    batch = train_batch.batch_from_arrays(no_text, causal_config)
    (_, terms), _ = loss_and_grad(golden_params, causal_config, batch, None, loss_config)
    np.testing.assert_array_equal(terms.loss_ce, 0.0)
    np.testing.assert_allclose(terms.loss, train_io["out/loss_flow"], rtol=1e-5, atol=1e-5)


def test_zero_text_weight_is_the_actions_only_loss(golden_params, causal_config, arrays, train_io):
    batch = train_batch.batch_from_arrays(arrays, causal_config)
    actions_only = loss.LossConfig(text_loss_weight=0.0, real_action_dim=int(train_io["in/real_action_dim"]))
    terms = jax.jit(loss.compute_loss, static_argnums=(1, 4))(
        golden_params, causal_config, batch, None, actions_only
    )
    assert terms.token_logprob is None
    np.testing.assert_array_equal(terms.loss_ce, 0.0)
    np.testing.assert_allclose(terms.loss, train_io["out/loss_flow"], rtol=1e-5, atol=1e-5)


def test_text_loss_on_a_bidirectional_prefix_is_refused(golden_params, tiny_config, arrays):
    batch = train_batch.batch_from_arrays(arrays, tiny_config)
    with pytest.raises(ValueError, match="causal_text"):
        loss.compute_loss(golden_params, tiny_config, batch, None)


def test_batch_errors_name_the_key(causal_config, arrays):
    missing = {k: v for k, v in arrays.items() if k != "actions"}
    with pytest.raises(inputs.InputError, match="missing input 'actions'"):
        train_batch.batch_from_arrays(missing, causal_config)
    on_padding = {**arrays, "token_loss_mask": np.ones_like(arrays["token_loss_mask"])}
    with pytest.raises(inputs.InputError, match="padding"):
        train_batch.batch_from_arrays(on_padding, causal_config)
    no_time = {k: v for k, v in arrays.items() if k != "time"}
    with pytest.raises(inputs.InputError, match="'noise' and 'time'"):
        train_batch.batch_from_arrays(no_time, causal_config)


@pytest.mark.slow
def test_train_cli_loss_on_writes_the_golden_terms(tmp_path, train_io):
    """scripts/train.py --loss_on on train_io.npz itself (its `in/...` keys, noise and time included)."""
    root = pathlib.Path(__file__).resolve().parents[1]
    out = tmp_path / "loss.npz"
    command = [
        sys.executable,
        str(root / "scripts" / "train.py"),
        "--config=pi05_tiny",
        "--config.model.prefix_attention=causal_text",
        "--config.training.text_loss_weight=1",
        f"--checkpoint_dir={GOLDEN / 'checkpoint'}",
        f"--loss_on={GOLDEN / 'train_io.npz'}",
        f"--out={out}",
    ]
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    got = np.load(out)
    for name in ("loss", "loss_flow", "loss_ce", "loss_mean"):
        np.testing.assert_allclose(got[name], train_io[f"out/{name}"], rtol=1e-5, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(got["grad_norm"], train_io["out/grad_norm"], rtol=1e-4)
