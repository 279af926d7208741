"""SL-NE: large-margin similarity learning with neighbourhood embedding (Wang et al., Algorithm 1).

Bilinear similarity s_M(x, y) = x^T M y (Eq. 2). Every training sample's neighbourhood comes from a
fixed kNN graph, symmetrised as in Eq. 4 (j is i's neighbour if j in N_i or i in N_j); targets are
same-label neighbours, impostors the others. SGD over permutations of the training set picks, for
each sample, its most violating target/impostor pair (Eq. 7) and applies the hinge update of Eq. 6:
M <- M + rho x_i (x_j - x_l)^T with rho = rho0 / sqrt((t - 1) / |S| + 1).

SL-DE (Section 3) trains one SL-NE per subspace P_n (consecutive PCA blocks or seeded Gaussian
projections) independently, so each member is its own task; the ensemble similarity is the sum of
the members' (Eq. 8), optionally refined by coordinate descent over members.

Inputs are the training features in a centred PCA space with rows l2-normalised, as in the paper's
experiments ("project to the PCA space and normalize their lengths"): with non-negative raw
features (pixels, ReLU activations) the summed updates otherwise build a rank-one "hub" term that
ranks database items by popularity rather than by the query.
"""
from dataclasses import dataclass, field

import numpy as np

from metricpipe.tasks.errors import InputError


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
    r = np.concatenate([rows[ok], cols[ok]])
    c = np.concatenate([cols[ok], rows[ok]])
    code = np.unique(r * n + c)  # sorted by row then column, duplicates (mutual neighbours) removed
    r, c = code // n, code % n
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


def triplet_update(M: np.ndarray, X: np.ndarray, nb: Neighbourhoods, B: np.ndarray, rho: np.ndarray,
                   margin: float, sampling: str, rng, offset: np.ndarray | None = None):
    """One mini-batch of Algorithm 1 with M held fixed: for each sample i of B pick (j, l) by Eq. 7
    (or uniformly) and, where the hinge of Eq. 6 is positive, add rho_i x_i (x_j - x_l)^T.

    Returns (dM (D, D) float64, hinge (len(B),) with 0 where the triplet is satisfied or missing).
    """
    seg = np.concatenate([[0], np.cumsum(nb.indptr[B + 1] - nb.indptr[B])])
    edges = np.concatenate([np.arange(nb.indptr[i], nb.indptr[i + 1]) for i in B]).astype(np.int64) \
        if len(B) else np.zeros(0, np.int64)
    owner = np.repeat(np.arange(len(B)), np.diff(seg))
    V = X[B] @ M.astype(np.float32)                                   # x_i^T M for the batch
    S = np.einsum("ed,ed->e", V[owner], X[nb.indices[edges]])         # s_M(x_i, x_j), Eq. 2
    if offset is not None:
        S = S + offset[edges]
    tgt = nb.target[edges]
    jp, lp = most_violating(S, tgt, seg) if sampling == "violating" else _uniform_pairs(tgt, seg, rng)
    ok = (jp >= 0) & (lp >= 0)
    hinge = np.zeros(len(B))
    hinge[ok] = margin - S[jp[ok]] + S[lp[ok]]                         # Eq. 6
    viol = np.flatnonzero(hinge > 0)
    hinge[hinge < 0] = 0.0
    D = X.shape[1]
    if not len(viol):
        return np.zeros((D, D)), hinge
    xi = X[B[viol]] * rho[viol, None].astype(np.float32)
    diff = X[nb.indices[edges[jp[viol]]]] - X[nb.indices[edges[lp[viol]]]]
    return (xi.T @ diff).astype(np.float64), hinge                    # sum of rho x_i (x_j - x_l)^T


