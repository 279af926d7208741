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

The estimators :class:`NML` and :class:`LinearML` (end of this module) take their pairs from
*pair pools*, a set of rows in hand with pairs of indices into it:

- from labels (``fit(X, y)``, the pipeline's ``fit_stream``): the pools of
  :mod:`metricpipe.tasks.stream`, each a uniform random sample of the training rows whatever their
  stored order; pairs are drawn inside each pool (:func:`sample_pairs`), so every batch mixes
  classes from across the data set;
- from pairs the user gives (``fit_pairs``, the pipeline's ``fit_pair_blocks``): the pairs are
  grouped by the layout blocks of their two rows (:func:`pair_groups`), and SGD visits the groups
  in a seeded order holding at most two blocks.
"""
from numbers import Integral, Real

import numpy as np
from sklearn.utils.validation import check_is_fitted

from metricpipe.tasks import moments, stream
from metricpipe.tasks.rows import ArrayRows, TrainingRows
from metricpipe.tasks.base import (COUNT, DIM, DIM_OR_NONE, NON_NEGATIVE, RANDOM_STATE, Interval, Learner, StrOptions, one_blas_thread,
                                   seed_of)
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.evaluation import can_rank, validation_map
from metricpipe.tasks.normalize import normalize_rows
from metricpipe.tasks.validate import beyond_float32


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
        raise InputError(f"{where}: Negative values in data: NML's chi2 kernel needs non-negative features (e.g. "
                         f"CNN activations after ReLU); found {int((X < 0).sum())} negative value(s), first at row {r}, "
                         f"column {c}; "
                         f"shift or clip them, or use method linear-ml")


class PairSGD:
    """Mini-batch SGD for NML (kind 'nml') or the linear baseline (kind 'linear').

    ``optimizer`` 'sgd' is Algorithm 1's update, L -= lr * gradient (averaged over the batch); 'adam'
    (Kingma and Ba, beta = 0.9, 0.999) scales each entry's step by its running gradient size. Both descend
    the same objective (Eq. 9 or 3); Adam matters for NML on l1-normalised inputs, whose kernel gradient
    2 x^2 / (|x| + |l|)^2 is ~1e-4 for l drawn from (-0.5, 0.5), so plain SGD barely moves L."""

    def __init__(self, L0: np.ndarray, kind: str, lr: float, bias: float, margin: float, learn_bias: bool = False,
                 optimizer: str = "sgd", threads: int = 1, scale: float = 1.0):
        if optimizer not in ("sgd", "adam"):
            raise ValueError(f"optimizer must be 'sgd' or 'adam', got {optimizer!r}")
        # the linear kind with the rows' RMS norm s: L starts at L0 / s and steps by lr / s^2 (Adam's
        # step, blind to the gradient's size: lr / s), i.e. SGD from L0 on the rows x / s; NML's kernel
        # reads l1-normalised rows and keeps s = 1
        scale = float(scale) if kind == "linear" else 1.0
        self.L = np.array(L0, np.float64) / scale
        self.kind, self.lr, self.bias, self.margin, self.learn_bias = kind, float(lr), float(bias), float(margin), learn_bias
        self.step_L = self.lr / (scale if optimizer == "adam" else scale ** 2)
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
            with np.errstate(over="ignore", invalid="ignore"):   # a diverging L is caught below
                loss, G, gb = linear_loss_and_gradient(self.L, Xi, Xj, y, self.bias, self.margin)
        self.steps += 1
        dL, db = self._direction(G, gb)
        with np.errstate(over="ignore", invalid="ignore"):
            self.L -= self.step_L * dL
        if beyond_float32(self.L):
            raise InputError(f"{'NML' if self.kind == 'nml' else 'LinearML'} diverged after {self.steps} steps "
                             f"(L is not finite in float32); lower 'lr' (now {self.lr})")
        if self.learn_bias:
            self.bias -= self.lr * db
        self.pairs_seen += len(y)
        return loss

    def embed(self, X: np.ndarray) -> np.ndarray:
        if self.kind == "nml":
            return chi2_embed(self.L, X)
        return X @ self.L.T

    def close(self) -> None:
        """Stop the kernel's threads (when ``threads`` > 1)."""
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None


# ---- pairs -----------------------------------------------------------------------------------------------

def sample_pairs(y: np.ndarray, count: int, rng: np.random.Generator):
    """``count`` pairs of distinct rows of one pool with class codes ``y`` (m,), in random order:
    half similar (s = +1), half dissimilar (s = -1).

    A similar pair is a row drawn uniformly among the rows whose class has another row in the pool
    and a second row of its class; a dissimilar pair a row drawn uniformly and a row of another
    class. When the pool cannot give one kind (one class only; no class with two rows), all pairs
    are of the other kind; a pool of fewer than two rows gives none. The draws depend on the order
    of the class codes only, not on their values, so the codes of the staged data and those of
    ``np.unique`` give the same pairs.

    Returns
    -------
    i, j : ndarray of shape (n_pairs,), int64 rows of the pool; s : ndarray (n_pairs,), float32 +-1
    """
    y = np.asarray(y)
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32))
    if count <= 0 or len(y) < 2:
        return empty
    _, codes, counts = np.unique(y, return_inverse=True, return_counts=True)
    codes = codes.ravel()
    order = np.argsort(codes, kind="stable")           # rows grouped by class, in pool order inside each
    start = np.r_[0, np.cumsum(counts)[:-1]]
    rank = np.empty(len(y), np.int64)
    rank[order] = np.arange(len(y)) - start[codes[order]]   # place of each row inside its class
    can_pos, can_neg = bool((counts >= 2).any()), len(counts) >= 2
    n_pos = (count // 2 if can_neg else count) if can_pos else 0
    n_neg = count - n_pos if can_neg else 0
    # similar: i among the rows of classes with >= 2 rows, j another row of its class
    eligible = np.flatnonzero(counts[codes] >= 2)
    i_pos = eligible[rng.integers(0, len(eligible), n_pos)] if n_pos else np.zeros(0, np.int64)
    c = codes[i_pos]
    k = rng.integers(0, counts[c] - 1) if n_pos else np.zeros(0, np.int64)
    j_pos = order[start[c] + k + (k >= rank[i_pos])]        # skips i itself
    # dissimilar: i any row, j the k-th row outside its class
    i_neg = rng.integers(0, len(y), n_neg)
    c = codes[i_neg]
    k = rng.integers(0, len(y) - counts[c]) if n_neg else np.zeros(0, np.int64)
    j_neg = order[np.where(k < start[c], k, k + counts[c])]
    perm = rng.permutation(n_pos + n_neg)
    s = np.r_[np.ones(n_pos, np.float32), -np.ones(n_neg, np.float32)]
    return np.r_[i_pos, i_neg][perm].astype(np.int64), np.r_[j_pos, j_neg][perm].astype(np.int64), s[perm]


def check_pair_indices(i, j, y, n_rows: int, where: str) -> None:
    """Pairs given by the user: integer row indices in 0..n_rows-1 of one equal length, y in {-1, +1}."""
    i, j, y = np.asarray(i), np.asarray(j), np.asarray(y)
    if not (len(i) == len(j) == len(y)) or len(i) == 0:
        raise InputError(f"{where}: pairs need arrays i, j, y of one equal, non-zero length; got "
                         f"{len(i)}, {len(j)}, {len(y)}")
    for name, a in (("i", i), ("j", j)):
        if not np.issubdtype(a.dtype, np.integer):
            raise InputError(f"{where}: pairs '{name}' must hold integer row indices; got {a.dtype}")
        bad = (a < 0) | (a >= n_rows)
        if bad.any():
            raise InputError(f"{where}: pair index {name}={int(a[bad][0])} is out of range 0..{n_rows - 1} "
                             f"(pair {int(np.flatnonzero(bad)[0])}); fix or drop it")
    if not np.isin(y, (-1, 1)).all():
        raise InputError(f"{where}: pair labels y must be +1 (similar) or -1 (dissimilar); got "
                         f"{sorted(set(np.unique(y).tolist()) - {-1, 1})[:3]}")


def pair_groups(pos_i: np.ndarray, pos_j: np.ndarray, n_rows: int, block_rows: int, seed: int):
    """Endless visiting order of user pairs over the layout of :mod:`metricpipe.tasks.stream`.

    The pairs are grouped by the (unordered) layout blocks of their two rows; every epoch visits
    the groups in a seeded order and each group's pairs in a seeded order. Since every layout block
    is a uniform sample of the rows, each group's pairs are a random subset of all pairs.

    Parameters
    ----------
    pos_i, pos_j : ndarray of shape (n_pairs,)
        Layout positions of the pairs' two rows.
    n_rows, block_rows : int
        Rows of the layout and rows per layout block.

    Yields
    ------
    blocks : tuple of one or two block numbers (ascending); sel : ndarray, pair indices in visiting order
    """
    n_blocks = -(-n_rows // block_rows)
    bi, bj = pos_i // block_rows, pos_j // block_rows
    lo, hi = np.minimum(bi, bj), np.maximum(bi, bj)
    key = lo * n_blocks + hi
    by = np.argsort(key, kind="stable")
    bounds = np.flatnonzero(np.r_[True, np.diff(key[by]) != 0, True])
    epoch = 0
    while True:
        rng = np.random.default_rng([seed, 23, epoch])
        for g in rng.permutation(len(bounds) - 1):
            sel = by[bounds[g]:bounds[g + 1]]
            b1, b2 = int(lo[sel[0]]), int(hi[sel[0]])
            yield ((b1,) if b1 == b2 else (b1, b2)), rng.permutation(sel)
        epoch += 1


# ---- the estimators --------------------------------------------------------------------------------------

_PAIR_CONSTRAINTS = {
    "dim": DIM,
    "pairs": [Interval(Integral, 2, None, closed="left")],
    "iters": [Interval(Integral, 0, None, closed="left")],
    "batch": COUNT,
    "learn_bias": ["boolean"],
    "bias": [Interval(Real, None, None, closed="neither")],
    "margin": NON_NEGATIVE,
    "optimizer": [StrOptions({"sgd", "adam"})],
    "lr": [*NON_NEGATIVE, None],
    "validation": [Interval(Integral, 0, None, closed="left")],
    "random_state": RANDOM_STATE,
}

# Early stopping: validation every ITERS // VALIDATIONS pairs; training stops after PATIENCE checks
# in a row without a better validation mAP, and keeps the best L.
VALIDATIONS, PATIENCE = 20, 10


class _PairLearner(Learner):
    """Shared by :class:`NML` and :class:`LinearML`: SGD on the hinge of pairs (Eqs. 3 and 9).

    Four ways in, two in memory and two for the pipeline, which share the SGD loop:

    ``fit(X, y)``
        pairs from labels, drawn inside the pools of ``tasks.stream.pools`` -> :meth:`fit_stream`.
    ``fit_stream(pools, n_samples, n_features, init)``
        the pipeline's entry point for labels: pools (X_pool, y_pool) from its shuffled copy.
    ``fit_pairs(pairs, y, X=None)``
        pairs given by the user, as metric-learn's pair learners take them -> :meth:`fit_pair_blocks`.
    ``fit_pair_blocks(pairs, y, read_block, n_rows, block_rows, n_features, init)``
        the pipeline's entry point for user pairs: layout positions and a reader of layout blocks.

    Pairs from labels: a pool of m rows (out of ``n_samples`` per pass over the rows) gets its share
    of ``pairs``, m * pairs / n_samples (rounded so that a pass draws exactly ``pairs``), drawn
    afresh on every pass (:func:`sample_pairs`); SGD takes them ``batch`` at a time (a pool's last
    batch may be shorter) until ``iters`` pairs are seen. So ``pairs`` is the number of pairs drawn
    per pass over the training rows (the paper's 500,000 sampled pairs seen over 1,000,000
    iterations become two passes of 500,000 fresh pairs each). Pairs from the user are all used,
    ``pairs`` is then ignored.

    Early stopping (pairs from labels): with ``validation`` > 0, the mAP of validation rows querying
    one another is measured at the start and every ``iters`` / 20 pairs; L is the best seen, and
    training stops after 10 checks (half of them) in a row without a better one. The validation rows are
    (X_val, y_val) when given, else a stratified, seeded share of the training rows (at most a fifth,
    ``validation`` at most) that SGD never sees; the pipeline gives its ``val`` split. When no
    validation row has another of its class (few-shot data), early stopping is off and every row trains.

    Fitted attributes: ``L_`` (dim, n_features) float32, ``bias_`` (the threshold b, learned when
    ``learn_bias``), ``history_`` (list of {"iter": pairs seen, "hinge": mean hinge since the
    previous entry}, about 50 entries, and {"iter", "val_map"} at each validation),
    ``pairs_seen_``, ``n_steps_``, ``n_pairs_`` (pairs drawn or given), ``pair_source_`` ("labels"
    or "user"), ``best_iter_`` and ``val_map_`` (the kept L's pairs seen and validation mAP; None
    without validation).
    """
    _kind = ""
    feeds = "pairs"
    fitted_attributes = ("L_", "bias_", "classes_", "history_", "best_iter_", "val_map_", "pairs_seen_", "n_pairs_",
                         "n_steps_", "pair_source_")

    def validates(self) -> bool:
        return self.validation > 0

    def start(self, statistics: dict) -> tuple:
        """(L's start rows or None for the seeded default, the rows' RMS norm ``lr`` is read by) from the
        statistics it reads (:attr:`reads_statistics`)."""
        return None, 1.0

    def refit_params(self) -> dict:
        """``iters`` = the pairs seen by the kept L, validation off (the rate does not decay, so fewer
        pairs are the same schedule cut short); {} when the fit did not validate (user pairs)."""
        best = getattr(self, "best_iter_", None)
        return {} if best is None else {"iters": int(best), "validation": 0}

    # -- in memory ---------------------------------------------------------------------------------------
    def fit(self, X, y, block_rows=None, X_val=None, y_val=None):
        """Learn from rows X with class labels y: pairs drawn from the labels.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
        block_rows : int or None
            Rows per pool (None: 64 MB of float32 rows, as the pipeline's row-blocks); the pipeline
            uses its row-block size, so ``fit(X, y, block_rows=data.chunk_rows)`` on the training
            rows learns the pipeline's model.
        X_val, y_val : optional validation rows for early stopping (see the class docstring).

        Returns
        -------
        self
        """
        self._validate_params()
        X, codes = self._check_Xy(X, y)
        if self.requires_nonnegative:   # named as given, before rows are held out for validation
            check_nonnegative(X, f"{type(self).__name__}.fit: X")
        yv = None
        if X_val is not None:
            X_val, y_val = self._check_val(X_val, y_val)
            if self.requires_nonnegative:
                check_nonnegative(X_val, f"{type(self).__name__}.fit: X_val")
            yv = np.searchsorted(self.classes_, y_val)
            if np.any(yv >= len(self.classes_)) or np.any(self.classes_[np.minimum(yv, len(self.classes_) - 1)] != y_val):
                raise InputError(f"{type(self).__name__}: y_val holds labels that are not in y")
        statistics = moments.statistics(X) if self.reads_statistics else {}
        return self.fit_rows(ArrayRows(X, codes, X_val, yv, block_rows), statistics)

    def fit_facts(self) -> dict:
        return {"samples": self.pairs_seen_, "pairs": int(self.n_pairs_), "pair_source": self.pair_source_,
                "best_iter": self.best_iter_, "val_map": self.val_map_}

    def fit_rows(self, rows: TrainingRows, statistics: dict, labels=None):
        """Learn from :class:`~metricpipe.tasks.rows.TrainingRows` (pairs drawn from the labels inside
        each pool) and the statistics it reads (:attr:`reads_statistics`): ``fit`` and the pipeline both
        end here. With ``validation`` > 0, early stopping reads the given validation rows, else a
        stratified share held out of the fit rows (none, and every row trains, when no held-out row has
        another of its class: few-shot data). Returns self."""
        self._validate_params()
        seed = seed_of(self.random_state)  # once: a RandomState random_state gives one draw per call
        keep, val = rows.fit.copy(), np.zeros(0, np.int64)
        if self.validates() and rows.val is not None and len(rows.val):
            val = stream.seeded_sample(rows.val, self.validation, seed)
        elif self.validates():
            pos = np.flatnonzero(keep)
            held = pos[stream.validation_split(rows.labels[pos], self.validation, rows.keys[pos], seed)]
            if can_rank(rows.labels[held]):
                keep[held] = False
                val = held
        init, scale = self.start(statistics)
        n = int((keep & rows.in_stats).sum())
        given = (rows.take(val), rows.labels[val]) if len(val) else None
        return self._fit_labels(rows.pools(keep, seed), n, rows.n_features, init, scale, seed, given)

    def fit_pairs(self, pairs, y, X=None, block_rows=None):
        """Learn from pairs given by the user (metric-learn's ``_PairsClassifierMixin`` convention).

        Parameters
        ----------
        pairs : array-like of shape (n_pairs, 2, n_features), or (n_pairs, 2) int when X is given
            The two images of each pair, or (with X, like metric-learn's ``preprocessor``) their row
            indices in X.
        y : array-like of shape (n_pairs,)
            +1 for a similar pair, -1 for a dissimilar one.
        X : array-like of shape (n_samples, n_features) or None
        block_rows : int or None
            Rows per layout block (None: 64 MB of float32 rows). The rows get the seeded layout of
            ``tasks.stream.layout``; pairs are visited by the blocks of their two rows
            (:func:`pair_groups`), as the pipeline visits them on its shuffled copy.

        Returns
        -------
        self
        """
        self._validate_params()
        name = type(self).__name__
        if X is None:
            P = np.asarray(pairs)
            if P.ndim != 3 or P.shape[1] != 2:
                raise InputError(f"{name}.fit_pairs: pairs must be an array of shape (n_pairs, 2, n_features) when "
                                 f"X is not given; got shape {P.shape}; pass X for pairs of row indices")
            X = self._check_X(P.reshape(-1, P.shape[2]), reset=True)
            idx = np.arange(len(X)).reshape(-1, 2)
        else:
            X = self._check_X(X, reset=True)
            idx = np.asarray(pairs)
            if idx.ndim != 2 or idx.shape[1] != 2:
                raise InputError(f"{name}.fit_pairs: with X, pairs must be an (n_pairs, 2) array of row indices; "
                                 f"got shape {idx.shape}")
        y = np.asarray(y).ravel()
        check_pair_indices(idx[:, 0], idx[:, 1], y, len(X), f"{name}.fit_pairs")
        n, seed = len(X), seed_of(self.random_state)
        br = block_rows or stream.block_rows_for(X.shape[1])
        pi = stream.layout(stream.row_keys(X), seed)
        pos = np.empty(n, np.int64)
        pos[pi] = np.arange(n)
        return self._fit_pairs(pos[idx], y, lambda b: X[pi[b * br:(b + 1) * br]], n, br, X.shape[1],
                               *self.start(moments.statistics(X) if self.reads_statistics else {}), seed)

    # -- the pipeline's entry points ---------------------------------------------------------------------
    def fit_stream(self, pools, n_samples: int, n_features: int, init=None, X_val=None, y_val=None, row_scale=1.0):
        """Learn from pools of labelled rows: pairs drawn inside each pool (see the class docstring).

        Parameters
        ----------
        pools : iterable of (X_pool (m, n_features), y_pool (m,) class codes)
            Endless (or long enough) stream of pools, e.g. ``tasks.stream.pools`` in memory or
            ``metricpipe.shuffle.stream_pools`` in the pipeline.
        n_samples : int
            Rows in one pass over the pools (the training rows).
        n_features : int
        init : ndarray of shape (k, n_features) or None
            The start of L: its first ``dim`` rows (LinearML: the PCA components, required; NML: None
            for Algorithm 1's seeded uniform(-0.5, 0.5)).
        X_val, y_val : optional validation rows and labels (early stopping; ignored when
            ``validation`` is 0).
        row_scale : float, default=1.0
            The training rows' RMS norm (:func:`metricpipe.tasks.moments.row_scale` of the
            statistics): LinearML reads ``lr`` and starts L for rows of unit RMS norm. NML ignores it.

        Returns
        -------
        self
        """
        self._validate_params()
        val = None if X_val is None else (np.asarray(X_val), np.asarray(y_val))
        return self._fit_labels(pools, n_samples, n_features, init, row_scale, seed_of(self.random_state), val)

    def fit_pair_blocks(self, pairs, y, read_block, n_rows: int, block_rows: int, n_features: int, init=None,
                        row_scale=1.0):
        """Learn from user pairs over rows in a block layout, holding at most two blocks at a time.

        Parameters
        ----------
        pairs : ndarray of shape (n_pairs, 2)
            Layout positions of the two rows of each pair (checked by the caller).
        y : ndarray of shape (n_pairs,), +-1
        read_block : callable
            ``read_block(b)`` -> rows ``b * block_rows`` up to ``(b + 1) * block_rows`` of the layout,
            an array (<= block_rows, n_features).
        n_rows, block_rows, n_features : int
        init, row_scale : as in :meth:`fit_stream`

        Returns
        -------
        self
        """
        self._validate_params()
        return self._fit_pairs(pairs, y, read_block, n_rows, block_rows, n_features, init, row_scale,
                               seed_of(self.random_state))

    # -- internals ---------------------------------------------------------------------------------------
    def _fit_labels(self, pools, n_samples, n_features, init, scale: float, seed: int, val=None):
        L0 = self._start(n_features, init, seed)
        rng = np.random.default_rng([seed, 17])
        if val is not None and (not self.validation or not can_rank(val[1])):
            val = None   # off, or no validation row has another of its class to find
        if val is not None:
            val = (self._prepare(val[0], f"{type(self).__name__}: validation rows"), val[1])
        with one_blas_thread():
            self._run(self._label_pair_pools(pools, int(n_samples), rng), L0, scale, val)
        self.pair_source_ = "labels"
        return self

    def _fit_pairs(self, pairs, y, read_block, n_rows, block_rows, n_features, init, scale: float, seed: int):
        pairs = np.asarray(pairs, np.int64)
        y = np.asarray(y, np.float32).ravel()
        L0 = self._start(n_features, init, seed)
        groups = pair_groups(pairs[:, 0], pairs[:, 1], int(n_rows), int(block_rows), seed)
        with one_blas_thread():
            self._run(self._block_pair_pools(groups, pairs, y, read_block, int(block_rows)), L0, scale)
        self.pair_source_ = "user"
        self.n_pairs_ = int(len(y))
        self.__dict__.pop("classes_", None)  # from an earlier fit(X, y)
        return self

    def _start(self, n_features: int, init, seed: int) -> np.ndarray:
        self.n_features_in_ = int(n_features)
        if init is None:
            return self._default_init(n_features, seed)
        init = np.asarray(init, np.float64)
        if init.ndim != 2 or init.shape[1] != n_features:
            raise InputError(f"{type(self).__name__}: init must be an array (k, n_features={n_features}); "
                             f"got shape {init.shape}")
        if self.dim is not None and self.dim > len(init):
            raise InputError(f"The 'dim' parameter of {type(self).__name__} must be <= {len(init)}, the rows of init "
                             f"(the PCA components L starts from; n_features = {n_features}). Got {self.dim} instead.")
        return init[:self.resolved_dim(len(init))]

    def _prepare(self, X, where: str) -> np.ndarray:
        """The rows SGD compares: float32 (NML: checked non-negative and l1-normalised)."""
        return np.asarray(X, np.float32)

    def _label_pair_pools(self, pools, n_samples: int, rng):
        """Pair pools (rows, i, j, s) from pools of labelled rows, until ``iters`` pairs are drawn."""
        rows = drawn = idle = self.n_pairs_ = 0
        if self.iters == 0:   # a refit of the start (refit_params of best_iter_ 0): no pair to draw
            return
        for X, y in pools:
            before = self.pairs * rows // n_samples
            rows += len(y)
            count = min(self.pairs * rows // n_samples - before, self.iters - drawn)
            i, j, s = sample_pairs(y, count, rng)
            if len(s) == 0:
                idle += len(y)
                if idle > 2 * n_samples:
                    raise InputError(f"{type(self).__name__}: two passes over the {n_samples} training rows gave no "
                                     f"pair (pools of fewer than two rows?); raise 'pairs' or the rows per pool")
                continue
            idle = 0
            drawn += len(s)
            self.n_pairs_ = drawn
            yield self._prepare(X, f"{type(self).__name__}: training rows"), i, j, s
            if drawn >= self.iters:
                return

    def _block_pair_pools(self, groups, pairs, y, read_block, block_rows: int):
        """Pair pools from the groups of :func:`pair_groups`: the group's one or two blocks, in hand."""
        held = {}
        for blocks, sel in groups:
            held = {b: held[b] if b in held else
                    self._prepare(read_block(b), f"{type(self).__name__}: rows of layout block {b}") for b in blocks}
            X = np.concatenate([held[b] for b in blocks]) if len(blocks) > 1 else held[blocks[0]]
            local = []
            for col in (0, 1):
                p = pairs[sel, col]
                b = p // block_rows
                local.append(p - b * block_rows + np.where(b == blocks[0], 0, len(held[blocks[0]])))
            yield X, local[0], local[1], y[sel]

    def _run(self, pair_pools, L0, scale: float, val=None) -> None:
        """The SGD loop: ``batch`` pairs per step from each pair pool until ``iters`` pairs are seen
        (or, with validation rows ``val`` = (X_val prepared, y_val), until early stopping)."""
        sgd = PairSGD(L0, self._kind, self._searched("lr"), self.bias, self.margin, self.learn_bias, self.optimizer,
                      getattr(self, "threads", 1), scale)
        history, losses, every = [], [], max(1, self.iters // 50)
        check = max(self.batch, self.iters // VALIDATIONS)
        best, stale = None, 0

        def validate():
            nonlocal best, stale
            with np.errstate(over="ignore", invalid="ignore"):   # a diverging L is the step's error to raise
                v = validation_map(sgd.embed(val[0]), val[1])
            history.append({"iter": int(sgd.pairs_seen), "val_map": v})
            if best is None or v > best[0] or not np.isfinite(best[0]):
                best, stale = (v, int(sgd.pairs_seen), sgd.L.copy(), sgd.bias), 0
            else:
                stale += 1
            return stale >= PATIENCE

        stop = val is not None and validate()
        try:
            for X, i, j, s in pair_pools:
                for a in range(0, len(s), self.batch):
                    b = min(a + self.batch, len(s), a + self.iters - sgd.pairs_seen)
                    losses.append(sgd.step(X[i[a:b]], X[j[a:b]], s[a:b]))
                    if sgd.pairs_seen // every != (sgd.pairs_seen - (b - a)) // every:
                        history.append({"iter": int(sgd.pairs_seen), "hinge": float(np.mean(losses))})
                        losses = []
                    if val is not None and sgd.pairs_seen // check != (sgd.pairs_seen - (b - a)) // check:
                        stop = validate()
                    if sgd.pairs_seen >= self.iters or stop:
                        break
                if sgd.pairs_seen >= self.iters or stop:
                    break
        finally:
            sgd.close()
        if losses:
            history.append({"iter": int(sgd.pairs_seen), "hinge": float(np.mean(losses))})
        checked = [h["iter"] for h in history if "val_map" in h]
        if val is not None and not stop and checked[-1] != sgd.pairs_seen:
            validate()   # the end of training is a candidate too
        self.best_iter_ = self.val_map_ = None
        if best is not None:
            self.val_map_, self.best_iter_ = best[0], best[1]
            sgd.L, sgd.bias = best[2], best[3]
        self.L_ = np.ascontiguousarray(sgd.L, np.float32)
        self.bias_ = float(sgd.bias)
        self.history_ = history
        self.pairs_seen_ = int(sgd.pairs_seen)
        self.n_steps_ = int(sgd.steps)

    @property
    def _n_features_out(self):
        return len(self.L_)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.required = True
        return tags


class NML(_PairLearner):
    """Non-linear metric learning (Sharma & Schiele): codes [k(l_1, x), ..., k(l_d, x)] (Eq. 7) of
    the l1-normalised row x with the chi2 kernel of Eq. 11, L learned by SGD on the pair hinge of
    Eq. 9 (Algorithm 1, in mini-batches). Input must be non-negative (e.g. CNN activations after
    ReLU); rows are l1-normalised inside, in ``fit`` and ``transform``.

    Parameters
    ----------
    dim : int, default=64
        Output dimension d (rows of L).
    pairs : int >= 2, default=500000
        Pairs drawn from the labels per pass over the training rows (see below; ignored for user pairs).
    iters : int, default=1000000
        Pairs seen by SGD.
    batch : int, default=64
        Pairs per SGD step.
    learn_bias : bool, default=False
        Learn the threshold b too (Eq. 10's derivative in b).
    bias : float, default=0.1
        The threshold b of Eq. 9 (its start when ``learn_bias``).
    margin : float >= 0, default=0.02
        The margin m of Eq. 9.
    optimizer : {"adam", "sgd"}, default="adam"
        "sgd" is Algorithm 1's update (needs lr ~300 on l1-normalised 784-d input); Adam scales each
        entry's step by its running gradient size.
    threads : int, default=1
        Threads splitting the kernel's passes over L's rows (the model is the same bit for bit).
    lr : float >= 0 or None, default=None
        None: 0.001 with Adam, 10 with Algorithm 1's SGD (the first value of each optimizer's
        selection grid).
    validation : int >= 0, default=2000
        Validation rows for early stopping (0: off; see below).
    random_state : int, RandomState or None, default=None (seed 0)
        Seeds the layout of the rows, the pools' order, the pairs and the start of L.

    Attributes
    ----------
    L_ : ndarray of shape (dim, n_features), float32
    bias_, history_, pairs_seen_, n_steps_, n_pairs_, pair_source_, classes_ (fit(X, y) only)

    Notes
    -----
    Entry points: ``fit(X, y)`` (pairs from labels), ``fit_pairs(pairs, y, X=None)`` (user pairs,
    metric-learn's convention) and, for the pipeline, ``fit_stream`` and ``fit_pair_blocks``.
    """
    requires_nonnegative = True   # the chi2 kernel; the pipeline checks the staged features for it
    search_space = {"lr": [0.001, 0.0001, 0.01]}
    selection_metric = "map"
    # Algorithm 1's plain SGD: its step grows with D (the chi2 gradient at l1-normalised rows is small);
    # validation mAP was highest at 1 on digits (64-d), 10 on Fashion 14 x 14 (196-d), 100 on HOG (324-d)
    search_space_when = {("optimizer", "sgd"): {"lr": [10.0, 1.0, 100.0, 1000.0]}}

    method = "nml"

    def code_dim(self, n_features: int, n_classes: int) -> int:
        return int(self.dim)   # L's rows: any number, whatever the features

    def portable(self) -> tuple[str, dict, dict]:
        """``chi2``: rows l1-normalised, codes[:, t] = sum_c 2 L[t, c] x_c / (|L[t, c]| + tiny + |x_c|)
        (Eqs. 7 and 11)."""
        check_is_fitted(self)
        return "chi2", {"L": self.L_}, {"tiny": float(TINY)}
    _kind = "nml"
    _parameter_constraints = {**_PAIR_CONSTRAINTS, "threads": COUNT}

    def __init__(self, dim=64, pairs=500000, iters=1000000, batch=64, learn_bias=False, bias=0.1, margin=0.02,
                 optimizer="adam", threads=1, lr=None, validation=2000, random_state=None):
        self.dim = dim
        self.pairs = pairs
        self.iters = iters
        self.batch = batch
        self.learn_bias = learn_bias
        self.bias = bias
        self.margin = margin
        self.optimizer = optimizer
        self.threads = threads
        self.lr = lr
        self.validation = validation
        self.random_state = random_state

    def _default_init(self, n_features: int, seed: int) -> np.ndarray:
        return np.random.default_rng([seed, 19]).uniform(-0.5, 0.5, (self.dim, n_features))  # Algorithm 1

    def _prepare(self, X, where: str) -> np.ndarray:
        X = np.asarray(X, np.float32)
        check_nonnegative(X, where)
        return normalize_rows(X, "l1")

    def _transform(self, X):
        X = np.asarray(X, np.float32)
        check_nonnegative(X, f"{type(self).__name__}.transform")
        out = np.empty((len(X), len(self.L_)), np.float32)
        for a in range(0, len(X), 256):  # bounded (d, rows, D) temporaries
            out[a:a + 256] = chi2_embed(self.L_, normalize_rows(X[a:a + 256], "l1"))    # Eq. 7
        return out

    def cost(self) -> dict:
        L = self.L_
        return {"nnz": int(L.size), "storage_bytes": int(L.nbytes), "flops_per_image": 4 * int(L.size)}

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.positive_only = True
        return tags


class LinearML(_PairLearner):
    """Linear metric learning, the baseline of Sharma & Schiele (Eq. 3 with a margin m): codes L x,
    L learned by SGD on the pair hinge max(0, m - y (b - ||L x_i - L x_j||^2)), from the PCA basis.

    Parameters
    ----------
    dim : int or None, default=None
        Output dimension (rows of L); at most the number of PCA components (n_features in memory).
        None: 64, or every component when the data has fewer features.
    pairs, iters, batch, learn_bias, validation, random_state : as in :class:`NML`
    bias : float, default=1.0
    margin : float >= 0, default=0.2
    optimizer : {"sgd", "adam"}, default="sgd"
    lr : float >= 0 or None, default=None
        The step for rows of unit RMS norm, as ``bias`` and ``margin`` are distances between such
        rows: L starts at the PCA components over the training rows' RMS norm s and steps by lr / s^2
        (Adam: lr / s), the same run as on the rows x / s (nothing changes on l2-normalised rows).
        None: 0.1 with SGD, 0.01 with Adam (the first value of each optimizer's selection grid).

    Attributes
    ----------
    L_ : ndarray of shape (dim, n_features), float32
        Codes are ``X @ L_.T``.
    bias_, history_, pairs_seen_, n_steps_, n_pairs_, pair_source_, classes_ (fit(X, y) only)

    Notes
    -----
    L starts from the ``dim`` leading PCA components: in memory those of X
    (:func:`metricpipe.tasks.moments.statistics`), in the pipeline the statistics stage's (``init``).
    Entry points: ``fit(X, y)`` (pairs from labels), ``fit_pairs(pairs, y, X=None)`` (user pairs,
    metric-learn's convention) and, for the pipeline, ``fit_stream`` and ``fit_pair_blocks``.
    """
    # lr for rows of unit RMS norm: the validation mAP was highest at 1 on digits, Fashion 14 x 14,
    # HOG and Fashion-MNIST, and lowest at 0.0001 and 0.001 on the first three (benchmarks/README.md)
    search_space = {"lr": [0.1, 0.01, 1.0, 10.0]}
    selection_metric = "map"
    # Adam's step is per entry (lr / s): validation mAP was highest at 0.01 on digits, Fashion 14 x 14, HOG
    search_space_when = {("optimizer", "adam"): {"lr": [0.01, 0.001, 0.1]}}

    method = "linear-ml"
    reads_statistics = ("pca_components", "mean_sq_norm")   # L's start, and the rows' scale lr is read by

    def start(self, statistics: dict) -> tuple:
        """The leading PCA components (``dim`` rows; fewer when the statistics kept fewer, which the fit
        refuses) and :func:`~metricpipe.tasks.moments.row_scale`."""
        comps = statistics["pca_components"]
        return comps[:self.resolved_dim(len(comps))], moments.row_scale(statistics)

    def portable(self) -> tuple[str, dict, dict]:
        """``affine``: codes = X @ L.T."""
        check_is_fitted(self)
        return "affine", {"W": self.L_.T}, {}
    _kind = "linear"
    _parameter_constraints = {**_PAIR_CONSTRAINTS, "dim": DIM_OR_NONE}
    dim_within_features = True
    DEFAULT_DIM = 64

    def __init__(self, dim=None, pairs=500000, iters=1000000, batch=64, learn_bias=False, bias=1.0, margin=0.2,
                 optimizer="sgd", lr=None, validation=2000, random_state=None):
        self.dim = dim
        self.pairs = pairs
        self.iters = iters
        self.batch = batch
        self.learn_bias = learn_bias
        self.bias = bias
        self.margin = margin
        self.optimizer = optimizer
        self.lr = lr
        self.validation = validation
        self.random_state = random_state

    def _default_init(self, n_features: int, seed: int) -> np.ndarray:
        raise InputError("LinearML starts from the PCA basis: pass init = the PCA components (k, n_features), "
                         "e.g. the statistics stage's pca_components")

    def _transform(self, X):
        return np.asarray(X, np.float32) @ self.L_.T

    def cost(self) -> dict:
        L = self.L_
        return {"nnz": int(L.size), "storage_bytes": int(L.nbytes), "flops_per_image": 2 * int(L.size)}


_doc = _PairLearner.__doc__
_PAIRS_NOTES = _doc[_doc.index("    Pairs from labels"):_doc.index("    Fitted attributes")]
NML.__doc__ += "\n" + _PAIRS_NOTES
LinearML.__doc__ += "\n" + _PAIRS_NOTES
