"""Out-of-core statistics as partial -> combine -> finalize.

Blocks of rows become :class:`Moments`; any two combine (associatively, Chan et al.'s pairwise
update of centred second moments, so no catastrophic cancellation from raw sums); the final
combination yields the mean, covariance, class means, within/between-class scatter and a PCA basis.
"""
from dataclasses import dataclass

import numpy as np


@dataclass
class Moments:
    """Sufficient statistics of a set of rows.

    n : int, rows seen; mean : (D,) float64; m2 : (D, D) float64 centred scatter sum or None when
    only first moments are kept; class_counts : (C,) int64; class_sums : (C, D) float64.
    """
    n: int
    mean: np.ndarray
    m2: np.ndarray | None
    class_counts: np.ndarray
    class_sums: np.ndarray


def partial_moments(X: np.ndarray, y: np.ndarray, n_classes: int, second: bool = True) -> Moments:
    """Moments of rows ``X`` (n, D) with class codes ``y`` (n,) in ``0..n_classes-1``."""
    X = np.array(X, dtype=np.float64)  # one float64 copy, centred in place below
    n, D = X.shape
    counts = np.bincount(y, minlength=n_classes).astype(np.int64)
    sums = class_sums(X, y, n_classes)
    if n == 0:
        return Moments(0, np.zeros(D), np.zeros((D, D)) if second else None, counts, sums)
    mean = X.mean(axis=0)
    m2 = None
    if second:
        X -= mean
        m2 = X.T @ X
    return Moments(n, mean, m2, counts, sums)


def class_sums(X: np.ndarray, y: np.ndarray, n_classes: int) -> np.ndarray:
    """Per-class row sums (n_classes, D) in float64: a sparse one-hot (C, n) times X, one pass over X
    whatever the number of classes (5x faster than sorting the rows and np.add.reduceat)."""
    import scipy.sparse as sp
    if len(y) == 0:
        return np.zeros((n_classes, X.shape[1]))
    onehot = sp.csr_matrix((np.ones(len(y)), (np.asarray(y), np.arange(len(y)))), shape=(n_classes, len(y)))
    return np.asarray(onehot @ np.asarray(X, dtype=np.float64))


def combine_moments(a: Moments, b: Moments) -> Moments:
    """Combine the moments of two disjoint row sets (associative up to rounding)."""
    n = a.n + b.n
    if a.n == 0 or b.n == 0:
        src = b if a.n == 0 else a
        return Moments(src.n, src.mean, src.m2, a.class_counts + b.class_counts, a.class_sums + b.class_sums)
    delta = b.mean - a.mean
    mean = a.mean + delta * (b.n / n)
    m2 = None
    if a.m2 is not None and b.m2 is not None:
        m2 = a.m2 + b.m2 + np.outer(delta, delta) * (a.n * b.n / n)
    return Moments(n, mean, m2, a.class_counts + b.class_counts, a.class_sums + b.class_sums)


def combine_all(parts: list) -> Moments:
    """Pairwise tree combination in a fixed order: the same answer whatever the worker count."""
    parts = list(parts)
    while len(parts) > 1:
        parts = [combine_moments(parts[i], parts[i + 1]) if i + 1 < len(parts) else parts[i]
                 for i in range(0, len(parts), 2)]
    return parts[0]


def finalize_statistics(m: Moments, n_components: int | None = None) -> dict:
    """Turn combined moments into the arrays every learner reads.

    Returns a dict of ``mean`` (D,), ``class_counts`` (C,), ``class_means`` (C, D) and, when second
    moments were kept, ``covariance`` (D, D) (unbiased), ``within_scatter`` Sw and
    ``between_scatter`` Sb (D, D) with Sw + Sb equal to the total scatter, and the PCA basis
    ``pca_components`` (k, D) with ``pca_variances`` (k,) in decreasing order.
    """
    if m.n < 2:
        raise ValueError(f"statistics need at least two rows; got {m.n}")
    counts = m.class_counts
    present = counts > 0
    class_means = np.zeros_like(m.class_sums)
    class_means[present] = m.class_sums[present] / counts[present, None]
    out = {"n_samples": np.int64(m.n), "mean": m.mean, "class_counts": counts, "class_means": class_means}
    if m.m2 is None:
        return out
    out["covariance"] = m.m2 / (m.n - 1)
    diff = (class_means[present] - m.mean) * np.sqrt(counts[present])[:, None]
    sb = diff.T @ diff
    out["between_scatter"] = sb
    out["within_scatter"] = m.m2 - sb
    values, vectors = pca_basis(out["covariance"], n_components)
    out["pca_components"] = vectors
    out["pca_variances"] = values
    return out


def pca_basis(cov: np.ndarray, n_components: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Eigen-decomposition of a covariance: (variances (k,), components (k, D)), decreasing.

    Signs are fixed (largest-magnitude entry of each component positive) so that the basis is
    reproducible across BLAS builds and worker counts.
    """
    values, vectors = np.linalg.eigh(cov)
    order = np.argsort(values)[::-1]
    k = len(order) if n_components is None else min(n_components, len(order))
    values = np.clip(values[order[:k]], 0.0, None)
    comps = vectors[:, order[:k]].T
    return values, fix_signs(comps)


def fix_signs(comps: np.ndarray) -> np.ndarray:
    """Flip each row so its largest-magnitude entry is positive."""
    idx = np.argmax(np.abs(comps), axis=1)
    signs = np.sign(comps[np.arange(len(comps)), idx])
    signs[signs == 0] = 1.0
    return comps * signs[:, None]
