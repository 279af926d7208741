"""Non-linear metric learning by approximate kernelization (Sharma, Schiele), Sections 2.1 and 3.

The embedding of x is [k(l_1, x), ..., k(l_d, x)] (Eq. 7) with the shifted chi2 kernel
k(l, x) = sum_c 2 l_c x_c / (|l_c| + |x_c|) (Eq. 11), on l1-normalised non-negative x; pairs
(i, j, y = +-1) train L (d, D) with the hinge max(0, m - y (b - d^2)) (Eq. 9), d^2 the squared
distance of the embeddings (Eq. 8), by SGD with the subgradient of Eq. 10 and the kernel gradient
of Eq. 12, dk/dl_c = 2 x_c |x_c| / (|x_c| + |l_c|)^2. 0/0 (l_c = x_c = 0) counts as 0 in both.

The linear baseline (Eq. 3 with a margin m) is the same hinge on d^2 = ||L x_i - L x_j||^2.

SGD runs on mini-batches of pairs: each step averages the subgradients of the batch's pairs, which
is Algorithm 1's update when the batch holds one pair. Only non-zero input coordinates contribute
to the kernel and its gradient, so the kernel is evaluated on the union of the batch's non-zero
columns.
"""
import numpy as np

from metricpipe.tasks.errors import InputError
from metricpipe.tasks.normalize import normalize_rows


# |l| + |x| is floored at TINY so that 0/0 (l_c = x_c = 0) gives 0 without a masked division:
# the term's numerator x_c is then 0 and TINY^-2 stays finite in float32.
TINY = np.float32(1e-18)


def _over_rows(pool, d: int, f) -> None:
    """f(slice of L's rows) over ``pool``'s threads (numpy's loops release the GIL), or inline. Each row
    t is computed by the same calls whatever the split, so the result does not depend on the pool."""
    if pool is None or d < 2:
        f(slice(0, d))
        return
    n = pool._max_workers
    cuts = np.linspace(0, d, min(n, d) + 1).astype(int)
    list(pool.map(f, [slice(a, b) for a, b in zip(cuts[:-1], cuts[1:])]))


def chi2_embed(L: np.ndarray, X: np.ndarray, gradient: bool = False, work: np.ndarray | None = None, pool=None):
    """k(l_t, x_i) for rows x_i of X (n, D) and rows l_t of L (d, D): (n, d); with
    ``gradient`` also half of Eq. 12's dk/dl = 2 x |x| / (|x| + |l|)^2 as a (d, n, D') array over the columns
    D' where some x_i is non-zero (returned with their indices).

    ``work``, a flat float array reused across calls, holds the (d, n, D') temporary: allocating it afresh
    costs page faults on every call when malloc returns large blocks to the system at once (as under a
    Dask nanny's MALLOC_TRIM_THRESHOLD_); the gradient returned is then a view of ``work``. ``pool``
    (a ThreadPoolExecutor) splits the rows of L over its threads: the passes are memory-bound numpy
    loops, which release the GIL."""
    dt = np.float64 if np.asarray(X).dtype == np.float64 else np.float32  # float32 unless given float64
    X = np.asarray(X, dt)
    cols = np.flatnonzero((X != 0).any(axis=0))
    if len(cols) > 0.9 * X.shape[1]:  # dense input: the gather costs more than the few zero columns
        cols = np.arange(X.shape[1])
        Xc, Lc = np.ascontiguousarray(X), np.ascontiguousarray(L, dtype=dt)
    else:  # column gathers come out column-major; C order keeps the broadcast passes below unit-stride
        Xc, Lc = np.ascontiguousarray(X[:, cols]), np.ascontiguousarray(np.asarray(L, dt)[:, cols])
    shape = (len(Lc), len(Xc), len(cols))
    size = shape[0] * shape[1] * shape[2]
    if work is None or work.dtype != dt or work.size < size:
        work = np.empty(size, dt)
    R = work[:size].reshape(shape)
    K = np.empty((shape[1], shape[0]), dt)
    absL, absX = np.abs(Lc) + dt(TINY), np.abs(Xc)
    signs = np.sign(Xc) if gradient and (Xc < 0).any() else None

    def rows(t):
        np.add(absL[t, None, :], absX[None, :, :], out=R[t])         # |l| + |x|
        np.divide(Xc[None, :, :], R[t], out=R[t])                   # x / (|l| + |x|)
        K[:, t] = 2.0 * np.matmul(R[t], Lc[t, :, None])[:, :, 0].T  # sum_c 2 l x / (|l| + |x|)  (Eq. 11)
        if gradient:
            np.multiply(R[t], R[t], out=R[t])                        # x^2 / (|l| + |x|)^2
            if signs is not None:
                R[t] *= signs[None, :, :]                            # x |x| / (|l| + |x|)^2

    _over_rows(pool, shape[0], rows)
    return (K, R, cols) if gradient else K                            # Eq. 12 is 2 R


