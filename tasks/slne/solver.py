"""SL-NE's neighbourhoods and the solver of Algorithm 1 (Wang et al.).

Bilinear similarity s_M(x, y) = x^T M y (Eq. 2). Every training sample's neighbourhood comes from a
fixed kNN graph, symmetrised as in Eq. 4 (j is i's neighbour if j in N_i or i in N_j); targets are
same-label neighbours, impostors the others. SGD over permutations of the training set picks, for
each sample, its most violating target/impostor pair (Eq. 7) and applies the hinge update of Eq. 6:
M <- M + rho x_i (x_j - x_l)^T with rho = rho0 / sqrt((t - 1) / |S| + 1).
"""

from dataclasses import dataclass

import numpy as np

from metricpipe.tasks import knn
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.evaluation import softvote_errors


@dataclass(frozen=True)
class Neighbourhoods:
    """The symmetrised neighbourhood graph in CSR form: neighbours of i are
    ``indices[indptr[i]:indptr[i+1]]``; ``target`` marks same-label neighbours."""

    indptr: np.ndarray
    indices: np.ndarray
    target: np.ndarray


def neighbourhoods(graph: np.ndarray, y: np.ndarray) -> Neighbourhoods:
    """Symmetrise a kNN graph (n, k) of local row indices (-1 = none) and split targets/impostors."""
    n, k = graph.shape
    rows = np.repeat(np.arange(n, dtype=np.int64), k)
    cols = graph.reshape(-1).astype(np.int64)
    ok = (cols >= 0) & (cols != rows)
    rows, cols = rows[ok], cols[ok]
    m = len(rows)
    code = np.empty(2 * m, np.int64)  # row * n + column of both directions, built in place (the
    np.multiply(rows, n, out=code[:m])  # graph's copies were most of an SL-NE task's memory)
    code[:m] += cols
    np.multiply(cols, n, out=code[m:])
    code[m:] += rows
    del rows, cols, ok
    code.sort()  # by row then column; duplicates (mutual neighbours) removed
    if len(code):
        keep = np.empty(len(code), bool)
        keep[0] = True
        np.not_equal(code[1:], code[:-1], out=keep[1:])
        code = code[keep]
        del keep
    r = code // n
    c = code - r * n
    del code
    indptr = np.searchsorted(r, np.arange(n + 1)).astype(np.int64)
    return Neighbourhoods(indptr, c, y[r] == y[c])


def most_violating(S: np.ndarray, target: np.ndarray, seg: np.ndarray):
    """Eq. 7 per segment: the target with the lowest score and the impostor with the highest.

    S : (E,) scores s_M(x_i, x_j) of every edge of the batch, segments given by ``seg`` starts.
    Returns (j_pos, l_pos) edge positions, -1 where a sample has no target or no impostor.
    """
    E = len(S)
    starts = seg[:-1]
    lengths = np.diff(seg)
    nonempty = lengths > 0
    j_pos = np.full(len(starts), -1, np.int64)
    l_pos = np.full(len(starts), -1, np.int64)
    if E == 0:
        return j_pos, l_pos
    seg_id = np.repeat(np.arange(len(starts)), lengths)
    # lexsort by (segment, key): the first entry of each segment is its extreme
    for out, key, mask in ((j_pos, S, target), (l_pos, -S, ~target)):
        k = np.where(mask, key, np.inf)
        order = np.lexsort((np.arange(E), k, seg_id))
        first = order[starts[nonempty]]
        valid = mask[first]
        idx = np.flatnonzero(nonempty)
        out[idx[valid]] = first[valid]
    return j_pos, l_pos


def triplet_update(
    M: np.ndarray,
    X: np.ndarray,
    nb: Neighbourhoods,
    B: np.ndarray,
    rho: np.ndarray,
    margin: float,
    sampling: str,
    rng,
    offset: np.ndarray | None = None,
):
    """One mini-batch of Algorithm 1 with M held fixed: for each sample i of B pick (j, l) by Eq. 7
    (or uniformly) and, where the hinge of Eq. 6 is positive, add rho_i x_i (x_j - x_l)^T.

    Returns (dM (D, D) float64, hinge (len(B),) with 0 where the triplet is satisfied or missing).
    """
    seg = np.concatenate([[0], np.cumsum(nb.indptr[B + 1] - nb.indptr[B])])
    edges = (
        np.concatenate([np.arange(nb.indptr[i], nb.indptr[i + 1]) for i in B]).astype(np.int64)
        if len(B)
        else np.zeros(0, np.int64)
    )
    owner = np.repeat(np.arange(len(B)), np.diff(seg))
    V = X[B] @ M.astype(np.float32)  # x_i^T M for the batch
    S = np.einsum("ed,ed->e", V[owner], X[nb.indices[edges]])  # s_M(x_i, x_j), Eq. 2
    if offset is not None:
        S = S + offset[edges]
    tgt = nb.target[edges]
    jp, lp = most_violating(S, tgt, seg) if sampling == "violating" else _uniform_pairs(tgt, seg, rng)
    ok = (jp >= 0) & (lp >= 0)
    hinge = np.zeros(len(B))
    hinge[ok] = margin - S[jp[ok]] + S[lp[ok]]  # Eq. 6
    viol = np.flatnonzero(hinge > 0)
    hinge[hinge < 0] = 0.0
    D = X.shape[1]
    if not len(viol):
        return np.zeros((D, D)), hinge
    xi = X[B[viol]] * rho[viol, None].astype(np.float32)
    diff = X[nb.indices[edges[jp[viol]]]] - X[nb.indices[edges[lp[viol]]]]
    return (xi.T @ diff).astype(np.float64), hinge  # sum of rho x_i (x_j - x_l)^T


