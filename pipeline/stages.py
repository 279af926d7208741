"""The stages: each opens its inputs lazily, checks them, writes its output template, maps `tasks`
kernels over row-blocks on the workers, and commits its unit. A stage wires; it does not compute.

Worker-side functions (prefixed ``_``) read exactly the row-block they are given, call a kernel and
write their own chunk-aligned region, so no task ever holds more than a row-block of features
(a kNN task holds a query block and a database block) and no two tasks write the same chunk.
"""
import importlib
import time
from dataclasses import dataclass
from functools import lru_cache

import dask.array as da
import distributed
import numpy as np
import xarray as xr

from metricpipe.config import SPLIT_NAMES, RunConfig
from metricpipe.context import StageContext
from metricpipe.sources import open_source
from metricpipe.sparse_train import training_subset
from metricpipe.storage import (Unit, array_names, chunk_rows_for, create_array, hash_key, load_arrays, open_array,
                              read_attrs, read_rows, row_chunks, row_codecs, save_arrays)
from metricpipe.tasks import knn, metrics, moments, ncmml
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.models import LinearModel
from metricpipe.tasks.normalize import normalize_rows
from metricpipe.tasks.registry import METHODS
from metricpipe.tasks.validate import check_feature_block, check_split, encode_labels

TRAIN, TEST = SPLIT_NAMES.index("train"), SPLIT_NAMES.index("test")


@dataclass(frozen=True)
class DataInfo:
    unit: Unit
    n_samples: int
    n_features: int
    chunk_rows: int
    classes: list
    labels: np.ndarray
    split: np.ndarray
    groups: np.ndarray | None

    @property
    def url(self):
        return self.unit.url

    @property
    def chunks(self):
        return row_chunks(self.n_samples, self.chunk_rows)

    def rows(self, code: int) -> np.ndarray:
        return np.flatnonzero(self.split == code)


def _timed(ctx: StageContext, unit: Unit, started: float, meta: dict) -> None:
    ctx.commit(unit, {**meta, "seconds": round(time.perf_counter() - started, 3)})


def _write_template(url: str, variables: dict, coords: dict, attrs: dict, chunk_rows: int,
                    samples: dict | None = None) -> None:
    """Write the metadata and coordinates of an xarray Dataset; data chunks are filled by tasks.
    ``samples`` (name -> a few rows as stored) lets a variable go uncompressed where LZ4 gains little."""
    data_vars, encoding = {}, {}
    for name, (dims, shape, dtype, fill) in variables.items():
        chunks = (min(chunk_rows, shape[0]),) + tuple(shape[1:])
        data_vars[name] = (dims, da.full(shape, fill, dtype=dtype, chunks=chunks))
        encoding[name] = {"chunks": chunks, "compressors": row_codecs((samples or {}).get(name))}
    ds = xr.Dataset(data_vars, coords={k: ("sample", v) for k, v in coords.items()}, attrs=attrs)
    ds.to_zarr(url, mode="w", compute=False, consolidated=False, encoding=encoding)


# ---- 1. stage ----------------------------------------------------------------------------------------

def _split_codes(cfg: RunConfig, src, codes: np.ndarray, classes: list) -> np.ndarray:
    n = len(codes)
    if src.split is not None:
        unknown = sorted(set(np.unique(src.split)) - set(SPLIT_NAMES))
        if unknown:
            raise InputError(f"{src.name}: split column holds {unknown[:3]} (data.split.column); "
                             f"allowed values are {', '.join(SPLIT_NAMES)}")
        lookup = {name: i for i, name in enumerate(SPLIT_NAMES)}
        return np.array([lookup[s] for s in src.split], np.int8) if n < 1000 else \
            np.select([src.split == s for s in SPLIT_NAMES], range(len(SPLIT_NAMES)), TRAIN).astype(np.int8)
    if cfg.data.split.column:
        raise InputError(f"{src.name}: this source has no split column {cfg.data.split.column!r} "
                         f"(data.split.column); use data.split.test instead")
    from sklearn.model_selection import train_test_split

    s = cfg.data.split
    split = np.full(n, TRAIN, np.int8)
    counts = np.bincount(codes)
    if counts.min() < 2:
        raise InputError(f"{src.name}: class {classes[int(np.argmin(counts))]!r} has {counts.min()} sample(s); a stratified "
                         f"split needs at least two per class (data.labels); drop or merge that class")
    held = s.test + s.val
    try:
        _, rest = train_test_split(np.arange(n), test_size=held, stratify=codes, random_state=s.seed)
        if s.val > 0:
            test, val = train_test_split(rest, test_size=s.val / held, stratify=codes[rest], random_state=s.seed)
            split[val] = SPLIT_NAMES.index("val")
        else:
            test = rest
    except ValueError as e:
        raise InputError(f"{src.name}: cannot split {n} samples of {len(counts)} classes with "
                         f"data.split.test={s.test}: {e}".splitlines()[0]) from None
    split[test] = TEST
    return split


def _stored_sample(reader, info, normalize: str, where: str, rows: int = 4096) -> np.ndarray:
    """The first rows as they will be stored, to decide the features' compression (checked like
    every block first, so bad input is the same one-line error here as in the stage's tasks)."""
    X = np.asarray(reader.read(0, min(rows, info.n_samples)))
    check_feature_block(X, 0, where)
    return normalize_rows(X.astype(np.float32), normalize)


