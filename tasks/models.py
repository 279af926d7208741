"""Model containers shared by learners and the encode stage."""

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from metricpipe.tasks.normalize import preprocess


@dataclass(frozen=True)
class LinearModel:
    """An encoder: optional preprocessing, then ``code = Z @ W + b``.

    Preprocessing (SL-NE's input space) is ``Z = l2normalize((X - pre_mean) @ pre_P)`` when
    ``pre_P`` is given, else ``Z = X``. ``W is None`` means the codes are Z itself.
    ``score`` says how codes are compared: ``euclidean`` distance or ``inner`` product.
    A bilinear model also carries ``M`` (p, p), the exact similarity s(x, y) = z_x^T M z_y, whose
    view is ``query = Z @ M`` against ``base = Z`` (see :meth:`exact_views`).

    W : (p, d) float32 or None; b : (d,) float32 or None; meta : JSON-able facts about the fit.
    """

    W: np.ndarray | None
    b: np.ndarray | None = None
    meta: dict = field(default_factory=dict)
    pre_mean: np.ndarray | None = None
    pre_P: np.ndarray | None = None
    M: np.ndarray | None = None
    score: str = "euclidean"

    def preprocess(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, np.float32)
        if self.pre_P is None:
            return X
        return preprocess(X, self.pre_mean, self.pre_P)

    def transform(self, X: np.ndarray) -> np.ndarray:
        Z = self.preprocess(X)
        if self.W is None:
            return Z
        out = self._matmul(Z)
        if self.b is not None:
            out += self.b
        return out

    # A sparse W is stored sparse (the storage win) and, up to SPARSE_BELOW stored entries per D x R,
    # multiplied by a compiled kernel that reads each row once and does one multiply and one add
    # (unfused) per non-zero and row (tasks/spmm.py; its speed at D = 16384, tau = 0.99 is in
    # benchmarks/README.md). Up to 20% the kernel takes 0.53-0.67x BLAS's time; at 30% 0.69-1.14x
    # (slower only at D = 16,384, R = 256), so a denser W goes to BLAS.
    SPARSE_BELOW = 0.2
    DENSE_COMPUTE_BYTES = 256e6  # ... unless the dense W would take more memory than this

    @cached_property
    def _matmul(self):
        """Z (n, p) float32 -> Z @ W (n, d) float32."""
        W = self.W
        if hasattr(W, "nnz"):
            size = W.shape[0] * W.shape[1]
            if W.nnz <= self.SPARSE_BELOW * size or size * 4 > self.DENSE_COMPUTE_BYTES:
                from metricpipe.tasks.spmm import SparseRows  # here: numba's import takes 0.13-0.27 s (measured)

                return SparseRows(W).matmul
            W = W.toarray().astype(np.float32)
        return lambda Z: np.asarray(Z @ W, np.float32)

    def keeps_distances(self, n_features: int, atol: float = 1e-4) -> bool:
        """True when the codes' Euclidean distances are the input's: no preprocessing, compared by
        distance, and W absent (the identity) or a dense orthonormal D x D (a rotation, e.g. PCA
        keeping every dimension). A neighbour graph of the inputs is then a graph of the codes."""
        if self.pre_P is not None or self.score != "euclidean" or self.M is not None:
            return False
        if self.W is None:
            return True
        if hasattr(self.W, "nnz") or self.W.shape != (n_features, n_features):
            return False
        W = np.asarray(self.W, np.float64)
        return bool(np.allclose(W.T @ W, np.eye(n_features), atol=atol))

    def exact_views(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(query view, base view) whose inner product is the exact bilinear similarity."""
        Z = self.preprocess(X)
        return Z @ self.M, Z

    def n_components(self, n_features: int) -> int:
        if self.W is not None:
            return self.W.shape[1]
        return n_features if self.pre_P is None else self.pre_P.shape[1]

    def arrays(self) -> dict:
        """Arrays to store; a scipy sparse W is stored as its CSC parts W_data, W_indices, W_indptr."""
        names = ("W", "b", "pre_mean", "pre_P", "M")
        out = {k: getattr(self, k) for k in names if getattr(self, k) is not None}
        if self.W is not None and hasattr(self.W, "tocsc"):
            W = self.W.tocsc()
            del out["W"]
            # row indices in the smallest unsigned type that holds them (uint16 below 65,536 features)
            small = np.uint16 if W.shape[0] <= np.iinfo(np.uint16).max else np.int32
            out.update(W_data=W.data, W_indices=W.indices.astype(small), W_indptr=W.indptr, W_shape=np.array(W.shape))
        return out

    @classmethod
    def from_arrays(cls, arrays: dict, attrs: dict) -> "LinearModel":
        W = arrays.get("W")
        if "W_data" in arrays:
            import scipy.sparse

            W = scipy.sparse.csc_array(
                (arrays["W_data"], arrays["W_indices"].astype(np.int32), arrays["W_indptr"]),
                shape=tuple(arrays["W_shape"]),
            )
        return cls(
            W,
            arrays.get("b"),
            attrs.get("fit_meta", {}),
            arrays.get("pre_mean"),
            arrays.get("pre_P"),
            arrays.get("M"),
            attrs.get("score", "euclidean"),
        )

    def cost(self, n_features: int) -> dict:
        """Non-zeros, storage bytes and multiply-adds per image of the projection."""
        if self.W is None:
            return {"nnz": 0, "storage_bytes": 0, "flops_per_image": 0}
        if hasattr(self.W, "nnz"):
            nnz = int(self.W.nnz)
            stored = sum(a.nbytes for k, a in self.arrays().items() if k.startswith("W_") and k != "W_shape")
        else:
            nnz, stored = int(self.W.size), int(self.W.nbytes)
        return {"nnz": nnz, "storage_bytes": int(stored), "flops_per_image": 2 * nnz}
