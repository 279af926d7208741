"""NML's chi2 embedding and the pair hinge (Sharma, Schiele, Eqs. 3 and 7-12), with their gradients.

The embedding of x is [k(l_1, x), ..., k(l_d, x)] (Eq. 7) with the shifted chi2 kernel
k(l, x) = sum_c 2 l_c x_c / (|l_c| + |x_c|) (Eq. 11), on l1-normalised non-negative x; pairs
(i, j, y = +-1) train L (d, D) with the hinge max(0, m - y (b - d^2)) (Eq. 9), d^2 the squared
distance of the embeddings (Eq. 8), with the subgradient of Eq. 10 and the kernel gradient of
Eq. 12, dk/dl_c = 2 x_c |x_c| / (|x_c| + |l_c|)^2. 0/0 (l_c = x_c = 0) counts as 0 in both. Only
non-zero input coordinates contribute to the kernel and its gradient, so the kernel is evaluated on
the union of the batch's non-zero columns. The linear baseline (Eq. 3 with a margin m) is the same
hinge on d^2 = ||L x_i - L x_j||^2.
"""

import numpy as np

from metricpipe.tasks.errors import InputError

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
        np.add(absL[t, None, :], absX[None, :, :], out=R[t])  # |l| + |x|
        np.divide(Xc[None, :, :], R[t], out=R[t])  # x / (|l| + |x|)
        K[:, t] = 2.0 * np.matmul(R[t], Lc[t, :, None])[:, :, 0].T  # sum_c 2 l x / (|l| + |x|)  (Eq. 11)
        if gradient:
            np.multiply(R[t], R[t], out=R[t])  # x^2 / (|l| + |x|)^2
            if signs is not None:
                R[t] *= signs[None, :, :]  # x |x| / (|l| + |x|)^2

    _over_rows(pool, shape[0], rows)
    return (K, R, cols) if gradient else K  # Eq. 12 is 2 R


def chi2_kernel(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """k(a, b) of Eq. 11 for all rows of A and B (reference, small inputs)."""
    num = 2.0 * A[:, None, :] * B[None, :, :]
    den = np.abs(A)[:, None, :] + np.abs(B)[None, :, :]
    return np.divide(num, den, out=np.zeros_like(num), where=den > 0).sum(-1)


def hinge(d2: np.ndarray, y: np.ndarray, bias: float, margin: float) -> np.ndarray:
    """max(0, m - y (b - d^2)) per pair (Eqs. 3 and 9)."""
    return np.maximum(0.0, margin - y * (bias - d2))


def nml_loss_and_gradient(
    L: np.ndarray,
    Xi: np.ndarray,
    Xj: np.ndarray,
    y: np.ndarray,
    bias: float,
    margin: float,
    work: np.ndarray | None = None,
    pool=None,
):
    """Mean hinge of Eq. 9 over the pairs and its subgradient with respect to L (Eq. 10) and b."""
    n = len(y)
    K, dK, cols = chi2_embed(L, np.concatenate([Xi, Xj]), gradient=True, work=work, pool=pool)
    diff = K[:n] - K[n:]  # k_i^t - k_j^t
    d2 = (diff**2).sum(1)
    loss = hinge(d2, y, bias, margin)
    active = loss > 0
    # d/dl_t of -y (b - d^2) = 2 y (k_i - k_j)(grad k_i - grad k_j)   (Eq. 10)
    c = (np.where(active, y, 0.0)[:, None] * 4.0 * diff).astype(dK.dtype)  # (n, d); 2 of Eq. 10 x 2 of Eq. 12
    G = np.zeros(L.shape, np.float64)
    # sum over pairs of c (grad k_i - grad k_j): one batched reduction over the 2n images
    cc = np.concatenate([c, -c]).T[:, None, :]  # (d, 1, 2n)
    Gc = np.empty((len(L), len(cols)), dK.dtype)

    def rows(t):
        Gc[t] = np.matmul(cc[t], dK[t])[:, 0, :]

    _over_rows(pool, len(L), rows)
    G[:, cols] = Gc / n
    gb = -np.where(active, y, 0.0).mean()
    return float(loss.mean()), G, gb


def linear_loss_and_gradient(L: np.ndarray, Xi: np.ndarray, Xj: np.ndarray, y: np.ndarray, bias: float, margin: float):
    """Mean hinge of Eq. 3 (with margin m) over the pairs and its gradient with respect to L and b."""
    n = len(y)
    Z = Xi - Xj
    P = Z @ L.T
    d2 = (P**2).sum(1)
    loss = hinge(d2, y, bias, margin)
    w = np.where(loss > 0, y, 0.0)
    G = 2.0 * (P * w[:, None]).T @ Z / n  # d/dL of y d^2 = 2 y L z z^T
    return float(loss.mean()), G, -w.mean()


def check_nonnegative(X: np.ndarray, where: str) -> None:
    if (X < 0).any():
        r, c = np.argwhere(X < 0)[0]
        raise InputError(
            f"{where}: Negative values in data: NML's chi2 kernel needs non-negative features (e.g. "
            f"CNN activations after ReLU); found {int((X < 0).sum())} negative value(s), first at row {r}, "
            f"column {c}; "
            f"shift or clip them, or use method linear-ml"
        )