def _stage_block(reader, start: int, stop: int, normalize: str, url: str, name: str) -> int:
    X = np.asarray(reader.read(start, stop))
    check_feature_block(X, start, name)
    out = open_array(f"{url}/features", mode="r+")
    out[start:stop] = normalize_rows(X, normalize)
    return stop - start


@dataclass(frozen=True)
class DataPlan:
    """Everything about the staged data that can be known and checked before any task runs."""
    source: object
    info: DataInfo
    coords: dict
    attrs: dict
    pairs: dict | None = None   # user pairs for NML / linear ML (pair_i, pair_j, pair_y)


def prepare_data(cfg: RunConfig, store) -> DataPlan:
    """Open the source lazily and check labels, splits, groups and ids on the client (cheap, 1-D)."""
    src = open_source(cfg.data)
    n, D = int(src.reader.shape[0]), int(np.prod(src.reader.shape[1:]))
    if n == 0 or D == 0:
        raise InputError(f"{src.name}: features are empty (shape {tuple(src.reader.shape)}); check data.features")
    codes, classes = encode_labels(src.labels, n, f"{src.name} (data.labels)")
    split = _split_codes(cfg, src, codes, classes)
    check_split(codes, split, SPLIT_NAMES, classes, src.name)
    coords = {"label": codes, "split": split}
    groups = None
    if src.groups is not None:
        groups = encode_labels(src.groups, n, f"{src.name} (data.groups)")[0] if len(np.unique(src.groups)) > 1 \
            else np.zeros(n, np.int32)
        coords["group"] = groups
    if src.ids is not None:
        ids = np.asarray(src.ids)
        if not np.issubdtype(ids.dtype, np.integer) or len(ids) != n:
            raise InputError(f"{src.name}: data.ids must be {n} integers; got dtype {ids.dtype}, length {len(ids)}")
        coords["id"] = ids
    d = cfg.data
    pairs_fp = None
    if d.pairs:
        coords_pairs = _read_pairs(d.pairs, split)
        from metricpipe.sources import fingerprint
        pairs_fp = fingerprint(d.pairs)
    chunk_rows = chunk_rows_for(D, d.chunk_mb)
    key = hash_key({"stage": "data", "source": src.fingerprint, "name": src.name, "features": d.features,
                    "labels": d.labels, "groups": d.groups, "normalize": d.normalize, "split": d.split.__dict__,
                    "chunk_rows": chunk_rows, **({"pairs": pairs_fp} if pairs_fp else {})})
    info = DataInfo(store.unit("data", key), n, D, chunk_rows, classes, codes, split, groups)
    attrs = {"source": src.name, "normalize": d.normalize, "classes": [str(c) for c in classes],
             "split_flag_meanings": " ".join(SPLIT_NAMES)}
    return DataPlan(src, info, coords, attrs, coords_pairs if d.pairs else None)


def _read_pairs(path: str, split: np.ndarray) -> dict:
    """User pairs (data.pairs: an npz with arrays i, j, y), checked against the staged rows."""
    from metricpipe.nml_train import check_pairs
    if not str(path).endswith(".npz"):
        raise InputError(f"{path}: data.pairs must be an .npz file with arrays i, j, y (np.savez(path, i=..., "
                         f"j=..., y=...))")
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in ("i", "j", "y") if k not in z.files]
            if missing:
                raise InputError(f"{path}: data.pairs needs arrays i, j, y; missing {missing} (it holds {sorted(z.files)})")
            i, j, y = z["i"], z["j"], z["y"]
    except InputError:
        raise
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot read data.pairs: {type(e).__name__}: {e}".splitlines()[0]) from None
    check_pairs(i, j, y, split, f"{path} (data.pairs)")
    return {"pair_i": i.astype(np.int64), "pair_j": j.astype(np.int64), "pair_y": y.astype(np.int8)}


def run_stage(ctx: StageContext, plan: DataPlan | None = None) -> DataInfo:
    """Read the source in row-blocks, validate, normalise, write features (sample, feature) + coords."""
    plan = plan or prepare_data(ctx.config, ctx.store)
    info, src, unit = plan.info, plan.source, plan.info.unit
    if ctx.reuse(unit, "stage"):
        ctx.log(f"  stage: reusing {unit.rel}")
        return info
    t0 = time.perf_counter()
    unit.begin()
    _write_template(unit.url, {"features": (("sample", "feature"), (info.n_samples, info.n_features), np.float32,
                                            np.nan)}, plan.coords, plan.attrs, info.chunk_rows,
                    samples={"features": _stored_sample(src.reader, info, ctx.config.data.normalize, src.name)})
    for name, values in (plan.pairs or {}).items():  # user pairs (NML), beside the rows
        create_array(f"{unit.url}/{name}", values.shape, (max(1, min(len(values), 1 << 20)),), values.dtype)[:] = values
    normalize = ctx.config.data.normalize
    futures = [ctx.submit(_stage_block, src.reader, a, b, normalize, unit.url, src.name, name="stage-block")
               for a, b in info.chunks]
    ctx.gather(futures, "stage", [f"rows {a}..{b - 1}" for a, b in info.chunks])
    _timed(ctx, unit, t0, {"n_samples": info.n_samples, "n_features": info.n_features, "source": src.name})
    return info


def load_features(url: str, start: int, stop: int, rows: np.ndarray | None = None) -> np.ndarray:
    """Rows ``start:stop`` of a staged array (optionally only the local positions ``rows``)."""
    X = open_array(f"{url}/features")[start:stop]
    return X if rows is None else X[rows]


# ---- 2. statistics -------------------------------------------------------------------------------------

