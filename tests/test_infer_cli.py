"""scripts/infer.py end to end on the golden checkpoint: actions, text and scores as upstream made them."""

import pathlib

import numpy as np
import pytest
from conftest import GOLDEN, golden_inputs, infer_script

from oxygen_jax.models import inputs

pytestmark = pytest.mark.integration

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_actions_text_and_scores_match_upstream(tmp_path, obs_file, model_io):
    text_ref = np.load(GOLDEN / "text_io_openpi.npz")
    np.save(tmp_path / "tf.npy", text_ref["in/tf_tokens"])
    out_path = tmp_path / "out.npz"
    run = infer_script(
        f"--obs={obs_file}",
        f"--out={out_path}",
        "--max_text_tokens=24",
        f"--score_tokens={tmp_path / 'tf.npy'}",
    )
    assert run.returncode == 0, run.stderr
    out = np.load(out_path)
    np.testing.assert_allclose(out["actions"], model_io["out/actions"], rtol=1e-4, atol=1e-4)
    assert out["text_tokens"].dtype == np.int32
    np.testing.assert_array_equal(out["text_tokens"], text_ref["greedy/tokens"])
    greedy = np.take_along_axis(text_ref["greedy/logprobs"], text_ref["greedy/tokens"][..., None], -1)[..., 0]
    np.testing.assert_allclose(out["text_logprobs"], greedy, rtol=0, atol=1e-4)
    np.testing.assert_allclose(out["score_token_logprobs"], text_ref["tf/token_logprobs"], rtol=0, atol=1e-4)
    assert out["text"].shape == (2,)
    assert "compile" in run.stdout


def test_config_override_serves_a_longer_horizon(tmp_path, model_io):
    arrays = {k: v for k, v in golden_inputs(model_io).items() if k != "noise"}
    np.savez(tmp_path / "obs.npz", **arrays)
    run = infer_script(
        "--config.model.action_horizon=16", f"--obs={tmp_path / 'obs.npz'}", f"--out={tmp_path / 'o.npz'}"
    )
    assert run.returncode == 0, run.stderr
    assert np.load(tmp_path / "o.npz")["actions"].shape == (2, 16, 32)


def test_bad_input_names_the_key(tmp_path, model_io):
    arrays = golden_inputs(model_io)
    arrays["image/base_0_rgb"] = arrays["image/base_0_rgb"][:, :100]
    np.savez(tmp_path / "bad.npz", **arrays)
    run = infer_script(f"--obs={tmp_path / 'bad.npz'}")
    assert run.returncode == 2
    assert "'image/base_0_rgb': expected shape [2, 224, 224, 3]" in run.stderr


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda a: a.pop("tokenized_prompt_mask"), "missing input 'tokenized_prompt_mask'"),
        (lambda a: a["image/left_wrist_0_rgb"].__setitem__((0, 0, 0, 0), np.nan), "NaN"),
        (
            lambda a: a.__setitem__("tokenized_prompt", a["tokenized_prompt"].astype(np.float32)),
            "int token ids",
        ),
        (lambda a: a.__setitem__("image_mask/base_0_rgb", np.ones(3, bool)), "'image_mask/base_0_rgb'"),
    ],
)
def test_input_validation(model_io, tiny_config, mutate, message):
    arrays = {k: np.array(v) for k, v in golden_inputs(model_io).items()}
    mutate(arrays)
    with pytest.raises(inputs.InputError, match=message):
        inputs.observation_from_arrays(arrays, tiny_config)


def test_uint8_images_equal_their_float_conversion(model_io, tiny_config):
    arrays = golden_inputs(model_io)
    as_u8 = {**arrays, **{f"image/{k}": model_io[f"in/image_u8/{k}"] for k in tiny_config.image_keys}}
    a = inputs.observation_from_arrays(arrays, tiny_config)
    b = inputs.observation_from_arrays(as_u8, tiny_config)
    for k in tiny_config.image_keys:
        np.testing.assert_allclose(a.images[k], b.images[k], rtol=0, atol=1e-6)


@pytest.mark.slow  # ~50 s; task texts from one prefill are tested in-process by test_text_tasks.py
def test_text_tasks_decode_from_the_extended_prefix(
    tmp_path, obs_file, golden_params, tiny_config, golden_obs
):
    """Each --text_task's text per row equals greedy decoding from the prefix extended by its
    instruction (computed here in-process), and a malformed task is a one-line error."""
    from oxygen_jax.engine.engine import Engine
    from oxygen_jax.tokenizer import Tokenizer

    tasks = {"narrate": "describe what you are doing", "memory": "where is the cup"}
    out_path = tmp_path / "out.npz"
    run = infer_script(
        f"--obs={obs_file}",
        f"--out={out_path}",
        "--max_text_tokens=6",
        f"--tokenizer_path={GOLDEN / 'tokenizer' / 'tiny_paligemma_standin.model'}",
        *(f"--text_task={n}:{i}" for n, i in tasks.items()),
    )
    assert run.returncode == 0, run.stderr
    out = np.load(out_path)
    engine = Engine(golden_params, tiny_config)
    tokenizer = Tokenizer(GOLDEN / "tokenizer" / "tiny_paligemma_standin.model")
    cache = engine.prefill(golden_obs)
    for name, instruction in tasks.items():
        suffix = tokenizer.tokenize_task(instruction)
        want = engine.generate(
            engine.select_rows(engine.extend(cache, np.array([0, 1]), [suffix] * 2), np.arange(2)), 6
        )
        np.testing.assert_array_equal(out[f"text_task_tokens/{name}"], want.tokens)
        assert out[f"text_task/{name}"].shape == (2,)
    bad = infer_script(f"--obs={obs_file}", "--max_text_tokens=6", "--text_task=nameonly")
    assert bad.returncode != 0 and "expected name:instruction" in bad.stderr
