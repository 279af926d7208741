"""Stage 3, neighbours: every sample's k nearest train samples, exact or through an IVF index."""

import time

import distributed
import numpy as np

from metricpipe import ivf
from metricpipe.budget import INDEX_BLOCKS, index_budget, limit_name, row_block, task_budget, usable
from metricpipe.config import NeighboursConfig
from metricpipe.context import StageContext
from metricpipe.stages.common import TRAIN, DataInfo, commit_timed, load_features, write_template
from metricpipe.store import Unit, create_array, hash_key, open_array, read_rows, row_chunk
from metricpipe.tasks import knn, stream
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.rows import take_rows

# ---- 3. neighbours -------------------------------------------------------------------------------------

# Query rows per kNN task. Fixed (never derived from the worker count) so results are identical on
# any cluster; small enough that tasks balance across workers, large enough that reading each
# database block (~64 MB, ~0.12 s) stays a small fraction of the GEMM work it feeds (~2 s at 784-d).
KNN_QUERY_ROWS = 4096


def _knn_piece(url: str, q_rows: np.ndarray, blocks: list, k: int):
    """Top-k among all train rows for the global train rows ``q_rows``, streaming the database one
    row-block at a time (the task holds the query piece and one database block). When the queries
    lie in one database block, that block goes first and gives them, so it is read once."""
    home = [blk for blk in blocks if blk[0] <= q_rows[0] and q_rows[-1] < blk[1]]
    order = home + [blk for blk in blocks if blk not in home]
    Q = None if home else read_rows(f"{url}/features", q_rows)
    best = knn.empty_topk(len(q_rows), k)
    for a, b in order:
        local = np.flatnonzero(open_array(f"{url}/split")[a:b] == TRAIN)
        X = load_features(url, a, b)
        if Q is None:
            Q = take_rows(X, q_rows - a)
        if len(local) < b - a:
            X = take_rows(X, local)
        # blocks in any order give the same lists: they are merged by (distance, index)
        best = knn.block_topk(Q, X, k, q_ids=q_rows, x_ids=local + a, exclude_self=True, init=best)
    return best


def _write_graph(url: str, data_url: str, q: tuple, k: int, piece_rows: list, *pieces) -> int:
    """Write rows q[0]:q[1] of the graph from the top-k lists of the query pieces overlapping them."""
    labels = open_array(f"{data_url}/label")[:]
    all_rows = np.concatenate(piece_rows)
    inside = (all_rows >= q[0]) & (all_rows < q[1])
    rows = all_rows[inside] - q[0]  # every row of the chunk, or the sampled query rows in it
    dist = np.concatenate([p[0] for p in pieces])[inside]
    idx = np.concatenate([p[1] for p in pieces])[inside]
    nbr = np.full((q[1] - q[0], k), -1, np.int32)
    d2 = np.full((q[1] - q[0], k), np.inf, np.float32)
    same = np.zeros((q[1] - q[0], k), bool)
    nbr[rows], d2[rows] = idx, dist
    same[rows] = (labels[np.maximum(idx, 0)] == labels[rows + q[0]][:, None]) & (idx >= 0)
    for name, value in (("neighbours", nbr), ("distances", d2), ("same_label", same)):
        open_array(f"{url}/{name}", mode="r+")[q[0] : q[1]] = value
    return len(rows)


def check_neighbours_k(cfg, n_train: int) -> None:
    """Each row's neighbours are k *other* train rows: k must be below the train split's rows (refused
    before the memory rule, which would price a graph of that k)."""
    k = (cfg.neighbours or NeighboursConfig()).k  # (a graph SL-NE or softvote needs: the defaults)
    if k >= n_train:
        raise InputError(
            f"{cfg.source_file}: neighbours.k={k} but the train split has {n_train} samples; use k < {n_train}"
        )


