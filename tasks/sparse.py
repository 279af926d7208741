"""Rank-optimised sparse projectors (Negrel, Picard, Gosselin), Section IV and Algorithm 1.

The similarity is d_U(x, y) = x^T U U^T y (Eq. 2), U (D, R). For each query q, with positives P_q,
negatives N_q and a pivot p_q (the negative scored highest by the initial U, Section IV-1), the
constraints of Eq. 6 ask s(q, i) > s(q, p_q) for i in P_q and s(q, p_q) >= s(q, j) for j in N_q.
The paper writes Eqs. 7-15 as if d_U were a distance (smaller = closer); with d_U a similarity the
same objective reads

    f_q(U) = alpha_q sum_i [eps + s(q, p) - s(q, i)]_+^2 + beta_q sum_j [s(q, j) - s(q, p)]_+^2   (Eq. 7)

with alpha_q, beta_q one over the number of violated positive / negative constraints (Eqs. 8-9,
held constant in the gradient as in Eq. 14), minimised by U <- U - mu grad (Eq. 15 with the sign of
a descent). The gradient of one query is rank two: sum_k c_k (x_q y_k^T + x_k y_q^T) with y = U^T x,
so a batch of queries costs three GEMMs, never a loop over triplets. After each step every column
keeps its M largest magnitudes (Eq. 17), M = (1 - tau) D (Eq. 19), and is rescaled to unit norm:
the objective is not scale-invariant (U -> 0 sends it to ~eps^2, the paper's stopping value, while
the ranking is lost), so the scale of each projector is held at its initial (PCA) value. The step
mu is found by golden-section search on the objective after projection and rescaling.

Continuation (``anneal``): projecting the dense PCA start straight onto M non-zeros discards most of
it and the support then barely moves (on Fashion-MNIST, R = 64, tau = 0.9: 89% of the dense
projector's test mAP). Shrinking M geometrically from D to its target over the first half of the
iterations lets the gradient choose the support, and reaches the dense projector's mAP (101%).
With anneal = 0 the learner is Algorithm 1 as printed.

Early stopping (``validation``): the paper runs a fixed number of iterations. The objective averages
each query's violated constraints (Eqs. 8-9), so it can keep falling while the ranking gets worse
(it lowers the pivot's score): on scikit-learn's raw digits (1,150 training rows, R = 16, dense)
train mAP rises from 0.674 to 0.759 and validation mAP from 0.694 to 0.755 over the first 16 steps,
then both drift down (0.732 and 0.692 at step 112) while the objective keeps falling. The
validation mAP is checked along the way and the best state kept; the PCA start is a candidate for
dense projectors, and sparse states only once their support has its final size.

:class:`SparseProjector` is the estimator. ``fit(X, y)`` draws a stratified subset of ``train_size``
rows (:func:`stratified_subset`), starts from the PCA of all of X and learns on the subset; the
pipeline draws the same subset of the train split, reads only those rows and calls
:meth:`SparseProjector.fit_subset` with the statistics stage's mean and PCA basis.
"""
import warnings
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
import scipy.sparse
from sklearn.utils.validation import check_array, check_is_fitted

from metricpipe.tasks.base import (COUNT, DIM_OR_NONE, NON_NEGATIVE, RANDOM_STATE, Interval, Learner, StrOptions,
                                   seed_of)
from metricpipe.tasks import evaluation, stream
from metricpipe.tasks.rows import ArrayRows, TrainingRows
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.metrics import retrieval_scores
from metricpipe.tasks.models import LinearModel
from metricpipe.tasks.moments import pca_statistics

GOLDEN = (np.sqrt(5.0) - 1.0) / 2.0


def golden_section(f, a: float, b: float, tol: float = 1e-6, max_iter: int = 60) -> float:
    """Minimiser of a unimodal f on [a, b] by golden-section search; stops when the bracket is
    ``tol`` times its initial width (relative: the step bracket can be far below 1)."""
    width = tol * abs(b - a)
    c, d = b - GOLDEN * (b - a), a + GOLDEN * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(max_iter):
        if abs(b - a) <= width:
            break
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - GOLDEN * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + GOLDEN * (b - a)
            fd = f(d)
    return c if fc <= fd else d


