"""Every config key is declared in the base config, so a misspelt key raises instead of reading None, and
every tool tokenizes prompts to the model's `max_token_len` (openpi's `PaligemmaTokenizer(max_len)`)."""

import json
import operator

import ml_collections
import numpy as np
import pytest
from conftest import GOLDEN

from oxygen_jax import config
from oxygen_jax.policies.policy import _FittingPrompt


def _keys(cfg: ml_collections.ConfigDict, prefix: str = "") -> set[str]:
    keys = set()
    for name, value in cfg.items():
        keys.add(prefix + name)
        if isinstance(value, ml_collections.ConfigDict):
            keys |= _keys(value, f"{prefix}{name}.")
    return keys


@pytest.mark.parametrize("name", config.known_configs())
def test_a_shipped_config_sets_only_keys_the_base_config_declares(name):
    assert _keys(config.load_config(name)) <= _keys(config.base_config())


MISSPELT = ["robots", "asset_ids", "checkpoint_dirs", "data.subtasks", "model.paligemma.widths"]


@pytest.mark.parametrize("key", MISSPELT)
def test_a_misspelt_key_raises_when_read_set_or_overridden(key):
    cfg = config.load_config("pi05_demo")
    parent, _, name = key.rpartition(".")
    owner = operator.attrgetter(parent)(cfg) if parent else cfg
    with pytest.raises(AttributeError):
        getattr(owner, name)
    with pytest.raises(AttributeError):
        setattr(owner, name, "x")
    with pytest.raises(KeyError):
        cfg.update_from_flattened_dict({key: "x"})  # create_policy's `overrides`


def test_configs_without_a_robot_or_checkpoint_say_so_with_none():
    base = config.base_config()
    assert (base.robot, base.asset_id, base.checkpoint_dir, base.data.subtask) == (None, None, None, None)
    assert config.checkpoint_for(base, None) is None and config.checkpoint_for(base, "run") == "run"
    assert config.checkpoint_for(config.load_config("pi05_demo"), None).endswith("assets/pi05_demo")


def test_the_config_tokenizer_makes_the_golden_prompts_of_the_tiny_model():
    """tokenizer_cases.json was made by openpi's tokenizer with max_len = the tiny model's max_token_len."""
    cfg = config.load_config("pi05_tiny")
    tokenizer = config.build_tokenizer(cfg, str(GOLDEN / "tokenizer" / "tiny_paligemma_standin.model"))
    cases = json.loads((GOLDEN / "tokenizer" / "tokenizer_cases.json").read_text())["cases"]
    assert {case["max_len"] for case in cases} == {cfg.model.max_token_len} == {tokenizer.max_len}
    for case in cases:
        state = None if case["state"] is None else np.asarray(case["state"], np.float32)
        ids, mask = tokenizer.tokenize(case["prompt"], state)
        np.testing.assert_array_equal(ids, case["tokens"], err_msg=case["name"])
        np.testing.assert_array_equal(mask, case["mask"], err_msg=case["name"])


def test_a_policy_prompt_of_exactly_max_token_len_tokens_fits_and_one_token_more_is_refused():
    tokenizer = config.build_tokenizer(config.load_config("pi05_tiny"))
    lengths = {len(tokenizer.prompt_tokens("a" * n)): "a" * n for n in range(1, 80)}
    fitting = _FittingPrompt(tokenizer)
    ids, mask = fitting.tokenize(lengths[tokenizer.max_len], None)
    assert mask.all() and ids.shape == (tokenizer.max_len,)
    with pytest.raises(ValueError, match="prompt too long"):
        fitting.tokenize(lengths[tokenizer.max_len + 1], None)
    # A state that overflows a fitting prompt is cut, as openpi's model was trained on.
    ids, mask = fitting.tokenize(lengths[tokenizer.max_len - 4], np.zeros(32, np.float32))
    assert mask.all() and ids.shape == (tokenizer.max_len,)
