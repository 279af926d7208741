"""Out-of-core statistics as partial -> combine -> finalize.

Blocks of rows become :class:`Moments`; any two combine (associatively, Chan et al.'s pairwise
update of centred second moments, so no catastrophic cancellation from raw sums); the final
combination yields the mean, covariance, class means, within/between-class scatter and a PCA basis.
"""

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from metricpipe.tasks import madds
from metricpipe.tasks.errors import InputError


@dataclass
class Moments:
    """Sufficient statistics of a set of rows.

    n : int, rows seen; mean : (D,) float64; m2 : (D, D) float64 centred scatter sum or None when
    only first moments are kept; class_counts : (C,) int64; class_sums : (C, D) float64; sumsq :
    float, the sum of the rows' squared norms (positive terms: a plain sum loses nothing).
    """

    n: int
    mean: np.ndarray
    m2: np.ndarray | None
    class_counts: np.ndarray
    class_sums: np.ndarray
    sumsq: float = 0.0


# Rows per float32 product in ``within_scatter``: each S x D slab's Z^T Z is a float32 GEMM (twice the
# float64 rate) added into a float64 total, so rounding grows with S, not with the block: on 65,536 x
# 256 blocks the scatter is within 2e-8 of float64 (relative to its largest entry) at 2048 rows and
# 1e-7 at 8192, and the block's moments take half the float64 time (0.08 s against 0.16 s).
SCATTER_ROWS = 2048


def partial_moments(
    X: np.ndarray, y: np.ndarray, n_classes: int, second: bool = True, rows: np.ndarray | None = None
) -> Moments:
    """Moments of rows ``X`` (n, D) with class codes ``y`` (n,) in ``0..n_classes-1``; with ``rows``,
    of ``X[rows]`` (``y`` then has one code per entry of ``rows``), gathered a slab at a time.

    The centred scatter is assembled as within-class scatter (rows minus their class mean, small
    numbers, so float32 products lose nothing that float32 features had) plus the between-class
    part from the float64 class means: no raw sums, no cancellation, whatever the offset."""
    X = np.asarray(X)
    y = np.asarray(y)
    D = X.shape[1]
    n = len(y)
    counts = np.bincount(y, minlength=n_classes).astype(np.int64)
    sums = class_sums(X, y, n_classes, rows)
    if n == 0:
        return Moments(0, np.zeros(D), np.zeros((D, D)) if second else None, counts, sums, 0.0)
    mean = sums.sum(axis=0) / n
    m2 = None
    if second:
        means = class_means(counts, sums)
        diff = (means - mean) * np.sqrt(counts)[:, None]
        m2 = within_scatter(X, y, means, counts, rows) + diff.T @ diff
        sumsq = float(np.trace(m2) + n * (mean @ mean))
    else:
        sumsq = float(sum(np.einsum("ij,ij->", slab, slab, dtype=np.float64) for _, slab in slabs(X, rows)))
    return Moments(n, mean, m2, counts, sums, sumsq)


def class_means(counts: np.ndarray, sums: np.ndarray) -> np.ndarray:
    """(C, D) float64 class means; zero rows for absent classes."""
    means = np.zeros_like(sums)
    present = counts > 0
    means[present] = sums[present] / counts[present, None]
    return means


def slabs(X: np.ndarray, rows: np.ndarray | None = None, step: int | None = None):
    """(start, slab) over the rows of X (or of X[rows]) in slabs of ``step``; gathered slabs share one
    buffer, so the caller uses each before asking for the next. Gathering a slab at a time spares a
    copy of the whole selection (a 58 MB temporary of a 64 MB block, page-faulted in afresh in a Dask
    worker)."""
    step = step or SCATTER_ROWS
    if rows is None:
        for s in range(0, len(X), step):
            yield s, X[s : s + step]
        return
    rows = np.asarray(rows, np.intp)
    if len(rows) and (rows.min() < 0 or rows.max() >= len(X)):
        raise IndexError(f"rows out of range 0..{len(X) - 1}")
    buf = np.empty((min(step, len(rows)),) + X.shape[1:], X.dtype)
    for s in range(0, len(rows), step):
        part = rows[s : s + step]
        yield s, np.take(X, part, axis=0, out=buf[: len(part)], mode="clip")  # (checked above)


