"""Row-wise normalisation of feature blocks."""

import numpy as np

from metricpipe.tasks.errors import InputError

NORMALIZATIONS = ("none", "l1", "l2", "power")


def normalize_rows(X: np.ndarray, kind: str) -> np.ndarray:
    """Normalise each row of ``X`` (n, D) and return float32.

    ``l1`` and ``l2`` divide by the row norm, ``power`` takes the signed square root and then
    l2-normalises (the usual treatment of Fisher and VLAD vectors). All-zero rows stay zero.
    """
    X = np.asarray(X, dtype=np.float32)
    if kind == "none":
        return X
    if kind == "power":
        X = np.sign(X) * np.sqrt(np.abs(X))
        kind = "l2"
    if kind == "l1":
        norms = np.abs(X).sum(axis=1, keepdims=True, dtype=np.float64)
    elif kind == "l2":
        norms = np.sqrt(np.einsum("ij,ij->i", X, X, dtype=np.float64))[:, None]
    else:
        raise InputError(f"normalize must be one of {', '.join(NORMALIZATIONS)}; got {kind!r}")
    norms[norms == 0] = 1.0  # leave zero rows at zero instead of dividing 0/0
    if norms.max() > np.finfo(np.float32).max:  # a norm beyond float32 (huge values): divide in float64
        return (X / norms).astype(np.float32)
    return (X / norms.astype(np.float32)).astype(np.float32, copy=False)


def preprocess(X: np.ndarray, mean: np.ndarray, P: np.ndarray) -> np.ndarray:
    """Centre, project on the PCA basis P (D, p) and l2-normalise rows: the SL-NE input space
    (SL-NE and SL-DE encode through it, and so does :class:`~metricpipe.tasks.models.LinearModel`)."""
    Z = (np.asarray(X, np.float32) - mean.astype(np.float32)) @ P.astype(np.float32)
    norms = np.linalg.norm(Z, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return Z / norms