def project_l0(U: np.ndarray, m: int) -> np.ndarray:
    """Keep the m largest-magnitude entries of every column (Eq. 17); the rest become 0."""
    D = U.shape[0]
    if m >= D:
        return U
    keep = np.argpartition(-np.abs(U), m - 1, axis=0)[:m]
    out = np.zeros_like(U)
    cols = np.broadcast_to(np.arange(U.shape[1]), keep.shape)
    out[keep, cols] = U[keep, cols]
    return out


def unit_columns(U: np.ndarray) -> np.ndarray:
    """Rescale every projector to unit norm. The objective is not scale-invariant (U -> 0 drives every
    hinge to eps and the objective to ~eps^2 while the ranking is lost), so the scale is fixed."""
    norms = np.linalg.norm(U, axis=0, keepdims=True)
    norms[norms == 0] = 1.0
    return U / norms


def _rounded_nonzeros(D: int, sparsity: float) -> int:
    return int(round((1.0 - sparsity) * D))


def nonzeros_per_column(D: int, sparsity: float) -> int:
    """M of Eq. 19: tau = (D - M) / D (at least 1: see :func:`sparsity_note`)."""
    return max(1, _rounded_nonzeros(D, sparsity))


def sparsity_note(D: int, sparsity: float) -> str | None:
    """The note for a tau whose M rounds to 0 on D-d signatures (one non-zero is kept), else None."""
    if _rounded_nonzeros(D, sparsity) >= 1:
        return None
    return (f"sparsity {sparsity} leaves {(1.0 - sparsity) * D:.2g} non-zeros per column of the data's {D} "
            f"features; 1 is kept (sparsity {1.0 - 1.0 / D:.6g})")


@dataclass(frozen=True)
class GroundTruth:
    """Queries (indices into the training rows) with relevance keys: same key = positive."""
    queries: np.ndarray
    key: np.ndarray

    def masks(self, qs: np.ndarray):
        pos = self.key[qs][:, None] == self.key[None, :]
        pos[np.arange(len(qs)), qs] = False  # a query is not its own positive
        neg = self.key[qs][:, None] != self.key[None, :]
        return pos, neg


