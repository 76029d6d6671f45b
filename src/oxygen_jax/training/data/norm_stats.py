"""Norm stats from training data, computed as openpi's `compute_norm_stats` does.

Mean and std are running moments; q01/q99 come from 5000-bin histograms per dimension whose range grows
with the data (openpi's `RunningStats`), so quantiles match openpi's to its bin width, not to exact
sorting. Stats are taken over the robot part of the input transforms (`Pipeline.data_inputs`): `state`
per frame and every step of the `actions` chunk.
"""

from collections.abc import Iterable, Mapping

import numpy as np
import tqdm

from oxygen_jax.policies.normalization import NormStats

NUM_QUANTILE_BINS = 5000
_EDGE_PAD = 1e-10


class RunningStats:
    """Per-dimension moments and histogram quantiles of a stream of [..., D] batches."""

    def __init__(self) -> None:
        self.count = 0
        self._mean: np.ndarray | None = None
        self._mean_sq: np.ndarray | None = None
        self._min: np.ndarray | None = None
        self._max: np.ndarray | None = None
        self._hists: np.ndarray | None = None  # [D, bins]
        self._edges: np.ndarray | None = None  # [D, bins + 1]

    def update(self, batch: np.ndarray) -> None:
        batch = np.asarray(batch, np.float64).reshape(-1, np.shape(batch)[-1])
        n, dim = batch.shape
        if self.count == 0:
            self._mean, self._mean_sq = batch.mean(0), (batch**2).mean(0)
            self._min, self._max = batch.min(0), batch.max(0)
            self._hists = np.zeros((dim, NUM_QUANTILE_BINS))
            self._edges = self._bin_edges()
        else:
            if dim != self._mean.size:
                raise ValueError(f"vectors of width {dim} after vectors of width {self._mean.size}")
            new_min, new_max = np.minimum(self._min, batch.min(0)), np.maximum(self._max, batch.max(0))
            grew = (new_min < self._min).any() or (new_max > self._max).any()
            self._min, self._max = new_min, new_max
            if grew:
                self._rebin()
        self.count += n
        self._mean += (batch.mean(0) - self._mean) * (n / self.count)
        self._mean_sq += ((batch**2).mean(0) - self._mean_sq) * (n / self.count)
        for d in range(dim):
            self._hists[d] += np.histogram(batch[:, d], bins=self._edges[d])[0]

    def _bin_edges(self) -> np.ndarray:
        return np.stack(
            [
                np.linspace(lo - _EDGE_PAD, hi + _EDGE_PAD, NUM_QUANTILE_BINS + 1)
                for lo, hi in zip(self._min, self._max, strict=True)
            ]
        )

    def _rebin(self) -> None:
        """Moves the counts onto the widened range, each old bin by its left edge (as openpi)."""
        edges = self._bin_edges()
        for d in range(len(edges)):
            self._hists[d] = np.histogram(self._edges[d][:-1], bins=edges[d], weights=self._hists[d])[0]
        self._edges = edges

    def _quantile(self, q: float) -> np.ndarray:
        index = [np.searchsorted(np.cumsum(h), q * self.count) for h in self._hists]
        return np.array([edges[i] for edges, i in zip(self._edges, index, strict=True)])

    def stats(self) -> NormStats:
        if self.count < 2:
            raise ValueError("norm stats need at least 2 vectors")
        std = np.sqrt(np.maximum(0.0, self._mean_sq - self._mean**2))
        return NormStats(mean=self._mean, std=std, q01=self._quantile(0.01), q99=self._quantile(0.99))


def compute_norm_stats(
    examples: Iterable[Mapping[str, np.ndarray]],
    keys: tuple[str, ...] = ("state", "actions"),
    total: int | None = None,
) -> dict[str, NormStats]:
    """Stats of `keys` over robot-transformed examples (each `state` [D], `actions` [H, D])."""
    running = {key: RunningStats() for key in keys}
    for example in tqdm.tqdm(examples, desc="norm stats", total=total, unit="frame"):
        for key in keys:
            running[key].update(np.asarray(example[key]))
    return {key: stats.stats() for key, stats in running.items()}
