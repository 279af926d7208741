"""Dense rows times a sparse projection, ``X @ W`` with W (D, R) at a few non-zeros per column, as a
compiled (numba) kernel that streams X once.

Why a kernel: on row-major features scipy's sparse product runs a scalar loop ~6x slower than the
dense GEMM, and gathering the used input dimensions for BLAS still multiplies every gathered
dimension by every column (benchmarks/README.md, sparse projectors). Here each block of ``LANES``
rows is gathered, ``KC`` used dimensions at a time, into a small transposed buffer (dimension-major,
so one input value of all the block's rows is one contiguous vector), and every non-zero w of W's
row d adds ``w * X[rows, d]`` to its column's accumulator: one vector multiply-add per non-zero and
block, with no index or weight reloaded per row.

Deterministic: code (i, j) is the sum over W's column j in increasing input dimension, each term
``w * x`` rounded then added (no fused multiply-add: numba compiles without fastmath), whatever the
row's position in its block or the block's in X; so any split of X into row-blocks gives the same
bits (the encode stage and ``metricpipe encode`` slice rows differently).
"""
import numpy as np
import scipy.sparse
from numba import njit

# Rows per block (the vector lanes) and used dimensions gathered at a time. They stay runtime
# arguments of the kernel: numba leaves LLVM's SLP vectoriser off, so a lane loop of constant
# length is unrolled into scalar code, while a runtime-length loop is vectorised. 32 lanes are four
# AVX2 vectors; a 256 x 32 float32 buffer is 32 KB (an L1 cache).
LANES = 32
KC = 256


@njit(cache=True, nogil=True, boundscheck=False)
def sparse_rows_matmul(X, used, rowptr, cols, vals, out, lanes, kc):  # pragma: no cover - compiled
    """out (n, R) = X (n, D) @ W for W's rows ``used`` in CSR parts (rowptr over used, cols, vals)."""
    n, R = out.shape
    nu = used.shape[0]
    acc = np.zeros((R, lanes), np.float32)   # acc[j, b]: code j of the block's row b
    xt = np.zeros((kc, lanes), np.float32)   # xt[k, b] = X[s + b, used[k0 + k]]
    for s in range(0, n, lanes):
        m = min(lanes, n - s)
        acc[:] = 0
        for k0 in range(0, nu, kc):
            k1 = min(k0 + kc, nu)
            for b in range(m):      # each row read in increasing address order
                for k in range(k0, k1):
                    xt[k - k0, b] = X[s + b, used[k]]
            for k in range(k0, k1):
                x = xt[k - k0]
                for p in range(rowptr[k], rowptr[k + 1]):
                    w = vals[p]
                    a = acc[cols[p]]
                    for b in range(lanes):  # lanes beyond m hold stale rows: computed, never written
                        a[b] += w * x[b]
        for b in range(m):
            for j in range(R):
                out[s + b, j] = acc[j, b]


class SparseRows:
    """``X @ W`` for a scipy sparse W (D, R), through the compiled kernel (compiled on first use,
    then cached on disk by numba).

    Parameters
    ----------
    W : scipy sparse array of shape (D, R)
    """

    def __init__(self, W):
        W = scipy.sparse.csr_array(W, dtype=np.float32)
        W.sum_duplicates()                      # canonical: each (d, j) once, columns sorted per row
        counts = np.diff(W.indptr)
        used = np.flatnonzero(counts)           # only input dimensions some column reads are gathered
        self.shape = W.shape
        self.used = used.astype(np.int64)
        self.rowptr = np.concatenate([[0], np.cumsum(counts[used])]).astype(np.int64)
        self.cols = W.indices.astype(np.int32)
        self.vals = np.ascontiguousarray(W.data, np.float32)

    def matmul(self, X: np.ndarray) -> np.ndarray:
        """Codes (n, R) float32 of the rows X (n, D) (cast to C-ordered float32)."""
        X = np.ascontiguousarray(X, np.float32)
        if X.ndim != 2 or X.shape[1] != self.shape[0]:
            raise ValueError(f"X has shape {X.shape}; expected (n, {self.shape[0]}).")
        out = np.empty((X.shape[0], self.shape[1]), np.float32)
        sparse_rows_matmul(X, self.used, self.rowptr, self.cols, self.vals, out, LANES, KC)
        return out
