"""The real-time-chunking cost benchmark (benchmarks/rtc_cost.py) on the tiny model: the plain, guided and
conditioned programs compiled before measuring, every call timed, the ratios computed from the medians,
the FLOPs of one plain and one guided step."""

import statistics

import jax
import pytest

from oxygen_jax.benchmarks import rtc_cost
from oxygen_jax.engine.engine import Engine

pytestmark = pytest.mark.integration  # runs scripts / full measurements: the second tier


def test_cost_of_guidance_is_measured_without_compiling(golden_params, tiny_config):
    engine = Engine(golden_params, tiny_config)
    measured = rtc_cost.measure_batch(engine, 2, rtc_cost.Setting(batches=(2,), reps=3))
    assert measured["compiles_while_measuring"] == 0
    assert len(measured["plain_ms_all"]) == len(measured["guided_ms_all"]) == 3
    assert len(measured["conditioned_ms_all"]) == 3
    assert measured["conditioned_over_plain"] == measured["conditioned_ms"] / measured["plain_ms"]
    assert measured["plain_ms"] == statistics.median(measured["plain_ms_all"])
    assert measured["guided_over_plain"] == measured["guided_ms"] / measured["plain_ms"]
    assert abs(measured["added_over_plain"] - (measured["guided_over_plain"] - 1)) < 1e-12
    # A guided step: the velocity's forward and its backward w.r.t. x_t only. A recomputed forward or a
    # gradient w.r.t. the weights would each add about one more plain step.
    assert 1.8 < measured["guided_over_plain_flops"] < 2.4


def test_step_programs_take_the_weights_and_cache_as_arguments(golden_params, tiny_config):
    """Closed over, the weights would be folded into the program as constants (gigabytes at full size)."""
    engine = Engine(golden_params, tiny_config)
    rows = rtc_cost._guidance(engine, 1, seed=0)
    cache = engine.prefill(rtc_cost.observation_batch(engine, 1, "libero"))
    noise = engine.noise(jax.random.key(0), 1)
    weights = jax.tree.leaves(engine.params)
    for name, lowered in rtc_cost.step_programs(engine, cache, noise, rows).items():
        arguments = jax.tree.leaves(lowered.args_info)
        assert len(arguments) >= len(weights) + len(jax.tree.leaves(cache)), name