def pivots(S0: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """The negative with the largest initial score for every query (Section IV-1)."""
    return np.argmax(np.where(neg, S0, -np.inf), axis=1)


def query_terms(S: np.ndarray, pos: np.ndarray, neg: np.ndarray, piv: np.ndarray, eps: float):
    """Per query f_q (Eq. 7) and the coefficient matrix C (P, N) of its gradient."""
    n = len(S)
    sp = S[np.arange(n), piv][:, None]
    a = np.where(pos, eps + sp - S, 0.0)
    a = np.maximum(a, 0.0)
    negp = neg.copy()
    negp[np.arange(n), piv] = False
    b = np.where(negp, S - sp, 0.0)
    b = np.maximum(b, 0.0)
    alpha = 1.0 / np.maximum((a > 0).sum(1), 1)                 # Eq. 8
    beta = 1.0 / np.maximum((b > 0).sum(1), 1)                  # Eq. 9
    f = alpha * (a ** 2).sum(1) + beta * (b ** 2).sum(1)        # Eq. 7
    C = 2.0 * (beta[:, None] * b - alpha[:, None] * a)          # d f / d s(q, k)
    C[np.arange(n), piv] += 2.0 * (alpha * a.sum(1) - beta * b.sum(1))
    return f, C


def objective_and_gradient(U: np.ndarray, X: np.ndarray, gt: GroundTruth, qs: np.ndarray, piv: np.ndarray,
                           eps: float, gradient: bool = True):
    """sum_q f_q over queries ``qs``, its gradient with respect to U (D, R) (Eq. 14; None when
    ``gradient`` is False) and the per-query f_q."""
    Y = X @ U
    S = Y[qs] @ Y.T
    pos, neg = gt.masks(qs)
    f, C = query_terms(S, pos, neg, piv, eps)
    G = None
    if gradient:  # d s(q, k) / dU = x_q y_k^T + x_k y_q^T  =>  G = X_q^T (C Y) + (C X)^T Y_q
        G = X[qs].T @ (C @ Y) + (C @ X).T @ Y[qs]
    return float(f.sum()), G, f


def train_map(U: np.ndarray, X: np.ndarray, gt: GroundTruth) -> float:
    """mAP of the training queries ranked by the projected similarity (each query against the others)."""
    Y = X @ U
    qs = gt.queries
    S = Y[qs] @ Y.T
    S[np.arange(len(qs)), qs] = -np.inf  # the query itself is not in its ranking
    pos, _ = gt.masks(qs)
    ap = retrieval_scores(-S, pos, (1,))["ap"]
    ap = ap[np.isfinite(ap)]  # a query without positives has no AP
    return float(ap.mean()) if len(ap) else float("nan")


# The objective over all queries below which training stops.
TOL = 1e-12


def support_size(it: int, D: int, m: int, anneal: float, max_iter: int) -> int:
    """M for iteration ``it``: geometric from D down to m over the first anneal * max_iter iterations."""
    steps = int(round(anneal * max_iter))
    if it >= steps:
        return m
    return max(m, int(round(D * (m / D) ** (it / steps))))


def check_rank_inputs(D: int, U0: np.ndarray, sparsity: float, anneal: float, pivot: str) -> None:
    """rank_projectors' arguments that no estimator parameter check covers (a direct call)."""
    if U0.shape[0] != D:
        raise InputError(f"sparse: initial projectors have {U0.shape[0]} rows for {D}-d signatures")
    if not 0.0 <= anneal <= 1.0:
        raise InputError(f"The 'anneal' parameter of sparse must be in [0, 1]. Got {anneal} instead.")
    if not 0.0 <= sparsity < 1.0:
        raise InputError(f"The 'sparsity' parameter of sparse must be in [0, 1). Got {sparsity} instead.")
    if pivot not in ("original", "initial"):
        raise InputError(f"The 'pivot' parameter of sparse must be original or initial. Got {pivot!r} instead.")


def start_pivots(X: np.ndarray, U0: np.ndarray, gt: GroundTruth, pivot: str) -> np.ndarray:
    """Every query's pivot (Section IV-1): by the original signatures X X^T, or by the projected start."""
    Y0 = X if pivot == "original" else X @ np.asarray(U0, np.float64)
    _, neg_all = gt.masks(gt.queries)
    return pivots(Y0 @ Y0.T, neg_all)


def select_queries(f_all: np.ndarray, P: int, rng: np.random.Generator) -> np.ndarray:
    """Algorithm 1's P queries of a step: the half with the highest f_q, the rest drawn at random."""
    active = np.argsort(-f_all, kind="stable")[:P // 2]                       # active half
    rest = np.setdiff1d(np.arange(len(f_all)), active)
    return np.concatenate([active, rng.choice(rest, P - len(active), replace=False)])  # stochastic half


def descent_step(U: np.ndarray, G: np.ndarray, X: np.ndarray, gt: GroundTruth, qs: np.ndarray, piv: np.ndarray,
                 eps: float, m: int) -> np.ndarray:
    """U - mu G kept to m non-zeros per column and unit columns (Eqs. 15, 17), mu by golden-section
    search on the queries' objective over [0, ||U|| / ||G||]."""
    def step(mu):
        return unit_columns(project_l0(U - mu * G, m))                         # Eqs. 15, 17

    mu = golden_section(lambda mu: objective_and_gradient(step(mu), X, gt, qs, piv, eps, gradient=False)[0],
                        0.0, np.linalg.norm(U) / np.linalg.norm(G), tol=1e-4, max_iter=20)
    return step(mu)


def history_entry(it: int, total: float, U: np.ndarray, X: np.ndarray, gt: GroundTruth) -> dict:
    """A ``history`` entry of rank_projectors: the iteration, the objective over all queries, the train mAP."""
    return {"iter": it, "objective": total, "train_map": train_map(U, X, gt)}


class ValidationCheck:
    """rank_projectors' early stopping: at a history entry whose U has its final support, the mAP of
    the validation rows querying each other by x U ("val_map"); keeps the best (val_map, iter, U)
    (ties: the earlier) and says stop after ``patience`` checks in a row without a better one. With
    no validation rows it never checks."""

    def __init__(self, validation, m_final: int, patience: int | None, eligible: int):
        self.on = validation is not None
        if self.on:
            self.Xv, self.kv = np.asarray(validation[0], np.float64), np.asarray(validation[1])
        self.m_final, self.patience = m_final, patience or max(5, (eligible + 1) // 2)
        self.best, self.stale = None, 0

    def __call__(self, entry: dict, U: np.ndarray) -> bool:
        if not self.on or np.count_nonzero(U, axis=0).max() > self.m_final:
            return False
        entry["val_map"] = v = evaluation.validation_map(self.Xv @ U, self.kv, "inner")
        if self.best is None or v > self.best[0]:
            self.best, self.stale = (v, entry["iter"], U.copy()), 0
        else:
            self.stale += 1
        return self.stale >= self.patience


def checked_iterations(D: int, m_final: int, anneal: float, max_iter: int, record_every: int) -> int:
    """The history entries of a full run whose U has its final support (each a validation check)."""
    return len([it for it in range(0, max_iter, record_every)
                if support_size(max(it - 1, 0), D, m_final, anneal, max_iter) == m_final])


def rank_projectors(X: np.ndarray, key: np.ndarray, U0: np.ndarray, *, sparsity: float = 0.9, queries: int = 100,
                    epsilon: float = 1e-6, max_iter: int = 200, anneal: float = 0.5, seed=0, tol: float = TOL,
                    record_every: int = 1, pivot: str = "original", validation=None, patience: int | None = None,
                    stop: int | None = None):
    """Algorithm 1 (with the continuation ``anneal``): rank-optimised projectors from a start U0.

    Parameters
    ----------
    X : (N, D) centred training signatures, each a query against the others.
    key : (N,) relevance keys (labels or groups): the same key is a positive.
    U0 : (D, R) initial projectors (PCA).
    sparsity : tau of Eq. 19 (0 = dense). queries : P, queries per iteration (half the highest f_q,
        half at random). epsilon : margin of Eq. 7. max_iter : iterations. anneal : share of max_iter
        over which M shrinks geometrically from D to its target (0 = Algorithm 1 as printed).
    seed : the random half of the query selection. tol : stop when the objective over all queries
        falls below it. record_every : iterations between ``history`` entries.
    pivot : "original": each query's pivot is its highest-scored negative by the original
        signatures, X X^T (Section IV-1, "to stay as close as possible to the original
        signatures"); "initial": by the projected start, (X U0)(X U0)^T.

    validation : optional (X_val centred like X, keys): early stopping. At every history entry whose
        support has reached its final size (the start too, when nothing is annealed) the mAP of the
        validation rows querying each other by x U is recorded ("val_map"), and the U with the best
        one is returned (ties: the earlier); training stops after ``patience`` such checks in a row
        without a better one (default: half of the checks the run would make, at least 5).
    stop : optional, stop after this many iterations of the ``max_iter`` schedule (a refit repeats a
        validated run's kept iterations on every training row: the support shrinks as in that run).

    Returns
    -------
    U : (D, R) float32 with unit columns of at most (1 - sparsity) D non-zeros; history : list of
    {"iter", "objective", "train_map"[, "val_map"]}, "iter" counting the steps taken; n_iter :
    iterations run (the one that found the objective below tol or a zero gradient included);
    with ``validation``, U is the best checked state and ``best`` = (iter, val_map) is appended to
    the return value.
    """
    X = np.asarray(X, np.float64)
    N, D = X.shape
    check_rank_inputs(D, U0, sparsity, anneal, pivot)
    gt = GroundTruth(np.arange(N), np.asarray(key))
    m_final = nonzeros_per_column(D, sparsity)
    U = unit_columns(project_l0(np.asarray(U0, np.float64), support_size(0, D, m_final, anneal, max_iter)))
    piv_all = start_pivots(X, U0, gt, pivot)
    rng = np.random.default_rng(seed)
    P = min(queries, N)
    history = []
    done = n_iter = 0
    checks = 0 if validation is None else checked_iterations(D, m_final, anneal, max_iter, record_every)
    check = ValidationCheck(validation, m_final, patience, checks)
    for it in range(max_iter if stop is None else min(max_iter, stop)):
        n_iter = it + 1
        total, _, f_all = objective_and_gradient(U, X, gt, gt.queries, piv_all, epsilon, gradient=False)
        if it % record_every == 0:
            history.append(history_entry(it, total, U, X, gt))
            if check(history[-1], U):
                break
        if total < tol:
            break
        qs = select_queries(f_all, P, rng)
        _, G, _ = objective_and_gradient(U, X, gt, qs, piv_all[qs], epsilon)
        if np.linalg.norm(G) == 0:
            break
        U = descent_step(U, G, X, gt, qs, piv_all[qs], epsilon, support_size(it, D, m_final, anneal, max_iter))
        done = it + 1
    U = final_state(U, X, gt, piv_all, epsilon, m_final, history, done, check)
    if validation is None:
        return U.astype(np.float32), history, n_iter
    best = check.best
    if best is None:           # no state reached the final support before stopping: the last one
        best = (history[-1].get("val_map", float("nan")), history[-1]["iter"], U)
    return best[2].astype(np.float32), history, n_iter, (int(best[1]), float(best[0]))


def final_state(U: np.ndarray, X: np.ndarray, gt: GroundTruth, piv_all: np.ndarray, epsilon: float, m_final: int,
           history: list, done: int, check: ValidationCheck) -> np.ndarray:
    """The end of rank_projectors: U on its final support, and its state after the last step (``done``)
    as the last history entry (validated)."""
    def objective(U):
        return objective_and_gradient(U, X, gt, gt.queries, piv_all, epsilon, gradient=False)[0]

    if not history:   # stopped before the first iteration (stop 0): the start
        history.append(history_entry(0, objective(U), U, X, gt))
        check(history[-1], U)
    cut = np.count_nonzero(U, axis=0).max() > m_final
    if cut:  # stopped (tol) before the annealed support reached its target: project onto it (Eq. 17)
        U = unit_columns(project_l0(U, m_final))
    if cut or history[-1]["iter"] != done:  # the state after the last step
        total = objective(U)
        if history[-1]["iter"] == done:
            history.pop()
        history.append(history_entry(done, total, U, X, gt))
        check(history[-1], U)
    return U


class SparseProjector(Learner):
    """Rank-optimised sparse projectors (Negrel, Picard, Gosselin): codes x U + b, U (D, R) with at
    most (1 - sparsity) D non-zeros per column, compared by inner product (Eq. 2).

    Parameters
    ----------
    dim : int or None, default None
        R, the number of projectors (the code dimension); None = ``DEFAULT_DIM`` (64, within the
        paper's R = 32 to 256), or every PCA direction when there are fewer.
    sparsity : float in [0, 1), default 0.9
        tau of Eq. 19 (0 = dense); M = round((1 - tau) D) non-zeros per column, at least 1 (a tau
        that rounds M to 0 keeps 1, with a warning; the pipeline prints it before staging).
    queries : int, default 100
        P, queries per iteration (half the highest f_q, half at random).
    train_size : int, default 2000
        Rows of the training set (a stratified, seeded subset of the rows given; each is a query
        against the others). Its cost grows with train_size squared.
    max_iter : int, default 200
        Iterations.
    anneal : float in [0, 1], default 0.5
        Share of max_iter over which M shrinks geometrically from D to its target (continuation;
        0 = Algorithm 1 as printed).
    epsilon : float, default 1e-6
        The margin of Eq. 7.
    pivot : {"original", "initial"}, default "original"
        Scores that choose each query's pivot: the original signatures (the paper) or the PCA start.
    validation : int >= 0, default 2000
        Early stopping (0 = off): the mAP of at most this many validation rows querying each other is
        checked at every history entry once the support has its final size, training stops after
        half the checks without a better one, and the best U is kept (for dense projectors the PCA
        start is a candidate). The rows are (X_val, y_val) when given, else a stratified, seeded share
        of the rows (at most a fifth) kept out of the training subset; the pipeline gives its ``val``
        split. Off when no validation row has both a positive and a negative (few-shot data: then
        every row trains).
    stop_iter : int >= 0 or None, default None
        Stop after this many iterations of the ``max_iter`` schedule (None: all of them); a run refits
        a validated projector on every training row with its kept iteration here (``refit_params``).
    random_state : int, RandomState or None, default None
        Seed of the training subset and of the random half of the queries (None: 0).

    Attributes
    ----------
    projectors_ : (D, R) float32, a scipy CSC sparse array when sparsity > 0, else dense.
    bias_ : (R,) float32, -mean U (the codes of centred rows).
    history_ : list of {"iter", "objective", "train_map"[, "val_map"]}. n_iter_ : iterations run (see
    :func:`rank_projectors`). best_iter_, val_map_ : the kept U's iteration and validation mAP (None
    without validation).
    n_features_in_, classes_.
    """
    # how long the support shrinks from D to its final size; 0 is Algorithm 1 as printed (cut to M
    # non-zeros at once): in issue 18's table validation chose it on Fashion 14 x 14, and 0.25 / 0.9 /
    # 0.9 on digits, HOG and Fashion-MNIST (benchmarks/README.md)
    search_space = {"anneal": [0.5, 0.25, 0.9, 0.0]}
    selection_metric = "map"

    @classmethod
    def search_grid(cls, params: dict) -> dict:
        """Dense projectors (sparsity 0) have no support to shrink: nothing to search."""
        return {} if params.get("sparsity", 0.9) == 0 else cls.search_space

    method = "sparse"
    feeds = "subset"
    reads_statistics = ("mean", "pca_components")

    def portable(self) -> tuple[str, dict, dict]:
        """``affine``: codes = X @ W + b with W the projectors, dense."""
        check_is_fitted(self)
        W = self.projectors_
        return "affine", {"W": W.toarray() if scipy.sparse.issparse(W) else np.asarray(W), "b": self.bias_}, {}
    fitted_attributes = ("projectors_", "bias_", "classes_", "history_", "best_iter_", "val_map_", "n_iter_")
    DEFAULT_DIM = 64       # compact codes, as the paper's R = 32 to 256: D projectors would not compress
    dim_within_features = True
    code_metric = "inner"
    _parameter_constraints = {
        "dim": DIM_OR_NONE,
        "sparsity": [Interval(Real, 0, 1, closed="left")],
        "queries": [Interval(Integral, 2, None, closed="left")],
        "train_size": [Interval(Integral, 4, None, closed="left")],
        "max_iter": COUNT,
        "anneal": [Interval(Real, 0, 1, closed="both")],
        "epsilon": NON_NEGATIVE,
        "pivot": [StrOptions({"original", "initial"})],
        "validation": [Interval(Integral, 0, None, closed="left")],
        "stop_iter": [Interval(Integral, 0, None, closed="left"), None],
        "random_state": RANDOM_STATE,
    }

    def shape_notes(self, n_features: int, n_classes: int) -> list[str]:
        note = sparsity_note(n_features, self.sparsity)
        return [note] if note else []

    def __init__(self, dim=None, sparsity=0.9, queries=100, train_size=2000, max_iter=200, anneal=0.5,
                 epsilon=1e-6, pivot="original", validation=2000, stop_iter=None, random_state=None):
        self.dim = dim
        self.sparsity = sparsity
        self.queries = queries
        self.train_size = train_size
        self.max_iter = max_iter
        self.anneal = anneal
        self.epsilon = epsilon
        self.pivot = pivot
        self.validation = validation
        self.stop_iter = stop_iter
        self.random_state = random_state

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.required = True
        return tags

    def fit(self, X, y, X_val=None, y_val=None):
        """Learn the projectors on a stratified subset of ``train_size`` rows of X, from the PCA of X.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,), the relevance keys (same key = relevant).
        X_val, y_val : optional validation rows and keys for early stopping (see ``validation``);
            without them a share of X is held out of the training subset.
        """
        self._validate_params()
        if y is None:
            raise ValueError("SparseProjector requires y to be passed, but the target y is None.")
        X, y = self._check_Xy(X, y, min_classes=1)
        _check_keys(len(self.classes_))
        yv = None
        if X_val is not None:
            X_val, y_val = self._check_val(X_val, y_val)
            yv = np.searchsorted(self.classes_, y_val)   # (keys it never saw rank as no positive)
            yv = np.where(self.classes_[np.minimum(yv, len(self.classes_) - 1)] == y_val, yv, -1 - np.arange(len(yv)))
        for note in self.shape_notes(X.shape[1], len(self.classes_)):
            warnings.warn(note, UserWarning, stacklevel=2)
        mean, components = pca_statistics(X)
        return self.fit_rows(ArrayRows(X, y, X_val, yv), {"mean": mean, "pca_components": components})

    def fit_rows(self, rows: TrainingRows, statistics: dict, labels=None):
        """Learn on a stratified subset of ``train_size`` of the fit rows (the order-free sampler,
        :func:`~metricpipe.tasks.stream.sample`) from the statistics' mean and PCA basis: ``fit`` and the
        pipeline both end here. With ``validation`` > 0, early stopping reads the given validation rows,
        else a stratified share held out of the fit rows (none when no held-out row has a positive and
        a negative to rank: few-shot data). Relevance: ``rows.groups`` where given, else the labels."""
        self._validate_params()
        seed = seed_of(self.random_state)
        rel = rows.labels if rows.groups is None else rows.groups
        among, val = np.flatnonzero(rows.fit & rows.in_stats), None
        if self.validates() and rows.val is not None and len(rows.val):
            val = rows.val
        elif self.validates():
            held = among[stream.validation_split(rows.labels[among], self.validation, rows.keys[among], seed)]
            if evaluation.can_rank(rel[held], negatives=True):   # else (few-shot data) no early stopping
                among, val = np.setdiff1d(among, held), held
        subset = among[stream.sample(rows.labels[among], self.train_size, rows.keys[among], seed, stream.SUBSET)]
        X, key = rows.take(subset), rel[subset]
        self.classes_ = np.unique(key)
        _check_keys(len(self.classes_))
        self.n_features_in_ = int(rows.n_features)
        given = None
        if val is not None:
            pick = val[stream.sample(rel[val], min(self.validation, len(val)), rows.keys[val], seed, stream.VALIDATION)]
            given = (rows.take(pick), rel[pick])
        return self._fit_subset(X, key, statistics["mean"], statistics["pca_components"], given)

    def fit_subset(self, X, key, mean, components, X_val=None, key_val=None):
        """The pipeline's entry point: learn on the training subset, starting from given statistics.

        Parameters
        ----------
        X : (n, D) the subset's rows (:func:`stratified_subset` of the train split with
            ``train_size`` and ``random_state``; bounded, so read in one task).
        key : (n,) their relevance keys (labels, or groups where the data has them).
        mean : (D,) the training rows' mean; components : (k, D) their PCA directions (rows).
        X_val, key_val : optional validation rows and keys (early stopping when ``validation`` > 0).
        """
        self._validate_params()
        X = check_array(X, dtype=[np.float64, np.float32])
        key = np.asarray(key)
        mean = np.asarray(mean, np.float64)
        if X.shape[1] != len(mean) or len(key) != len(X):
            raise InputError(f"SparseProjector.fit_subset: X must have {len(mean)} columns (the mean's length) and "
                             f"one key per row. Got X {X.shape} and {len(key)} keys.")
        self.classes_ = np.unique(key)
        _check_keys(len(self.classes_))
        self.n_features_in_ = int(X.shape[1])
        self.__dict__.pop("feature_names_in_", None)
        val = None if X_val is None else (check_array(X_val, dtype=[np.float64, np.float32]), np.asarray(key_val))
        for note in self.shape_notes(X.shape[1], len(self.classes_)):
            warnings.warn(note, UserWarning, stacklevel=2)
        return self._fit_subset(X, key, mean, components, val)

    def _fit_subset(self, X, key, mean, components, val=None):
        comps = np.asarray(components)
        if self.dim is not None and self.dim > len(comps):
            raise InputError(f"The 'dim' parameter of sparse must be <= {len(comps)}, the PCA projectors "
                             f"available to start from (X has {comps.shape[1]} feature(s)). Got {self.dim} "
                             f"instead.")
        dim = self.resolved_dim(len(comps))
        mean = np.asarray(mean, np.float64)
        if val is not None and (not self.validation or not evaluation.can_rank(val[1], negatives=True)):
            val = None   # off, or no validation row has a positive and a negative to rank
        if val is not None:
            val = (np.asarray(val[0], np.float64) - mean, val[1])
        U, history, n_iter, *best = rank_projectors(
            np.asarray(X, np.float64) - mean, key, comps[:dim].T, sparsity=self.sparsity, queries=self.queries,
            epsilon=self.epsilon, max_iter=self.max_iter, anneal=self.anneal, seed=seed_of(self.random_state),
            record_every=max(1, self.max_iter // 50), pivot=self.pivot, validation=val, stop=self.stop_iter)
        self.best_iter_, self.val_map_ = best[0] if best else (None, None)
        self.projectors_ = scipy.sparse.csc_array(U) if self.sparsity > 0 else U
        self.bias_ = (-mean.astype(np.float32) @ U).astype(np.float32)
        self.history_ = history
        self.n_iter_ = int(n_iter)
        return self

    def validates(self) -> bool:
        return self.validation > 0

    def fit_facts(self) -> dict:
        return {"final": self.history_[-1], "best_iter": self.best_iter_, "val_map": self.val_map_}

    def refit_params(self) -> dict:
        """The kept U's iteration as ``stop_iter``, validation off: the refit shrinks its support on the
        same ``max_iter`` schedule and stops where the validated run's best state was."""
        best = getattr(self, "best_iter_", None)
        return {} if best is None else {"stop_iter": int(best), "validation": 0}

    @property
    def _n_features_out(self) -> int:
        return int(self.projectors_.shape[1])

    def _model(self) -> LinearModel:
        # a fresh container per call: its cached compute form must not live on the estimator
        return LinearModel(self.projectors_, self.bias_, score="inner")

    def _transform(self, X):
        return self._model().transform(X)

    def cost(self) -> dict:
        """Non-zeros of U, its storage (CSC with small row indices when sparse) and multiply-adds."""
        check_is_fitted(self)
        return self._model().cost(self.n_features_in_)


def _check_keys(n_keys: int) -> None:
    if n_keys < 2:
        raise InputError(f"SparseProjector needs at least 2 relevance keys (positives and negatives); got "
                         f"{n_keys} class. Pass labels of several classes.")