def chi2_kernel(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """k(a, b) of Eq. 11 for all rows of A and B (reference, small inputs)."""
    num = 2.0 * A[:, None, :] * B[None, :, :]
    den = np.abs(A)[:, None, :] + np.abs(B)[None, :, :]
    return np.divide(num, den, out=np.zeros_like(num), where=den > 0).sum(-1)


def hinge(d2: np.ndarray, y: np.ndarray, bias: float, margin: float) -> np.ndarray:
    """max(0, m - y (b - d^2)) per pair (Eqs. 3 and 9)."""
    return np.maximum(0.0, margin - y * (bias - d2))


def nml_loss_and_gradient(L: np.ndarray, Xi: np.ndarray, Xj: np.ndarray, y: np.ndarray, bias: float,
                          margin: float, work: np.ndarray | None = None, pool=None):
    """Mean hinge of Eq. 9 over the pairs and its subgradient with respect to L (Eq. 10) and b."""
    n = len(y)
    K, dK, cols = chi2_embed(L, np.concatenate([Xi, Xj]), gradient=True, work=work, pool=pool)
    diff = K[:n] - K[n:]                                          # k_i^t - k_j^t
    d2 = (diff ** 2).sum(1)
    loss = hinge(d2, y, bias, margin)
    active = loss > 0
    # d/dl_t of -y (b - d^2) = 2 y (k_i - k_j)(grad k_i - grad k_j)   (Eq. 10)
    c = (np.where(active, y, 0.0)[:, None] * 4.0 * diff).astype(dK.dtype)   # (n, d); 2 of Eq. 10 x 2 of Eq. 12
    G = np.zeros(L.shape, np.float64)
    # sum over pairs of c (grad k_i - grad k_j): one batched reduction over the 2n images
    cc = np.concatenate([c, -c]).T[:, None, :]                    # (d, 1, 2n)
    Gc = np.empty((len(L), len(cols)), dK.dtype)

    def rows(t):
        Gc[t] = np.matmul(cc[t], dK[t])[:, 0, :]

    _over_rows(pool, len(L), rows)
    G[:, cols] = Gc / n
    gb = -np.where(active, y, 0.0).mean()
    return float(loss.mean()), G, gb


def linear_loss_and_gradient(L: np.ndarray, Xi: np.ndarray, Xj: np.ndarray, y: np.ndarray, bias: float,
                             margin: float):
    """Mean hinge of Eq. 3 (with margin m) over the pairs and its gradient with respect to L and b."""
    n = len(y)
    Z = Xi - Xj
    P = Z @ L.T
    d2 = (P ** 2).sum(1)
    loss = hinge(d2, y, bias, margin)
    w = np.where(loss > 0, y, 0.0)
    G = 2.0 * (P * w[:, None]).T @ Z / n                           # d/dL of y d^2 = 2 y L z z^T
    return float(loss.mean()), G, -w.mean()


def check_nonnegative(X: np.ndarray, where: str) -> None:
    if (X < 0).any():
        r, c = np.argwhere(X < 0)[0]
        raise InputError(f"{where}: NML's chi2 kernel needs non-negative features (e.g. CNN activations after "
                         f"ReLU); found {int((X < 0).sum())} negative value(s), first at row {r}, column {c}; "
                         f"shift or clip them, or use method linear-ml")


class PairSGD:
    """Mini-batch SGD for NML (kind 'nml') or the linear baseline (kind 'linear').

    ``optimizer`` 'sgd' is Algorithm 1's update, L -= lr * gradient (averaged over the batch); 'adam'
    (Kingma and Ba, beta = 0.9, 0.999) scales each entry's step by its running gradient size. Both descend
    the same objective (Eq. 9 or 3); Adam matters for NML on l1-normalised inputs, whose kernel gradient
    2 x^2 / (|x| + |l|)^2 is ~1e-4 for l drawn from (-0.5, 0.5), so plain SGD barely moves L."""

    def __init__(self, L0: np.ndarray, kind: str, lr: float, bias: float, margin: float, learn_bias: bool = False,
                 optimizer: str = "sgd", threads: int = 1):
        if optimizer not in ("sgd", "adam"):
            raise ValueError(f"optimizer must be 'sgd' or 'adam', got {optimizer!r}")
        self.L = np.array(L0, np.float64)
        self.kind, self.lr, self.bias, self.margin, self.learn_bias = kind, float(lr), float(bias), float(margin), learn_bias
        self.optimizer = optimizer
        self.pairs_seen = self.steps = 0
        self.work = None  # NML's reused (d, 2 x batch, D) temporary
        self.moments = None
        self.pool = None
        if threads > 1 and kind == "nml":
            from concurrent.futures import ThreadPoolExecutor
            self.pool = ThreadPoolExecutor(threads)

    def _direction(self, G: np.ndarray, gb: float):
        """The step for L and b from their gradients."""
        if self.optimizer == "sgd":
            return G, gb
        if self.moments is None:
            self.moments = [np.zeros_like(self.L), np.zeros_like(self.L), 0.0, 0.0]
        m1, m2, b1, b2 = self.moments
        t = self.steps
        m1 *= 0.9
        m1 += 0.1 * G
        m2 *= 0.999
        m2 += 0.001 * G * G
        b1, b2 = 0.9 * b1 + 0.1 * gb, 0.999 * b2 + 0.001 * gb * gb
        self.moments[2:] = b1, b2
        c1, c2 = 1 - 0.9 ** t, 1 - 0.999 ** t
        return (m1 / c1) / (np.sqrt(m2 / c2) + 1e-12), (b1 / c1) / (np.sqrt(b2 / c2) + 1e-12)

    def step(self, Xi, Xj, y) -> float:
        if len(y) == 0:
            return 0.0
        if self.kind == "nml":
            if self.work is None or self.work.size < 2 * len(y) * self.L.size:
                self.work = np.empty(2 * len(y) * self.L.size, np.float32)
            loss, G, gb = nml_loss_and_gradient(self.L, Xi, Xj, y, self.bias, self.margin, self.work, self.pool)
        else:
            loss, G, gb = linear_loss_and_gradient(self.L, Xi, Xj, y, self.bias, self.margin)
        self.steps += 1
        dL, db = self._direction(G, gb)
        self.L -= self.lr * dL
        if self.learn_bias:
            self.bias -= self.lr * db
        self.pairs_seen += len(y)
        return loss

    def embed(self, X: np.ndarray) -> np.ndarray:
        if self.kind == "nml":
            return chi2_embed(self.L, X)
        return X @ self.L.T


class ChiEmbedding:
    """The encoder of an NML model: rows are l1-normalised (the chi2 kernel compares histograms),
    then embedded as [k(l_1, x), ..., k(l_d, x)] (Eq. 7). Same interface as LinearModel."""
    score = "euclidean"
    M = None

    def __init__(self, L: np.ndarray, meta: dict | None = None):
        self.L = np.asarray(L, np.float32)
        self.meta = meta or {}

    def transform(self, X: np.ndarray, rows: int = 256) -> np.ndarray:
        X = np.asarray(X, np.float32)
        check_nonnegative(X, "features to encode")
        out = np.empty((len(X), len(self.L)), np.float32)
        for a in range(0, len(X), rows):  # bounded (d, rows, D) temporaries
            B = X[a:a + rows]
            B = normalize_rows(B, "l1")
            out[a:a + rows] = chi2_embed(self.L, B)
        return out

    def n_components(self, n_features: int) -> int:
        return len(self.L)

    def arrays(self) -> dict:
        return {"L": self.L}

    @classmethod
    def from_arrays(cls, arrays: dict, attrs: dict) -> "ChiEmbedding":
        return cls(arrays["L"], attrs.get("fit_meta", {}))

    def cost(self, n_features: int) -> dict:
        return {"nnz": int(self.L.size), "storage_bytes": int(self.L.nbytes), "flops_per_image": 4 * int(self.L.size)}
