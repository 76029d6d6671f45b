"""Bidirectional decoding (`policies/bid.py`) on hand-made chunks, and `BidRobot` on the golden tiny
model."""

import numpy as np
import pytest
from conftest import E2E, make_policy, raw_observation

from oxygen_jax.client import protocol
from oxygen_jax.errors import InvalidArgumentError
from oxygen_jax.policies import bid, chunk_choice
from oxygen_jax.robots.bid_robot import BidRobot
from oxygen_jax.robots.trial import draw_noise

PREVIOUS = np.zeros((2, 1))  # H = 2 actions of one dim, the aligned previous chunk
WEIGHTS = np.array([1.0, 0.0])  # the first action is executed while the new chunk is computed


def _chunks(*rows) -> np.ndarray:
    return np.array(rows, np.float64)[:, :, None]


def test_backward_coherence_decides_where_the_weak_model_agrees_with_the_strong_one():
    """Weak samples equal to the strong ones: the contrast's positives and negatives are the same chunks,
    it cancels, and the chunk closest to the executed action is kept."""
    strong = _chunks([0.5, 1.0], [0.0, -1.0], [1.0, 1.0])
    np.testing.assert_allclose(bid.losses(strong, strong, PREVIOUS, WEIGHTS), [0.5, 0.0, 1.0])
    assert bid.select(strong, strong, PREVIOUS, WEIGHTS) == 1


def test_forward_contrast_decides_against_a_chunk_between_the_motions():
    """The chunk between two motions (index 0) agrees best with the executed action, but the weak model
    (few denoising steps) lands there too: the contrast keeps a chunk of the motion instead."""
    strong = _chunks([0.0, 0.0], [0.1, 1.0], [0.2, 1.05], [0.1, 0.9])
    weak = np.zeros_like(strong)
    assert int(np.argmin(bid.backward_loss(strong, PREVIOUS, WEIGHTS))) == 0
    losses = bid.losses(strong, weak, PREVIOUS, WEIGHTS, k=2)
    # index 1: backward 0.1; to the positives (chunks 0, 1) 1.1 + 0, to the negatives 2 * 1.1; / N = 4.
    np.testing.assert_allclose(losses[:2], [0.275, 0.1 - 0.275])
    assert bid.select(strong, weak, PREVIOUS, WEIGHTS, k=2) == 1


def test_contrast_size_is_a_quarter_of_the_samples():
    assert [bid.contrast_size(n) for n in (1, 2, 4, 8, 16)] == [1, 1, 1, 2, 4]


@pytest.fixture(scope="module")
def policy():
    return make_policy("dsi0", "float32")


def test_bid_policy_keeps_one_of_its_samples_and_answers_as_rtc_policy(policy):
    """The first reply is the densest sample; a continued one is one of the strong samples, each as
    Policy.infer computes it alone with that noise; chunk ids and start as `LocalRobot`'s."""
    noise = np.stack([E2E["in/noise"], *draw_noise(np.random.default_rng(3), (3, 10, 32), None)])
    alone = np.stack([policy.infer(raw_observation(), noise=n)["actions"] for n in noise])
    served = BidRobot(policy, samples=4)
    first = served.infer(raw_observation(), noise=noise)
    np.testing.assert_allclose(first["actions"], alone[chunk_choice.densest(alone)], atol=1e-5)
    assert (first[protocol.CHUNK_ID], first[protocol.START]) == (0, 0)
    continued = served.infer({**raw_observation(), protocol.RTC: {"executed": 2, "delay": 3}}, noise=noise)
    assert min(np.abs(continued["actions"] - a).max() for a in alone) < 1e-5
    assert (continued[protocol.CHUNK_ID], continued[protocol.START]) == (1, 3)
    with pytest.raises(InvalidArgumentError, match="at least 2 samples"):
        BidRobot(policy, samples=1)
