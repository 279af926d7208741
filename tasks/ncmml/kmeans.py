"""k-means for NCMC's centroids (Mensink et al., Section 3.3): k-means++ seeds from an in-memory
sample of each class, then Lloyd passes over row-blocks (blocks add up their partial sums)."""

import numpy as np

from metricpipe.tasks.errors import InputError
from metricpipe.tasks.moments import class_sums
from metricpipe.tasks.ncmml.objectives import sqdist


def kmeans_plus_plus(X: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k seeds by D^2 sampling (k-means++), on rows held in memory (a sample of one class)."""
    if len(X) < k:
        raise InputError(f"k-means++ seeds {k} centroids from {len(X)} rows; give at most {len(X)} centroids")
    C = [X[rng.integers(len(X))]]
    d = ((X - C[0]) ** 2).sum(1)
    for _ in range(1, k):
        total = d.sum()
        i = rng.choice(len(X), p=d / total) if total > 0 else rng.integers(len(X))
        C.append(X[i])
        d = np.minimum(d, ((X - X[i]) ** 2).sum(1))
    return np.array(C)


def assign(X: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Index of the nearest centroid (l2) of every row; ties go to the lower index."""
    return np.argmin(sqdist(X, C), axis=1)


def lloyd_partial(X: np.ndarray, y: np.ndarray, centroids: np.ndarray, owner: np.ndarray):
    """One block's share of a Lloyd step: per centroid, the sum and count of the rows of its class
    that are nearest to it. Blocks add up; `lloyd_update` divides."""
    sums = np.zeros_like(centroids, dtype=np.float64)
    counts = np.zeros(len(centroids), np.int64)
    for c in np.unique(y):
        mine = np.flatnonzero(owner == c)
        if not len(mine):
            continue
        Xc = X[y == c]
        j = assign(Xc, centroids[mine])
        sums[mine] += class_sums(Xc, j, len(mine))
        counts[mine] += np.bincount(j, minlength=len(mine))
    return sums, counts


def lloyd_update(centroids: np.ndarray, sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """New centroids; an empty one keeps its place."""
    out = centroids.copy()
    full = counts > 0
    out[full] = sums[full] / counts[full, None]
    return out


def class_kmeans(
    Xs: np.ndarray, ys: np.ndarray, classes, k, blocks, iters: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """k centroids per class (Section 3.3; ``k`` an int, or one per class): k-means++ seeds from the
    in-memory sample (Xs, ys), then up to ``iters`` Lloyd steps, each one pass over ``blocks()`` (a
    callable giving (X, y) row-blocks, so the data never needs to fit in memory). Returns (centroids
    (sum of k, D), their classes)."""
    ks = np.broadcast_to(np.asarray(k, np.int64), (len(classes),))
    cents = np.concatenate(
        [kmeans_plus_plus(np.asarray(Xs[ys == c], np.float64), int(kc), rng) for c, kc in zip(classes, ks)]
    )
    owner = np.repeat(np.asarray(classes), ks)
    for _ in range(iters):
        sums, counts = np.zeros_like(cents), np.zeros(len(cents), np.int64)
        for X, y in blocks():
            s, n = lloyd_partial(X, y, cents, owner)
            sums += s
            counts += n
        new = lloyd_update(cents, sums, counts)
        if np.array_equal(new, cents):
            break
        cents = new
    return cents, owner