@dataclass
class SLNE:
    """Similarity learning with neighbourhood embedding.

    Parameters
    ----------
    margin : b of Eq. 6 (default 0.02). step : rho0 (default 0.2). epochs : passes over the data.
    batch : samples whose updates are computed with the same M (1 = Algorithm 1 exactly).
    sampling : 'violating' (Eq. 7) or 'uniform' (a random target and a random impostor).
    normalize : after each batch rescale M to this Frobenius norm (None: no normalisation).
    symmetric : project M to (M + M^T) / 2 after each batch. seed : permutation seed.
    """
    margin: float = 0.02
    step: float = 0.2
    epochs: int = 3
    batch: int = 64
    sampling: str = "violating"
    normalize: float | None = None
    symmetric: bool = True
    seed: int = 0
    history: list = field(default_factory=list)

    def fit(self, X: np.ndarray, y: np.ndarray, graph: np.ndarray, offset: np.ndarray | None = None,
            M0: np.ndarray | None = None) -> "SLNE":
        """Learn M.

        X : (n, D) training features; y : (n,) labels; graph : (n, k) local kNN indices (-1 = none).
        offset : optional fixed score added to every edge of :func:`neighbourhoods` (the other members'
            similarity during SL-DE's joint refinement). M0 : initial M (default identity).
        """
        X = np.ascontiguousarray(X, np.float32)
        n, D = X.shape
        if graph.shape[0] != n:
            raise InputError(f"SL-NE: the neighbour graph has {graph.shape[0]} rows for {n} samples")
        if self.sampling not in ("violating", "uniform"):
            raise InputError(f"The 'sampling' parameter of slne must be violating or uniform. Got {self.sampling!r}")
        nb = neighbourhoods(graph, np.asarray(y))
        if offset is not None and len(offset) != len(nb.indices):
            raise InputError(f"SL-NE: offset has {len(offset)} entries for {len(nb.indices)} edges")
        M = np.eye(D, dtype=np.float64) if M0 is None else np.array(M0, dtype=np.float64)
        rng = np.random.default_rng(self.seed)
        self.history = []
        t = 0
        for epoch in range(self.epochs):
            perm = rng.permutation(n)
            n_viol, loss = 0, 0.0
            for a in range(0, n, self.batch):
                B = perm[a:a + self.batch]
                rho = self.step / np.sqrt((t + np.arange(len(B))) / n + 1.0)  # Algorithm 1 line 7 (t-1 -> t)
                t += len(B)
                dM, hinge = triplet_update(M, X, nb, B, rho, self.margin, self.sampling, rng, offset)
                if hinge.any():
                    M += dM
                    if self.symmetric:
                        M = 0.5 * (M + M.T)
                    if self.normalize:
                        M *= self.normalize / np.linalg.norm(M)
                n_viol += int((hinge > 0).sum())
                loss += float(hinge.sum())
            self.history.append({"epoch": epoch + 1, "violations": int(n_viol), "hinge": float(loss / n)})
        self.M_ = M.astype(np.float32)
        return self

    def similarity(self, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        """s_M between rows of A (n, D) and B (m, D): (n, m), Eq. 2."""
        return (np.asarray(A, np.float32) @ self.M_) @ np.asarray(B, np.float32).T


def edge_scores(X: np.ndarray, M: np.ndarray, nb: Neighbourhoods) -> np.ndarray:
    """s_M(x_i, x_j) for every edge (i, j) of the neighbourhood graph, in CSR order."""
    rows = np.repeat(np.arange(len(nb.indptr) - 1), np.diff(nb.indptr))
    out = np.empty(len(rows), np.float32)
    for a in range(0, len(rows), 1 << 18):
        r, c = rows[a:a + (1 << 18)], nb.indices[a:a + (1 << 18)]
        out[a:a + len(r)] = np.einsum("ed,ed->e", X[r] @ M, X[c])
    return out


def hinge_objective(X: np.ndarray, y: np.ndarray, graph: np.ndarray, M: np.ndarray, margin: float) -> float:
    """Eq. 6 summed over every (i, target j, impostor l) triplet of the neighbourhoods (tests, small n)."""
    nb = neighbourhoods(graph, np.asarray(y))
    total = 0.0
    for i in range(len(X)):
        nbrs = nb.indices[nb.indptr[i]:nb.indptr[i + 1]]
        tgt = nb.target[nb.indptr[i]:nb.indptr[i + 1]]
        s = X[i] @ M @ X[nbrs].T
        total += np.maximum(margin - s[tgt][:, None] + s[~tgt][None, :], 0).sum()
    return float(total)


# ---- preprocessing, subspaces, factorisation, the ensemble ---------------------------------------

def preprocess(X: np.ndarray, mean: np.ndarray, P: np.ndarray) -> np.ndarray:
    """Centre, project on the PCA basis P (D, p) and l2-normalise rows: the SL-NE input space."""
    Z = (np.asarray(X, np.float32) - mean.astype(np.float32)) @ P.astype(np.float32)
    norms = np.linalg.norm(Z, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return Z / norms


def subspaces(p: int, members: int, dim: int, kind: str, seed: int) -> list[np.ndarray]:
    """The projections P_n (dim, p) of SL-DE in the p-dimensional preprocessed space.

    ``pca-blocks``: consecutive blocks of PCA coordinates (the input is already in PCA coordinates,
    so P_n selects coordinates n*dim .. (n+1)*dim-1). ``random``: Gaussian N(0, 1/dim), seeded per member.
    """
    if kind == "pca-blocks":
        if members * dim > p:
            raise InputError(f"slde: members x dim = {members} x {dim} = {members * dim} PCA directions, but only "
                             f"{p} exist; lower members or dim, or use subspace: random")
        return [np.eye(p, dtype=np.float32)[n * dim:(n + 1) * dim] for n in range(members)]
    if kind == "random":
        return [(np.random.default_rng([seed, 7, n]).standard_normal((dim, p)) / np.sqrt(dim)).astype(np.float32)
                for n in range(members)]
    raise InputError(f"The 'subspace' parameter of slde must be pca-blocks or random. Got {kind!r} instead.")


def factor(M: np.ndarray, rank: int | None = None) -> np.ndarray:
    """L (p, r) with L L^T the best PSD approximation of sym(M) (negative eigenvalues clipped),
    keeping the ``rank`` largest eigenvalues, so s(x, y) ~ <x L, y L>."""
    values, vectors = np.linalg.eigh(0.5 * (M + M.T).astype(np.float64))
    order = np.argsort(values)[::-1]
    values, vectors = values[order], vectors[:, order]
    keep = values > 0
    if rank is not None:
        keep &= np.arange(len(values)) < rank
    L = vectors[:, keep] * np.sqrt(values[keep])[None, :]
    if L.shape[1] == 0:
        L = np.zeros((len(M), 1))
    return L.astype(np.float32)


SLNE_KEYS = ("margin", "step", "epochs", "batch", "sampling", "normalize")


def slne_params(spec: dict) -> dict:
    """The SLNE constructor arguments found in a method spec."""
    return {k: spec[k] for k in SLNE_KEYS if spec.get(k) is not None}


def member_seed(seed: int, n: int) -> int:
    return int(np.random.SeedSequence([seed, n]).generate_state(1)[0])


def fit_member(Zn: np.ndarray, y: np.ndarray, graph: np.ndarray, params: dict, seed: int):
    """One SL-DE member: SL-NE on its projected data Zn = Z P_n^T. Returns (M_n (d, d), meta)."""
    import time
    t0 = time.perf_counter()
    model = SLNE(**{**params, "seed": seed}).fit(Zn, y, graph)
    seconds = time.perf_counter() - t0
    return model.M_, {"history": model.history, "seconds": seconds,
                      "samples_per_second": params.get("epochs", 3) * len(Zn) / max(seconds, 1e-9)}


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
        Ms[n] = SLNE(**{**params, "seed": member_seed(seed + 1, n)}).fit(Zn, y, graph, offset=others, M0=Ms[n]).M_
        scores[n] = edge_scores(Zn, Ms[n], nb)
    return Ms


def _uniform_pairs(tgt, seg, rng):
    jp = np.full(len(seg) - 1, -1, np.int64)
    lp = np.full(len(seg) - 1, -1, np.int64)
    for s in range(len(seg) - 1):
        pos = np.arange(seg[s], seg[s + 1])
        tp, ip = pos[tgt[pos]], pos[~tgt[pos]]
        if len(tp) and len(ip):
            jp[s], lp[s] = rng.choice(tp), rng.choice(ip)
    return jp, lp