def _moments_block(url: str, start: int, stop: int, n_classes: int, second: bool, array_url: str | None = None):
    """Moments of the train rows of block start:stop (of ``array_url``, default the staged features)."""
    split = open_array(f"{url}/split")[start:stop]
    y = open_array(f"{url}/label")[start:stop]
    train = np.flatnonzero(split == TRAIN)
    X = open_array(array_url or f"{url}/features")[start:stop][train]
    return moments.partial_moments(X, y[train], n_classes, second=second)


def _finalize_statistics(m, url: str, n_components) -> dict:
    stats = moments.finalize_statistics(m, n_components)
    save_arrays(url, stats)
    return {"n_train": int(m.n)}


def _tree_combine(ctx, futures, name):
    while len(futures) > 1:
        futures = [ctx.submit(moments.combine_moments, futures[i], futures[i + 1], name=name)
                   if i + 1 < len(futures) else futures[i] for i in range(0, len(futures), 2)]
    return futures[0]


def run_statistics(ctx: StageContext, data: DataInfo) -> Unit:
    """Mean, covariance (blockwise tree reduction), class counts/means, scatters, PCA basis."""
    cfg = ctx.config.statistics
    dense = data.n_features <= cfg.max_dense_dim
    key = hash_key({"stage": "statistics", "data": data.unit.key, "dense": dense,
                    "components": None if dense else cfg.components})
    unit = ctx.store.unit("statistics", key)
    if ctx.reuse(unit, "statistics"):
        ctx.log(f"  statistics: reusing {unit.rel}")
        return unit
    t0 = time.perf_counter()
    unit.begin()
    parts = [ctx.submit(_moments_block, data.url, a, b, len(data.classes), dense, name="moments-block")
             for a, b in data.chunks]
    ctx.gather(parts, "statistics", [f"rows {a}..{b - 1}" for a, b in data.chunks])
    total = _tree_combine(ctx, parts, "moments-combine")
    if dense:
        meta = ctx.gather([ctx.submit(_finalize_statistics, total, unit.url, None, name="statistics-finalize")],
                          "statistics")[0]
    else:
        meta = _randomized_statistics(ctx, data, total, unit, cfg.components)
    _timed(ctx, unit, t0, {**meta, "dense": dense})
    return unit