def _solver_inputs(Z, y, graph, sampling: str, offset):
    """The training rows as float32 and their neighbourhoods, the arguments checked."""
    X = np.ascontiguousarray(Z, np.float32)
    n = X.shape[0]
    graph = np.asarray(graph)
    if graph.ndim != 2 or graph.shape[0] != n:
        raise InputError(
            f"SL-NE: the neighbour graph must have one row per sample, shape ({n}, k). Got shape {graph.shape} instead."
        )
    if sampling not in ("violating", "uniform"):
        raise InputError(f"The 'sampling' parameter of slne must be violating or uniform. Got {sampling!r}")
    nb = neighbourhoods(graph, np.asarray(y))
    if offset is not None and len(offset) != len(nb.indices):
        raise InputError(f"SL-NE: offset has {len(offset)} entries for {len(nb.indices)} edges")
    return X, nb


def _epoch(
    M, X, nb, t: int, rng, batch: int, step: float, margin: float, sampling: str, offset, symmetric: bool, normalize
):
    """One pass of Algorithm 1 over a permutation of the rows, ``batch`` samples per update of M;
    (M, samples seen, violations, summed hinge)."""
    n = len(X)
    perm = rng.permutation(n)
    n_viol, loss = 0, 0.0
    for a in range(0, n, batch):
        B = perm[a : a + batch]
        rho = step / np.sqrt((t + np.arange(len(B))) / n + 1.0)  # Algorithm 1 line 7 (t-1 -> t)
        t += len(B)
        dM, hinge = triplet_update(M, X, nb, B, rho, margin, sampling, rng, offset)
        if hinge.any():
            M += dM  # Eq. 6's hinge step
            if symmetric:
                M = 0.5 * (M + M.T)
            if normalize:
                M *= normalize / np.linalg.norm(M)
        n_viol += int((hinge > 0).sum())
        loss += float(hinge.sum())
    return M, t, n_viol, loss


def learn_similarity(
    Z: np.ndarray,
    y: np.ndarray,
    graph: np.ndarray,
    *,
    margin: float = 0.02,
    step: float = 0.2,
    epochs: int = 3,
    batch: int = 64,
    sampling: str = "violating",
    normalize: float | None = None,
    seed=0,
    symmetric: bool = True,
    offset: np.ndarray | None = None,
    M0: np.ndarray | None = None,
    validate=None,
):
    """Algorithm 1: learn M of s_M(z_i, z_j) = z_i^T M z_j (Eq. 2) on a fixed neighbour graph.

    Parameters
    ----------
    Z : (n, p) training rows (in SL-NE's input space, see :func:`preprocess`).
    y : (n,) labels; equal labels make a neighbour a target, others an impostor.
    graph : (n, k) int, local kNN indices into Z's rows (-1 = none).
    margin : b of Eq. 6. step : rho0 of Algorithm 1. epochs : passes over the data.
    batch : samples whose updates are computed with the same M (1 = Algorithm 1 exactly).
    sampling : 'violating' (Eq. 7) or 'uniform' (a random target and a random impostor).
    normalize : after each batch rescale M to this Frobenius norm (None: no normalisation).
    seed : permutation seed (anything ``np.random.default_rng`` takes).
    symmetric : project M to (M + M^T) / 2 after each batch.
    offset : optional fixed score added to every edge of :func:`neighbourhoods` (the other members'
        similarity during SL-DE's joint refinement). M0 : initial M (default identity).
    validate : optional callable M -> validation error (e.g. :func:`softvote_validator`), called at
        the start and after every epoch; M is then the one with the lowest error (early stopping,
        the start included, so training never leaves M worse on validation than it began).

    Returns
    -------
    M : (p, p) float32; history : list of {"epoch", "violations", "hinge"} dicts, one per epoch
    (with ``validate``: "val_error" in each, and a first entry {"epoch": 0, "val_error"}).
    """
    X, nb = _solver_inputs(Z, y, graph, sampling, offset)
    M = np.eye(X.shape[1], dtype=np.float64) if M0 is None else np.array(M0, dtype=np.float64)
    rng = np.random.default_rng(seed)
    history = []
    best = None
    if validate is not None:
        best = (float(validate(M)), M.copy())
        history.append({"epoch": 0, "val_error": best[0]})
    t = 0
    for epoch in range(epochs):
        M, t, n_viol, loss = _epoch(M, X, nb, t, rng, batch, step, margin, sampling, offset, symmetric, normalize)
        history.append({"epoch": epoch + 1, "violations": int(n_viol), "hinge": float(loss / max(len(X), 1))})
        if validate is not None:
            err = float(validate(M))
            history[-1]["val_error"] = err
            if err < best[0]:
                best = (err, M.copy())
    if best is not None:
        M = best[1]
    return M.astype(np.float32), history


