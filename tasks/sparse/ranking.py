"""Algorithm 1: the ranking objective of Eq. 7 over pivots, its rank-two gradient (Eq. 14), projected
descent steps with continuation and early stopping on validation mAP (`rank_projectors`)."""

from dataclasses import dataclass

import numpy as np

from metricpipe.tasks import evaluation
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.metrics import retrieval_scores
from metricpipe.tasks.sparse.projection import golden_section, nonzeros_per_column, project_l0, unit_columns


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
    alpha = 1.0 / np.maximum((a > 0).sum(1), 1)  # Eq. 8
    beta = 1.0 / np.maximum((b > 0).sum(1), 1)  # Eq. 9
    f = alpha * (a**2).sum(1) + beta * (b**2).sum(1)  # Eq. 7
    C = 2.0 * (beta[:, None] * b - alpha[:, None] * a)  # d f / d s(q, k)
    C[np.arange(n), piv] += 2.0 * (alpha * a.sum(1) - beta * b.sum(1))
    return f, C


def objective_and_gradient(
    U: np.ndarray, X: np.ndarray, gt: GroundTruth, qs: np.ndarray, piv: np.ndarray, eps: float, gradient: bool = True
):
    """sum_q f_q over queries ``qs``, its gradient with respect to U (D, R) (Eq. 14; None when
    ``gradient`` is False) and the per-query f_q."""
    Y = X @ U
    S = Y[qs] @ Y.T
    pos, neg = gt.masks(qs)
    f, C = query_terms(S, pos, neg, piv, eps)
    G = None
    if gradient:  # d s(q, k) / dU = x_q y_k^T + x_k y_q^T  =>  G = X_q^T C Y + X^T C^T Y_q, each
        # in the cheapest order for the shapes ((C X)^T Y_q took queries x N x D where N x R x D will do)
        G = np.linalg.multi_dot([X[qs].T, C, Y]) + np.linalg.multi_dot([X.T, C.T, Y[qs]])
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
    active = np.argsort(-f_all, kind="stable")[: P // 2]  # active half
    rest = np.setdiff1d(np.arange(len(f_all)), active)
    return np.concatenate([active, rng.choice(rest, P - len(active), replace=False)])  # stochastic half


def descent_step(
    U: np.ndarray, G: np.ndarray, X: np.ndarray, gt: GroundTruth, qs: np.ndarray, piv: np.ndarray, eps: float, m: int
) -> np.ndarray:
    """U - mu G kept to m non-zeros per column and unit columns (Eqs. 15, 17), mu by golden-section
    search on the queries' objective over [0, ||U|| / ||G||]."""

    def step(mu):
        return unit_columns(project_l0(U - mu * G, m))  # Eqs. 15, 17

    mu = golden_section(
        lambda mu: objective_and_gradient(step(mu), X, gt, qs, piv, eps, gradient=False)[0],
        0.0,
        np.linalg.norm(U) / np.linalg.norm(G),
        tol=1e-4,
        max_iter=20,
    )
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
    return len(
        [
            it
            for it in range(0, max_iter, record_every)
            if support_size(max(it - 1, 0), D, m_final, anneal, max_iter) == m_final
        ]
    )


def _start(X: np.ndarray, key, U0, sparsity: float, anneal: float, pivot: str, max_iter: int):
    """(ground truth, final non-zeros per column, the start U on its first support, each query's pivot)."""
    N, D = X.shape
    check_rank_inputs(D, U0, sparsity, anneal, pivot)
    gt = GroundTruth(np.arange(N), np.asarray(key))
    m_final = nonzeros_per_column(D, sparsity)
    U = unit_columns(project_l0(np.asarray(U0, np.float64), support_size(0, D, m_final, anneal, max_iter)))
    return gt, m_final, U, start_pivots(X, U0, gt, pivot)


def rank_projectors(
    X: np.ndarray,
    key: np.ndarray,
    U0: np.ndarray,
    *,
    sparsity: float = 0.9,
    queries: int = 100,
    epsilon: float = 1e-6,
    max_iter: int = 200,
    anneal: float = 0.5,
    seed=0,
    tol: float = TOL,
    record_every: int = 1,
    pivot: str = "original",
    validation=None,
    patience: int | None = None,
    stop: int | None = None,
):
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
    gt, m_final, U, piv_all = _start(X, key, U0, sparsity, anneal, pivot, max_iter)
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
    best = check.best or (history[-1].get("val_map", float("nan")), history[-1]["iter"], U)  # (none checked: the last)
    return best[2].astype(np.float32), history, n_iter, (int(best[1]), float(best[0]))


def final_state(
    U: np.ndarray,
    X: np.ndarray,
    gt: GroundTruth,
    piv_all: np.ndarray,
    epsilon: float,
    m_final: int,
    history: list,
    done: int,
    check: ValidationCheck,
) -> np.ndarray:
    """The end of rank_projectors: U on its final support, and its state after the last step (``done``)
    as the last history entry (validated)."""

    def objective(U):
        return objective_and_gradient(U, X, gt, gt.queries, piv_all, epsilon, gradient=False)[0]

    if not history:  # stopped before the first iteration (stop 0): the start
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
