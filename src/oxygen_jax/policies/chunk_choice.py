"""One action chunk chosen among several sampled from the same observation.

A flow policy trained on several valid motions (around an obstacle on either side, say) samples one of them
for most noise draws, but for some it returns a chunk between them, near their average, which is none of
the motions and can lead into the obstacle. Among a few samples, the ones inside a motion have close
neighbours and one between motions has none, so the sample whose k-th nearest neighbour is closest lies
inside the motion most samples took. With one motion it is a typical sample of it.
"""

import numpy as np


def neighbours(samples: int) -> int:
    """k: the neighbour whose distance ranks a sample, a quarter of the others (at least 1)."""
    return max(1, samples // 4)


def densest(chunks: np.ndarray) -> int:
    """Index of the chunk [N, H, A] (N >= 2) whose k-th nearest other chunk is closest (Euclidean over the
    whole chunk; ties: the lowest index)."""
    flat = np.asarray(chunks, np.float64).reshape(len(chunks), -1)
    distances = np.linalg.norm(flat[:, None] - flat[None], axis=-1)
    np.fill_diagonal(distances, np.inf)
    kth = np.sort(distances, axis=1)[:, neighbours(len(chunks)) - 1]
    return int(np.argmin(kth))
