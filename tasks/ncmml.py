"""Nearest-class-mean metric learning (Mensink, Verbeek, Perronnin, Csurka), Sections 3-4.

W (d, D) defines d_W(x, y) = ||W x - W y||^2. Every learner here is plain minibatch SGD on rows
handed to it. The estimators NCMML, NCMC and KNNML (end of this module) run the SGD over the pools of
`metricpipe.tasks.stream`: in memory from arrays, in the pipeline from the shuffled copy of the train rows.

- NCMML: p(c|x) = softmax_c(-d_W(x, mu_c) / 2) (Eq. 5), maximise the mean log-likelihood (Eq. 9),
  gradient sum_ic alpha_ic W z_ic z_ic^T with alpha_ic = p(c|x_i) - [c = y_i], z_ic = mu_c - x_i
  (Eq. 10). Distances are taken in the projected space (Table 1's cheapest option): the m images and
  the C means are projected once per step.
- NCMC: k centroids per class, p(c|x) = sum_j softmax_cj(-d_W(x, m_cj) / 2) (Eqs. 21-22), gradient
  with alpha_icj = p(m_cj|x) - [c = y] p(m_cj|x) / sum_j' p(m_cj'|x) (Eqs. 24-25). NCM is the
  case k = 1, and both share one gradient routine.
- The dot-product variant (Eq. 27): p(c|x) = softmax_c(x^T W^T W mu_c + s_c) with a learned bias
  per class; a class added later takes s_c = -||W mu_c||^2 / 2, the bias the Euclidean form implies.
- k-NN metric learning: the triplet hinge [1 + d_W(q, p) - d_W(q, n)]_+ (Eq. 35), triplets from m
  images per step (rho m from one class, Section 4.2), and the gradient 2 W X^T A X whose coefficients
  come from one sort per query (Algorithm 1, Eqs. 40-43), never a loop over triplets.

The sign convention of the ascent: W <- W + lr * grad of the log-likelihood (NCM/NCMC); W <- W - lr *
grad of the hinge loss (k-NN).
"""
from numbers import Integral, Real

import numpy as np
from sklearn.base import ClassifierMixin

