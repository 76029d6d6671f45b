"""Choosing one action chunk among several samples (policies/chunk_choice.py)."""

import numpy as np
import pytest
from conftest import make_policy, raw_observation

from oxygen_jax.errors import InvalidRequest
from oxygen_jax.policies import chunk_choice
from oxygen_jax.policies.request_options import RequestOptions


@pytest.fixture(scope="module")
def policy():
    return make_policy("dsi0", "float32")


def _motion(side: float, rng: np.random.Generator, count: int) -> np.ndarray:
    """`count` chunks [10, 2] of one motion: straight down, then off to `side`, with a little noise."""
    steps = np.arange(10, dtype=np.float64)
    path = np.stack([side * 0.03 * np.maximum(steps - 3, 0), -0.04 * steps], axis=1)
    return path + rng.normal(0, 0.003, (count, 10, 2))


def test_a_chunk_between_two_motions_is_never_the_densest():
    rng = np.random.default_rng(0)
    left, right = _motion(-1, rng, 4), _motion(1, rng, 3)
    between = (left[:1] + right[:1]) / 2  # the average of the two motions: straight down
    chunks = np.concatenate([between, right, left])
    assert chunk_choice.neighbours(len(chunks)) == 2
    # The densest lies in the motion most samples took (left: 4 of 8), never the average.
    assert chunk_choice.densest(chunks) >= 1 + len(right)


def test_one_motion_never_gives_its_outlier_and_ties_give_the_lowest_index():
    rng = np.random.default_rng(1)
    chunks = _motion(1, rng, 6)
    chunks[0] += 0.2  # far from the other five
    assert chunk_choice.densest(chunks) != 0
    assert chunk_choice.densest(np.zeros((2, 10, 2))) == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (RequestOptions(samples=0), r"samples must lie in \[1, 64\], got 0"),
        (RequestOptions(samples=65), r"samples must lie in \[1, 64\], got 65"),
        (RequestOptions(samples="4"), "'samples': expected an integer, got str"),
        (RequestOptions(samples=3, noise=np.zeros((2, 10, 32))), r"'noise': expected shape \[3, 10, 32\]"),
    ],
)
def test_bad_sample_counts_are_one_line_request_errors(policy, options, message):
    with pytest.raises(InvalidRequest, match=message) as error:
        policy.prepare(raw_observation(), options)
    assert "\n" not in str(error.value)
