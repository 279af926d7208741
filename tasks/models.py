"""Model containers shared by learners and the encode stage."""
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np


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
        from metricpipe.tasks.slne import preprocess
        return preprocess(X, self.pre_mean, self.pre_P)

    def transform(self, X: np.ndarray) -> np.ndarray:
        Z = self.preprocess(X)
        if self.W is None:
            return Z
        rows, W = self._W_compute
        out = np.asarray((Z if rows is None else np.take(Z, rows, axis=1)) @ W, np.float32)
        if self.b is not None:
            out += self.b
        return out

    # A sparse W is stored sparse (the storage win) but multiplied with BLAS: on row-major features
    # scipy's sparse product is ~6x slower than the dense GEMM at tau = 0.99 (benchmarks/README.md).
    # When the columns' supports leave input dimensions unused, only the used ones are gathered and
    # multiplied by the dense rows of W that touch them (1.5x the dense speed at D = 16384, R = 64);
    # the gather pays off while it skips at least GATHER_BELOW of the dimensions.
    DENSE_COMPUTE_BYTES = 256e6
    GATHER_BELOW = 0.6

    @cached_property
    def _W_compute(self):
        """(input rows to gather or None, the matrix to multiply them by)."""
        W = self.W
        if not hasattr(W, "toarray") or W.shape[0] * W.shape[1] * 4 > self.DENSE_COMPUTE_BYTES:
            return None, W
        used = np.flatnonzero(np.diff(W.tocsr().indptr))  # input dimensions some column reads
        dense = W.toarray().astype(np.float32)
        if len(used) <= self.GATHER_BELOW * W.shape[0]:
            return used, np.ascontiguousarray(dense[used])
        return None, dense

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
            out.update(W_data=W.data, W_indices=W.indices.astype(small), W_indptr=W.indptr,
                       W_shape=np.array(W.shape))
        return out

    @classmethod
    def from_arrays(cls, arrays: dict, attrs: dict) -> "LinearModel":
        W = arrays.get("W")
        if "W_data" in arrays:
            import scipy.sparse
            W = scipy.sparse.csc_array((arrays["W_data"], arrays["W_indices"].astype(np.int32), arrays["W_indptr"]),
                                       shape=tuple(arrays["W_shape"]))
        return cls(W, arrays.get("b"), attrs.get("fit_meta", {}), arrays.get("pre_mean"),
                   arrays.get("pre_P"), arrays.get("M"), attrs.get("score", "euclidean"))

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
