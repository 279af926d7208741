"""k-NN metric learning's triplets (Mensink et al., Section 4): the hinge [1 + d_W(q, p) - d_W(q, n)]_+
(Eq. 35), triplets from m images per step (rho m from one class, Section 4.2), and the gradient
2 W X^T A X whose coefficients come from one sort per query (Algorithm 1, Eqs. 40-43), never a loop
over triplets."""

import numpy as np

from metricpipe.tasks.errors import InputError
from metricpipe.tasks.knn import block_topk
from metricpipe.tasks.ncmml.objectives import sqdist


def triplet_counts(
    dq: np.ndarray, targets: np.ndarray, negatives: np.ndarray, margin: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
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
    neg_before = np.cumsum(n_sorted, axis=1) - n_sorted  # C_n: negatives ahead
    tgt_after = t_sorted.sum(1, keepdims=True) - np.cumsum(t_sorted, axis=1)  # C_p: targets behind
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
    w[queries] = cp - cn  # + x_qp x_qp^T per violating triplet, - x_qn x_qn^T
    # sum_qj w_qj (x_q - x_j)(x_q - x_j)^T = X^T (diag(rowsum + colsum) - w - w^T) X
    A = np.diag(w.sum(1) + w.sum(0)) - w - w.T
    # multi_dot takes the cheapest order for the shapes (((W X^T) A) X while m <= D); (W X^T)(A X) took m x m x D
    return 2.0 * np.linalg.multi_dot([W, X.T, A, X])


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
    d = sqdist(Y[:n_pos], Y[:n_pos])
    np.fill_diagonal(d, np.inf)
    near = np.argsort(d, axis=1, kind="stable")[:, :k]
    t[:] = False
    np.put_along_axis(t, near, True, 1)
    return t


def knnml_step(W: np.ndarray, X: np.ndarray, is_pos: np.ndarray, k: int, mode: str, fixed=None, margin: float = 1.0):
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
    dq = sqdist(Y[queries], Y)
    cp, cn = triplet_counts(dq, targets, negatives, margin)
    G = triplet_gradient(W, X, queries, cp, cn)
    if mode == "all" and n_pos - 1 > k:  # per k targets, as the other modes: lr means the same in each
        G = G * (k / (n_pos - 1))  # (every positive as a target diverged at the default lr)
    return G / len(queries), int(cp.sum())


def l2_targets(X: np.ndarray, y: np.ndarray, k: int) -> np.ndarray:
    """LMNN's fixed targets (Section 4.1, option 1): for every row, its k nearest rows of the same
    class by l2 distance (row indices; -1 where the class has fewer than k + 1 rows)."""
    out = np.full((len(X), k), -1, np.int64)
    Xf = np.asarray(X, np.float32)
    for c in np.unique(y):
        rows = np.flatnonzero(y == c)
        for a in range(0, len(rows), 2048):
            q = rows[a : a + 2048]
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
