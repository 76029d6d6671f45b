"""openpi's `policy_config.create_trained_policy` by name and arguments, on the golden checkpoint."""

import dataclasses

import numpy as np
import pytest
from conftest import ACTIONS_ATOL, E2E, GOLDEN, TOKENIZER, raw_observation

from oxygen_jax import config
from oxygen_jax.errors import ConfigError
from oxygen_jax.policies import normalization, policy_config

pytestmark = pytest.mark.timeout(120)

CHECKPOINT = GOLDEN / "checkpoint"
ASSET = CHECKPOINT / "assets" / "physical-intelligence" / "libero"


@dataclasses.dataclass(frozen=True)
class OpenpiTrainConfig:
    """The part of openpi's `TrainConfig` a ported script hands over: its name."""

    name: str


@dataclasses.dataclass(frozen=True)
class OpenpiNormStats:
    """openpi's `NormStats` fields (numpy arrays, as openpi loads them)."""

    mean: np.ndarray
    std: np.ndarray
    q01: np.ndarray | None = None
    q99: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class OpenpiGroup:
    """openpi's `transforms.Group`: input and output transforms."""

    inputs: tuple = ()
    outputs: tuple = ()


@pytest.fixture(scope="module")
def golden_actions() -> np.ndarray:
    """openpi's create_trained_policy(pi05_tiny, checkpoint).infer(obs, noise) actions."""
    policy = policy_config.create_trained_policy(
        config.get_config("pi05_tiny"), CHECKPOINT, tokenizer_path=TOKENIZER
    )
    return policy.infer(raw_observation(), noise=E2E["in/noise"])["actions"]


def test_openpi_call_answers_like_openpi(golden_actions):
    np.testing.assert_allclose(golden_actions, E2E["out/dsi1/actions"], atol=ACTIONS_ATOL, rtol=0)


def test_openpi_train_config_and_norm_stats_are_taken(golden_actions):
    """openpi's TrainConfig picks our config of its name; its NormStats replace the checkpoint's:
    action quantiles moved by one unnormalize every action one higher."""
    stats = normalization.load_norm_stats(ASSET)
    shifted = {
        "state": OpenpiNormStats(**dataclasses.asdict(stats["state"])),
        "actions": OpenpiNormStats(
            stats["actions"].mean, stats["actions"].std, stats["actions"].q01 + 1, stats["actions"].q99 + 1
        ),
    }
    policy = policy_config.create_trained_policy(
        OpenpiTrainConfig("pi05_tiny"), str(CHECKPOINT), norm_stats=shifted, tokenizer_path=TOKENIZER
    )
    actions = policy.infer(raw_observation(), noise=E2E["in/noise"])["actions"]
    np.testing.assert_allclose(actions, golden_actions + 1, atol=1e-5, rtol=0)


def test_sample_kwargs_num_steps_and_default_prompt():
    policy = policy_config.create_trained_policy(
        "pi05_tiny",
        CHECKPOINT,
        sample_kwargs={"num_steps": 3},
        default_prompt="pick up the bowl",
        tokenizer_path=TOKENIZER,
    )
    assert policy.num_steps == 3
    without_prompt = {key: value for key, value in raw_observation().items() if key != "prompt"}
    assert policy.model_inputs(without_prompt)["tokenized_prompt_mask"].any()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sample_kwargs": {"temperature": 1.0}}, r"sample_kwargs \['temperature'\] are not supported"),
        ({"pytorch_device": "cuda"}, "not PyTorch"),
        ({"repack_transforms": OpenpiGroup(inputs=(dict,))}, "repack the observation"),
    ],
)
def test_unsupported_openpi_arguments_are_one_line_errors(kwargs, message):
    with pytest.raises(ValueError, match=message) as error:
        policy_config.create_trained_policy("pi05_tiny", CHECKPOINT, **kwargs)
    assert "\n" not in str(error.value)


def test_unknown_config_name_is_refused():
    with pytest.raises(ConfigError, match="no config named 'pi0_aloha_sim'"):
        policy_config.create_trained_policy(OpenpiTrainConfig("pi0_aloha_sim"), CHECKPOINT)
