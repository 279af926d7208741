"""Baseline projections users compare against: identity, PCA, PCA-whitening, LDA, random.

Each takes the statistics dict of :func:`tasks.moments.finalize_statistics` (so it never sees the
N x D data) and returns a :class:`tasks.models.LinearModel`. Codes are centred (``b = -mean @ W``).
"""
import warnings

import numpy as np
import scipy.linalg

from metricpipe.tasks.errors import InputError
from metricpipe.tasks.models import LinearModel


def _centred(W: np.ndarray, stats: dict, meta: dict) -> LinearModel:
    W = np.ascontiguousarray(W, np.float32)
    b = (-np.asarray(stats["mean"], np.float64) @ W).astype(np.float32)
    return LinearModel(W, b, meta)


def _check_dim(dim: int, limit: int, method: str, why: str) -> int:
    if dim > limit:
        raise InputError(f"The 'dim' parameter of {method} must be <= {limit} ({why}). Got {dim} instead.")
    return dim


def fit_identity(stats: dict, dim=None) -> LinearModel:
    """The raw features: no projection."""
    return LinearModel(None, None, {"dim": int(len(stats["mean"]))})


def fit_pca(stats: dict, dim: int) -> LinearModel:
    """Project on the ``dim`` leading principal components."""
    comps = stats["pca_components"]
    _check_dim(dim, len(comps), "pca", "the number of principal components available")
    return _centred(comps[:dim].T, stats, {"explained_variance": float(stats["pca_variances"][:dim].sum())})


def fit_pcaw(stats: dict, dim: int, eps: float = 1e-6) -> LinearModel:
    """PCA followed by whitening: component i scaled by 1/sqrt(lambda_i + eps * lambda_1)."""
    comps, var = stats["pca_components"], stats["pca_variances"]
    _check_dim(dim, len(comps), "pcaw", "the number of principal components available")
    scale = 1.0 / np.sqrt(var[:dim] + eps * var[0])
    return _centred(comps[:dim].T * scale[None, :], stats, {"eps": eps})


def fit_lda(stats: dict, dim: int | None = None, reg: float = 1e-4) -> LinearModel:
    """Fisher LDA: generalised eigenvectors of (Sb, Sw + reg * trace(Sw)/D * I), W^T Sw W = I.

    ``dim`` defaults to (number of classes - 1), the rank of Sb.
    """
    counts = stats["class_counts"]
    n_classes = int((counts > 0).sum())
    if dim is None:
        dim = n_classes - 1
    _check_dim(dim, n_classes - 1, "lda", "LDA has at most n_classes - 1 discriminant directions")
    sw = stats["within_scatter"]
    D = sw.shape[0]
    ridge = reg * np.trace(sw) / D
    values, vectors = scipy.linalg.eigh(stats["between_scatter"], sw + ridge * np.eye(D),
                                        subset_by_index=[D - dim, D - 1])
    order = np.argsort(values)[::-1]
    return _centred(vectors[:, order], stats, {"reg": reg, "eigenvalues": values[order].tolist()})


def fit_random(stats: dict, dim: int, seed: int = 0) -> LinearModel:
    """Gaussian random projection, entries N(0, 1/dim), seeded."""
    D = len(stats["mean"])
    if dim > D:
        warnings.warn(f"random projection to dim={dim} > n_features={D} adds no information", stacklevel=2)
    W = np.random.default_rng(seed).standard_normal((D, dim)) / np.sqrt(dim)
    return _centred(W, stats, {"seed": seed})