def softvote_validator(Zv: np.ndarray, yv: np.ndarray, nbr: np.ndarray, Z: np.ndarray, y: np.ndarray, k: int = 10):
    """M -> top-1 error of Eq. 9's soft vote for validation rows Zv (labels yv): the k members of
    their neighbourhoods ``nbr`` (V, >= k) among the training rows Z (labels y; local indices, -1
    none) most similar under s_M(z_v, z_j) = z_v^T M z_j vote with those similarities, as the evaluate
    stage's softvoteK does over the stored graph. The early-stopping criterion of SL-NE and SL-DE.
    (Cutting ``nbr`` to its first k would leave M only the weights of the same k Euclidean voters:
    on digits every epoch and step then scored the start's error.)"""
    _, codes = np.unique(np.r_[np.asarray(y), np.asarray(yv)], return_inverse=True)
    ytr, yval = codes[: len(y)], codes[len(y) :]
    nbr = np.asarray(nbr, np.int64)
    flat = np.arange(len(Z))
    Zv32 = np.ascontiguousarray(Zv, np.float32)
    n_classes = int(codes.max()) + 1
    return lambda M: float(
        softvote_errors(Zv32 @ np.asarray(M, np.float32), yval, nbr, Z, flat, ytr, [k], n_classes)[f"softvote{k}"][
            0
        ].mean()
    )


def edge_scores(X: np.ndarray, M: np.ndarray, nb: Neighbourhoods) -> np.ndarray:
    """s_M(x_i, x_j) for every edge (i, j) of the neighbourhood graph, in CSR order."""
    rows = np.repeat(np.arange(len(nb.indptr) - 1), np.diff(nb.indptr))
    out = np.empty(len(rows), np.float32)
    for a in range(0, len(rows), 1 << 18):
        r, c = rows[a : a + (1 << 18)], nb.indices[a : a + (1 << 18)]
        out[a : a + len(r)] = np.einsum("ed,ed->e", X[r] @ M, X[c])
    return out


def hinge_objective(X: np.ndarray, y: np.ndarray, graph: np.ndarray, M: np.ndarray, margin: float) -> float:
    """Eq. 6 summed over every (i, target j, impostor l) triplet of the neighbourhoods (tests, small n)."""
    nb = neighbourhoods(graph, np.asarray(y))
    total = 0.0
    for i in range(len(X)):
        nbrs = nb.indices[nb.indptr[i] : nb.indptr[i + 1]]
        tgt = nb.target[nb.indptr[i] : nb.indptr[i + 1]]
        s = X[i] @ M @ X[nbrs].T
        total += np.maximum(margin - s[tgt][:, None] + s[~tgt][None, :], 0).sum()
    return float(total)


def knn_graph(X: np.ndarray, n_neighbors: int) -> np.ndarray:
    """The exact kNN graph of the rows of X (n, D) among themselves, self excluded, as the neighbours
    stage computes it on the train rows: (n, k) int64 local indices, k = min(n_neighbors, n - 1)
    (one column of -1 when n = 1)."""
    n = len(X)
    k = min(int(n_neighbors), n - 1)
    if k < 1:
        return np.full((n, 1), -1, np.int64)
    ids = np.arange(n)
    return knn.block_topk(X, X, k, q_ids=ids, x_ids=ids, exclude_self=True)[1]


def training_graph(anchors: np.ndarray, neighbours: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The training rows of a stored graph and the graph in their local indices.

    Parameters
    ----------
    anchors : (a,) sorted global rows that have a neighbour list (the train split, or the sampled
        ``query_rows`` of ``neighbours.queries``).
    neighbours : (a, k) int, their lists as global rows (-1 = none).

    Returns
    -------
    rows : (n,) sorted global rows that take part: the anchors and every row they list. A row listed
        but not an anchor has no list of its own (-1) and takes part through Eq. 4's reverse edges.
    graph : (n, k) int64 local indices into ``rows`` (-1 = none).
    """
    anchors = np.asarray(anchors, np.int64)
    neighbours = np.asarray(neighbours, np.int64)
    rows = np.union1d(anchors, neighbours[neighbours >= 0])
    graph = np.full((len(rows), neighbours.shape[1]), -1, np.int64)
    local = np.searchsorted(rows, np.maximum(neighbours, 0))
    graph[np.searchsorted(rows, anchors)] = np.where(neighbours >= 0, local, -1)
    return rows, graph


def _uniform_pairs(tgt, seg, rng):
    jp = np.full(len(seg) - 1, -1, np.int64)
    lp = np.full(len(seg) - 1, -1, np.int64)
    for s in range(len(seg) - 1):
        pos = np.arange(seg[s], seg[s + 1])
        tp, ip = pos[tgt[pos]], pos[~tgt[pos]]
        if len(tp) and len(ip):
            jp[s], lp[s] = rng.choice(tp), rng.choice(ip)
    return jp, lp