def run_neighbours(ctx: StageContext, data: DataInfo) -> Unit:
    """Exact kNN graph: every sample's k nearest *train* samples (itself excluded), as neighbours
    (sample, neighbour) int32 global indices, squared distances float32 and same_label. Train rows
    form the graph SL-NE learns from (same_label marks targets, the rest impostors); the other rows
    are the neighbourhoods the soft-vote classifier (Eq. 9) votes over.

    With ``neighbours.queries: Q`` only a seeded, class-stratified sample of Q train rows is searched
    (still against every train row); the other rows keep -1 and the sample is stored as
    ``query_rows``. That is what makes the graph affordable at millions of rows."""
    k = ctx.config.neighbours.k
    n_train = int((data.split == TRAIN).sum())
    check_neighbours_k(ctx.config, n_train)
    nb = ctx.config.neighbours
    by_index = nb.method == "ivf" or (nb.method == "auto" and n_train > ivf.EXACT_MAX_TRAIN)
    streamed = by_index and _streamed(ctx, data)  # a sampled graph searched with no index
    unit = ctx.store.unit("neighbours", hash_key(_inputs(ctx, data, by_index, streamed)))
    if ctx.reuse(unit, "neighbours"):
        ctx.log(f"  neighbours: reusing {unit.rel}")
        return unit
    t0 = time.perf_counter()
    unit.begin()
    _write_template(unit, data, k)
    blocks = [(a, b) for a, b in data.chunks if (data.split[a:b] == TRAIN).any()]  # database blocks
    # Query pieces are cut over all train rows (so tasks are equal whatever the chunk layout); each
    # chunk's write task takes the pieces that overlap it.
    query_rows = _query_rows(ctx, data, unit)
    # equal pieces of at most KNN_QUERY_ROWS: a short last piece would leave a worker idle at the end
    cuts = [c for c in np.array_split(query_rows, -(-len(query_rows) // KNN_QUERY_ROWS)) if len(c)]
    extra = {}
    if streamed:
        pieces, extra = _streamed_pieces(ctx, data, blocks, cuts, k)
    elif by_index:
        pieces, extra = _ivf_pieces(ctx, data, unit, blocks, cuts, k)
    else:
        pieces = [
            ctx.submit(
                _knn_piece,
                data.url,
                piece,
                blocks,
                k,
                name="knn-piece",
                madds=knn.search_cost(len(piece), n_train, data.n_features),
            )
            for piece in cuts
        ]
    writes, where = _write_tasks(ctx, unit, data, cuts, pieces, k)
    ctx.gather(pieces, "neighbours", [f"query rows {p[0]}..{p[-1]}" for p in cuts])
    ctx.gather(writes, "neighbours", where)
    commit_timed(
        ctx,
        unit,
        t0,
        {
            "k": k,
            "n_train": n_train,
            "method": "ivf" if by_index else "exact",
            "queries": int(len(query_rows)),
            **extra,
        },
    )
    if by_index:
        _log_recall(ctx, k, extra, streamed)
    return unit


def _inputs(ctx: StageContext, data: DataInfo, by_index: bool, streamed: bool) -> dict:
    """What the graph's unit is keyed on: the data, k, the query sample and the IVF settings."""
    nb = ctx.config.neighbours
    inputs = {"stage": "neighbours", "data": data.unit.key, "k": nb.k, "queries": nb.queries or "all"}
    if nb.queries is not None:
        inputs["queries_seed"] = ctx.config.seed
    if streamed:
        inputs["ivf"] = {"nlist": nb.nlist, "nprobe": nb.nprobe, "seed": ctx.config.seed, "streamed": True}
    elif by_index:
        inputs["ivf"] = {
            "nlist": nb.nlist,
            "nprobe": nb.nprobe,
            "seed": ctx.config.seed,
            "rerank": nb.rerank,
            "index": _factory(ctx, data),
        }  # its bytes per row follow the workers' memory
    return inputs


def _write_template(unit: Unit, data: DataInfo, k: int) -> None:
    """The graph's arrays, filled with -1, inf and False until a query row's neighbours are written."""
    N = data.n_samples
    write_template(
        unit.url,
        {
            "neighbours": (("sample", "neighbour"), (N, k), np.int32, -1),
            "distances": (("sample", "neighbour"), (N, k), np.float32, np.inf),
            "same_label": (("sample", "neighbour"), (N, k), bool, False),
        },
        {},
        {"k": k, "data": data.unit.key},
        data.chunk_rows,
    )


def _query_rows(ctx: StageContext, data: DataInfo, unit: Unit) -> np.ndarray:
    """The rows searched: every row, or (neighbours.queries) a stratified sample of train rows, stored."""
    nb = ctx.config.neighbours
    if nb.queries is None:
        return np.arange(data.n_samples)
    train = data.rows(TRAIN)  # a stratified sample of them, in the seeded order of their content
    keys = open_array(f"{data.url}/row_key")[:][train]
    query_rows = train[stream.sample(data.labels[train], nb.queries, keys, ctx.config.seed, stream.QUERIES)]
    create_array(f"{unit.url}/query_rows", query_rows.shape, (max(1, len(query_rows)),), np.int64)[:] = query_rows
    return query_rows


def _write_tasks(ctx: StageContext, unit: Unit, data: DataInfo, cuts: list, pieces: list, k: int) -> tuple:
    """(one write task per chunk that holds query rows, the rows each writes), from the pieces overlapping it."""
    writes, where = [], []
    for q in data.chunks:
        mine = [(piece, f) for piece, f in zip(cuts, pieces) if piece[0] < q[1] and piece[-1] >= q[0]]
        if not mine:
            continue  # no query row here: the chunk keeps the template's fill (-1, inf, False)
        writes.append(
            ctx.submit(
                _write_graph, unit.url, data.url, q, k, [p for p, _ in mine], *[f for _, f in mine], name="knn-write"
            )
        )
        where.append(f"rows {q[0]}..{q[1] - 1}")
    return writes, where


def _log_recall(ctx: StageContext, k: int, extra: dict, streamed: bool) -> None:
    """Log an IVF graph's recall against exact search."""
    nb = ctx.config.neighbours
    if streamed:
        ctx.log(
            f"  neighbours: IVF ({extra['index']} over the streamed rows, nprobe {nb.nprobe}) "
            f"recall@{k} {extra['recall']:.3f} against exact search on {extra['recall_queries']} train queries"
        )
    else:
        ctx.log(
            f"  neighbours: IVF ({extra['index']}, nprobe {nb.nprobe}, rerank {extra['rerank']}) "
            f"recall@{k} {extra['recall']:.3f} "
            f"against exact search on {extra['recall_queries']} train queries"
        )


def _factory(ctx: StageContext, data: DataInfo) -> str:
    """The index of the train rows within the worker's share of memory (pipeline/budget.py)."""
    n_train = int((data.split == TRAIN).sum())
    return ivf.factory_string(
        n_train,
        data.n_features,
        ctx.config.neighbours.nlist or _nlist(ctx, n_train),
        index_budget(ctx.client, data.chunk_rows, data.n_features),
        ctx.config.source_file,
        ctx.config.setting("memory_limit"),
    )


def _nlist(ctx: StageContext, n_train: int) -> int:
    """The default lists: fewer for a sampled graph (its queries and the recall check's)."""
    return ivf.nlist_searched(n_train, ctx.config.neighbours.queries)


def _streamed(ctx: StageContext, data: DataInfo) -> bool:
    """A sampled graph whose queries every task can hold is searched over the streamed rows."""
    n_train = int((data.split == TRAIN).sum())
    nb = ctx.config.neighbours
    return ivf.streamed(
        nb.queries,
        data.n_features,
        nb.k,
        nb.nlist or _nlist(ctx, n_train),
        data.chunk_rows * data.n_features * 4.0,
        task_budget(ctx.client),
        nb.nprobe,
    )


def _samples(ctx: StageContext, train: np.ndarray, nlist: int) -> tuple[np.ndarray, np.ndarray]:
    """The seeded k-means sample and the recall check's train queries."""
    rng = np.random.default_rng([ctx.config.seed, 37])
    sample = np.sort(rng.choice(train, ivf.sample_rows(len(train), nlist), replace=False))
    return sample, np.sort(rng.choice(train, min(len(train), ivf.RECALL_QUERIES), replace=False))


def _streamed_pieces(ctx: StageContext, data: DataInfo, blocks: list, cuts: list, k: int):
    """IVF-Flat search of the sampled queries over the streamed row-blocks (pipeline/ivf.py): the
    centroids trained on a sample, one scan task per block (its lists, and the recall check's exact
    side in the same read), merged in a tree. Returns the query pieces' futures and facts for the unit."""
    nb = ctx.config.neighbours
    train = data.rows(TRAIN)
    nlist = nb.nlist or _nlist(ctx, len(train))
    sample, probe = _samples(ctx, train, nlist)
    feat = f"{data.url}/features"
    pieces, exact, approx = ivf.search_streamed(
        ctx, feat, feat, f"{data.url}/split", blocks, cuts, probe, sample, nlist, nb.nprobe, k
    )
    e, a = ctx.gather([exact, approx], "neighbours", ["recall: exact", "recall: ivf"])
    return pieces, {
        "index": f"IVF{nlist},Flat",
        "streamed": True,
        "nprobe": nb.nprobe,
        "recall": ivf.recall(e, a, k),
        "recall_queries": int(len(probe)),
    }


def _ivf_pieces(ctx: StageContext, data: DataInfo, unit: Unit, blocks: list, cuts: list, k: int):
    """Train, fill and search the IVF index; returns the query pieces' futures and facts for the unit."""
    nb, seed = ctx.config.neighbours, ctx.config.seed
    train = data.rows(TRAIN)
    nlist = nb.nlist or _nlist(ctx, len(train))
    factory = _factory(ctx, data)
    sample, probe = _samples(ctx, train, nlist)
    # the exact side of the recall check needs no index: submitted first, it runs beside the training
    # (in 2 pieces, so that neither worker is left with a 50 s task at 5M rows while the other idles)
    exact = [
        ctx.submit(_knn_piece, data.url, p, blocks, k, name="ivf-recall")
        for p in np.array_split(probe, min(2, len(probe)))
    ]
    token = f"{unit.url}@{time.time_ns()}"  # this build's index in the workers' caches
    code_size = ctx.gather(
        [ctx.submit(ivf.train, f"{data.url}/features", unit.url, sample, factory, seed, name="ivf-train")],
        "neighbours",
        ["training the IVF index"],
    )[0]
    create_array(
        f"{unit.url}/ivf_codes",
        (data.n_samples, code_size),
        (row_chunk(data.chunk_rows, data.n_samples), code_size),
        np.uint8,
    )
    ctx.gather(
        [
            ctx.submit(
                ivf.encode, f"{data.url}/features", f"{data.url}/split", unit.url, token, a, b, name="ivf-encode"
            )
            for a, b in blocks
        ],
        "neighbours",
        [f"encoding rows {a}..{b - 1}" for a, b in blocks],
    )
    rerank = nb.rerank if ",PQ" in factory else 1  # IVF-Flat distances are exact already
    pieces = _ivf_search(ctx, data, unit, token, blocks, cuts, k, rerank)
    approx = _ivf_search(ctx, data, unit, token, blocks, [probe], k, rerank)[0]
    *e, a = ctx.gather([*exact, approx], "neighbours", [*["recall: exact"] * len(exact), "recall: ivf"])
    e = tuple(np.concatenate([piece[i] for piece in e]) for i in range(2))
    distributed.wait(pieces)  # (a failed piece is reported by the graph writes that need it)
    ctx.client.run(ivf.release)  # the filled index (N x code bytes) leaves the workers' memory
    return pieces, {
        "index": factory,
        "nprobe": nb.nprobe,
        "rerank": rerank,
        "recall": ivf.recall(e, a, k),
        "recall_queries": int(len(probe)),
    }


def _ivf_search(
    ctx: StageContext, data: DataInfo, unit: Unit, token: str, blocks: list, cuts: list, k: int, rerank: int
):
    """Futures of (distances, ids) per query piece: the index's top k or, with rerank > 1, its top
    rerank x k re-scored exactly (one pass over the row-blocks per group of pieces whose candidates
    fit ivf.RERANK_PAIRS) and cut to k."""
    kc = k * rerank
    found = [
        ctx.submit(
            ivf.search,
            f"{data.url}/features",
            f"{data.url}/split",
            unit.url,
            token,
            tuple(blocks),
            piece,
            kc,
            ctx.config.neighbours.nprobe,
            name="ivf-search",
        )
        for piece in cuts
    ]
    if rerank <= 1:
        return found
    return ivf.rescored(ctx, f"{data.url}/features", f"{data.url}/features", blocks, cuts, found, k, kc)


def largest_tasks(info, cfg, limit: float) -> list:
    """An IVF index over the train rows (neighbours.method ivf, or auto past ivf.EXACT_MAX_TRAIN): its
    k-means sample, and the index with the row-blocks re-ranking reads, or, for a sampled graph whose
    queries fit, the streamed search's queries and lists; exact search holds row-blocks only."""
    nb = cfg.neighbours or NeighboursConfig()
    D, n_train = info.n_features, int((info.split == TRAIN).sum())
    if not n_train or not (nb.method == "ivf" or (nb.method == "auto" and n_train > ivf.EXACT_MAX_TRAIN)):
        return []
    block = row_block(info)
    nlist = nb.nlist or ivf.nlist_searched(n_train, nb.queries)
    rows = ivf.sample_rows(n_train, nlist)
    out = [
        (
            f"the IVF index's k-means sample ({rows:,} rows)",
            2 * rows * D * 4.0 + nlist * D * 4.0,
            "lower neighbours.nlist or raise memory_limit",
        )
    ]
    if ivf.streamed(nb.queries, D, nb.k, nlist, block, usable(limit), nb.nprobe):
        q = min(n_train, nb.queries) + ivf.RECALL_QUERIES
        out.append(
            (
                f"the neighbours stage's IVF search of {q:,} queries over the streamed rows",
                ivf.stream_bytes(q, D, nb.k, nlist, block, nb.nprobe),
                "lower neighbours.queries or raise memory_limit",
            )
        )
    else:
        factory = ivf.factory_string(
            n_train,
            D,
            nlist,
            usable(limit) - INDEX_BLOCKS * block,
            where=cfg.source_file,
            limit_setting=limit_name(cfg),
        )
        out.append(
            (
                f"the neighbours stage's IVF index ({factory}) and {INDEX_BLOCKS} row-blocks",
                ivf.index_bytes(n_train, D, factory) + INDEX_BLOCKS * block,
                "raise memory_limit",
            )
        )
    return out


def work(info, cfg, specs: list) -> float | None:
    """Multiply-adds of the exact graph: every row (or neighbours.queries train rows) searched among the
    train rows; None for an IVF graph (not estimated)."""
    nb = cfg.neighbours or NeighboursConfig()
    n_train = int((info.split == TRAIN).sum())
    if nb.method == "ivf" or (nb.method == "auto" and n_train > ivf.EXACT_MAX_TRAIN):
        return None
    queries = info.n_samples if nb.queries is None else min(nb.queries, n_train)
    return knn.search_cost(queries, n_train, info.n_features)