def _randomized_statistics(ctx, data, total, unit, n_components) -> dict:
    """PCA by dask's out-of-core randomized SVD when D is too large for a dense covariance."""
    m = ctx.gather([total], "statistics")[0]
    stats = moments.finalize_statistics(m)
    train = data.rows(TRAIN)
    X = da.from_zarr(open_array(f"{data.url}/features"))[train] - stats["mean"].astype(np.float32)
    k = min(n_components, data.n_features, len(train))
    u, s, v = da.linalg.svd_compressed(X.rechunk({1: -1}), k=k, n_power_iter=2, seed=ctx.config.seed)
    s, v = ctx.client.compute([s, v], sync=True)
    stats["pca_variances"] = (np.asarray(s, np.float64) ** 2) / (m.n - 1)
    stats["pca_components"] = moments.fix_signs(np.asarray(v, np.float64))
    save_arrays(unit.url, stats)
    return {"n_train": int(m.n)}


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
            Q = X[q_rows - a]
        if len(local) < b - a:
            X = X[local]
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
        open_array(f"{url}/{name}", mode="r+")[q[0]:q[1]] = value
    return len(rows)


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
    if k >= n_train:
        raise InputError(f"{ctx.config.source_file}: neighbours.k={k} but the train split has {n_train} samples; "
                         f"use k < {n_train}")
    nb = ctx.config.neighbours
    ivf = nb.method == "ivf" or (nb.method == "auto" and n_train > EXACT_MAX_TRAIN)
    inputs = {"stage": "neighbours", "data": data.unit.key, "k": k, "queries": nb.queries or "all"}
    if nb.queries is not None:
        inputs["queries_seed"] = ctx.config.seed
    if ivf:
        inputs["ivf"] = {"nlist": nb.nlist, "nprobe": nb.nprobe, "seed": ctx.config.seed, "rerank": nb.rerank}
    unit = ctx.store.unit("neighbours", hash_key(inputs))
    if ctx.reuse(unit, "neighbours"):
        ctx.log(f"  neighbours: reusing {unit.rel}")
        return unit
    t0 = time.perf_counter()
    unit.begin()
    N = data.n_samples
    _write_template(unit.url, {"neighbours": (("sample", "neighbour"), (N, k), np.int32, -1),
                               "distances": (("sample", "neighbour"), (N, k), np.float32, np.inf),
                               "same_label": (("sample", "neighbour"), (N, k), bool, False)},
                    {}, {"k": k, "data": data.unit.key}, data.chunk_rows)
    blocks = [(a, b) for a, b in data.chunks if (data.split[a:b] == TRAIN).any()]  # database blocks
    # Query pieces are cut over all train rows (so tasks are equal whatever the chunk layout); each
    # chunk's write task takes the pieces that overlap it.
    if nb.queries is None:
        query_rows = np.arange(N)
    else:
        query_rows = training_subset(data.split, data.labels, nb.queries, [ctx.config.seed, 41])
        create_array(f"{unit.url}/query_rows", query_rows.shape, (max(1, len(query_rows)),), np.int64)[:] = query_rows
    # equal pieces of at most KNN_QUERY_ROWS: a short last piece would leave a worker idle at the end
    cuts = [c for c in np.array_split(query_rows, -(-len(query_rows) // KNN_QUERY_ROWS)) if len(c)]
    extra = {}
    if ivf:
        pieces, extra = _ivf_pieces(ctx, data, unit, blocks, cuts, k)
    else:
        pieces = [ctx.submit(_knn_piece, data.url, piece, blocks, k, name="knn-piece") for piece in cuts]
    writes, where = [], []
    for q in data.chunks:
        mine = [(piece, f) for piece, f in zip(cuts, pieces) if piece[0] < q[1] and piece[-1] >= q[0]]
        if not mine:
            continue  # no query row here: the chunk keeps the template's fill (-1, inf, False)
        writes.append(ctx.submit(_write_graph, unit.url, data.url, q, k, [p for p, _ in mine],
                                 *[f for _, f in mine], name="knn-write"))
        where.append(f"rows {q[0]}..{q[1] - 1}")
    ctx.gather(pieces, "neighbours", [f"query rows {p[0]}..{p[-1]}" for p in cuts])
    ctx.gather(writes, "neighbours", where)
    _timed(ctx, unit, t0, {"k": k, "n_train": n_train, "method": "ivf" if ivf else "exact",
                      "queries": int(len(query_rows)), **extra})
    if ivf:
        ctx.log(f"  neighbours: IVF ({extra['index']}, nprobe {nb.nprobe}, rerank {extra['rerank']}) "
                f"recall@{k} {extra['recall']:.3f} "
                f"against exact search on {extra['recall_queries']} train queries")
    return unit


# Exact search stays the default up to this many train rows (neighbours.method auto); above it an IVF
# index (pipeline/ivf.py) is built.
EXACT_MAX_TRAIN = 200_000


def _ivf_pieces(ctx: StageContext, data: DataInfo, unit: Unit, blocks: list, cuts: list, k: int):
    """Train, fill and search the IVF index; returns the query pieces' futures and facts for the unit."""
    from metricpipe import ivf
    nb, seed = ctx.config.neighbours, ctx.config.seed
    train = data.rows(TRAIN)
    nlist = nb.nlist or ivf.nlist_for(len(train))
    factory = ivf.factory_string(len(train), data.n_features, nlist)
    rng = np.random.default_rng([seed, 37])
    sample = np.sort(rng.choice(train, min(len(train), max(39 * nlist, 20_000)), replace=False))
    probe = np.sort(rng.choice(train, min(len(train), ivf.RECALL_QUERIES), replace=False))
    # the exact side of the recall check needs no index: submitted first, it runs beside the training
    # (one task on one worker, which left the other idle for 52 s at 5M rows)
    exact = ctx.submit(_knn_piece, data.url, probe, blocks, k, name="ivf-recall")
    token = f"{unit.url}@{time.time_ns()}"   # this build's index in the workers' caches
    code_size = ctx.gather([ctx.submit(ivf.train, data.url, unit.url, sample, factory, seed, name="ivf-train")],
                           "neighbours", ["training the IVF index"])[0]
    create_array(f"{unit.url}/ivf_codes", (data.n_samples, code_size), (data.chunk_rows, code_size), np.uint8)
    ctx.gather([ctx.submit(ivf.encode, data.url, unit.url, token, a, b, name="ivf-encode") for a, b in blocks],
               "neighbours", [f"encoding rows {a}..{b - 1}" for a, b in blocks])
    rerank = nb.rerank if ",PQ" in factory else 1   # IVF-Flat distances are exact already
    pieces = _ivf_search(ctx, data, unit, token, blocks, cuts, k, rerank)
    approx = _ivf_search(ctx, data, unit, token, blocks, [probe], k, rerank)[0]
    e, a = ctx.gather([exact, approx], "neighbours", ["recall: exact", "recall: ivf"])
    distributed.wait(pieces)      # (a failed piece is reported by the graph writes that need it)
    ctx.client.run(ivf.release)  # the filled index (N x code bytes) leaves the workers' memory
    return pieces, {"index": factory, "nprobe": nb.nprobe, "rerank": rerank, "recall": ivf.recall(e, a, k),
                    "recall_queries": int(len(probe))}


def _ivf_search(ctx: StageContext, data: DataInfo, unit: Unit, token: str, blocks: list, cuts: list, k: int,
                rerank: int):
    """Futures of (distances, ids) per query piece: the index's top k or, with rerank > 1, its top
    rerank x k re-scored exactly (one pass over the row-blocks per group of pieces whose candidates
    fit ivf.RERANK_PAIRS) and cut to k."""
    from metricpipe import ivf
    kc = k * rerank
    found = [ctx.submit(ivf.search, data.url, unit.url, token, tuple(blocks), piece, kc, ctx.config.neighbours.nprobe,
                        name="ivf-search") for piece in cuts]
    if rerank <= 1:
        return found
    groups, size = [[]], 0
    for piece, f in zip(cuts, found):
        if groups[-1] and (size + len(piece)) * kc > ivf.RERANK_PAIRS:
            groups.append([])
            size = 0
        groups[-1].append((piece, f))
        size += len(piece)
    out = []
    for group in groups:
        Q = ctx.submit(read_rows, f"{data.url}/features", np.concatenate([p for p, _ in group]), name="ivf-queries")
        scored = [ctx.submit(ivf.rescore, data.url, a, b, Q, *[f for _, f in group], name="ivf-rescore")
                  for a, b in blocks]
        lo = 0
        for piece, f in group:
            out.append(ctx.submit(ivf.rerank, f, lo, k, *scored, name="ivf-rerank"))
            lo += len(piece)
    return out


# ---- 4. train ------------------------------------------------------------------------------------------

def model_id(spec: dict) -> str:
    """A short readable name: method, dim, then the parameters that differ from their defaults."""
    params = METHODS[spec["method"]].params
    extra = "-".join(f"{k}{v}" for k, v in sorted(spec.items())
                     if k not in ("method", "dim") and v is not None and (k not in params or v != params[k].default))
    return "-".join(str(x) for x in (spec["method"], spec.get("dim") or "", extra) if x != "")


def _train_model(spec: dict, stats_url: str, model_url: str) -> dict:
    method = METHODS[spec["method"]]
    stats, _ = load_arrays(stats_url)
    params = {k: v for k, v in spec.items() if k != "method"}
    t0 = time.perf_counter()
    model = method.fit(stats, **params)
    seconds = time.perf_counter() - t0
    n_out = model.n_components(len(stats["mean"]))
    save_arrays(model_url, model.arrays(), {"spec": spec, "dim": n_out, "fit_meta": model.meta,
                                            "identity": model.W is None})
    return {"dim": n_out, "fit_seconds": seconds, "score": model.score}


def run_train(ctx: StageContext, data: DataInfo, stats: Unit, neighbours: Unit | None) -> list[tuple[dict, Unit]]:
    """One task per (method, parameter set); returns [(spec, model unit)]."""
    stats_meta = stats.meta()
    todo, out = [], []
    for spec in ctx.config.methods:
        method = METHODS[spec["method"]]
        if method.needs_covariance and not stats_meta.get("dense", True) and spec["method"] in ("lda",):
            raise InputError(f"{ctx.config.source_file}: methods: lda needs a dense covariance but D="
                             f"{data.n_features} > statistics.max_dense_dim; raise max_dense_dim or drop lda")
        inputs = {"statistics": stats.key}
        if "neighbours" in method.inputs:
            inputs["neighbours"] = neighbours.key
        unit = ctx.store.unit("models", hash_key({"stage": "model", "spec": spec, **inputs}))
        out.append((spec, unit))
        if ctx.reuse(unit, "train"):
            continue
        unit.begin()
        if method.trainer == "statistics":
            fut = ctx.submit(_train_model, spec, stats.url, unit.url, name=f"train-{model_id(spec)}")
        elif method.trainer in ("sparse", "nml", "ncmml", "slem"):  # pipeline/<trainer>_train.py
            trainer = importlib.import_module(f"metricpipe.{method.trainer}_train")
            fut = trainer.submit(ctx, spec, data, stats, unit, model_id(spec))
        else:
            from metricpipe import slne_train
            fut = slne_train.submit(ctx, spec, data, stats, neighbours, unit, model_id(spec))
        todo.append((spec, unit, fut))
    if len(todo) < len(out):
        ctx.log(f"  train: reusing {len(out) - len(todo)} of {len(out)} models")
    t0 = time.perf_counter()
    results = ctx.gather([f for *_, f in todo], "train", [f"model {model_id(s)}" for s, *_ in todo])
    for (spec, unit, _), res in zip(todo, results):
        unit.commit({**res, "spec": spec, "seconds": round(res["fit_seconds"], 3),
                     "wall": round(time.perf_counter() - t0, 3)})
        if "samples_per_second" in res:
            ctx.log(f"  train: {model_id(spec)} {res['samples_per_second']:.0f} samples/s")
    return out


# ---- 5. encode -----------------------------------------------------------------------------------------

@lru_cache(maxsize=8)
def _load_model(model_url: str) -> LinearModel:
    arrays, attrs = load_arrays(model_url)
    if attrs.get("kind"):  # a non-linear encoder with LinearModel's interface
        from metricpipe.tasks import nml, slem
        kinds = {"chi2-embedding": nml.ChiEmbedding, "slem-linear": slem.LinearSLEM, "slem-kernel": slem.KernelSLEM,
                 "esvm": slem.ESVMEncoder}
        return kinds[attrs["kind"]].from_arrays(arrays, attrs)
    return LinearModel.from_arrays(arrays, attrs)


def _encode_block(data_url: str, model_url: str, code_url: str, start: int, stop: int) -> int:
    model = _load_model(model_url)
    X = load_features(data_url, start, stop)
    open_array(f"{code_url}/codes", mode="r+")[start:stop] = model.transform(X)
    if model.M is not None:  # bilinear: also the two views whose inner product is the exact score
        query, base = model.exact_views(X)
        open_array(f"{code_url}/query", mode="r+")[start:stop] = query
        open_array(f"{code_url}/base", mode="r+")[start:stop] = base
    return stop - start


def run_encode(ctx: StageContext, data: DataInfo, models: list) -> list[tuple[dict, Unit, int]]:
    """Apply every model to every row-block; returns [(spec, codes unit, code dim)]."""
    out, futures, labels, pending = [], [], [], []
    t0 = time.perf_counter()
    for spec, model in models:
        meta = model.meta()
        dim = int(meta["dim"])
        unit = ctx.store.unit("codes", hash_key({"stage": "codes", "model": model.key, "data": data.unit.key}))
        out.append((spec, unit, dim))
        if ctx.reuse(unit, "encode"):
            continue
        unit.begin()
        variables = {"codes": (("sample", "code"), (data.n_samples, dim), np.float32, np.nan)}
        if meta.get("bilinear_dim"):
            p = int(meta["bilinear_dim"])
            variables["query"] = (("sample", "input"), (data.n_samples, p), np.float32, np.nan)
            variables["base"] = (("sample", "input"), (data.n_samples, p), np.float32, np.nan)
        _write_template(unit.url, variables, {}, {"model": model.key, "spec": spec, "score": meta.get("score"),
                                                  "bilinear": bool(meta.get("bilinear_dim"))}, data.chunk_rows)
        pending.append((unit, {"score": meta.get("score") or "euclidean", "bilinear": bool(meta.get("bilinear_dim")),
                               "cost": meta.get("cost")}))
        for a, b in data.chunks:
            futures.append(ctx.submit(_encode_block, data.url, model.url, unit.url, a, b,
                                      name=f"encode-{model_id(spec)}"))
            labels.append(f"model {model_id(spec)} rows {a}..{b - 1}")
    if len(pending) < len(out):
        ctx.log(f"  encode: reusing {len(out) - len(pending)} of {len(out)} encodings")
    ctx.gather(futures, "encode", labels)
    for unit, meta in pending:
        _timed(ctx, unit, t0, meta)
    return out


# ---- 6. evaluate ---------------------------------------------------------------------------------------

def _scores(Q: np.ndarray, X: np.ndarray, score: str, x_sq: np.ndarray | None = None) -> np.ndarray:
    """Distances to rank by (ascending): squared Euclidean, minus the inner product, or minus kernel
    SLEM's similarity (Eq. 16, score "slem:..."); ``x_sq``: X's squared row norms, if known."""
    if score.startswith("slem:"):
        from metricpipe.tasks.slem import similarity
        return -similarity(Q, X, score).astype(np.float32)
    return metrics.sq_distances(Q, X, x_sq) if score == "euclidean" else -(np.asarray(Q, np.float32) @ X.T)


def _retrieval_block(q_url: str, db_url: str, score: str, q_idx: np.ndarray, db_idx: np.ndarray,
                     rel_key: np.ndarray, ks: tuple, ukb: bool, chunk_rows: int, group: int) -> dict:
    """Queries ``q_idx`` against database ``db_idx`` (global rows, sorted), ``group`` queries at a
    time; relevance = equal rel_key. The database is read once per task when it fits in
    RETRIEVAL_DB_BYTES (the test rows are spread over every row-block, so a read is a pass over the
    whole array), else streamed again for every group."""
    Q = read_rows(q_url, q_idx)
    n_db = len(db_idx)
    X = read_rows(db_url, db_idx) if n_db * open_array(db_url).shape[1] * 4 <= RETRIEVAL_DB_BYTES else None
    x_sq = np.einsum("ij,ij->i", X, X) if X is not None and score == "euclidean" else None
    db_key = rel_key[db_idx]
    dist = np.empty((min(group, len(q_idx)), n_db), np.float32)
    work = np.empty_like(dist)  # buffers reused by every group
    parts = []
    for s in range(0, len(q_idx), group):
        q = q_idx[s:s + group]
        d = dist[:len(q)]
        for a in range(0, n_db, chunk_rows):  # in row-blocks: the score tiles stay small
            if X is None:
                d[:, a:a + chunk_rows] = _scores(Q[s:s + group], read_rows(db_url, db_idx[a:a + chunk_rows]), score)
            else:
                d[:, a:a + chunk_rows] = _scores(Q[s:s + group], X[a:a + chunk_rows], score,
                                                 None if x_sq is None else x_sq[a:a + chunk_rows])
        pos = np.minimum(np.searchsorted(db_idx, q), n_db - 1)
        own = np.flatnonzero(db_idx[pos] == q)  # queries that are in the database: not their own hit
        d[own, pos[own]] = np.inf
        relevant = rel_key[q][:, None] == db_key[None, :]
        relevant[own, pos[own]] = False
        out = metrics.retrieval_scores(d, relevant, ks, work=work)
        if ukb:
            out["ukb4"] = metrics.ukb_score(d, relevant)
        parts.append(out)
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _classify_block(q_url: str, db_url: str, score: str, q_idx: np.ndarray, train_blocks: list,
                    labels: np.ndarray, classifiers: tuple, means, graph_url: str | None,
                    ncm_model: dict | None = None) -> dict:
    Q = read_rows(q_url, q_idx)
    y = labels[q_idx]
    n_classes = int(labels.max()) + 1
    out = {}
    ks = [int(c[3:]) for c in classifiers if c.startswith("knn")]
    if ks:
        kmax = max(ks)
        metric = "l2" if score == "euclidean" else "ip"
        best = knn.empty_topk(len(Q), kmax)
        for rows in train_blocks:
            X = read_rows(db_url, rows)
            if score.startswith("slem:"):
                best = knn.merge_topk(best, knn.distance_topk(_scores(Q, X, score), rows, kmax), kmax)
            else:
                best = knn.block_topk(Q, X, kmax, x_ids=rows, metric=metric, init=best)
        nb_labels = np.where(best[1] >= 0, labels[np.maximum(best[1], 0)], -1)
        for k in ks:
            errs = metrics.topk_errors(metrics.knn_class_ranking(nb_labels, n_classes, k), y)
            out[f"knn{k}"] = (errs[1], errs[5])
    soft = [int(c[8:]) for c in classifiers if c.startswith("softvote")]
    if soft:
        # Eq. 9: the neighbourhood is the stored Euclidean k-NN of the input features; the votes are
        # weighted by the model's similarity (inner product of its query and base views).
        nbr = open_array(f"{graph_url}/neighbours").get_orthogonal_selection((q_idx, slice(None))).astype(np.int64)
        flat = np.unique(nbr[nbr >= 0])
        B = read_rows(db_url, flat)
        pos = np.searchsorted(flat, np.maximum(nbr, 0))
        sims = np.einsum("qd,qkd->qk", Q, B[pos])
        nb_labels = np.where(nbr >= 0, labels[np.maximum(nbr, 0)], -1)
        for k in soft:
            errs = metrics.topk_errors(metrics.softvote_ranking(nb_labels, sims, n_classes, k), y)
            out[f"softvote{k}"] = (errs[1], errs[5])
    if "ncm" in classifiers:
        if ncm_model and ncm_model.get("bias") is not None:  # Eq. 27's dot form with class biases
            bias = ncm_model["bias"]
            bias = np.where(np.isfinite(bias), bias, -0.5 * (means.astype(np.float64) ** 2).sum(1))
            ranking = np.argsort(-ncmml.ncm_scores(Q.astype(np.float64), means.astype(np.float64), bias),
                                 axis=1, kind="stable")
        else:
            ranking = metrics.nearest_mean_ranking(Q, means)
        errs = metrics.topk_errors(ranking, y)
        out["ncm"] = (errs[1], errs[5])
    if "ncmc" in classifiers and ncm_model and ncm_model.get("centroids") is not None:
        scores = ncmml.mixture_class_scores(Q.astype(np.float64), ncm_model["centroids"], ncm_model["owner"],
                                            n_classes)
        errs = metrics.topk_errors(np.argsort(-scores, axis=1, kind="stable"), y)
        out["ncmc"] = (errs[1], errs[5])
    return out


def _ncm_model(model_url: str) -> dict | None:
    """What the ncm / ncmc classifiers need from an NCMML/NCMC model: class biases (dot form) and
    the centroids in code space with their classes (only when some class has more than one)."""
    if "centroid_class" not in array_names(model_url):
        return None
    arrays, _ = load_arrays(model_url)
    owner = arrays["centroid_class"].astype(np.int64)
    out = {"bias": arrays.get("class_bias"), "centroids": None, "owner": owner}
    if np.bincount(owner).max() > 1:
        out["centroids"] = _load_model(model_url).transform(arrays["centroids"]).astype(np.float64)
    return out


def _class_means(m) -> np.ndarray:
    return moments.finalize_statistics(m)["class_means"].astype(np.float32)


# Fixed (not worker-count dependent) so that every query meets the same GEMM shapes on any cluster.
CLASSIFY_QUERIES = 4096


def _fixed_blocks(idx: np.ndarray, size: int) -> list[np.ndarray]:
    return [idx[a:a + size] for a in range(0, len(idx), size)]


# An evaluation task's memory: EVAL_BUDGET bytes beyond its queries, of which a retrieval task
# keeps up to RETRIEVAL_DB_BYTES for its database (the test rows of one view; streamed again for
# every group of queries when larger) and the rest for a group's distance matrix, its sorted copy and
# masks. A view's queries are cut into at most RETRIEVAL_TASKS tasks (fixed, so the split is the same
# on any cluster), each reading the database once.
EVAL_BUDGET = 2.5e8
RETRIEVAL_DB_BYTES = 1.5e8
RETRIEVAL_TASKS = 8


def _query_group(n_db: int, budget_bytes: float = EVAL_BUDGET - RETRIEVAL_DB_BYTES) -> int:
    """Queries scored at once: 24 bytes per query x database entry within ``budget_bytes``."""
    return int(max(1, budget_bytes // max(1, n_db * 24)))


def _query_blocks(idx: np.ndarray, n_db: int) -> list[np.ndarray]:
    """One block per retrieval task: at least one group, at most RETRIEVAL_TASKS blocks."""
    return _fixed_blocks(idx, max(_query_group(n_db), -(-len(idx) // RETRIEVAL_TASKS)))


def run_evaluate(ctx: StageContext, data: DataInfo, codes: list, neighbours: Unit | None = None
                 ) -> list[tuple[dict, Unit]]:
    """Retrieval (test queries against the rest of test) and classification (train as database).

    Every model is evaluated on its codes; a bilinear model (SL-NE, SL-DE) also on its exact
    similarity (query view Z M against base view Z), so the loss from factoring is visible.
    """
    ev = ctx.config.evaluate
    test = data.rows(TEST)
    queries = test  # retrieval queries: every test image, or a seeded sample of them (evaluate.retrieval.queries)
    if ev.queries is not None and ev.queries < len(test):
        queries = np.sort(np.random.default_rng([ctx.config.seed, 31]).choice(test, ev.queries, replace=False))
    rel_key = data.groups if data.groups is not None else data.labels
    ukb = data.groups is not None and bool(np.all(np.bincount(data.groups[test])[np.unique(data.groups[test])] == 4))
    train_blocks = [r for r in (np.flatnonzero(data.split[a:b] == TRAIN) + a for a, b in data.chunks) if len(r)]
    labels_f = ctx.client.scatter(data.labels, broadcast=True)
    rel_f = labels_f if data.groups is None else ctx.client.scatter(rel_key, broadcast=True)
    if any(c.startswith("softvote") for c in ev.classifiers) and neighbours is None:
        raise InputError(f"{ctx.config.source_file}: evaluate: softvote classifiers need the neighbours stage; "
                         f"add neighbours: {{k: 50}}")
    graph_url = neighbours.url if neighbours is not None else None
    out, jobs, costs = [], [], {}
    for spec, cunit, dim in codes:
        unit = ctx.store.unit("evaluation", hash_key({"stage": "evaluation", "version": 2, "codes": cunit.key,
                                                     "graph": neighbours.key if neighbours else None,
                                                     "evaluate": ev.__dict__, "data": data.unit.key}))
        out.append((spec, unit))
        if ctx.reuse(unit, "evaluate"):
            continue
        unit.begin()
        cmeta = cunit.meta()
        costs[unit.key] = cmeta.get("cost")
        views = [("codes", f"{cunit.url}/codes", f"{cunit.url}/codes", (cmeta.get("score") or "euclidean"))]
        if cmeta.get("bilinear"):
            views.append(("exact", f"{cunit.url}/query", f"{cunit.url}/base", "inner"))
        for view, q_url, db_url, score in views:
            means = None
            if "ncm" in ev.classifiers:
                parts = [ctx.submit(_moments_block, data.url, a, b, len(data.classes), False, db_url,
                                    name="ncm-means") for a, b in data.chunks]
                means = ctx.submit(_class_means, _tree_combine(ctx, parts, "ncm-combine"), name="ncm-means")
            ret = [ctx.submit(_retrieval_block, q_url, db_url, score, q, test, rel_f, ev.retrieval_k, ukb,
                              data.chunk_rows, _query_group(len(test)), name=f"retrieval-{model_id(spec)}")
                   for q in _query_blocks(queries, len(test))] if ev.retrieval else []
            ncm_model = None
            if view == "codes" and spec["method"] in ("ncmml", "ncmc"):
                ncm_model = ctx.submit(_ncm_model, ctx.store.unit("models", read_attrs(cunit.url)["model"]).url,
                                      name="ncm-model")
            cls = [ctx.submit(_classify_block, q_url, db_url, score, q, train_blocks, labels_f, ev.classifiers,
                              means, graph_url, ncm_model, name=f"classify-{model_id(spec)}")
                   for q in _fixed_blocks(test, CLASSIFY_QUERIES)] if ev.classifiers else []
            jobs.append((spec, unit, dim, view, score, ret, cls))
    # When the models that leave classes out of training all keep the same ones, every model also
    # reports its errors on the other classes' test images: the control beside the new-class figure.
    subsets = {tuple(spec["classes"]) for spec, *_ in codes if spec.get("classes")}
    common = list(subsets.pop()) if len(subsets) == 1 else None
    t0 = time.perf_counter()
    records = {}
    for spec, unit, dim, view, score, ret, cls in jobs:
        trained_on = spec.get("classes") or common
        name = f"{model_id(spec)} ({view})"
        ret_res = ctx.gather(ret, "evaluate", [f"model {name} retrieval block {i}" for i in range(len(ret))])
        cls_res = ctx.gather(cls, "evaluate", [f"model {name} classification block {i}" for i in range(len(cls))])
        extra = {} if view == "codes" and score == "euclidean" else {"view": view, "score": score}
        recs = records.setdefault(unit.key, (unit, []))[1]
        recs.extend(_records(spec, dim, ev, data.labels[test], ret_res, cls_res, extra, trained_on,
                             data.labels[queries]))
        if view == "codes" and costs.get(unit.key):  # the projection's size and cost next to its metrics
            base = {"method": spec["method"], "dim": dim, "classifier": None,
                    "params": {k: v for k, v in spec.items() if k not in ("method", "dim")}}
            recs.extend({**base, "metric": k, "value": v} for k, v in costs[unit.key].items())
    for unit, recs in records.values():
        unit.write_json("records.json", recs)
        _timed(ctx, unit, t0, {})
    return out


def _records(spec: dict, dim: int, ev, test_labels: np.ndarray, ret_res: list, cls_res: list,
             extra: dict | None = None, trained_on: list | None = None,
             query_labels: np.ndarray | None = None) -> list[dict]:
    """Metric records; ``query_labels`` are the retrieval queries' labels (default: the test labels)."""
    query_labels = test_labels if query_labels is None else query_labels
    params = {**{k: v for k, v in spec.items() if k not in ("method", "dim")}, **(extra or {})}
    base = {"method": spec["method"], "dim": dim, "params": params}
    recs = []
    if ret_res:
        cat = {k: np.concatenate([r[k] for r in ret_res]) for k in ret_res[0]}
        recs.append({**base, "classifier": None, "metric": "map", "value": float(np.nanmean(cat["ap"]))})
        for j, k in enumerate(ev.retrieval_k):
            recs.append({**base, "classifier": None, "metric": f"mprec@{k}",
                         "value": float(metrics.class_average(cat["prec"][:, j], query_labels))})
            recs.append({**base, "classifier": None, "metric": f"recall@{k}",
                         "value": float(np.nanmean(cat["recall"][:, j]))})
        if "ukb4" in cat:
            recs.append({**base, "classifier": None, "metric": "ukb4", "value": float(cat["ukb4"].mean())})
    if cls_res:
        # a model trained on some classes only is also scored on the test images of the others
        new = None if not trained_on else ~np.isin(test_labels, trained_on)
        for c in ev.classifiers:
            if c not in cls_res[0]:  # e.g. ncmc for a model without centroids
                continue
            top1 = np.concatenate([r[c][0] for r in cls_res])
            top5 = np.concatenate([r[c][1] for r in cls_res])
            recs.append({**base, "classifier": c, "metric": "top1_error", "value": float(top1.mean())})
            recs.append({**base, "classifier": c, "metric": "top5_error", "value": float(top5.mean())})
            if new is not None and new.any():
                recs.append({**base, "classifier": c, "metric": "top1_error_new_classes", "value": float(top1[new].mean())})
                recs.append({**base, "classifier": c, "metric": "top5_error_new_classes", "value": float(top5[new].mean())})
    return recs
