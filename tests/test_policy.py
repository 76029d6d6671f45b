"""Policy.infer end to end against openpi's `create_trained_policy(...).infer` (golden policy_e2e)."""

import dataclasses
import json

import numpy as np
import pytest
from conftest import ACTIONS_ATOL, E2E, GOLDEN, VARIANTS, make_policy, raw_observation

from oxygen_jax.errors import InvalidRequest
from oxygen_jax.models import inputs
from oxygen_jax.policies.request_options import RequestOptions
from oxygen_jax.runtime.inline import Speech

pytestmark = pytest.mark.timeout(60)

DESCRIPTION = json.loads((GOLDEN / "policy_e2e.json").read_text())


@pytest.fixture(scope="module")
def policies():
    """Language on (8 tokens) in every policy: the golden actions must not depend on it."""
    return {
        (tag, dtype): make_policy(tag, dtype, max_text_tokens=8)
        for tag in VARIANTS
        for dtype in ("bfloat16", "float32")
    }


@pytest.mark.parametrize("tag", VARIANTS)
def test_model_inputs_equal_openpi(policies, tag):
    ours = policies[tag, "bfloat16"].model_inputs(raw_observation())
    prefix = f"model_input/{tag}/"
    golden = {key.removeprefix(prefix): E2E[key] for key in E2E if key.startswith(prefix)}
    assert ours.keys() == golden.keys()
    # The canonical state is float32, as openpi's model receives it (jnp.asarray of its float64 state).
    golden["state"] = golden["state"].astype(np.float32)
    for key, want in golden.items():
        np.testing.assert_array_equal(ours[key], want, err_msg=key)


@pytest.mark.parametrize("tag", VARIANTS)
@pytest.mark.parametrize(
    ("dtype", "golden_key"), [("bfloat16", "actions"), ("float32", "actions_f32_params")]
)
def test_actions_match_openpi(policies, tag, dtype, golden_key):
    out = policies[tag, dtype].infer(raw_observation(), noise=E2E["in/noise"])
    want = E2E[f"out/{tag}/{golden_key}"]
    assert out["actions"].shape == tuple(DESCRIPTION["variants"][tag]["actions_shape"])
    np.testing.assert_allclose(out["actions"], want, atol=ACTIONS_ATOL, rtol=0)


def test_openpi_output_keys_plus_text(policies):
    out = policies["dsi0", "bfloat16"].infer(raw_observation())
    openpi_keys = set(DESCRIPTION["variants"]["dsi0"]["policy_output_keys"])
    assert set(out) == openpi_keys | {"text", "text_tokens"}
    assert isinstance(out["text"], str)
    assert out["text_tokens"].dtype == np.int32
    assert 1 <= len(out["text_tokens"]) <= 8
    assert out["policy_timing"]["infer_ms"] > 0


def test_text_and_actions_share_one_prefill(policies):
    policy = policies["dsi0", "bfloat16"]
    for _ in range(3):
        before = policy.engine.stats.prefill_calls
        out = policy.infer(raw_observation(), noise=E2E["in/noise"])
        assert policy.engine.stats.prefill_calls == before + 1
        assert "text" in out


def test_actions_do_not_depend_on_language(policies):
    policy = policies["dsi0", "bfloat16"]
    with_text = policy.infer(raw_observation(), noise=E2E["in/noise"])
    without = policy.infer(raw_observation(), noise=E2E["in/noise"], prompt_for_text=False)
    assert "text" not in without
    np.testing.assert_array_equal(with_text["actions"], without["actions"])


def test_language_off_by_default():
    out = make_policy("dsi0").infer(raw_observation(), noise=E2E["in/noise"])
    assert set(out) == {"actions", "policy_timing"}


def test_metadata_names_horizon_robot_and_language(policies):
    metadata = policies["dsi0", "bfloat16"].metadata
    assert metadata["action_horizon"] == 10
    assert metadata["robot"] == "libero"
    assert metadata["language"] is True
    assert metadata["max_text_tokens"] == 8


def _without(key: str) -> dict:
    obs = raw_observation()
    del obs[key]
    return obs


@pytest.mark.parametrize(
    ("obs", "kwargs", "named"),
    [
        (_without("observation/state"), {}, "observation/state"),
        (_without("prompt"), {}, "Prompt"),
        (raw_observation() | {"observation/state": np.full(8, np.nan)}, {}, "observation/state"),
        (raw_observation() | {"observation/state": np.zeros((2, 8))}, {}, "state"),
        (raw_observation() | {"observation/image": np.zeros((224, 224), np.uint8)}, {}, "observation/image"),
        (raw_observation() | {"prompt": "pick up the bowl " * 40}, {}, "prompt too long"),
        (raw_observation(), {"noise": np.zeros((10, 7), np.float32)}, "noise"),
        (raw_observation(), {"noise": np.full((10, 32), np.inf, np.float32)}, "noise"),
        (raw_observation(), {"max_text_tokens": 9}, "max_text_tokens"),
        (raw_observation(), {"temperature": -1.0}, "temperature"),
    ],
)
def test_bad_input_raises_invalid_request_naming_it(policies, obs, kwargs, named):
    """The client's mistakes are `InvalidRequest` (a ValueError, as openpi raises), never a server fault."""
    with pytest.raises(InvalidRequest, match=named):
        policies["dsi0", "bfloat16"].infer(obs, **kwargs)


def test_a_bug_in_a_transform_is_a_server_fault_not_an_invalid_request(policies):
    """An exception the checks did not raise passes through unchanged: it is not the client's fault."""
    policy = policies["dsi0", "bfloat16"]

    def broken(_data):
        raise KeyError("a transform that reads a key it never gets")

    io = dataclasses.replace(policy.io, pipeline=dataclasses.replace(policy.io.pipeline, inputs=broken))
    with pytest.raises(KeyError, match="never gets") as error:
        io.inputs(raw_observation())
    assert not isinstance(error.value, InvalidRequest)


def test_prepare_and_finish_are_infer_split_in_two(policies):
    """`infer` is prepare -> engine -> finish: the same stages, driven by hand, give the same reply (the
    actions to float32 rounding: the two paths compile separately, and the CPU backend may order sums
    differently in each)."""
    policy = policies["dsi0", "float32"]
    options = RequestOptions(noise=E2E["in/noise"])
    prepared = policy.prepare(raw_observation(), options)
    assert [plan.max_new_tokens for plan in prepared.texts] == [policy.max_text_tokens]
    observation = inputs.observation_from_arrays(prepared.arrays, policy.engine.config)
    cache = policy.engine.prefill(observation)
    actions = np.asarray(policy.engine.denoise(cache, prepared.noise, policy.num_steps))[0]
    text = policy.engine.generate(cache, policy.max_text_tokens, max_new=policy.max_text_tokens)
    tokens = np.asarray(text.tokens)[0, : int(np.asarray(text.lengths)[0])]
    reply = policy.finish(prepared, actions, {None: Speech(tokens)})
    alone = policy.infer(raw_observation(), noise=E2E["in/noise"])
    np.testing.assert_allclose(reply["actions"], alone["actions"], rtol=0, atol=1e-5)
    np.testing.assert_array_equal(reply["text_tokens"], alone["text_tokens"])
    assert reply["text"] == alone["text"] == policy.detokenize(tokens)