from metricpipe.tasks import moments, stream
from metricpipe.tasks.rows import ArrayRows, TrainingRows
from metricpipe.tasks.base import (COUNT, DIM_OR_NONE, POSITIVE, RANDOM_STATE, Interval, Learner, Options, StrOptions,
                                   one_blas_thread, seed_of)
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.moments import class_sums
from metricpipe.tasks.validate import beyond_float32, class_codes


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _sqdist(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    d = (A * A).sum(1)[:, None] - 2.0 * (A @ B.T) + (B * B).sum(1)[None, :]
    return np.maximum(d, 0.0)


def mixture_posteriors(Y: np.ndarray, Mp: np.ndarray, owner: np.ndarray, n_classes: int):
    """p(m_cj|x) (Eq. 21) for projected rows Y (m, d) and projected centroids Mp (K, d) whose classes
    are ``owner`` (K,); returns (p_centroid (m, K), p_class (m, C)) (Eq. 22)."""
    pc = _softmax(-0.5 * _sqdist(Y, Mp))
    pclass = np.zeros((len(Y), n_classes))
    np.add.at(pclass.T, owner, pc.T)
    return pc, pclass


def log_likelihood_and_gradient(W: np.ndarray, X: np.ndarray, y: np.ndarray, centroids: np.ndarray,
                                owner: np.ndarray, n_classes: int, gradient: bool = True):
    """Mean log-likelihood (Eq. 9) of labels y (m,) under the NCMC posterior (NCM when each class
    has one centroid), and its gradient with respect to W (Eqs. 10 / 24-25)."""
    Y, Mp = X @ W.T, centroids @ W.T
    pc, pclass = mixture_posteriors(Y, Mp, owner, n_classes)
    m = len(X)
    py = np.maximum(pclass[np.arange(m), y], 1e-300)
    L = float(np.log(py).mean())
    if not gradient:
        return L, None
    mine = owner[None, :] == y[:, None]                           # centroids of the true class
    alpha = pc - np.where(mine, pc / py[:, None], 0.0)            # Eq. 25 (Eq. 10 when k = 1)
    # sum_ij alpha_ij (Mp_j - Y_i)(mu_j - x_i)^T, expanded into four GEMMs
    col, row = alpha.sum(0), alpha.sum(1)
    G = (Mp.T * col) @ centroids - Mp.T @ (alpha.T @ X) - (Y.T @ alpha) @ centroids + (Y.T * row) @ X
    return L, G / m


def dot_log_likelihood_and_gradient(W: np.ndarray, bias: np.ndarray, X: np.ndarray, y: np.ndarray,
                                    means: np.ndarray, gradient: bool = True):
    """Eq. 27: logits x^T W^T W mu_c + s_c. The images are projected twice (x_hat = W^T W x) and
    compared with the means in the input space, so the C means are never projected (Table 1)."""
    m = len(X)
    Y = X @ W.T
    Xh = Y @ W                                                    # (m, D) double projection
    P = _softmax(Xh @ means.T + bias)
    L = float(np.log(np.maximum(P[np.arange(m), y], 1e-300)).mean())
    if not gradient:
        return L, None, None
    R = -P
    R[np.arange(m), y] += 1.0                                     # [c = y] - p(c|x)
    # d/dW x^T W^T W mu = W (x mu^T + mu x^T)
    RM = R @ means                                                # (m, D)
    G = (Y.T @ RM + (RM @ W.T).T @ X) / m
    return L, G, R.mean(0)


def ncm_scores(Y: np.ndarray, Mp: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """Class scores of projected rows against projected means: -d/2 (Eq. 5) or the dot form (Eq. 27)."""
    if bias is None:
        return -0.5 * _sqdist(Y, Mp)
    return Y @ Mp.T + bias


def mixture_class_scores(Y: np.ndarray, Mp: np.ndarray, owner: np.ndarray, n_classes: int) -> np.ndarray:
    """log p(c|x) of the NCMC mixture (Eq. 22), -inf for classes without centroids."""
    _, pclass = mixture_posteriors(Y, Mp, owner, n_classes)
    with np.errstate(divide="ignore"):
        return np.log(pclass)


def implied_bias(W: np.ndarray, means: np.ndarray) -> np.ndarray:
    """s_c = -||W mu_c||^2 / 2: the bias a class added after training takes in the dot form."""
    Mp = means @ W.T
    return -0.5 * (Mp * Mp).sum(1)


# ---- k-means for NCMC centroids (Section 3.3) --------------------------------------------------------------

def kmeans_plus_plus(X: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k seeds by D^2 sampling (k-means++), on rows held in memory (a sample of one class)."""
    if len(X) < k:
        raise InputError(f"k-means++ seeds {k} centroids from {len(X)} rows; give at most {len(X)} centroids")
    C = [X[rng.integers(len(X))]]
    d = ((X - C[0]) ** 2).sum(1)
    for _ in range(1, k):
        total = d.sum()
        i = rng.choice(len(X), p=d / total) if total > 0 else rng.integers(len(X))
        C.append(X[i])
        d = np.minimum(d, ((X - X[i]) ** 2).sum(1))
    return np.array(C)


def assign(X: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Index of the nearest centroid (l2) of every row; ties go to the lower index."""
    return np.argmin(_sqdist(X, C), axis=1)


def lloyd_partial(X: np.ndarray, y: np.ndarray, centroids: np.ndarray, owner: np.ndarray):
    """One block's share of a Lloyd step: per centroid, the sum and count of the rows of its class
    that are nearest to it. Blocks add up; `lloyd_update` divides."""
    sums = np.zeros_like(centroids, dtype=np.float64)
    counts = np.zeros(len(centroids), np.int64)
    for c in np.unique(y):
        mine = np.flatnonzero(owner == c)
        if not len(mine):
            continue
        Xc = X[y == c]
        j = assign(Xc, centroids[mine])
        sums[mine] += class_sums(Xc, j, len(mine))
        counts[mine] += np.bincount(j, minlength=len(mine))
    return sums, counts


def lloyd_update(centroids: np.ndarray, sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """New centroids; an empty one keeps its place."""
    out = centroids.copy()
    full = counts > 0
    out[full] = sums[full] / counts[full, None]
    return out


def class_kmeans(Xs: np.ndarray, ys: np.ndarray, classes, k, blocks, iters: int,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """k centroids per class (Section 3.3; ``k`` an int, or one per class): k-means++ seeds from the
    in-memory sample (Xs, ys), then up to ``iters`` Lloyd steps, each one pass over ``blocks()`` (a
    callable giving (X, y) row-blocks, so the data never needs to fit in memory). Returns (centroids
    (sum of k, D), their classes)."""
    ks = np.broadcast_to(np.asarray(k, np.int64), (len(classes),))
    cents = np.concatenate([kmeans_plus_plus(np.asarray(Xs[ys == c], np.float64), int(kc), rng)
                            for c, kc in zip(classes, ks)])
    owner = np.repeat(np.asarray(classes), ks)
    for _ in range(iters):
        sums, counts = np.zeros_like(cents), np.zeros(len(cents), np.int64)
        for X, y in blocks():
            s, n = lloyd_partial(X, y, cents, owner)
            sums += s
            counts += n
        new = lloyd_update(cents, sums, counts)
        if np.array_equal(new, cents):
            break
        cents = new
    return cents, owner


# ---- k-NN metric learning (Section 4) ------------------------------------------------------------------------

def triplet_counts(dq: np.ndarray, targets: np.ndarray, negatives: np.ndarray,
                   margin: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 1 for a batch of queries. dq (Q, m): d_W from each query to the m images;
    targets / negatives (Q, m) boolean. Returns (cp, cn) (Q, m): for a target p the number of
    negatives n with [margin + d(q,p) - d(q,n)]_+ > 0, for a negative n the number of such targets p.

    One sort per query of the distances with the targets shifted by the margin (step 1-2); the
    counts are running sums over the sorted order (steps 3-5). Ties (margin + d(q,p) = d(q,n), zero loss)
    sort the target first so they are not counted."""
    shifted = np.where(targets, dq + margin, dq)
    keyed = np.where(targets | negatives, shifted, np.inf)
    order = np.lexsort((~targets, keyed), axis=1)  # by value, targets before negatives on ties
    t_sorted = np.take_along_axis(targets, order, 1)
    n_sorted = np.take_along_axis(negatives, order, 1)
    neg_before = np.cumsum(n_sorted, axis=1) - n_sorted                          # C_n: negatives ahead
    tgt_after = t_sorted.sum(1, keepdims=True) - np.cumsum(t_sorted, axis=1)    # C_p: targets behind
    cp = np.zeros(dq.shape, np.int64)
    cn = np.zeros(dq.shape, np.int64)
    np.put_along_axis(cp, order, np.where(t_sorted, neg_before, 0), 1)
    np.put_along_axis(cn, order, np.where(n_sorted, tgt_after, 0), 1)
    return cp, cn


def triplet_gradient(W: np.ndarray, X: np.ndarray, queries: np.ndarray, cp: np.ndarray, cn: np.ndarray):
    """Gradient of sum_q sum_pn L_qpn (Eq. 39 summed) = 2 W X^T A X (Eq. 40) for images X (m, D),
    query rows ``queries`` (Q,) into X and the counts of `triplet_counts`."""
    m = len(X)
    w = np.zeros((m, m))
    w[queries] = cp - cn                 # + x_qp x_qp^T per violating triplet, - x_qn x_qn^T
    # sum_qj w_qj (x_q - x_j)(x_q - x_j)^T = X^T (diag(rowsum + colsum) - w - w^T) X
    A = np.diag(w.sum(1) + w.sum(0)) - w - w.T
    return 2.0 * (W @ X.T) @ (A @ X)


def triplet_loss_loop(W: np.ndarray, X: np.ndarray, queries, targets, negatives, margin: float = 1.0):
    """Reference: the hinge loss and its gradient by an explicit loop over triplets (tests, benchmark)."""
    Y = X @ W.T
    loss, G = 0.0, np.zeros_like(W)
    for qi, q in enumerate(queries):
        for p in np.flatnonzero(targets[qi]):
            dp = Y[q] - Y[p]
            for n in np.flatnonzero(negatives[qi]):
                dn = Y[q] - Y[n]
                v = margin + dp @ dp - dn @ dn
                if v > 0:
                    loss += v
                    xp, xn = X[q] - X[p], X[q] - X[n]
                    G += 2.0 * (np.outer(W @ xp, xp) - np.outer(W @ xn, xn))
    return loss, G


def sample_triplet_batch(y: np.ndarray, m: int, rho: float, rng: np.random.Generator, classes=None):
    """Section 4.2: a class c at random, round(rho m) images of c and the rest from other classes.
    Returns (rows, is_positive, None) with the positives first (the shape of `sample_fixed_batch`'s
    answer); None when no class has two images."""
    classes = np.unique(y) if classes is None else classes
    counts = np.array([(y == c).sum() for c in classes])
    ok = classes[counts >= 2]
    if not len(ok):
        return None
    c = ok[rng.integers(len(ok))]
    same = np.flatnonzero(y == c)
    other = np.flatnonzero(y != c)
    n_pos = min(len(same), max(2, int(round(rho * m))))
    n_neg = min(len(other), m - n_pos)
    rows = np.concatenate([rng.choice(same, n_pos, replace=False), rng.choice(other, n_neg, replace=False)])
    return rows, np.arange(len(rows)) < n_pos, None


def choose_targets(Y: np.ndarray, n_pos: int, k: int | None, mode: str) -> np.ndarray:
    """Targets (n_pos, m) of the n_pos queries (the positives, rows 0..n_pos-1) among the other
    positives: all of them, or the k closest under the current W (dynamic). Fixed targets come from
    `l2_targets` and `sample_fixed_batch` instead."""
    m = len(Y)
    t = np.zeros((n_pos, m), bool)
    t[:, :n_pos] = True
    t[np.arange(n_pos), np.arange(n_pos)] = False
    if mode == "all" or k is None or k >= n_pos - 1:
        return t
    if mode != "dynamic":
        raise InputError(f"choose_targets: mode must be all or dynamic, got {mode!r}")
    d = _sqdist(Y[:n_pos], Y[:n_pos])
    np.fill_diagonal(d, np.inf)
    near = np.argsort(d, axis=1, kind="stable")[:, :k]
    t[:] = False
    np.put_along_axis(t, near, True, 1)
    return t


def knnml_step(W: np.ndarray, X: np.ndarray, is_pos: np.ndarray, k: int, mode: str, fixed=None,
               margin: float = 1.0):
    """One SGD direction for the triplet objective on the batch X (positives first); returns
    (gradient / number of queries, number of violating triplets). For mode 'fixed' ``fixed`` is
    (queries, targets) from `sample_fixed_batch`; otherwise every positive is a query."""
    n_pos = int(is_pos.sum())
    Y = X @ W.T
    if mode == "fixed":
        queries, targets = fixed
    else:
        queries, targets = np.arange(n_pos), choose_targets(Y, n_pos, k, mode)
    negatives = np.broadcast_to(~is_pos, targets.shape)
    dq = _sqdist(Y[queries], Y)
    cp, cn = triplet_counts(dq, targets, negatives, margin)
    G = triplet_gradient(W, X, queries, cp, cn)
    if mode == "all" and n_pos - 1 > k:   # per k targets, as the other modes: lr means the same in each
        G = G * (k / (n_pos - 1))           # (every positive as a target diverged at the default lr)
    return G / len(queries), int(cp.sum())


def l2_targets(X: np.ndarray, y: np.ndarray, k: int) -> np.ndarray:
    """LMNN's fixed targets (Section 4.1, option 1): for every row, its k nearest rows of the same
    class by l2 distance (row indices; -1 where the class has fewer than k + 1 rows)."""
    from metricpipe.tasks.knn import block_topk
    out = np.full((len(X), k), -1, np.int64)
    Xf = np.asarray(X, np.float32)
    for c in np.unique(y):
        rows = np.flatnonzero(y == c)
        for a in range(0, len(rows), 2048):
            q = rows[a:a + 2048]
            _, idx = block_topk(Xf[q], Xf[rows], k, q_ids=q, x_ids=rows, exclude_self=True)
            out[q] = idx
    return out


def sample_fixed_batch(y: np.ndarray, targets: np.ndarray, m: int, rho: float, rng: np.random.Generator):
    """Section 4.2 for fixed targets: a class c at random; queries of c taken in random order, each
    with its targets, until round(rho m) positive images; the rest of the m images from other
    classes. Returns (rows, is_pos, (query positions, target mask)) or None."""
    classes, counts = np.unique(y, return_counts=True)
    ok = classes[counts >= 2]
    if not len(ok):
        return None
    c = ok[rng.integers(len(ok))]
    budget = max(2, int(round(rho * m)))
    chosen, queries = [], []
    index = {}
    for q in rng.permutation(np.flatnonzero(y == c)):
        group = [q] + [t for t in targets[q] if t >= 0]
        new = [r for r in group if r not in index]
        if len(index) + len(new) > budget and queries:
            break
        for r in new:
            index[r] = len(chosen)
            chosen.append(r)
        queries.append(q)
    other = np.flatnonzero(y != c)
    neg = rng.choice(other, min(len(other), m - len(chosen)), replace=False)
    rows = np.concatenate([np.array(chosen, np.int64), neg])
    mask = np.zeros((len(queries), len(rows)), bool)
    for i, q in enumerate(queries):
        mask[i, [index[t] for t in targets[q] if t >= 0]] = True
    return rows, np.arange(len(rows)) < len(chosen), (np.array([index[q] for q in queries]), mask)


# ---- SGD drivers: the pipeline feeds them batches; they hold W and the best W seen on validation --------------

class Diverged(InputError):
    """SGD's W left float32's range: the rate is too large for these rows."""


# lr left unset: each divergence goes on from the best W validated so far at a tenth of the rate, at most
# BACK_OFFS times (a rate the user or a selection sets is theirs: its divergence is an error)
BACK_OFF, BACK_OFFS = 10, 3


class MetricSGD:
    """Minibatch SGD on W (d, D) with early stopping (Section 5.1): every ``validate_every`` steps
    the caller reports a validation error; the W with the lowest error is kept.

    objective: 'ncm' (Eqs. 9-10, with ``centroids``/``owner``: NCMC, Eqs. 21-25), 'dot' (Eq. 27,
    learned biases) or 'knn' (Eq. 35 with Algorithm 1's gradient).

    ``scale`` s (the rows' RMS norm, :func:`~metricpipe.tasks.moments.row_scale`): W starts at W0 / s
    and steps by lr / s^2 (biases by lr), which is SGD from W0 at rate lr on the rows x / s, with W
    kept in the rows' own units: ``lr`` means the same on raw and on l2-normalised rows."""

    def __init__(self, W0: np.ndarray, objective: str, lr: float, centroids: np.ndarray | None = None,
                 owner: np.ndarray | None = None, n_classes: int | None = None, targets: str = "dynamic",
                 k: int = 5, scale: float = 1.0, margin: float = 1.0):
        self.margin = float(margin)
        if objective not in ("ncm", "dot", "knn"):
            raise InputError(f"metric learning objective must be ncm, dot or knn. Got {objective!r} instead.")
        self.W = np.array(W0, np.float64) / scale
        self.objective, self.lr, self.targets, self.k = objective, float(lr), targets, int(k)
        self.step_W = self.lr / scale ** 2
        self.centroids = None if centroids is None else np.asarray(centroids, np.float64)
        self.owner = None if owner is None else np.asarray(owner, np.int64)
        self.n_classes = n_classes
        self.bias = None
        # dot form: validate with the implied biases -||W mu||^2 / 2 (what a model trained on a class
        # subset classifies with) instead of the learned ones
        self.implied_bias = False
        self.patience, self.stale = 5, 0   # validations without a lower error before record() says stop
        if objective == "dot":  # one mean and one bias per trained class, in the order of ``owner``
            self.bias = np.zeros(len(self.owner))
            self._position = np.full(n_classes, -1)
            self._position[self.owner] = np.arange(len(self.owner))
        self.steps = 0
        self.best = (np.inf, self.W.copy(), None if self.bias is None else self.bias.copy(), 0)
        self.history = []

    def step(self, X: np.ndarray, y: np.ndarray, is_pos: np.ndarray | None = None, fixed=None) -> float:
        """One update from the batch; returns the batch's log-likelihood (ncm/dot) or the number of
        violating triplets (knn)."""
        X = np.asarray(X, np.float64)
        if self.objective == "ncm":
            value, G = log_likelihood_and_gradient(self.W, X, y, self.centroids, self.owner, self.n_classes)
            self.W += self.step_W * G
        elif self.objective == "dot":
            value, G, gb = dot_log_likelihood_and_gradient(self.W, self.bias, X, self._position[y], self.centroids)
            self.W += self.step_W * G
            self.bias += self.lr * gb
        else:
            G, value = knnml_step(self.W, X, is_pos, self.k, self.targets, fixed, self.margin)
            self.W -= self.step_W * G
        if beyond_float32(self.W):
            raise Diverged(f"metric learning diverged after {self.steps + 1} steps (W is not finite in float32); "
                           f"lower 'lr' (now {self.lr})")
        self.steps += 1
        return float(value)

    def back_off(self) -> None:
        """After a divergence: go on from the best W validated so far at a BACK_OFF-th of the rate."""
        _, W, bias, _ = self.best
        self.W = W.copy()
        self.bias = None if bias is None else bias.copy()
        self.lr /= BACK_OFF
        self.step_W /= BACK_OFF
        self.stale = 0
        self.history.append({"iter": self.steps, "lr": self.lr})

    def classify(self, X: np.ndarray) -> np.ndarray:
        """Class (as given in ``owner``) of each row under the current W: nearest class mean (Eq. 5),
        the mixture of Eq. 22, or the dot form of Eq. 27."""
        Y, Mp = np.asarray(X, np.float64) @ self.W.T, self.centroids @ self.W.T
        if self.bias is not None:   # scored as the model will classify: learned biases, or the implied ones
            bias = -0.5 * (Mp * Mp).sum(1) if self.implied_bias else self.bias
            return self.owner[np.argmax(ncm_scores(Y, Mp, bias), axis=1)]
        return np.argmax(mixture_class_scores(Y, Mp, self.owner, self.n_classes), axis=1)

    def record(self, val_error: float, train_value: float | None) -> bool:
        """Report the validation error of the current W (early stopping keeps the best); True when
        PATIENCE validations in a row have not improved on the best (time to stop)."""
        self.history.append({"iter": self.steps, "val_error": float(val_error),
                             "batch": None if train_value is None else float(train_value)})
        if val_error < self.best[0]:
            self.best = (val_error, self.W.copy(), None if self.bias is None else self.bias.copy(), self.steps)
            self.stale = 0
        else:
            self.stale += 1
        return self.stale >= self.patience


# ---- estimators ----------------------------------------------------------------------------------------------

KMEANS_SAMPLE = 2000  # rows per class NCMC's k-means++ seeds from, at most ...
KMEANS_BYTES = 2.5e8  # ... and at most this many bytes of float32 rows over all classes (>= k per class)
IDLE_POOLS = 100      # pools in a row without a batch before SGD gives up (instead of looping forever)
PATIENCE = 0.5        # SGD stops after this share of its validations (iters / validate_every) in a row
                      # without a lower error, at least 5 (the best W is kept). k-NN ML's error often rises
                      # for a few hundred steps before it falls below the start, so half, not a fixed 5.

_SGD_CONSTRAINTS = {
    "dim": DIM_OR_NONE,
    "batch": [Interval(Integral, 2, None, closed="left")],
    "lr": [*POSITIVE, None],
    "iters": [Interval(Integral, 0, None, closed="left")],
    "validate_every": COUNT,
    "validation": [Interval(Integral, 10, None, closed="left")],
    "early_stopping": ["boolean"],
    "classes": ["array-like", None],
    "random_state": RANDOM_STATE,
}


class _MetricLearner(Learner):
    """Shared by NCMML, NCMC and KNNML: W (dim, D) starts from the PCA directions and learns by
    minibatch SGD over the pools of :mod:`metricpipe.tasks.stream`; the W with the lowest validation
    error (every ``validate_every`` steps, the PCA start included) is kept (Section 5.1).

    Codes are ``x @ components_`` with ``components_ = W.T`` (D, dim).
    """
    fitted_attributes = ("components_", "classes_", "history_", "lr_", "best_iter_", "val_error_")
    dim_within_features = True
    DEFAULT_DIM = 32   # dim None: this many PCA directions, or all of them when the data has fewer
    feeds = "stream"
    reads_statistics = ("mean", "pca_components", "class_means", "class_counts", "mean_sq_norm")

    def _validate_params(self):
        super()._validate_params()
        c = self.classes
        ok = c is None or (hasattr(c, "__len__") and not isinstance(c, str) and len(c) > 0 and all(
            isinstance(v, (Real, np.generic, str)) for v in c))
        if not ok:
            raise InputError(f"The 'classes' parameter of {type(self).__name__} must be a non-empty list of class "
                             f"labels (as in y) or None. Got {c!r} instead.")

    def _transform(self, X):
        return np.asarray(X, np.float64) @ self.components_.astype(np.float64)

    @property
    def _n_features_out(self):
        return self.components_.shape[1]

    def cost(self) -> dict:
        W = self.components_
        return {"nnz": int(W.size), "storage_bytes": int(W.nbytes), "flops_per_image": 2 * int(W.size)}

    def trained_classes(self, labels) -> np.ndarray:
        """The class codes (positions in ``labels``, the class labels in code order: ``classes_``, a
        run's class names) whose images train W: those ``classes`` names (:func:`class_codes`),
        default all."""
        if self.classes is None:
            return np.arange(len(labels))
        return class_codes(self.classes, labels, f"The 'classes' parameter of {type(self).__name__}")

    def _fit_classes(self, statistics: dict, labels) -> tuple[np.ndarray, np.ndarray]:
        """(the class codes W trains on, the class codes with training rows): :meth:`trained_classes`
        less the classes the statistics hold no training row of. A class without one (a run's
        held-out class, ``data.split.classes``) neither trains W nor gets a mean: the model never
        sees it, and classifies it only once its mean is added (:meth:`add_centroids`)."""
        present = np.flatnonzero(np.asarray(statistics["class_counts"]) > 0)
        trained = self.trained_classes(self.classes_ if labels is None else labels)
        return trained[np.isin(trained, present)], present

    def pool_rows(self, n_classes: int) -> int | None:
        """Rows of the training set's pools that ``fit_stream`` reads at most, so that the pipeline
        writes only the blocks of its shuffled copy visited first. SGD cuts each pool into batches of
        at most ``batch`` rows, one step each, so pools holding ``iters`` x ``batch`` rows give every
        step; the rows taken out of the pools are added: the validation share held out of the train
        split, at most ``validation`` + ``n_classes`` (:func:`~metricpipe.tasks.stream.validation_split`
        rounds each class's share, which may pass ``validation`` by a row a class). None (every row) when
        ``classes`` leaves other classes' rows out of the pools too."""
        if self.classes is not None:
            return None
        held = int(self.validation) + int(n_classes) if self.early_stopping else 0
        return int(self.iters) * int(self.batch) + held

    def fit(self, X, y, X_val=None, y_val=None, block_rows=None):
        """Learn W from rows X (n_samples, n_features) with labels y.

        Early stopping reads (X_val, y_val) when given, else a stratified, seeded share of X (at most a
        fifth, ``validation`` rows at most) that SGD never sees. SGD takes its batches from pools of
        ``block_rows`` rows (default: 64 MB of float32 rows, as the pipeline's row-blocks), each a
        uniform sample of the training rows whatever their order (:func:`metricpipe.tasks.stream.pools`).

        Returns
        -------
        self
        """
        self._validate_params()
        X, codes = self._check_Xy(X, y)
        classes = self.classes_
        yv = None
        if X_val is not None:
            X_val, y_val = self._check_val(X_val, y_val)
            yv = np.searchsorted(classes, y_val)
            if np.any(yv >= len(classes)) or np.any(classes[np.minimum(yv, len(classes) - 1)] != y_val):
                raise InputError(f"{type(self).__name__}: y_val holds labels that are not in y")
        rows = ArrayRows(X, codes, X_val, yv, block_rows)
        self.fit_rows(rows, moments.statistics(X, codes), labels=classes)
        self.classes_ = classes
        return self

    def fit_rows(self, rows: TrainingRows, statistics: dict, labels=None):
        """Learn W from :class:`~metricpipe.tasks.rows.TrainingRows` and the statistics of its
        ``in_stats`` rows: ``fit`` and the pipeline both end here. Which rows validate (the given
        ones, else a stratified share held out of the fit rows), which stay out of the class means
        and the centroids (every row that scores: a mean holding its own validation rows makes their
        error optimistic; NCMC's was 0 on digits), what else the learner reads (NCMC's k-means,
        k-NN ML's reference rows, NCMML's other-class monitor): decided here. ``labels``: the class
        labels in code order, which ``classes`` names (default: the codes). Returns self."""
        self._validate_params()
        C = len(statistics["class_means"])
        seed = seed_of(self.random_state)
        trained = self.trained_classes(np.arange(C) if labels is None else labels)
        allowed = np.isin(rows.labels, trained) & rows.fit
        keep, means = allowed.copy(), rows.fit.copy()      # SGD's rows; the rows in the class means
        val = np.zeros(0, np.int64)
        if self.early_stopping and rows.val is not None and len(rows.val):
            val = stream.seeded_sample(rows.val[np.isin(rows.labels[rows.val], trained)], self.validation, seed)
        elif self.early_stopping:
            pos = np.flatnonzero(allowed)
            counts = np.bincount(rows.labels[pos], minlength=C)[trained]
            if counts.min() < 2:   # early stopping holds out a validation row of every class it trains on
                name = trained[int(np.argmin(counts))] if labels is None else np.asarray(labels)[trained][np.argmin(counts)]
                raise InputError(f"{type(self).__name__}: class {np.asarray(name).item()!r} has {int(counts.min())} "
                                 f"sample(s); give every class at least 2, as the pipeline's stratified split requires "
                                 f"(or pass X_val, y_val to fit)")
            val = pos[stream.validation_split(rows.labels[pos], self.validation, rows.keys[pos], seed)]
            keep[val] = means[val] = False
        if not keep.any():
            raise InputError(f"{type(self).__name__}: no training rows left for SGD after the validation rows")
        extra = self._side_inputs(rows, keep, means, trained, C, seed)
        out = np.flatnonzero(rows.in_stats & ~means)   # (sorted, as the statistics' rows)
        if len(out):
            statistics = moments.without_rows(statistics, rows.take(out), rows.labels[out])
        Xv, yv = (rows.take(val), rows.labels[val]) if len(val) else (None, None)
        return self.fit_stream(statistics, rows.pools(keep, seed), Xv, yv, labels=labels, **extra)

    def fit_facts(self) -> dict:
        facts = {"best_iter": self.best_iter_, "val_error": self.val_error_}
        return {**facts, **{k: getattr(self, f"{k}_", None) for k in ("val_error_new_classes", "best_iter_new_classes")}}

    def _side_inputs(self, rows: TrainingRows, keep, means, trained, n_classes: int, seed: int) -> dict:
        """What ``fit_stream`` takes beyond the statistics and pools; ``keep``: SGD's rows, ``means``:
        the rows in the class means (a learner that holds rows out to score clears theirs)."""
        return {}

    def _start(self, stats: dict):
        comps = stats["pca_components"]
        if self.dim is not None and self.dim > len(comps):
            raise InputError(f"The 'dim' parameter of {type(self).__name__} must be <= {len(comps)}, the PCA "
                             f"directions W starts from (n_features = {len(stats['mean'])}). Got {self.dim} instead.")
        self._validate_params()
        self.n_features_in_ = int(len(stats["mean"]))
        self.classes_ = np.arange(len(stats["class_means"]))
        return comps[:self.resolved_dim(len(comps))]

    def validates(self) -> bool:
        return bool(self.early_stopping)

    def refit_params(self) -> dict:
        """``iters`` = the kept W's step, without early stopping: the fit on every training row takes
        the steps this one kept (the rate is constant, so fewer steps are the same schedule cut short)."""
        return {"iters": int(self.best_iter_), "early_stopping": False} if self.early_stopping else {}

    def _run(self, sgd: "MetricSGD", pools, Xv, yv, error, batches) -> None:
        """The SGD loop: batches from each pool until ``iters`` steps; early stopping on validation
        (``early_stopping``), else the W of the last step."""
        if not self.early_stopping:
            error = None
        yv = np.asarray(yv if yv is not None else [], np.int64)
        if error is not None and not len(yv):
            raise InputError(f"{type(self).__name__}: no validation rows to stop early on (X_val in fit; the "
                             f"data's val rows)")
        # a class with no validation row (few-shot data: its share is under one row) still competes as
        # every query's possible answer; the error is over the classes that have rows
        sgd.patience = max(5, int(PATIENCE * self.iters / self.validate_every))
        with one_blas_thread():
            self._steps(sgd, pools, Xv, yv, error, batches)
        if error is None:   # no validation: the last W
            sgd.best = (np.nan, sgd.W.copy(), None if sgd.bias is None else sgd.bias.copy(), sgd.steps)
        err, W, bias, at = sgd.best
        self.components_ = np.ascontiguousarray(W.T, np.float32)
        self.history_ = sgd.history
        self.lr_ = sgd.lr
        self.best_iter_ = int(at)
        self.val_error_ = None if error is None else float(err)
        self._best_bias = bias

    def _steps(self, sgd, pools, Xv, yv, error, batches) -> None:
        if error is not None:
            sgd.record(error(sgd, Xv, yv), None)  # the PCA start is a candidate too
            self._watch(sgd)
        if self.iters == 0:
            return
        rng = np.random.default_rng([seed_of(self.random_state), 5])
        stop = False
        idle = 0   # pools in a row that gave no batch (k-NN ML needs a class with two rows in a pool)
        for X, y in pools:
            drawn = batches(X, y, rng)
            idle = 0 if drawn else idle + 1
            if idle >= IDLE_POOLS:
                raise InputError(f"{type(self).__name__}: {IDLE_POOLS} pools in a row held no class with two "
                                 f"training rows, so no batch could be drawn; give more images per class or "
                                 f"lower 'validation' (now {self.validation})")
            for sel, is_pos, fixed in drawn:
                try:
                    with np.errstate(over="ignore", invalid="ignore"):
                        value = sgd.step(X[sel], y[sel], is_pos, fixed)
                except Diverged:
                    if self.lr is not None or sum("lr" in h for h in sgd.history) >= BACK_OFFS:
                        raise
                    sgd.back_off()
                    continue
                stop = False
                if error is None:
                    if sgd.steps % self.validate_every == 0 or sgd.steps == self.iters:
                        sgd.history.append({"iter": sgd.steps, "batch": float(value)})
                elif sgd.steps % self.validate_every == 0 or sgd.steps == self.iters:
                    stop = sgd.record(error(sgd, Xv, yv), value)
                    self._watch(sgd)
                if sgd.steps >= self.iters or stop:
                    break
            if sgd.steps >= self.iters or stop:
                break

    def _watch(self, sgd) -> None:
        """Record the new classes' validation error beside the last validation (NCMML's monitor)."""
        monitor = getattr(self, "_monitor", None)
        if monitor is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                sgd.history[-1]["val_error_new_classes"] = monitor(sgd)

    def _slices(self, X, y, rng):
        """NCM/NCMC batches: the pool's rows (already in random order) ``batch`` at a time."""
        return [(np.arange(s, min(len(y), s + self.batch)), None, None) for s in range(0, len(y), self.batch)]


class _NCMClassifier(ClassifierMixin):
    """predict / predict_proba of the nearest-class-mean rule (Eq. 5), its mixture (Eq. 22) or its
    dot form with class biases (Eq. 27), over ``centroids_`` (input space) and their classes."""
    fitted_attributes = ("centroids_", "centroid_classes_", "class_bias_")

    def _class_scores(self, X):
        from sklearn.utils.validation import check_is_fitted
        check_is_fitted(self)
        X = self._check_X(X, reset=False).astype(np.float64)
        W = self.components_.astype(np.float64)
        Y, Mp = X @ W, self.centroids_.astype(np.float64) @ W
        C = len(self.classes_)
        if self.class_bias_ is not None:
            scores = np.full((len(X), C), -np.inf)
            scores[:, self.centroid_classes_] = ncm_scores(Y, Mp, self.class_bias_[self.centroid_classes_])
            return scores
        return mixture_class_scores(Y, Mp, self.centroid_classes_, C)

    def add_centroids(self, centroids, classes):
        """Extend the fitted classifier with new classes without touching W (Sections 3.6 and 5.4).

        centroids : (m, n_features) their means (NCMC: k-means centroids, several per class) in the
        input space; classes : (m,) each centroid's class label, of the kind ``classes_`` holds and
        not one of them (codes len(classes_), ... follow in order of first appearance; ``predict``
        returns these labels). In the dot form (Eq. 27) every class then takes the bias the
        Euclidean form implies, -||W mu_c||^2 / 2: a learned bias and an implied one are not on one
        scale, and Section 3.4 finds the implied one as good for the trained classes. Returns self.
        """
        from sklearn.utils.validation import check_is_fitted
        check_is_fitted(self)
        centroids = np.asarray(centroids, np.float32)
        labels = np.asarray(classes)
        if centroids.ndim != 2 or centroids.shape[1] != self.n_features_in_:
            raise InputError(f"centroids must be (m, {self.n_features_in_}); got shape {centroids.shape}")
        if labels.shape != (len(centroids),):
            raise InputError(f"classes must hold one label per centroid ({len(centroids)}); got shape {labels.shape}")
        if not np.isfinite(centroids).all():
            raise InputError("centroids hold NaN or inf; give finite class means")
        text_old, text_new = self.classes_.dtype.kind in "USO", labels.dtype.kind in "USO"
        if len(labels) and text_old != text_new:
            raise InputError(f"the new classes' labels must be of the kind of the model's classes ("
                             f"{'text' if text_old else 'numbers'}); got {labels[:3].tolist()}")
        new = list(dict.fromkeys(labels.tolist()))
        taken = [c for c in new if np.isin(c, self.classes_)]
        if taken:
            raise InputError(f"class {taken[0]!r} is already one of the model's classes; add_centroids adds new "
                             f"classes only")
        position = {c: len(self.classes_) + i for i, c in enumerate(new)}
        codes = np.array([position[c] for c in labels.tolist()], np.int32)
        self.centroids_ = np.concatenate([self.centroids_, centroids])
        self.centroid_classes_ = np.concatenate([self.centroid_classes_, codes]).astype(np.int32)
        self.classes_ = np.concatenate([self.classes_, np.asarray(new, dtype=labels.dtype)])
        if self.class_bias_ is not None:   # one mean per class (Eq. 27): every class by its norm
            self.class_bias_ = self._implied_biases()
        return self

    def _implied_biases(self) -> np.ndarray:
        bias = np.full(len(self.classes_), np.nan, np.float32)
        bias[self.centroid_classes_] = implied_bias(self.components_.T.astype(np.float64),
                                                    self.centroids_.astype(np.float64))
        return bias

    def predict_proba(self, X):
        """p(c|x) for every class, shape (n_samples, n_classes)."""
        s = self._class_scores(X)
        s = s - s.max(axis=1, keepdims=True)
        e = np.exp(s)
        return e / e.sum(axis=1, keepdims=True)

    def predict(self, X):
        """The most probable class of every row."""
        scores = self._class_scores(X)
        return self.classes_[np.argmax(scores, axis=1)]


class NCMML(_NCMClassifier, _MetricLearner):
    """Nearest-class-mean metric learning (Mensink et al., Sections 3.1-3.2).

    p(c|x) = softmax_c(-||W x - W mu_c||^2 / 2) (Eq. 5); the mean log-likelihood (Eq. 9) is maximised
    by minibatch SGD with the gradient of Eq. 10; ``objective='dot'`` is Eq. 27's
    softmax(x^T W^T W mu_c + s_c) with a learned bias per class.

    Parameters
    ----------
    dim : int or None, default=None
        Rows of W: the code dimension. None: 32, or every PCA direction when the data has fewer
        features (so the defaults run on 13-d data as on 4,096-d; a dim set above them is refused).
    objective : {'euclidean', 'dot'}, default='euclidean'
    batch : int, default=1000
        Images per SGD step.
    lr : float or None, default=None
        Fixed SGD step for rows of unit RMS norm: the learner divides it by the training rows' mean
        squared norm and starts W at the PCA directions over their RMS norm (the same run as on the
        rows scaled to unit RMS norm; nothing changes on l2-normalised rows). None: 30 for the
        Euclidean objective, 1 for the dot form (where 10 and more diverged), the first value each
        objective's selection grid tries; if W then diverges, SGD goes on from the best W validated
        so far at a tenth of the rate, at most 3 times (``lr_``: the rate it ended with). A rate you
        set is kept: its divergence is an error.
    iters : int, default=2000
        SGD steps.
    validate_every : int, default=100
    validation : int, default=5000
        Validation rows at most: held out of SGD when no X_val is given, else a seeded sample of X_val
        (the pipeline's validation rows) when it holds more.
    early_stopping : bool, default=True
        Keep the W with the lowest validation error (checked every ``validate_every`` steps, the start
        included; SGD stops after half of its checks in a row without a lower one). False: no
        validation rows, every training row trains and the W of step ``iters`` is kept (a run refits
        the chosen candidate so, with the steps it kept: ``refit_params``).
    classes : list of labels or None, default=None
        The labels (as y holds them) of the classes whose images train W; the others are new
        classes the classifier meets with their means only (Section 5.4).
    random_state : int, RandomState or None, default=None (seed 0)

    Attributes
    ----------
    components_ : ndarray (n_features, dim), W^T
    centroids_ : ndarray (n_classes, n_features), the class means
    centroid_classes_ : ndarray (n_classes,)
    class_bias_ : ndarray (n_classes,) or None (dot objective only)
    classes_, history_, best_iter_, val_error_, lr_
    val_error_new_classes_, best_iter_new_classes_ : with ``classes`` and rows of the other
        classes to validate on: their NCM error at the kept W, and the step where it was lowest
        (a diagnostic of Section 5.4's protocol: W is still chosen on the trained classes)
    """
    # lr is read for rows of unit RMS norm, so one grid serves raw and l2 data: half a decade apart
    # around the default. With the old grid (0.001 ... 100) the validation error was lowest at 10, 30
    # or 100 on digits, Fashion 14 x 14 and HOG, and 0.001 to 0.1 never moved W off its start in 2,000
    # steps; with this one it was lowest at 3 to 300 on those and on Fashion-MNIST (benchmarks/README.md)
    search_space = {"lr": [30.0, 3.0, 10.0, 100.0, 300.0]}
    selection_metric = "ncm"
    own_classifier = "ncm"   # Eq. 5 (Eq. 27 in the dot form) over the class means
    # the dot form (Eq. 27) steps on scores, not squared distances: lr 10 and more diverged on digits,
    # Fashion 14 x 14 and HOG, whose validation error was lowest at 1, 3 and 3 (0.1 never left the start)
    search_space_when = {("objective", "dot"): {"lr": [1.0, 0.3, 3.0, 10.0, 0.1]}}

    method = "ncmml"
    fitted_attributes = ("val_error_new_classes_", "best_iter_new_classes_")
    _parameter_constraints = {**_SGD_CONSTRAINTS, "objective": [StrOptions({"euclidean", "dot"})]}

    def __init__(self, dim=None, objective="euclidean", batch=1000, lr=None, iters=2000, validate_every=100,
                 validation=5000, early_stopping=True, classes=None, random_state=None):
        self.dim = dim
        self.objective = objective
        self.batch = batch
        self.lr = lr
        self.iters = iters
        self.validate_every = validate_every
        self.validation = validation
        self.early_stopping = early_stopping
        self.classes = classes
        self.random_state = random_state

    def _side_inputs(self, rows, keep, means, trained, n_classes, seed) -> dict:
        """With ``classes`` set, the other classes' rows to monitor: their given validation rows, else a
        stratified share of their rows, as validation (then out of the class means), ``validation`` rows
        at most."""
        others = ~np.isin(rows.labels, trained)
        if self.classes is None or not self.early_stopping or not others.any():
            return {}
        new = np.zeros(0, np.int64) if rows.val is None else rows.val[others[rows.val]]
        carved = not len(new)
        if carved:
            pos = np.flatnonzero(others & rows.fit)
            new = pos[stream.validation_split(rows.labels[pos], self.validation, rows.keys[pos], seed)]
        new = stream.seeded_sample(new, self.validation, seed)
        if carved:
            means[new] = False
        return {"X_new": rows.take(new), "y_new": rows.labels[new]}

    def fit_stream(self, statistics: dict, pools, X_val, y_val, X_new=None, y_new=None, labels=None):
        """The pipeline's entry point (``fit`` calls it too): W from the statistics' PCA directions
        and class means, SGD over ``pools`` (an iterable of (X_pool, y_pool) with class codes
        0..C-1), early stopping on (X_val, y_val). With ``classes`` set, (X_new, y_new): validation
        rows of the other classes, whose NCM error over all class means is recorded at every
        validation (``history_``'s "val_error_new_classes") but never chooses W. ``labels``: the
        class labels in code order, which ``classes`` names (default: the codes). Returns self."""
        W0 = self._start(statistics)
        C = len(self.classes_)
        trained, present = self._fit_classes(statistics, labels)
        self._train_classes = trained
        means = statistics["class_means"]
        sgd = MetricSGD(W0, "dot" if self.objective == "dot" else "ncm", self._searched("lr"), means[trained], trained, C,
                        scale=moments.row_scale(statistics))
        # with classes left out, the dot model classifies by implied biases (below): early stopping too
        sgd.implied_bias = self.objective == "dot" and len(trained) < len(present)
        self._monitor = None
        if X_new is not None and len(X_new):   # (the dot form with implied biases is this same rule)
            Xn, yn = np.asarray(X_new, np.float64), np.asarray(y_new, np.int64)
            M = np.asarray(means, np.float64)[present]
            self._monitor = lambda s: float((present[metrics_nearest(Xn @ s.W.T, M @ s.W.T)] != yn).mean())
        self._run(sgd, pools, X_val, y_val, _class_error, self._slices)
        hist = [h for h in self.history_ if "val_error_new_classes" in h]
        self.val_error_new_classes_ = next((h["val_error_new_classes"] for h in hist if h["iter"] == self.best_iter_),
                                           None)
        self.best_iter_new_classes_ = min(hist, key=lambda h: h["val_error_new_classes"])["iter"] if hist else None
        del self._monitor
        self.centroids_ = np.asarray(means, np.float32)[present]
        self.centroid_classes_ = present.astype(np.int32)
        self.class_bias_ = None
        if self.objective == "dot":
            # the learned biases (Eq. 27) when every class with a mean was trained; with classes left out,
            # every class takes the implied one: the learned ones (from 0) and the implied ones
            # (-||W mu||^2 / 2) are on different scales, so the left-out classes would never win
            # (Section 3.4: as good)
            if len(trained) < len(present):
                self.class_bias_ = self._implied_biases()
            else:
                self.class_bias_ = np.full(C, np.nan, np.float32)
                self.class_bias_[trained] = self._best_bias
        del self._best_bias, self._train_classes
        return self


class NCMC(_NCMClassifier, _MetricLearner):
    """Nearest class multiple centroids (Mensink et al., Section 3.3): k centroids per class from
    k-means in the input space, the mixture posterior of Eqs. 21-22 and its gradient (Eqs. 24-25).

    Parameters
    ----------
    centroids : int, default=10
        k, centroids per class; a class with fewer training images has one centroid on each.
    train_centroids : {1} or None, default=None
        1: NCMC-test, W learns with the class means and is used with the k centroids.
    kmeans_iters : int, default=10
        Lloyd passes over the data.
    dim, batch, lr, iters, validate_every, validation, early_stopping, classes, random_state : as :class:`NCMML`.
    """
    search_space = NCMML.search_space
    selection_metric = "ncmc"
    own_classifier = "ncmc"   # Eq. 22's mixture over the k centroids of every class

    method = "ncmc"
    _parameter_constraints = {**_SGD_CONSTRAINTS, "centroids": COUNT, "train_centroids": [Options(Integral, {1}), None],
                              "kmeans_iters": COUNT}

    def __init__(self, dim=None, centroids=10, train_centroids=None, kmeans_iters=10, batch=1000, lr=None,
                 iters=2000, validate_every=100, validation=5000, early_stopping=True, classes=None,
                 random_state=None):
        self.dim = dim
        self.centroids = centroids
        self.train_centroids = train_centroids
        self.kmeans_iters = kmeans_iters
        self.batch = batch
        self.lr = lr
        self.iters = iters
        self.validate_every = validate_every
        self.validation = validation
        self.early_stopping = early_stopping
        self.classes = classes
        self.random_state = random_state

    @staticmethod
    def kmeans_sample(labels: np.ndarray, keys: np.ndarray, seed, per_class: int = KMEANS_SAMPLE,
                      at_least: int = 0) -> np.ndarray:
        """Positions (among the training rows, whose :func:`~metricpipe.tasks.stream.row_keys` are
        ``keys``) of the stratified sample k-means++ seeds from: each class's share of it, and at
        least ``at_least`` rows of each class (all of a class with fewer; its first in the same
        seeded order), since a class's share of a sample of unequal classes can fall below its k.
        In that seeded order, not the rows' stored one: k-means++ draws its seeds by position in the
        sample, so the same rows stored in another order get the same centroids."""
        labels = np.asarray(labels)
        rank = stream.rank(keys, seed, stream.KMEANS)
        pos = stream.stratified_subset(labels, per_class * len(np.unique(labels)), rank, at_least=max(1, at_least))
        return pos[np.argsort(rank[pos], kind="stable")]

    def kmeans_per_class(self, n_classes: int, n_features: int) -> int:
        """Rows per class the k-means++ seeding sample holds: KMEANS_SAMPLE, fewer where the sample
        would pass KMEANS_BYTES (1,000 classes x 4,096 dimensions: 15 rows each, 246 MB), never
        fewer than the k centroids it seeds; the Lloyd passes that follow see every row."""
        fit = int(KMEANS_BYTES // (4 * max(1, n_classes) * max(1, n_features)))
        return max(self.centroids, min(KMEANS_SAMPLE, fit))

    def kmeans(self, X_sample, y_sample, blocks, n_classes: int, counts=None):
        """k centroids for every class (Section 3.3): k-means++ on the sample, then ``kmeans_iters``
        Lloyd passes over ``blocks()`` (a callable giving (X, y) row-blocks). A class with fewer
        training images than k (``counts``: each class's training images; default the sample's)
        has one centroid on each, as few-shot data and scikit-learn's checks' small classes need (the
        sample holds them all: :meth:`kmeans_sample`'s ``at_least``). Returns (centroids, their
        classes), k per class (fewer for such a class)."""
        in_sample = np.bincount(np.asarray(y_sample, np.int64), minlength=n_classes)
        counts = in_sample if counts is None else np.asarray(counts, np.int64)
        k = np.minimum(self.centroids, counts)
        need = np.where(counts > 0, np.maximum(k, 1), 0)   # a class with no training image has no centroid
        if (in_sample < need).any():
            c = int(np.argmax(in_sample < need))
            raise InputError(f"NCMC: class code {c} has {int(in_sample[c])} image(s) in the k-means sample for "
                             f"{int(need[c])} centroid(s); give every class training images")
        classes = np.flatnonzero(counts > 0)
        return class_kmeans(np.asarray(X_sample), np.asarray(y_sample), classes, k[classes], blocks,
                            self.kmeans_iters, np.random.default_rng([seed_of(self.random_state), 11]))

    def _side_inputs(self, rows, keep, means, trained, n_classes, seed) -> dict:
        """k-means over the rows in the class means (k-means sees no validation row)."""
        return {"centroids": self.class_centroids(rows, means, n_classes)}

    def class_centroids(self, rows: TrainingRows, mask: np.ndarray, n_classes: int):
        """k centroids per class of the rows where ``mask`` holds (:meth:`kmeans`): k-means++ on its
        seeding sample (:meth:`kmeans_sample`), one streamed pass over the rows per Lloyd step. Returns
        (centroids in the input space, their class codes)."""
        pos = np.flatnonzero(mask)
        sample = pos[self.kmeans_sample(rows.labels[pos], rows.keys[pos], seed_of(self.random_state),
                                        self.kmeans_per_class(n_classes, rows.n_features), self.centroids)]
        return self.kmeans(rows.take(sample), rows.labels[sample], lambda: rows.blocks(mask), n_classes,
                           np.bincount(rows.labels[pos], minlength=n_classes))

    def fit_stream(self, statistics: dict, pools, X_val, y_val, centroids, labels=None):
        """The pipeline's entry point (``fit`` calls it too); ``centroids`` is :meth:`kmeans`'s answer."""
        W0 = self._start(statistics)
        C = len(self.classes_)
        trained = self._train_classes = self._fit_classes(statistics, labels)[0]
        cents, owner = centroids
        if self.train_centroids == 1:  # NCMC-test: the metric learns with one mean per class
            sgd = MetricSGD(W0, "ncm", self._searched("lr"), statistics["class_means"][trained], trained, C,
                            scale=moments.row_scale(statistics))
        else:
            mine = np.isin(owner, trained)
            sgd = MetricSGD(W0, "ncm", self._searched("lr"), cents[mine], owner[mine], C, scale=moments.row_scale(statistics))
        self._run(sgd, pools, X_val, y_val, _class_error, self._slices)
        self.centroids_ = np.asarray(cents, np.float32)
        self.centroid_classes_ = np.asarray(owner, np.int32)
        self.class_bias_ = None
        del self._best_bias, self._train_classes
        return self


class KNNML(_MetricLearner):
    """k-NN metric learning (Mensink et al., Section 4): the triplet hinge of Eq. 35 with targets
    fixed (l2 same-class neighbours within the pool), all same-class images, or dynamic (the k
    closest under the current W); batches of ``batch`` images, 2/3 from one class (Section 4.2);
    the gradient from one sort per query (Algorithm 1). Early stopping on the kNN error of the
    validation rows against ``validation`` reference rows of the training set.

    Parameters
    ----------
    targets : {'dynamic', 'all', 'fixed'}, default='dynamic'
    k : int, default=5
    batch : int, default=300
    lr : float or None, default=None
        As :class:`NCMML`'s: the step for rows of unit RMS norm; None: 0.1 (the grid's first value),
        a tenth of it after each divergence, at most 3 times.
    margin : float > 0, default=0.1
        The hinge's margin (Eq. 35's 1), a squared distance between rows of unit RMS norm under W.
        Searched (0.1, 1, 0.01) with lr: at the PCA start such rows are about 0.5-0.7 apart (digits,
        Fashion-MNIST 14 x 14), so with Eq. 35's margin 1 nearly every triplet violates, the first
        step grows W about 13-fold and early stopping mostly keeps the start; a margin of m is the
        same run as the start W0 / sqrt(m) with margin 1. 0.1 is the margin validation chose on
        digits, Fashion-MNIST, Fashion 14 x 14 and HOG (benchmarks/README.md).
    dim, iters, validate_every, validation, early_stopping, classes, random_state : as :class:`NCMML`.
    """
    search_space = {"lr": [0.1, 0.0001, 0.001, 0.01, 1.0], "margin": [0.1, 1.0, 0.01]}
    selection_metric = "knn5"

    method = "knnml"
    _parameter_constraints = {**_SGD_CONSTRAINTS, "targets": [StrOptions({"dynamic", "all", "fixed"})], "k": COUNT,
                              "batch": [Interval(Integral, 3, None, closed="left")], "margin": POSITIVE}

    def pool_rows(self, n_classes: int) -> None:
        """Every row: a pool gives batches only from classes with two rows in it, so no row count
        bounds what ``iters`` steps read."""
        return None

    def __init__(self, dim=None, targets="dynamic", k=5, batch=300, lr=None, margin=0.1, iters=2000,
                 validate_every=100, validation=5000, early_stopping=True, classes=None, random_state=None):
        self.dim = dim
        self.targets = targets
        self.k = k
        self.batch = batch
        self.lr = lr
        self.margin = margin
        self.iters = iters
        self.validate_every = validate_every
        self.validation = validation
        self.early_stopping = early_stopping
        self.classes = classes
        self.random_state = random_state

    @staticmethod
    def reference_rows(labels: np.ndarray, keep: np.ndarray, keys: np.ndarray, size: int, seed) -> np.ndarray:
        """Positions of the reference rows (among SGD's rows) the validation kNN error searches."""
        pos = np.flatnonzero(keep)
        return pos[stream.stratified_subset(labels[pos], size, stream.rank(keys[pos], seed, stream.REFERENCE))]

    def _side_inputs(self, rows, keep, means, trained, n_classes, seed) -> dict:
        """The reference rows (among SGD's) the validation queries search."""
        if not self.early_stopping:
            return {}
        ref = self.reference_rows(rows.labels, keep, rows.keys, self.validation, seed)
        return {"reference": (rows.take(ref), rows.labels[ref])}

    def _batches(self, X, y, rng):
        tl2 = l2_targets(X, y, self.k) if self.targets == "fixed" else None
        out = []
        for _ in range(max(1, len(y) // self.batch)):
            drawn = (sample_fixed_batch(y, tl2, self.batch, 2.0 / 3.0, rng) if tl2 is not None
                     else sample_triplet_batch(y, self.batch, 2.0 / 3.0, rng))
            if drawn is not None:
                out.append(drawn)
        return out

    def fit_stream(self, statistics: dict, pools, X_val, y_val, reference=None, labels=None):
        """The pipeline's entry point (``fit`` calls it too); ``reference`` = (X_ref, y_ref), the
        training rows the validation queries search (:meth:`reference_rows`; None without early
        stopping)."""
        W0 = self._start(statistics)
        C = len(self.classes_)
        self._train_classes = self._fit_classes(statistics, labels)[0]
        sgd = MetricSGD(W0, "knn", self._searched("lr"), n_classes=C, targets=self.targets, k=self.k,
                        scale=moments.row_scale(statistics), margin=self.margin)
        error = None
        if self.early_stopping:
            Xr, yr = np.asarray(reference[0], np.float64), np.asarray(reference[1], np.int64)
            error = lambda s, Xv, yv: _knn_error(s, Xv, yv, Xr, yr, self.k)  # noqa: E731
        self._run(sgd, pools, X_val, y_val, error, self._batches)
        del self._best_bias, self._train_classes
        return self


def metrics_nearest(Y: np.ndarray, M: np.ndarray) -> np.ndarray:
    """Index of the nearest row of M for every row of Y (squared Euclidean)."""
    d = (Y * Y).sum(1)[:, None] - 2 * Y @ M.T + (M * M).sum(1)[None, :]
    return np.argmin(d, axis=1)


def _class_error(sgd: "MetricSGD", Xv, yv) -> float:
    return float((sgd.classify(np.asarray(Xv, np.float64)) != yv).mean())


def _knn_error(sgd: "MetricSGD", Xv, yv, Xr, yr, k: int) -> float:
    """Top-1 error of the kNN classifier (k neighbours among the reference rows) under the current W."""
    from metricpipe.tasks import knn, metrics
    k = min(k, len(Xr))
    with np.errstate(over="ignore", invalid="ignore"):   # a W on its way to diverging: a poor error, not a crash
        _, nb = knn.block_topk((np.asarray(Xv, np.float64) @ sgd.W.T).astype(np.float32),
                               (Xr @ sgd.W.T).astype(np.float32), k)
    rank = metrics.knn_class_ranking(yr[nb], sgd.n_classes, k)
    return float((rank[:, 0] != yv).mean())
