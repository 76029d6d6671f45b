"""A model's config says how it runs real-time chunking; `LocalRobot` and the closed-loop tools use it."""

import types

import pytest
from conftest import make_policy, raw_observation

from oxygen_jax import config
from oxygen_jax.client import protocol
from oxygen_jax.policies import rtc_defaults
from oxygen_jax.robots.local import LocalRobot
from oxygen_jax.robots.trial import GuidanceSettings


@pytest.mark.parametrize(
    ("name", "method", "samples"),
    [
        ("pi05_detour", "guided", 1),
        ("pi05_detour_wide", "guided", 1),
        ("pi05_detour_prefix", "conditioned", 8),
    ],
)
def test_the_config_names_the_method_and_the_samples(name, method, samples):
    """Conditioned where the model was trained with a clean prefix; the prefix model's best measured
    setting keeps its first chunk among 8 samples (docs/rtc.md)."""
    assert rtc_defaults.metadata(config.load_config(name)) == {"rtc_method": method, "rtc_samples": samples}


def test_rtc_policy_and_the_tools_take_the_policys_samples_unless_told_otherwise():
    engine = types.SimpleNamespace(config=types.SimpleNamespace(max_clean_prefix=5))
    policy = types.SimpleNamespace(metadata={"rtc_samples": 8}, engine=engine)
    assert LocalRobot(policy).fresh_samples == 8
    assert LocalRobot(policy, fresh_samples=1).fresh_samples == 1
    assert LocalRobot(policy).robot.method == "conditioned"
    assert GuidanceSettings().for_policy(policy).fresh_samples == 8
    assert GuidanceSettings(fresh_samples=2).for_policy(policy).fresh_samples == 2
    bare = types.SimpleNamespace(metadata={}, engine=engine)
    assert GuidanceSettings().for_policy(bare).fresh_samples == 1


def test_a_reply_to_an_rtc_request_names_the_method_that_ran():
    policy = make_policy("dsi0", "float32")
    served = LocalRobot(policy)
    assert "rtc_method" not in served.infer(raw_observation())
    continued = {**raw_observation(), protocol.RTC: {"executed": 2, "delay": 1}}
    assert served.infer(continued)["rtc_method"] == "guided"
