"""`create_policy("pi05_demo")` needs no checkpoint argument: the config names the model shipped in the
package, and the policy's repr says which config, checkpoint, robot and text budget it runs."""

import pathlib

import pytest

from oxygen_jax import config
from oxygen_jax.policies import policy_config
from oxygen_jax.policies.policy import create_policy
from oxygen_jax.table_task import scenes

SHIPPED = config.load_config("pi05_demo").checkpoint_dir


@pytest.fixture(scope="module")
def demo_policy():
    return create_policy("pi05_demo", max_text_tokens=12, params_dtype="float32")


def test_demo_policy_without_a_checkpoint_argument_loads_the_shipped_model(demo_policy):
    assert pathlib.Path(demo_policy.checkpoint).resolve() == pathlib.Path(SHIPPED).resolve()
    scene = next(scenes.scenes(scenes.HELD_OUT_SEED))
    # Only the trained model says the scene's subtask (a random init says noise).
    assert demo_policy.infer(scene.observation(0))["text"] == scene.subtask


def test_policy_repr_names_config_checkpoint_robot_and_text_budget(demo_policy):
    assert repr(demo_policy) == (
        f"Policy(config='pi05_demo', checkpoint={SHIPPED!r}, robot='table', max_text_tokens=12)"
    )


def test_openpi_entry_point_without_a_checkpoint_takes_the_configs_own():
    policy = policy_config.create_trained_policy("pi05_demo")
    assert pathlib.Path(policy.checkpoint).resolve() == pathlib.Path(SHIPPED).resolve()