def within_scatter(
    X: np.ndarray, y: np.ndarray, means: np.ndarray, counts: np.ndarray, rows: np.ndarray | None = None
) -> np.ndarray:
    """sum_i (x_i - mu_{y_i})(x_i - mu_{y_i})^T in float64, by products of SCATTER_ROWS-row slabs in
    the features' precision (float32 unless they are float64); ``rows``: of X[rows]."""
    dt = np.float64 if X.dtype == np.float64 else np.float32
    m = means.astype(dt)
    D = X.shape[1]
    W = np.zeros((D, D))
    # buffers made once: Dask workers set MALLOC_TRIM_THRESHOLD_, under which every fresh temporary
    # is a new mmap and page-faults; that doubled this loop's time there (0.067 s -> 0.145 s a block)
    Z, P = np.empty((min(SCATTER_ROWS, len(y)), D), dt), np.empty((D, D), dt)
    for s, slab in slabs(X, rows):
        z = Z[: len(slab)]
        np.take(m, y[s : s + len(z)], axis=0, out=z, mode="clip")  # "raise" would buffer out
        np.subtract(slab, z, out=z, casting="unsafe")
        np.matmul(z.T, z, out=P)  # numpy runs z^T z as one syrk
        W += P
    # the slabs were centred on the rounded means m: sum (x - m)(x - m)^T = W + n_c (mu - m)(mu - m)^T
    d = (means - m) * np.sqrt(counts)[:, None]
    return W - d.T @ d


def class_sums(X: np.ndarray, y: np.ndarray, n_classes: int, rows: np.ndarray | None = None) -> np.ndarray:
    """Per-class row sums (n_classes, D) in float64: a sparse one-hot (C, rows) times X in float64,
    slab by slab (one pass over X whatever the number of classes, 5x faster than sorting the rows
    and np.add.reduceat; the slabs keep the float64 copy small); ``rows``: of X[rows]."""
    sums = np.zeros((n_classes, X.shape[1]))
    buf = np.empty((min(SCATTER_ROWS, len(y)), X.shape[1]))
    for s, slab in slabs(X, rows):
        ys = np.asarray(y[s : s + len(slab)])
        b = buf[: len(ys)]
        np.copyto(b, slab, casting="unsafe")
        onehot = sp.csr_matrix((np.ones(len(ys)), (ys, np.arange(len(ys)))), shape=(n_classes, len(ys)))
        sums += onehot @ b
    return sums


def combine_moments(a: Moments, b: Moments) -> Moments:
    """Combine the moments of two disjoint row sets (associative up to rounding)."""
    n = a.n + b.n
    if a.n == 0 or b.n == 0:
        src = b if a.n == 0 else a
        return Moments(
            src.n, src.mean, src.m2, a.class_counts + b.class_counts, a.class_sums + b.class_sums, a.sumsq + b.sumsq
        )
    delta = b.mean - a.mean
    mean = a.mean + delta * (b.n / n)
    m2 = None
    if a.m2 is not None and b.m2 is not None:
        m2 = a.m2 + b.m2 + np.outer(delta, delta) * (a.n * b.n / n)
    return Moments(n, mean, m2, a.class_counts + b.class_counts, a.class_sums + b.class_sums, a.sumsq + b.sumsq)


def combine_all(parts: list) -> Moments:
    """Pairwise tree combination in a fixed order: the same answer whatever the worker count."""
    parts = list(parts)
    while len(parts) > 1:
        parts = [
            combine_moments(parts[i], parts[i + 1]) if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)
        ]
    return parts[0]


