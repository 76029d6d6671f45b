"""Bidirectional decoding (BID; Liu et al., "Bidirectional Decoding: Improving Action Chunking via
Closed-Loop Resampling", 2024): a baseline for real-time chunking that picks one chunk among samples
instead of steering the denoiser.

Each sample of the strong model is scored by two terms, compared as the robot executes them:
- backward coherence: its distance to the previous chunk (aligned: what the robot executes at each of
  the new chunk's indices), per action weighted by the prefix weights of real-time chunking (1 on the
  d actions executed while it is computed, falling to 0 at the prefix horizon s);
- forward contrast: its distance to the k strong samples most coherent with the previous chunk, minus its
  distance to the k most coherent samples of a weaker model, divided by the number of samples: it prefers
  what the strong model does and the weak one does not.
The sample with the least sum is kept.
"""

import numpy as np


def contrast_size(samples: int) -> int:
    """k: the positive and negative samples of the forward contrast, a quarter of the samples (at least 1)."""
    return max(1, samples // 4)


def _distances(chunks: np.ndarray, others: np.ndarray) -> np.ndarray:
    """[N, M]: sum over the horizon of the per-action Euclidean distance of chunk n to chunk m."""
    return np.linalg.norm(chunks[:, None] - others[None], axis=-1).sum(axis=-1)


def backward_loss(chunks: np.ndarray, previous: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """[N]: the weighted distance of each chunk [N, H, A] to the aligned previous chunk [H, A]."""
    return (np.linalg.norm(chunks - previous[None], axis=-1) * weights[None]).sum(axis=-1)


def losses(
    strong: np.ndarray, weak: np.ndarray, previous: np.ndarray, weights: np.ndarray, k: int | None = None
) -> np.ndarray:
    """[N]: backward loss plus forward contrast of each strong chunk (strong, weak: [N, H, A]; previous:
    [H, A]; weights: [H]); k: `contrast_size(N)` by default."""
    strong, weak = np.asarray(strong, np.float64), np.asarray(weak, np.float64)
    previous, weights = np.asarray(previous, np.float64), np.asarray(weights, np.float64)
    k = contrast_size(len(strong)) if k is None else k
    backward = backward_loss(strong, previous, weights)
    positives = strong[np.argsort(backward, kind="stable")[:k]]
    negatives = weak[np.argsort(backward_loss(weak, previous, weights), kind="stable")[:k]]
    forward = _distances(strong, positives).sum(axis=1) - _distances(strong, negatives).sum(axis=1)
    return backward + forward / len(strong)


def select(
    strong: np.ndarray, weak: np.ndarray, previous: np.ndarray, weights: np.ndarray, k: int | None = None
) -> int:
    """Index of the strong chunk with the least BID loss (ties: the lowest index)."""
    return int(np.argmin(losses(strong, weak, previous, weights, k)))
