"""Exact k-nearest-neighbour search over blocks, merged into a running top-k.

Squared Euclidean distances come from one GEMM per tile (||q||^2 + ||x||^2 - 2 q.x); each tile's
entries are pushed into the running top-k lists by one compiled pass (an entry above a list's k-th
distance costs one comparison). Lists are ordered by (distance, index), so results do not depend on
how the database was split into blocks.
"""

from functools import lru_cache

import numpy as np

from metricpipe.tasks import madds

# Distance tiles are (query_tile x db_tile) float32: 512 x 2048 x 4 B = 4 MiB, read by the push pass
# right after its GEMM writes it, which is still large enough to run near peak (measured on the
# Intel VM, 6,000 x 30,000 x 784, k = 50: the kernel at 0.89 x the GEMM rate at 512 x 2048, 0.76 x at
# 512 x 4096, 0.88 x at 512 x 1024).
QUERY_TILE = 512
DB_TILE = 2048
# pooled_topk's float64 tiles: database rows per tile, and the pool's room beyond 2k
POOL_TILE = 4096


def empty_topk(n_queries: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """A top-k list with no candidates yet: distances +inf, indices -1."""
    return np.full((n_queries, k), np.inf, np.float32), np.full((n_queries, k), -1, np.int64)


def sort_topk(dist: np.ndarray, idx: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Keep the k best of each row, ordered by (distance, index)."""
    # Missing candidates (-1) sort last among equal (inf) distances.
    tie = np.where(idx < 0, np.iinfo(np.int64).max, idx)
    order = np.lexsort((tie, dist), axis=-1)[:, :k]
    return np.take_along_axis(dist, order, 1), np.take_along_axis(idx, order, 1)


def merge_topk(a: tuple, b: tuple, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge two top-k lists of the same queries (associative and commutative)."""
    return sort_topk(np.concatenate([a[0], b[0]], 1), np.concatenate([a[1], b[1]], 1), k)


def sq_norms(X: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", X, X)


def block_topk(
    Q: np.ndarray,
    X: np.ndarray,
    k: int,
    db_offset: int = 0,
    q_ids: np.ndarray | None = None,
    x_ids: np.ndarray | None = None,
    exclude_self: bool = False,
    metric: str = "l2",
    init: tuple | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """k nearest rows of ``X`` (m, D) for every row of ``Q`` (n, D), by squared Euclidean distance
    (``metric="l2"``) or by largest inner product (``metric="ip"``, distances are then -q.x).

    Parameters
    ----------
    Q, X : float32 arrays (n, D) and (m, D).
    k : neighbours to keep; fewer candidates than k leave (inf, -1) at the end.
    db_offset : added to row numbers of X when ``x_ids`` is not given.
    q_ids, x_ids : global ids of the rows; with ``exclude_self`` a query never lists its own id.
    init : a top-k list of the same queries over other rows (from an earlier call) to merge into;
        passing it lets the first tiles skip entries that cannot enter the list.

    Returns
    -------
    dist : (n, k) float32 squared distances, ascending; idx : (n, k) int64 global ids.
    """
    Q = np.ascontiguousarray(Q, dtype=np.float32)
    X = np.ascontiguousarray(X, dtype=np.float32)
    if x_ids is None:
        x_ids = np.arange(db_offset, db_offset + len(X), dtype=np.int64)
    x_ids = np.asarray(x_ids, dtype=np.int64)
    best = empty_topk(len(Q), k)
    D = X.shape[1]
    if metric == "l2":  # ||x||^2 rides in the GEMM as an extra column (a query's is 1): one pass less per tile
        X = np.concatenate([X, sq_norms(X)[:, None]], axis=1)
    # One distance tile reused for every tile: a fresh temporary per tile is page-faulted in again
    # each time under Dask's MALLOC_TRIM_THRESHOLD_ (the nanny's default).
    d_buf = np.empty(min(QUERY_TILE, len(Q)) * min(DB_TILE, len(X)), np.float32)
    push = _compiled_push()
    for q0 in range(0, len(Q), QUERY_TILE):
        q = Q[q0 : q0 + QUERY_TILE]
        q_m2 = np.empty((len(q), X.shape[1]), np.float32)
        q_m2[:, :D] = q * np.float32(-2.0 if metric == "l2" else -1.0)  # fold the -2 of -2 q.x into the GEMM
        q_m2[:, D:] = 1.0
        # a query's own id is skipped with exclude_self; -2 matches no row
        qid = (
            np.asarray(q_ids[q0 : q0 + QUERY_TILE], dtype=np.int64)
            if exclude_self and q_ids is not None
            else np.full(len(q), -2, np.int64)
        )
        qn = sq_norms(q)[:, None] if metric == "l2" else 0.0
        if init is None:
            run_d, run_i = empty_topk(len(q), k)
        else:  # back to the kernel's ranking space: ||x||^2 - 2 q.x = distance - ||q||^2
            run_d = np.ascontiguousarray(init[0][q0 : q0 + QUERY_TILE] - qn, np.float32)
            run_i = np.array(init[1][q0 : q0 + QUERY_TILE], np.int64)
        rows = np.arange(len(q))
        for x0 in range(0, len(X), DB_TILE):
            # ||x||^2 - 2 q.x ranks each row exactly as the distance does (||q||^2 is constant per
            # row), so ||q||^2 and the clamp at 0 are applied to the k selected entries only.
            Xt = X[x0 : x0 + DB_TILE].T
            d = np.matmul(q_m2, Xt, out=d_buf[: len(q) * Xt.shape[1]].reshape(len(q), Xt.shape[1]))
            push(run_d, run_i, rows, d, x_ids[x0 : x0 + DB_TILE], qid)
        if metric == "l2":
            run_d = np.maximum(run_d + qn, 0.0)
        best[0][q0 : q0 + len(q)], best[1][q0 : q0 + len(q)] = run_d, run_i
    return best


def distance_topk(
    d: np.ndarray, ids: np.ndarray, k: int, kth: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The top-k list of a precomputed (n, m) distance block whose columns are the rows ``ids``;
    ``kth``: each row's k-th smallest distance when already known (e.g. from a sorted copy)."""
    part = _select(d, min(k, d.shape[1]), kth)
    cand_d = np.take_along_axis(d, part, 1).astype(np.float32)
    cand = (cand_d, np.where(np.isinf(cand_d), -1, np.asarray(ids, np.int64)[part]))
    return merge_topk(empty_topk(len(d), k), cand, k)


def _select(d: np.ndarray, k: int, kth: np.ndarray | None = None) -> np.ndarray:
    """Column positions of the k smallest entries of each row, ties resolved towards lower columns.

    np.partition finds each row's k-th value (it is SIMD-accelerated, unlike argpartition); the
    entries at or below it are then taken in column order. Rows where ties make that more than k
    entries fall back to a stable sort, so the (distance, index) order stays exact.
    """
    m = d.shape[1]
    if k >= m:
        return np.broadcast_to(np.arange(m), d.shape)
    if kth is None:
        kth = np.partition(d, k - 1, axis=1)[:, k - 1]
    mask = d <= kth[:, None]
    exact = mask.sum(axis=1) == k
    if exact.all():  # flat indices: 1-D flatnonzero is several times faster than 2-D nonzero
        return (np.flatnonzero(mask) % m).reshape(len(d), k)
    part = np.empty((len(d), k), np.intp)
    part[exact] = (np.flatnonzero(mask[exact]) % m).reshape(-1, k)
    tied = np.flatnonzero(~exact)
    part[tied] = np.argsort(d[tied], axis=1, kind="stable")[:, :k]
    return part


def brute_force_knn(Q: np.ndarray, X: np.ndarray, k: int, exclude_self: bool = False):
    """Reference: full float64 distance matrix, ordered by (distance, index). For tests only."""
    Q = np.asarray(Q, np.float64)
    X = np.asarray(X, np.float64)
    d = ((Q[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    if exclude_self:
        np.fill_diagonal(d, np.inf)
    idx = np.broadcast_to(np.arange(len(X)), d.shape)
    order = np.lexsort((idx, d), axis=-1)[:, :k]
    return np.take_along_axis(d, order, 1), order


def pooled_topk(
    Q: np.ndarray, blocks, k: int, q_ids: np.ndarray | None = None, exclude_self: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """k nearest rows (squared Euclidean) of a stream of database ``blocks`` for every row of ``Q``,
    for large k (thousands; MAP@R needs k = the largest class).

    ``block_topk`` inserts each entry below a list's k-th into its sorted list (up to k moves); here each
    query keeps a pool of 2k + POOL_TILE candidates and only entries at or below its current k-th
    distance enter it; the pool is cut back to its k best (a selection, np.partition) when it would
    overflow, as faiss's reservoir does, and sorted once at the end. A query sees about
    k (1 + ln(N / k)) entries enter in all, so the pool is cut a few times per query.

    Parameters
    ----------
    Q : (n, D) queries.
    blocks : iterable of (ids, X): global ids (m,), sorted, and their rows (m, D).
    k : neighbours to keep; fewer candidates than k leave (inf, -1) at the end.
    q_ids : (n,) global ids of the queries; with ``exclude_self`` a query never lists its own id.

    Returns
    -------
    dist : (n, k) float64 squared distances ascending, computed as ||q||^2 + ||x||^2 - 2 q.x in float64
        and clipped at 0; idx : (n, k) int64 global ids. Ties are ordered by id, as faiss's IndexFlatL2
        orders them. float32 would do for the GEMM's speed but, on near-tied neighbours, reorders them
        against faiss (measured: MAP@R off by 2.6e-6 on 1-D data), so the tiles are float64.
    """
    Q = np.ascontiguousarray(Q, dtype=np.float64)
    n = len(Q)
    cap = 2 * k + POOL_TILE
    pool_d = np.full((n, cap), np.inf, np.float64)
    pool_i = np.full((n, cap), -1, np.int64)
    fill = np.zeros(n, np.int64)
    thr = np.full(n, np.inf, np.float64)
    q_sq = sq_norms(Q)

    def cut(rows):  # keep the k best (distance, id) of these rows' pools (each holds more than k)
        pd, pi = pool_d[rows], pool_i[rows]
        kth = np.partition(pd, k - 1, axis=1)[:, k - 1]  # a selection, not a sort: O(pool) per row
        keep = pd < kth[:, None]
        tie = pd == kth[:, None]
        need = k - np.count_nonzero(keep, axis=1)  # ties to keep: those of lowest id
        id_cut = np.full(len(rows), np.iinfo(np.int64).max)
        for j in np.flatnonzero(np.count_nonzero(tie, axis=1) > need):  # rare: exact ties at the k-th
            id_cut[j] = np.sort(pi[j][tie[j]])[need[j] - 1]
        keep |= tie & (pi <= id_cut[:, None])
        flat = np.flatnonzero(keep)  # exactly k per row, in pool order
        r, c = np.divmod(flat, cap)
        pool_d[rows, :k] = pd[r, c].reshape(len(rows), k)
        pool_i[rows, :k] = pi[r, c].reshape(len(rows), k)
        pool_d[rows, k:], pool_i[rows, k:] = np.inf, -1
        fill[rows], thr[rows] = k, kth

    qid = None if q_ids is None else np.asarray(q_ids, np.int64)
    for ids, X in blocks:
        X = np.asarray(X)
        ids = np.asarray(ids, np.int64)
        for x0 in range(0, len(X), POOL_TILE):
            tid = ids[x0 : x0 + POOL_TILE]
            d = _sq_dist64(Q, q_sq, X[x0 : x0 + POOL_TILE])
            mask = d <= thr[:, None]  # ties with the k-th are kept: the cut orders them by id
            if exclude_self and qid is not None:
                _unmask_self(mask, tid, qid)
            cnt = np.count_nonzero(mask, axis=1)
            over = np.flatnonzero(fill + cnt > cap)
            if len(over):
                cut(over)
            flat = np.flatnonzero(mask)
            r, c = np.divmod(flat, d.shape[1])
            slot = fill[r] + np.arange(len(flat)) - (np.cumsum(cnt) - cnt)[r]
            pool_d[r, slot], pool_i[r, slot] = d[r, c], tid[c]
            fill += cnt
    full = np.flatnonzero(fill > k)
    if len(full):
        cut(full)
    d, i = sort_topk(pool_d[:, :k], pool_i[:, :k], k)
    return np.ascontiguousarray(d), np.ascontiguousarray(i)


def _sq_dist64(Q: np.ndarray, q_sq: np.ndarray, X: np.ndarray) -> np.ndarray:
    """Squared distances of float64 queries to rows X as ||q||^2 + ||x||^2 - 2 q.x, clipped at 0: one
    formula for every pass over the reference, so a distance is the same number in each."""
    Xt = np.asarray(X, np.float64)
    d = Q @ Xt.T
    d *= -2.0
    d += q_sq[:, None] + sq_norms(Xt)[None, :]
    return np.maximum(d, 0.0, out=d)


def _unmask_self(mask: np.ndarray, tid: np.ndarray, qid: np.ndarray) -> None:
    pos = np.minimum(np.searchsorted(tid, qid), len(tid) - 1)
    hit = np.flatnonzero(tid[pos] == qid)
    mask[hit, pos[hit]] = False


def nearest_of_class(
    Q: np.ndarray,
    blocks,
    q_labels: np.ndarray,
    ref_labels: np.ndarray,
    q_ids: np.ndarray | None = None,
    exclude_self: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """(distance, id) of each query's nearest reference sharing its label, ties by id; (inf, -1) when
    none. ``blocks`` as for ``pooled_topk``; ``ref_labels`` indexed by global id."""
    Q = np.ascontiguousarray(Q, dtype=np.float64)
    q_sq, q_labels = sq_norms(Q), np.asarray(q_labels)
    best_d, best_i = np.full(len(Q), np.inf), np.full(len(Q), -1, np.int64)
    qid = None if q_ids is None else np.asarray(q_ids, np.int64)
    for ids, X in blocks:
        ids = np.asarray(ids, np.int64)
        d = _sq_dist64(Q, q_sq, X)
        ok = np.asarray(ref_labels)[ids][None, :] == q_labels[:, None]
        if exclude_self and qid is not None:
            _unmask_self(ok, ids, qid)
        d[~ok] = np.inf
        j = np.argmin(d, axis=1)  # the first of equal minima: the lowest id in this block
        dj = d[np.arange(len(Q)), j]
        better = dj < best_d  # an equal distance in a later block has a higher id
        best_d[better], best_i[better] = dj[better], ids[j[better]]
    return best_d, best_i


def rank_before(
    Q: np.ndarray,
    blocks,
    dist: np.ndarray,
    ids_at: np.ndarray,
    q_ids: np.ndarray | None = None,
    exclude_self: bool = False,
) -> np.ndarray:
    """How many references come before (``dist``, ``ids_at``) in each query's (distance, id) order,
    the query itself not counted: the place of that reference is this + 1."""
    Q = np.ascontiguousarray(Q, dtype=np.float64)
    q_sq = sq_norms(Q)
    count = np.zeros(len(Q), np.int64)
    qid = None if q_ids is None else np.asarray(q_ids, np.int64)
    for ids, X in blocks:
        ids = np.asarray(ids, np.int64)
        d = _sq_dist64(Q, q_sq, X)
        before = (d < dist[:, None]) | ((d == dist[:, None]) & (ids[None, :] < ids_at[:, None]))
        if exclude_self and qid is not None:
            _unmask_self(before, ids, qid)
        count += np.count_nonzero(before, axis=1)
    return count


# --- IVF over a streamed database (a sampled graph's few queries held, the rows read once) ----------
#
# An IVF index scans, for each query, the rows of its nprobe nearest lists. When the queries are few
# enough to hold (a sampled graph), the database need not be indexed: each row-block is read once,
# its rows are assigned to their nearest list (one GEMM against the centroids), and each list's rows
# are compared exactly with the queries that probe that list (one small GEMM per list). The result
# is what an IVF-Flat index with these centroids returns, computed in GEMMs instead of one scan per
# query, and no index is held in memory (pipeline/ivf.py, streamed).

ASSIGN_TILE = 8192  # rows assigned to lists at a time: an 8192 x nlist float32 score tile
# A list's comparison in tiles of at most LIST_QUERY_TILE queries x LIST_ROW_TILE rows (8 MB): a
# crowded list (a large cluster, duplicate rows) never makes a larger matrix. Fixed sizes, so the
# same pairs meet the same GEMM shapes on any cluster.
LIST_QUERY_TILE = 512
LIST_ROW_TILE = 4096


def _ranked(X: np.ndarray, metric: str, query: bool) -> np.ndarray:
    """Rows extended by one column so that a GEMM of query rows by database rows gives the ranking
    score: [-2 q, 1] . [x, ||x||^2] = ||x||^2 - 2 q.x (l2), [-q, 0] . [x, 0] = -q.x (ip)."""
    X = np.asarray(X, np.float32)
    out = np.empty((len(X), X.shape[1] + 1), np.float32)  # one copy: filled in place
    out[:, :-1] = X
    if query:
        out[:, :-1] *= np.float32(-2.0 if metric == "l2" else -1.0)
        out[:, -1] = 1.0 if metric == "l2" else 0.0
    else:
        out[:, -1] = sq_norms(X) if metric == "l2" else 0.0
    return out


def nearest_lists(X: np.ndarray, centroids: np.ndarray, n: int = 1, metric: str = "l2") -> np.ndarray:
    """(m, n) int32: the ``n`` nearest centroids of each row of ``X`` by squared Euclidean distance
    (``metric`` "ip": largest inner product), nearest first, ties towards the lower list (n = 1: a
    row's list; n = nprobe: a query's lists)."""
    Cm2 = _ranked(centroids, metric, False).T
    X = np.ascontiguousarray(X, np.float32)
    out = np.empty((len(X), n), np.int32)
    for s in range(0, len(X), ASSIGN_TILE):
        scores = _ranked(X[s : s + ASSIGN_TILE], metric, True) @ Cm2
        out[s : s + len(scores)] = (
            np.argmin(scores, 1)[:, None] if n == 1 else distance_topk(scores, np.arange(len(centroids)), n)[1]
        )
    return out


def queries_of_lists(probes: np.ndarray, nlist: int) -> tuple[np.ndarray, np.ndarray]:
    """The queries that probe each list, as (queries, start): list l's are queries[start[l]:start[l+1]],
    ascending. ``probes`` (n_queries, nprobe) are the lists of each query."""
    flat = probes.ravel()
    order = np.argsort(flat, kind="stable")
    start = np.searchsorted(flat[order], np.arange(nlist + 1)).astype(np.int64)
    return (order // probes.shape[1]).astype(np.int64), start


def ivf_block_topk(
    Q: np.ndarray,
    q_ids: np.ndarray,
    lists: tuple,
    X: np.ndarray,
    x_ids: np.ndarray,
    centroids: np.ndarray,
    k: int,
    init: tuple | None = None,
    metric: str = "l2",
) -> tuple[np.ndarray, np.ndarray]:
    """The running top-k of every query over the rows of one database block that fall in the lists
    it probes (IVF-Flat search, the block's part of it); a query never lists its own id.

    Q : (n, D) float32 queries; q_ids (n,) their global ids.
    lists : :func:`queries_of_lists` of the queries' probed lists.
    X : (m, D) the block's database rows; x_ids (m,) their global ids.
    init : the running lists of the queries over earlier blocks, updated in place (None: empty).

    metric : "l2" (squared Euclidean) or "ip" (largest inner product; lists by inner product too).

    Returns (dist, idx) (n, k) in ranking space: ||x||^2 - 2 q.x, which orders a query's rows as
    the squared distance does (:func:`ivf_distances` adds ||q||^2), or -q.x for "ip". Ties by id;
    blocks searched apart and merged (:func:`merge_topk`) in any order give the lists of their
    union. (A pair's score is a GEMM's, whose last bits may depend on the shapes it meets: for a given
    layout of the database the same bits on any cluster, near-ties aside across layouts.)
    """
    run = empty_topk(len(Q), k) if init is None else init
    if not len(X):
        return run
    X = np.ascontiguousarray(X, np.float32)
    nlist = len(centroids)
    own = nearest_lists(X, centroids, 1, metric)[:, 0]
    order = np.argsort(own, kind="stable")
    x_start = np.searchsorted(own[order], np.arange(nlist + 1))
    Xa = _ranked(X[order], metric, False)  # the rows grouped by list
    ids = np.asarray(x_ids, np.int64)[order]
    Qm2 = _ranked(Q, metric, True)
    queries, q_start = lists
    q_ids = np.asarray(q_ids, np.int64)
    for lst in np.flatnonzero((np.diff(x_start) > 0) & (np.diff(q_start) > 0)):
        for q0 in range(q_start[lst], q_start[lst + 1], LIST_QUERY_TILE):
            qs = queries[q0 : min(q0 + LIST_QUERY_TILE, q_start[lst + 1])]
            Qt = Qm2[qs]
            for a in range(x_start[lst], x_start[lst + 1], LIST_ROW_TILE):
                b = min(a + LIST_ROW_TILE, x_start[lst + 1])
                _push_topk(run[0], run[1], qs, Qt @ Xa[a:b].T, ids[a:b], q_ids)
    return run


def ivf_distances(run: tuple, Q: np.ndarray, metric: str = "l2") -> tuple[np.ndarray, np.ndarray]:
    """Squared distances (clamped at 0) from :func:`ivf_block_topk`'s ranking space; for "ip" the
    ranking space is the distance (-q.x), as ``block_topk``'s "ip" lists."""
    if metric != "l2":
        return run[0].astype(np.float32), run[1]
    dist = np.maximum(run[0] + sq_norms(np.asarray(Q, np.float32))[:, None], 0.0)
    dist[run[1] < 0] = np.inf
    return dist.astype(np.float32), run[1]


def _push_topk(run_d, run_i, qs, d, ids, q_ids):
    return _compiled_push()(run_d, run_i, qs, np.ascontiguousarray(d, np.float32), ids, q_ids)


@lru_cache(maxsize=1)
def _compiled_push():
    """The compiled :func:`_push_topk_loop`, made on first use (importing numba costs ~0.3 s, which
    every command that imports this module but never searches would pay)."""
    from numba import njit

    return njit(cache=True, nogil=True, boundscheck=False)(_push_topk_loop)


def _push_topk_loop(run_d, run_i, qs, d, ids, q_ids):  # pragma: no cover - compiled
    """Insert candidates d[a, c] (row ids[c]) into query qs[a]'s sorted list (distance, id); an empty
    slot is (inf, -1) and sorts after every candidate; a query's own id is skipped."""
    k = run_d.shape[1]
    for a in range(qs.shape[0]):
        q = qs[a]
        me = q_ids[q]
        for c in range(d.shape[1]):
            v = d[a, c]
            i = ids[c]
            if i == me:
                continue
            wd = run_d[q, k - 1]
            wi = run_i[q, k - 1]
            if v > wd or (v == wd and wi >= 0 and i > wi):
                continue
            j = k - 1
            while j > 0:
                pd = run_d[q, j - 1]
                pi = run_i[q, j - 1]
                if pd < v or (pd == v and pi >= 0 and pi < i):
                    break
                run_d[q, j] = pd
                run_i[q, j] = pi
                j -= 1
            run_d[q, j] = v
            run_i[q, j] = i


def search_cost(n_queries: int, n_database: int, dim: int) -> float:
    """Multiply-adds of an exact k-NN search of ``n_queries`` rows among ``n_database`` of ``dim``
    dimensions (:func:`block_topk`): the float32 distance GEMM and the passes that add the norms and
    select each query's k (:mod:`metricpipe.tasks.madds`'s unit)."""
    return madds.gemm(n_queries, n_database, dim, float32=True) + madds.passes(n_queries * n_database, 3)
