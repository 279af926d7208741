"""Approximate neighbours for large N: a faiss IVF index, built on a sample and searched by the workers.

The index is IVF-Flat when the train rows' vectors fit in IVF_FLAT_BYTES and the worker's share
(pipeline/budget.py), else IVF-PQ with the most bytes per vector that fit (at most D/4 and 64
sub-quantizers), so one worker holds it whatever N; from HNSW_MIN_WORK lists x dimensions the
coarse quantizer is an HNSW graph. Steps: one task trains the coarse quantizer (and PQ) on a seeded
sample of train rows and stores it in the neighbours unit; one task per row-block encodes its train
rows (``sa_encode``: the list number and the code) into the unit's ``ivf_codes``; then query pieces
are searched by the workers, each filling the trained index from the stored codes once
(``add_sa_codes`` in block order; cached per worker and per build, keyed by ``token``). No process
ever holds a serialized copy of the full index. A PQ index's distances are approximate, so it
returns ``rerank`` x k candidates per query, which are re-scored exactly in one pass over the
row-blocks (per group of queries whose candidates fit RERANK_PAIRS) and cut to k. Recall@k against
exact search is measured on a seeded sample of train queries (its exact side runs beside the
training, which needs no index) and recorded with the graph.

A sampled graph (``neighbours.queries``) whose queries every task can hold builds no index: one
task trains the centroids, one finds each query's nprobe lists, and one scan task per row-block
assigns the block's train rows to their nearest list and compares each list's rows exactly with the
queries that probe it (``tasks.knn.ivf_block_topk``: one GEMM per list), its read also serving the
recall check's exact side; the blocks' lists are merged in a fixed tree. That is IVF-Flat's answer
with exact distances, at GEMM speed instead of one scan per query, and the rows are read once.

faiss (faiss-cpu) is the standard library for this; it runs single-threaded in a Dask worker.
"""

from functools import lru_cache

import numpy as np

from metricpipe.store import create_array, open_array, read_rows
from metricpipe.tasks import knn
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.rows import take_rows

IVF_FLAT_BYTES = 512e6
# Train queries of the recall check. Its exact side is a brute-force search (at 5M x 256, 1,000
# queries were 50 s of CPU, a sixth of the stage); 500 queries x k neighbours put the standard
# error of the mean recall near 0.1 / sqrt(500) = 0.005 for a per-query spread of 0.1.
RECALL_QUERIES = 500
RERANK_PAIRS = 4_000_000  # candidate pairs re-scored per pass over the row-blocks (32 MB of ids)
# From this many lists x dimensions the coarse quantizer is an HNSW graph over the centroids: finding
# a vector's list is then a graph walk instead of nlist x D flops. At 5M x 256 with 4,096 lists a
# 62,500-row block encoded in 1.41 s instead of 2.38 s, for recall@20 0.835 instead of 0.838
# (500k-row check); at 2,048 lists the flat quantizer's GEMM wins: 125k rows in 0.71 s against 2.63 s
# at D = 32, 1.20 s against 3.83 s at D = 128 (one thread).
HNSW_MIN_WORK = 4096 * 256

# kNN over the train rows is exact up to this many of them (a flat scan); above, an IVF index
EXACT_MAX_TRAIN = 200_000


def sample_rows(n_train: int, nlist: int) -> int:
    """Rows the index trains on: 39 per list (faiss's minimum for its k-means), at least 20,000."""
    return min(n_train, max(39 * nlist, 20_000))


