"""SL-DE (Wang et al., Section 3): one SL-NE per subspace P_n (consecutive PCA blocks or seeded
Gaussian projections), each member its own task (:func:`fit_member`); the ensemble similarity is the
sum of the members' (Eq. 8), optionally refined by coordinate descent over members; codes from the
PSD factor of a similarity (:func:`factor`)."""

import time

import numpy as np

from metricpipe.tasks.errors import InputError
from metricpipe.tasks.slne.solver import edge_scores, learn_similarity, neighbourhoods, softvote_validator


def subspace(p: int, n: int, dim: int, kind: str, seed) -> np.ndarray:
    """The projection P_n (dim, p) of SL-DE member n in the p-dimensional preprocessed space.

    ``pca-blocks``: the n-th block of PCA coordinates (the input is already in PCA coordinates, so P_n
    selects coordinates n*dim .. (n+1)*dim-1). ``random``: Gaussian N(0, 1/dim), seeded per member.
    """
    if kind == "pca-blocks":
        return np.eye(p, dtype=np.float32)[n * dim : (n + 1) * dim]
    if kind == "random":
        return (np.random.default_rng([seed, 7, n]).standard_normal((dim, p)) / np.sqrt(dim)).astype(np.float32)
    raise InputError(f"The 'subspace' parameter of slde must be pca-blocks or random. Got {kind!r} instead.")


def project(Z: np.ndarray, Pn: np.ndarray) -> np.ndarray:
    """Rows Z (n, p) in member subspace Pn (d, p): Z P_n^T, (n, d) float32."""
    return np.asarray(Z, np.float32) @ Pn.T


def check_subspaces(p: int, members: int, dim: int, kind: str, n_features: int | None = None) -> None:
    """pca-blocks needs members x dim <= p PCA directions (``n_features``: D, for the message)."""
    if kind == "pca-blocks" and members * dim > p:
        of = "" if n_features is None else f" (X has {n_features} feature(s))"
        raise InputError(
            f"slde: members x member_dim = {members} x {dim} = {members * dim} PCA directions, but "
            f"only {p} exist{of}; lower members or member_dim, or use subspace: random"
        )


def subspaces(p: int, members: int, dim: int, kind: str, seed, n_features: int | None = None) -> list[np.ndarray]:
    """Every member's :func:`subspace` (see :func:`check_subspaces`)."""
    check_subspaces(p, members, dim, kind, n_features)
    return [subspace(p, n, dim, kind, seed) for n in range(members)]


def factor(M: np.ndarray, rank: int | None = None) -> np.ndarray:
    """L (p, r) with L L^T the best PSD approximation of sym(M) (negative eigenvalues clipped),
    keeping the ``rank`` largest eigenvalues, so s(x, y) ~ <x L, y L>; with a ``rank`` and fewer
    positive eigenvalues, zero columns pad L to ``rank`` (the code dimension asked for; they change
    no score). Equal eigenvalues keep the input's order: M = I (the start, kept when no epoch
    validates better) in PCA coordinates keeps the leading PCA directions, not the last ones."""
    values, vectors = np.linalg.eigh(0.5 * (M + M.T).astype(np.float64))
    order = np.argsort(-values, kind="stable")
    values, vectors = values[order], vectors[:, order]
    keep = values > 0
    if rank is not None:
        keep &= np.arange(len(values)) < rank
    L = vectors[:, keep] * np.sqrt(values[keep])[None, :]
    width = max(1, L.shape[1]) if rank is None else rank
    if L.shape[1] < width:
        L = np.concatenate([L, np.zeros((len(M), width - L.shape[1]))], axis=1)
    return L.astype(np.float32)


def member_seed(seed: int, n: int) -> int:
    """The SGD seed of SL-DE member n: a function of the estimator's seed and n only (never of the
    number of workers or the order members run in)."""
    return int(np.random.SeedSequence([seed, n]).generate_state(1)[0])


def fit_member(
    params: dict,
    Zn: np.ndarray,
    y: np.ndarray,
    graph: np.ndarray,
    seed: int,
    offset: np.ndarray | None = None,
    M0: np.ndarray | None = None,
    validation: tuple | None = None,
):
    """One SL-DE member: SL-NE (:func:`learn_similarity`) on its projected rows. A pure function, so
    the pipeline runs each member as its own task and :meth:`SLDE.fit` runs them one after another.

    Parameters
    ----------
    params : the SL-NE solver parameters, :meth:`SLDE.member_params`.
    Zn : (n, d) the training rows in the member's subspace, Z P_n^T.
    y : (n,) labels. graph : (n, k) local kNN indices (-1 = none).
    seed : the member's seed, :meth:`SLDE.member_seed`.
    offset, M0 : see :func:`learn_similarity` (joint refinement).
    validation : optional (Zv_n (V, d), yv (V,), nbr (V, k)): validation rows in the member's
        subspace and their neighbourhoods among the training rows (local indices, -1 none); the
        member then keeps the epoch with the lowest soft-vote error on them (:func:`softvote_validator`).

    Returns
    -------
    M_n : (d, d) float32; meta : {"history", "seconds", "cpu_seconds" (this thread's), "samples_per_second"}.
    """
    t0, c0 = time.perf_counter(), time.thread_time()
    validate = None if validation is None else softvote_validator(*validation, Zn, y)
    M, history = learn_similarity(Zn, y, graph, **params, seed=seed, offset=offset, M0=M0, validate=validate)
    seconds = time.perf_counter() - t0
    return M, {
        "history": history,
        "seconds": seconds,
        "cpu_seconds": time.thread_time() - c0,
        "samples_per_second": params.get("epochs", 3) * len(Zn) / max(seconds, 1e-9),
    }


def ensemble_matrix(Ps: list, Ms: list) -> np.ndarray:
    """M_E = sum_n P_n^T M_n P_n, so that s_E(x, y) = x^T M_E y (Eq. 8)."""
    p = Ps[0].shape[1]
    out = np.zeros((p, p), np.float64)
    for P, M in zip(Ps, Ms):
        out += P.T.astype(np.float64) @ M.astype(np.float64) @ P.astype(np.float64)
    return out.astype(np.float32)


def refine(Ps: list, Ms: list, Z: np.ndarray, y: np.ndarray, graph: np.ndarray, params: dict, seed: int) -> list:
    """Joint refinement: one round of coordinate descent, each member re-trained with the others'
    similarity fixed as a per-edge offset (Section 3.1)."""
    nb = neighbourhoods(graph, np.asarray(y))
    Ms = [m.copy() for m in Ms]
    scores = [edge_scores(Z @ P.T, M, nb) for P, M in zip(Ps, Ms)]
    for n, P in enumerate(Ps):
        others = np.sum([sc for m, sc in enumerate(scores) if m != n], axis=0)
        Zn = Z @ P.T
        Ms[n] = fit_member(params, Zn, y, graph, member_seed(seed + 1, n), offset=others, M0=Ms[n])[0]
        scores[n] = edge_scores(Zn, Ms[n], nb)
    return Ms