def finalize_statistics(m: Moments, n_components: int | None = None) -> dict:
    """Turn combined moments into the arrays every learner reads.

    Returns a dict of ``mean`` (D,), ``class_counts`` (C,), ``class_means`` (C, D), ``mean_sq_norm``
    (the rows' mean squared norm, the scale SGD learners set their step by) and, when second
    moments were kept, ``covariance`` (D, D) (unbiased), ``within_scatter`` Sw and
    ``between_scatter`` Sb (D, D) with Sw + Sb equal to the total scatter, and the PCA basis
    ``pca_components`` (k, D) with ``pca_variances`` (k,) in decreasing order.
    """
    if m.n < 2:
        raise ValueError(f"statistics need at least two rows; got {m.n}")
    counts = m.class_counts
    present = counts > 0
    means = class_means(counts, m.class_sums)
    out = {
        "n_samples": np.int64(m.n),
        "mean": m.mean,
        "class_counts": counts,
        "class_means": means,
        "mean_sq_norm": np.float64(m.sumsq / m.n),
    }
    if m.m2 is None:
        return out
    out["covariance"] = m.m2 / (m.n - 1)
    diff = (means[present] - m.mean) * np.sqrt(counts[present])[:, None]
    sb = diff.T @ diff
    out["between_scatter"] = sb
    out["within_scatter"] = m.m2 - sb
    values, vectors = pca_basis(out["covariance"], n_components)
    out["pca_components"] = vectors
    out["pca_variances"] = values
    return out


def without_rows(stats: dict, X: np.ndarray, y: np.ndarray) -> dict:
    """``stats`` with the class counts and class means of the rows it describes less rows X (n, D) with
    class codes y (n,), which it includes: how rows held out to score a learner (validation) leave the
    means it classifies with. What reads no label (the mean, covariance, PCA basis and scale) stays that
    of every row, so nothing of size D x D is touched."""
    counts = np.asarray(stats["class_counts"], np.int64)
    b = partial_moments(np.asarray(X), np.asarray(y, np.int64), len(counts), second=False)
    left = counts - b.class_counts
    if np.any(left < 0):
        raise ValueError(
            f"without_rows: {b.n} rows are not a part of the {int(counts.sum())} rows the statistics describe"
        )
    sums = np.asarray(stats["class_means"], np.float64) * counts[:, None] - b.class_sums
    return {**stats, "class_counts": left, "class_means": class_means(left, sums)}


def row_scale(stats: dict) -> float:
    """The rows' RMS norm, sqrt(mean ||x||^2) from :func:`finalize_statistics` (1 on l2-normalised
    rows; 1 for rows that are all zero). SGD learners read their ``lr`` as the step for rows of unit
    RMS norm: training on x with the start W0 / s and the step lr / s^2 is training on x / s with W0
    and lr (the same distances and losses all along), so one default rate suits raw and l2 data.
    The norm is not centred (so l2 rows keep s = 1): rows far from the origin compared with their
    spread (a large common offset) get a smaller step than their spread would bear; on raw digits
    s^2 is 3.2x the centred mean squared norm, within the selection grid's reach (3 to 300)."""
    if "mean_sq_norm" not in stats:
        raise InputError(
            "statistics without 'mean_sq_norm' (the rows' mean squared norm): make them with "
            "metricpipe.tasks.moments.statistics or finalize_statistics"
        )
    ms = float(stats["mean_sq_norm"])
    return float(np.sqrt(ms)) if ms > 0 and np.isfinite(ms) else 1.0


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


def statistics(X: np.ndarray, y: np.ndarray | None = None, n_components: int | None = None) -> dict:
    """In memory, what the statistics stage computes out of core: :func:`finalize_statistics` of
    the moments of X (n, D) with class codes y (n,) in 0..C-1 (None: one class)."""
    y = np.zeros(len(X), np.int64) if y is None else np.asarray(y, np.int64)
    return finalize_statistics(partial_moments(X, y, int(y.max()) + 1 if len(y) else 1), n_components)


def pca_statistics(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What the statistics stage gives the learners, from rows X (n, D) in memory: the mean (D,)
    float64 and the PCA basis (D, D) as rows, decreasing variance (:func:`finalize_statistics`)."""
    stats = finalize_statistics(partial_moments(X, np.zeros(len(X), np.int64), 1))
    return stats["mean"], stats["pca_components"]


def statistics_cost(n_rows: int, n_features: int) -> float:
    """Multiply-adds of :func:`statistics` over ``n_rows`` rows: the scatter (a D x D GEMM over the
    rows), the class sums, and the PCA's eigendecomposition (:mod:`metricpipe.tasks.madds`'s unit)."""
    return (
        madds.gemm(n_features, n_features, n_rows)
        + madds.passes(n_rows * n_features, 3)
        + madds.eigh(n_features)
        + madds.passes(n_features**2, 6)
    )