def nlist_for(n_train: int, n_queries: int | None = None) -> int:
    """About 2 sqrt(n) lists (a power of two), with at least 39 training points per list: training
    (k-means on 39 points per list) grows as nlist^2, a query scans nprobe n / nlist vectors.

    With only ``n_queries`` searched (a sampled graph), at most 7 sqrt(Q): encoding the n rows costs
    n x nlist x D flops and searching nprobe n / nlist codes per query, so the two balance near
    sqrt(Q nprobe x (a code's scan / a GEMM flop)). Measured at 5M x 256 with 21,000 queries (the
    graph's 20,000 and the recall check's 1,000), IVF-PQ64, nprobe 16: encode 96 s and search 87 s
    of CPU at 1,024 lists (so ~7 sqrt(Q)), the stage 142 s against 190 s at 2 sqrt(n) = 4,096 lists,
    recall@20 0.975 against 0.974. Searched over the streamed rows instead (no index), assigning a
    row costs nlist x D flops and comparing it nprobe Q / nlist x D, balanced near sqrt(nprobe Q)
    (~570 lists here): a 62,500-row block of the 5M x 256 data against the 20,500 queries took
    0.73 / 0.53 / 0.55 / 0.71 s at 256 / 512 / 1,024 / 2,048 lists (one thread, min of 3), so the
    rule's 1,024 stands for both searches."""
    target = 2 * np.sqrt(n_train)
    if n_queries is not None:
        target = min(target, 7 * np.sqrt(n_queries))
    nlist = 1 << int(round(np.log2(max(target, 16))))
    return int(max(1, min(nlist, n_train // 39, 65536)))


def nlist_searched(n_train: int, queries: int | None) -> int:
    """:func:`nlist_for` an index searched by ``queries`` rows (None: every train row) and by the
    recall check's RECALL_QUERIES: the one rule the memory check, the neighbours stage and
    evaluate's kNN indexes share."""
    return nlist_for(n_train, None if queries is None else min(n_train, queries) + RECALL_QUERIES)


def factory_string(
    n_train: int,
    dim: int,
    nlist: int,
    budget: float | None = None,
    where: str = "",
    limit_setting: str = "memory_limit",
) -> str:
    """The index for ``n_train`` vectors of ``dim`` within ``budget`` bytes (the memory rule's share
    of a worker, pipeline/budget.py; None: IVF_FLAT_BYTES): IVF-Flat when the vectors fit, else
    IVF-PQ with the most bytes per vector that fit (at most D/4 and 64 sub-quantizers, dividing D).
    An index that cannot fit even at one byte per vector is refused naming ``limit_setting``."""
    coarse = f"IVF{nlist}_HNSW32" if nlist * dim >= HNSW_MIN_WORK else f"IVF{nlist}"
    flat_max = IVF_FLAT_BYTES if budget is None else min(IVF_FLAT_BYTES, budget)
    if index_bytes(n_train, dim, f"{coarse},Flat") <= flat_max:
        return f"{coarse},Flat"
    fits = [
        d
        for d in range(1, min(64, dim) + 1)
        if dim % d == 0
        and d <= max(1, dim // 4)
        and (budget is None or index_bytes(n_train, dim, f"{coarse},PQ{d}") <= budget)
    ]
    if not fits:
        raise InputError(
            f"{where}: an IVF index of {n_train:,} train rows needs "
            f"~{index_bytes(n_train, dim, f'{coarse},PQ1') / 1e6:,.0f} MB at one byte per row, over the "
            f"{max(0.0, budget) / 1e6:,.0f} MB a worker can give it; raise {limit_setting}"
        )
    return f"{coarse},PQ{max(fits)}"


def code_bytes(factory: str, dim: int) -> int:
    """Bytes of one vector's standalone code (``sa_encode``): its list number and its code."""
    return int(_faiss().index_factory(dim, factory).sa_code_size())


def index_bytes(n: int, dim: int, factory: str) -> float:
    """Bytes of a filled index: each vector's code and its 8-byte id, plus the centroids."""
    nlist = int(factory.split(",")[0][3:].split("_")[0])
    code = 4 * dim if factory.endswith(",Flat") else int(factory.rsplit("PQ", 1)[1])
    return float(n) * (code + 8) + nlist * dim * 4.0


def _faiss():
    try:
        import faiss
    except ImportError:  # pragma: no cover - faiss-cpu is a dependency
        raise InputError("neighbours.method ivf needs faiss-cpu; pip install faiss-cpu") from None
    return faiss


def train(feat_url: str, unit_url: str, rows: np.ndarray, factory: str, seed: int, metric: str = "l2") -> int:
    """Train the empty index on the sample ``rows`` of the 2-D array ``feat_url``, store it as the
    unit's ``ivf_trained``; returns the size in bytes of one vector's code. ``metric`` "ip" ranks by
    largest inner product (codes compared by their dot product)."""
    faiss = _faiss()
    X = np.ascontiguousarray(read_rows(feat_url, rows), dtype=np.float32)
    index = faiss.index_factory(X.shape[1], factory, faiss.METRIC_INNER_PRODUCT if metric == "ip" else faiss.METRIC_L2)
    ivf = faiss.downcast_index(faiss.extract_index_ivf(index))
    ivf.cp.seed = seed
    if isinstance(ivf, faiss.IndexIVFPQ):
        # the factory turns on polysemous training (Hamming filtering, which search never uses); it was
        # 95% of training time: 190 s of 200 s for IVF2048,PQ64 on 80k x 256
        ivf.do_polysemous_training = False
    index.train(X)
    _store_blob(f"{unit_url}/ivf_trained", faiss.serialize_index(index))
    return int(index.sa_code_size())


def _store_blob(url: str, blob: np.ndarray) -> None:
    create_array(url, blob.shape, (max(1, min(len(blob), 1 << 26)),), np.uint8)[:] = blob


@lru_cache(maxsize=2)
def _trained(unit_url: str, token: str):
    faiss = _faiss()
    index = faiss.deserialize_index(open_array(f"{unit_url}/ivf_trained")[:])
    ivf = faiss.downcast_index(faiss.extract_index_ivf(index))
    if isinstance(ivf, faiss.IndexIVFPQ):
        # IVF-PQ's precomputed residual tables are nlist x M x 256 floats (268 MB at IVF4096,PQ64), the
        # size of the codes of 4M vectors; without them a query computes its table per probed list,
        # which costs little at nprobe 16. Dropped so the index fits a small worker.
        ivf.use_precomputed_table = -1
        ivf.precompute_table()
    return index


def encode(feat_url: str, split_url: str, unit_url: str, token: str, a: int, b: int) -> int:
    """Encode the train rows (``split_url`` == 0) of block a:b of ``feat_url`` into rows a:b of the
    unit's ``ivf_codes`` (one chunk per block, so blocks never share a chunk); returns the rows encoded."""
    split = open_array(split_url)[a:b]
    local = np.flatnonzero(split == 0)
    X = np.ascontiguousarray(open_array(feat_url)[a:b][local], dtype=np.float32)
    codes = open_array(f"{unit_url}/ivf_codes")
    block = np.zeros((b - a, codes.shape[1]), np.uint8)
    block[local] = _trained(unit_url, token).sa_encode(X)
    open_array(f"{unit_url}/ivf_codes", mode="r+")[a:b] = block
    return len(local)


@lru_cache(maxsize=1)  # one filled index per worker at a time (the memory rule counts one)
def _load(unit_url: str, token: str, split_url: str, chunks: tuple):
    """The filled index: the trained one plus every block's codes, appended in block order. A worker
    builds it once from the stored codes (no serialized copy of the full index is ever made)."""
    faiss = _faiss()
    index = faiss.clone_index(_trained(unit_url, token))
    codes = open_array(f"{unit_url}/ivf_codes")
    for a, b in chunks:
        local = np.flatnonzero(open_array(split_url)[a:b] == 0)
        if len(local):
            index.add_sa_codes(np.ascontiguousarray(codes[a:b][local]), (local + a).astype(np.int64))
    return index


def release() -> None:
    """Drop the indexes this process caches (run on every worker when the stage ends)."""
    _load.cache_clear()
    _trained.cache_clear()


def search(
    feat_url: str, split_url: str, unit_url: str, token: str, chunks: tuple, q_rows: np.ndarray, k: int, nprobe: int
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k train rows (itself excluded) of the global rows ``q_rows`` of ``feat_url``: (squared
    distances, or minus inner products for an "ip" index, ids)."""
    faiss = _faiss()
    index = _load(unit_url, token, split_url, tuple(chunks))
    ivf = faiss.extract_index_ivf(index)
    ivf.nprobe = nprobe
    quantizer = faiss.downcast_index(ivf.quantizer)
    if isinstance(quantizer, faiss.IndexHNSW):  # the graph walk keeps 4 x nprobe candidate lists to find nprobe
        quantizer.hnsw.efSearch = max(16, 4 * nprobe)
    Q = np.ascontiguousarray(read_rows(feat_url, q_rows), dtype=np.float32)
    dist, idx = index.search(Q, k + 1)
    if index.metric_type == faiss.METRIC_INNER_PRODUCT:
        dist = -dist  # smaller is nearer, as knn.block_topk's "ip" lists
    own = idx == np.asarray(q_rows)[:, None]
    keep = np.where(own.any(1)[:, None], ~own, np.arange(k + 1)[None, :] < k)  # drop self, else the last
    dist = dist[keep].reshape(len(Q), k).astype(np.float32)
    idx = idx[keep].reshape(len(Q), k).astype(np.int64)
    dist[idx < 0] = np.inf
    return dist, idx


def rescore(db_url: str, a: int, b: int, Q: np.ndarray, *pieces, metric: str = "l2") -> tuple[np.ndarray, np.ndarray]:
    """Exact distances (squared L2, or minus the inner product for ``metric`` "ip") of the
    candidates that fall in row-block a:b of the 2-D array ``db_url``.

    ``pieces`` are search results (distances, ids) whose rows, stacked, match the query vectors Q;
    returns (positions in the stacked, flattened ids, distances). The block is read once, whatever
    the number of queries."""
    ids = np.concatenate([p[1] for p in pieces])
    kc = ids.shape[1]
    flat = ids.reshape(-1)
    pos = np.flatnonzero((flat >= a) & (flat < b))
    if not len(pos):
        return pos, np.empty(0, np.float32)
    X = open_array(db_url)[a:b]
    d = np.empty(len(pos), np.float32)
    for s in range(0, len(pos), 65536):  # bounded temporaries: 65,536 pairs x D floats
        p = pos[s : s + 65536]
        q, x = Q[p // kc].astype(np.float32), X[flat[p] - a].astype(np.float32)
        if metric == "ip":
            d[s : s + 65536] = -np.einsum("ij,ij->i", q, x)
        else:
            diff = q - x
            d[s : s + 65536] = np.einsum("ij,ij->i", diff, diff)
    return pos, d


def rescored(
    ctx,
    q_url: str,
    db_url: str,
    blocks,
    cuts: list,
    found: list,
    k: int,
    kc: int,
    metric: str = "l2",
    name: str = "ivf",
    priority: int = 0,
) -> list:
    """Futures of each query piece's k best candidates by exact distance: ``found`` are the index's
    futures (distances, ids) of kc = rerank x k candidates for the global query rows ``cuts`` of
    ``q_url``, re-scored against the database ``db_url`` in one pass over its row-``blocks`` per group
    of pieces whose candidates fit RERANK_PAIRS."""
    groups, size = [[]], 0
    for piece, f in zip(cuts, found):
        if groups[-1] and (size + len(piece)) * kc > RERANK_PAIRS:
            groups.append([])
            size = 0
        groups[-1].append((piece, f))
        size += len(piece)
    out = []
    for group in groups:
        Q = ctx.submit(
            read_rows, q_url, np.concatenate([p for p, _ in group]), name=f"{name}-queries", priority=priority
        )
        scored = [
            ctx.submit(
                rescore,
                db_url,
                a,
                b,
                Q,
                *[f for _, f in group],
                metric=metric,
                name=f"{name}-rescore",
                priority=priority,
            )
            for a, b in blocks
        ]
        lo = 0
        for piece, f in group:
            out.append(ctx.submit(rerank, f, lo, k, *scored, name=f"{name}-rerank", priority=priority))
            lo += len(piece)
    return out


def rerank(piece: tuple, lo: int, k: int, *scored) -> tuple[np.ndarray, np.ndarray]:
    """The k best of one query piece's candidates by their exact distances (``rescore`` parts of the
    group the piece sits in at row offset ``lo``); ties keep the index's order."""
    ids = piece[1]
    n, kc = ids.shape
    d = np.full(n * kc, np.inf, np.float32)
    start = lo * kc
    for pos, dist in scored:
        sel = (pos >= start) & (pos < start + n * kc)
        d[pos[sel] - start] = dist[sel]
    d = d.reshape(n, kc)
    order = np.argsort(d, axis=1, kind="stable")[:, :k]
    dist, idx = np.take_along_axis(d, order, 1), np.take_along_axis(ids, order, 1)
    idx[~np.isfinite(dist)] = -1
    return dist, idx


# --- a sampled graph's search over the streamed rows (tasks/knn.py, ivf_block_topk) -------------------
# Its queries (and their lists) are held by every scan task: at most this many bytes of them, else
# the stage builds a faiss index as for an all-rows graph.
STREAM_QUERY_BYTES = 256e6


def stream_bytes(n_queries: int, dim: int, k: int, nlist: int, block: float, nprobe: int) -> float:
    """What one scan task holds at most: the queries twice (as read and with -2 q, 1 for the GEMM),
    their probed lists (16 B per query and probed list), eight top-k lists' worth (12 B per entry: a
    merge task holds two blocks' lists, their concatenation, its sort keys and order, and the merged
    list), the block three times (as read, its train rows, grouped by list), the list-assignment
    tile's scores and their copy, and one list tile's scores (knn.LIST_QUERY_TILE x knn.LIST_ROW_TILE)."""
    return (
        n_queries * (2 * (dim + 1) * 4.0 + nprobe * 16 + 8 * k * 12)
        + 3 * block
        + 2 * knn.ASSIGN_TILE * nlist * 4.0
        + 2 * knn.LIST_QUERY_TILE * knn.LIST_ROW_TILE * 4.0
    )


def streamed(
    n_queries: int | None, dim: int, k: int, nlist: int, block: float, budget: float | None, nprobe: int
) -> bool:
    """Whether ``n_queries`` sampled rows are searched over the streamed rows (no index): their
    vectors within STREAM_QUERY_BYTES and the scan task within ``budget``, a task's share of a worker
    (``budget.task_budget``; None: no limit known)."""
    if n_queries is None:
        return False
    need = stream_bytes(n_queries + RECALL_QUERIES, dim, k, nlist, block, nprobe)
    return n_queries * (dim + 1) * 4.0 <= STREAM_QUERY_BYTES and (budget is None or need <= budget)


def train_centroids(feat_url: str, rows: np.ndarray, nlist: int, seed: int, metric: str = "l2") -> np.ndarray:
    """(nlist, D) float32: the coarse quantizer's centroids, faiss's IVF k-means on the sample ``rows``."""
    faiss = _faiss()
    X = np.ascontiguousarray(read_rows(feat_url, rows), dtype=np.float32)
    index = faiss.index_factory(
        X.shape[1], f"IVF{nlist},Flat", faiss.METRIC_INNER_PRODUCT if metric == "ip" else faiss.METRIC_L2
    )
    ivf = faiss.downcast_index(faiss.extract_index_ivf(index))
    ivf.cp.seed = seed
    index.train(X)
    return faiss.downcast_index(ivf.quantizer).reconstruct_n(0, nlist)


def stream_plan(q_url: str, q_rows: np.ndarray, centroids: np.ndarray, nprobe: int, metric: str = "l2") -> tuple:
    """(queries, their ids, the queries of each list) for the scan tasks."""
    Q = np.ascontiguousarray(read_rows(q_url, q_rows), dtype=np.float32)
    probes = knn.nearest_lists(Q, centroids, min(nprobe, len(centroids)), metric)
    return Q, np.asarray(q_rows, np.int64), knn.queries_of_lists(probes, len(centroids))


def stream_block(
    db_url: str,
    split_url: str,
    a: int,
    b: int,
    plan: tuple,
    centroids: np.ndarray,
    n_exact: int,
    k: int,
    metric: str = "l2",
) -> tuple:
    """One row-block's part of the search: (the IVF lists of every query in ranking space, the exact
    lists of the last ``n_exact`` queries, the recall check's), from the block's train rows."""
    Q, q_ids, lists = plan
    local = np.flatnonzero(open_array(split_url)[a:b] == 0)
    X = open_array(db_url)[a:b]
    if len(local) < b - a:
        X = take_rows(X, local)
    x_ids = local + a
    run = knn.ivf_block_topk(Q, q_ids, lists, X, x_ids, centroids, k, metric=metric)
    exact = (
        knn.block_topk(
            Q[len(Q) - n_exact :], X, k, q_ids=q_ids[len(Q) - n_exact :], x_ids=x_ids, exclude_self=True, metric=metric
        )
        if n_exact
        else None
    )
    return run, exact


def merge_streamed(x: tuple, y: tuple, k: int) -> tuple:
    """Two blocks' (or block groups') parts merged: the same lists whatever the order."""
    return knn.merge_topk(x[0], y[0], k), (None if x[1] is None else knn.merge_topk(x[1], y[1], k))


def streamed_lists(part: tuple, plan: tuple, lo: int, hi: int, metric: str = "l2") -> tuple[np.ndarray, np.ndarray]:
    """Queries lo:hi's (distances, ids), from the merged parts (-1 and inf where empty)."""
    run = part[0]
    return knn.ivf_distances((run[0][lo:hi], run[1][lo:hi]), plan[0][lo:hi], metric)


def streamed_exact(part: tuple) -> tuple[np.ndarray, np.ndarray]:
    return part[1]


def search_streamed(
    ctx,
    q_url: str,
    db_url: str,
    split_url: str,
    blocks: list,
    cuts: list,
    probe: np.ndarray,
    sample: np.ndarray,
    nlist: int,
    nprobe: int,
    k: int,
    metric: str = "l2",
    name: str = "ivf",
    priority: int = 0,
) -> tuple[list, object, object]:
    """Submit the search of the query rows ``cuts`` (pieces of global rows of ``q_url``) among the
    train rows of the database ``db_url``'s row-``blocks``, over the streamed rows; ``probe`` are the
    recall check's queries, searched both ways in the same pass. Returns (each piece's future of
    (distances, ids), the probe's exact future, its IVF future)."""
    cents = ctx.submit(
        train_centroids, db_url, sample, nlist, ctx.config.seed, metric, name=f"{name}-train", priority=priority
    )
    plan = ctx.submit(
        stream_plan,
        q_url,
        np.concatenate([*cuts, probe]),
        cents,
        nprobe,
        metric,
        name=f"{name}-queries",
        priority=priority,
    )
    parts = [
        ctx.submit(
            stream_block,
            db_url,
            split_url,
            a,
            b,
            plan,
            cents,
            len(probe),
            k,
            metric,
            name=f"{name}-scan",
            priority=priority,
        )
        for a, b in blocks
    ]
    while len(parts) > 1:  # a fixed tree over the blocks' order: the same lists on any cluster
        parts = [
            ctx.submit(merge_streamed, parts[i], parts[i + 1], k, name=f"{name}-merge", priority=priority)
            if i + 1 < len(parts)
            else parts[i]
            for i in range(0, len(parts), 2)
        ]
    bounds = np.cumsum([0] + [len(c) for c in cuts] + [len(probe)])
    pieces = [
        ctx.submit(streamed_lists, parts[0], plan, lo, hi, metric, name=f"{name}-lists", priority=priority)
        for lo, hi in zip(bounds[:-1], bounds[1:])
    ]
    return pieces[:-1], ctx.submit(streamed_exact, parts[0], name=f"{name}-lists", priority=priority), pieces[-1]


def recall(exact: tuple, approx: tuple, k: int) -> float:
    """Mean share of each query's exact k neighbours that the approximate list also holds."""
    e, a = exact[1], approx[1]
    hits = [len(np.intersect1d(e[i][e[i] >= 0], a[i][a[i] >= 0])) / max(1, (e[i] >= 0).sum()) for i in range(len(e))]
    return float(np.mean(hits))
