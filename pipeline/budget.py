"""The memory rule: what one task may hold, checked before staging against the workers' limits.

A task holds at most BLOCKS_PER_TASK row-blocks of the staged features (a kNN piece: its queries, one
database block and the distance tile; NML: the two blocks of a pair group) plus the evaluation's
budget (stages.EVAL_BUDGET: a retrieval task's database and distances). Tasks that hold more than
row-blocks are counted too:

- the statistics stage's D x D covariance (float64): a block's partial and the two being combined;
- a retrieval task's database: the test split's codes (n_test x d float32, d the widest code the
  config names), held whole beside the query groups' buffers;
- kernel SLEM's n x n kernel matrix and its factors (n x r with ICD), n its negatives' count;
- an IVF index (the neighbours stage's over the features, the evaluate stage's over each model's train
  codes when the train split is large), cached in every worker beside the row-blocks that re-ranking
  reads: IVF-Flat when the vectors fit the index budget, else IVF-PQ with as many bytes per vector as
  fit (pipeline/ivf.py); its k-means sample is read by one task. A sampled graph whose queries fit
  keeps no index: each scan task holds the queries, their lists and three copies of a row-block.

Each must stay under SPILL_FRACTION of the smallest worker's memory limit (Dask's spill target, so
spilling never has to save a running task); the rest up to Dask's terminate threshold (95%) holds
the worker process itself (Python, numpy, faiss, zarr: ~250 MB resident before any task; 350 MB at a
1 GB limit). A configuration that cannot fit is refused before staging with one line naming the
setting to change.
"""
from metricpipe.config import NeighboursConfig
from metricpipe.tasks import registry
from metricpipe.tasks.errors import InputError

BLOCKS_PER_TASK = 4
SPILL_FRACTION = 0.6
PAUSE_FRACTION = 0.8      # Dask pauses a worker above this share of its limit (distributed's default)
WORKER_RESIDENT = 2.5e8   # a worker process before any task (Python, numpy, faiss, zarr; measured)
# The index shares its worker with the row-blocks a re-ranking task reads (one block and the queries).
INDEX_BLOCKS = 2


def worker_limit(client) -> float | None:
    """The smallest worker memory limit in bytes (None when the workers have none)."""
    limits = [w.get("memory_limit") for w in client.scheduler_info()["workers"].values()]
    limits = [m for m in limits if m]
    return float(min(limits)) if limits else None


def usable(limit: float) -> float:
    return SPILL_FRACTION * limit


def block_bytes(chunk_rows: int, n_features: int) -> float:
    return chunk_rows * n_features * 4.0


def index_budget(client, chunk_rows: int | None = None, n_features: int | None = None) -> float | None:
    """Bytes a filled IVF index may take in one worker (None: no limit known); ``chunk_rows`` and
    ``n_features`` size the row-blocks that share the worker with it (default: one 64 MB block)."""
    limit = worker_limit(client)
    if limit is None:
        return None
    blocks = INDEX_BLOCKS * (block_bytes(chunk_rows, n_features) if chunk_rows else 64e6)
    return usable(limit) - blocks


def task_budget(client) -> float | None:
    """Bytes one task may hold (None: no limit known)."""
    limit = worker_limit(client)
    return None if limit is None else usable(limit)


def retrieval_db_budget(client, buffers: float) -> float | None:
    """Bytes of test codes a retrieval task may hold beside its ``buffers`` (None: no limit known)."""
    limit = worker_limit(client)
    return None if limit is None else usable(limit) - buffers


def _code_dim(spec: dict, D: int, n_classes: int | None = None) -> int:
    """A model's code width as its config gives it: ``dim``; SL-DE's members x member_dim; SL-NE's
    input_dim; LDA's classes - 1; the class's default dim (NCMML's 32, a sparse projector's 64...);
    else D (an upper bound: a wider guess could refuse a run that fits)."""
    if isinstance(spec.get("dim"), int):
        return min(spec["dim"], D)
    if spec.get("members") and spec.get("member_dim"):
        return int(spec["members"]) * int(spec["member_dim"])
    if isinstance(spec.get("input_dim"), int):
        return min(spec["input_dim"], D)
    if spec.get("method") == "lda" and n_classes:
        return min(n_classes - 1, D)
    default = _default_dim(spec)
    return D if default is None else min(default, D)


def _default_dim(spec: dict) -> int | None:
    from metricpipe.tasks import registry
    if spec.get("method") not in registry.METHODS:
        return None
    cls = registry.estimator_class(spec["method"], spec)
    dim = registry.defaults(cls).get("dim")
    return dim if isinstance(dim, int) else getattr(cls, "DEFAULT_DIM", None)


def needs(info, cfg, limit: float) -> list[tuple[str, float, str]]:
    """(what, bytes, the setting to change) of every task kind this run will hold at its largest."""
    from metricpipe import ivf, stages
    from metricpipe.runner import stage_names
    D, n_train = info.n_features, int((info.split == stages.TRAIN).sum())
    block = block_bytes(min(info.chunk_rows, len(info.split)), D)   # a small set is one block
    need = BLOCKS_PER_TASK * block + stages.EVAL_BUDGET
    fix = "lower data.chunk_mb or raise memory_limit"
    if stages.EVAL_BUDGET >= 0.9 * usable(limit):   # smaller blocks cannot help: the buffers alone do not fit
        fix = (f"raise memory_limit to at least {-(-need // SPILL_FRACTION // 1e6):,.0f} MB (the evaluation's "
               f"buffers alone take {stages.EVAL_BUDGET / 1e6:,.0f} MB)")
    out = [("a row-block task (4 row-blocks and the evaluation's buffers)", need, fix)]
    if D <= cfg.statistics.max_dense_dim:
        out.append((f"the statistics stage's {D} x {D} covariance (3 copies, float64)", 3 * 8.0 * D * D + block,
                    f"set statistics.max_dense_dim below {D} (randomized PCA) or raise memory_limit"))
    n_test = int((info.split == stages.TEST).sum())
    if cfg.evaluate.retrieval and cfg.methods:
        n_classes = len(getattr(info, "classes", None) or []) or None
        d = max(_code_dim(cand, D, n_classes) for spec in cfg.methods for cand in registry.candidates(spec))
        out.append((f"a retrieval task's database (the {n_test:,} test rows' codes, up to {d} dimensions)",
                    n_test * d * 4.0 + stages.EVAL_BUDGET - stages.RETRIEVAL_DB_BYTES,
                    "set evaluate.retrieval: false, lower data.split's test share, or raise memory_limit"))
    if any(c.startswith("softvote") for c in cfg.evaluate.classifiers) and cfg.methods and n_train:
        from metricpipe.stages.evaluate import CLASSIFY_QUERIES
        from metricpipe.tasks.evaluation import SOFTVOTE_GROUP_BYTES
        n_classes = len(getattr(info, "classes", None) or []) or None
        # SL-NE / SL-DE codes are classified in their exact view too: input_dim (default D) wide
        d = max(max(_code_dim(cand, D, n_classes),
                    min(cand.get("input_dim") or D, D) if cand["method"] in ("slne", "slde") else 0)
                for spec in cfg.methods for cand in registry.candidates(spec))
        k = (cfg.neighbours or NeighboursConfig()).k
        rows = min(n_train, CLASSIFY_QUERIES * k)
        out.append((f"a soft-vote task ({CLASSIFY_QUERIES:,} queries' {k} stored neighbours: {rows:,} rows of codes up "
                    f"to {d} dimensions)", (rows + CLASSIFY_QUERIES) * d * 4.0 + SOFTVOTE_GROUP_BYTES,
                    "lower neighbours.k, drop the softvote classifiers, or raise memory_limit"))
    for spec in cfg.methods:
        for cand in registry.candidates(spec):
            if cand["method"] == "slem" and cand.get("kernel", "linear") != "linear":
                out.append(_kernel_slem(cand, info))
    nb = cfg.neighbours or NeighboursConfig()
    seen = set()
    for spec in cfg.methods:
        for cand in registry.candidates(spec):
            if cand["method"] in ("slne", "slde") and n_train:
                task = _slne_task(cand, D, n_train, nb)
                if task[0] not in seen:
                    seen.add(task[0])
                    out.append(task)
    if "neighbours" in stage_names(cfg) and n_train:
        if nb.method == "ivf" or (nb.method == "auto" and n_train > stages.EXACT_MAX_TRAIN):
            nlist = nb.nlist or ivf.nlist_searched(n_train, nb.queries)
            budget = usable(limit) - INDEX_BLOCKS * block
            rows = ivf.sample_rows(n_train, nlist)
            out.append((f"the IVF index's k-means sample ({rows:,} rows)", 2 * rows * D * 4.0 + nlist * D * 4.0, "lower neighbours.nlist or raise memory_limit"))
            if ivf.streamed(nb.queries, D, nb.k, nlist, block, usable(limit), nb.nprobe):
                q = min(n_train, nb.queries) + ivf.RECALL_QUERIES
                out.append((f"the neighbours stage's IVF search of {q:,} queries over the streamed rows",
                            ivf.stream_bytes(q, D, nb.k, nlist, block, nb.nprobe), "lower neighbours.queries or raise memory_limit"))
            else:
                factory = ivf.factory_string(n_train, D, nlist, budget, where=cfg.source_file,
                                             limit_setting=limit_name(cfg))
                out.append((f"the neighbours stage's IVF index ({factory}) and {INDEX_BLOCKS} row-blocks",
                            ivf.index_bytes(n_train, D, factory) + INDEX_BLOCKS * block,
                            "raise memory_limit"))
    return out


# Bytes an SL-NE task holds per neighbour-graph entry (n x k): the graph, its symmetrised CSR form
# and the solver's per-edge arrays; fit_space's peak (tracemalloc) at n = 20,000, k = 10 and 50 was
# 66-68 bytes per entry, plus the graph itself (8) and the reading of its rows.
SLNE_BYTES_PER_EDGE = 80


def _slne_task(spec: dict, D: int, n_train: int, nb) -> tuple[str, float, str]:
    """An SL-NE task (or an SL-DE member's) holds its training rows in its input space (twice while
    they are gathered block by block) and the neighbour graph among them: the train split, or with
    neighbours.queries the sampled rows and their neighbours."""
    from metricpipe.tasks import registry
    est = registry.make(spec)
    p = min(getattr(est, "input_dim", None) or D, D)
    what = "an SL-NE task"
    if spec["method"] == "slde":
        d = est.member_size(p)
        p, what = (p, "an SL-DE task (refine)") if est.refine else (d, f"an SL-DE member ({d} dimensions)")
    # with a sampled graph only the sampled rows list neighbours (the others' lists are empty)
    anchors = n_train if nb.queries is None else min(n_train, nb.queries)
    rows = n_train if nb.queries is None else min(n_train, nb.queries * (nb.k + 1))
    # (an empty list still costs the graph's and the symmetrisation's per-entry arrays, ~32 B an entry:
    # 99,403 rows, k = 50, 2,000 sampled, p = 16 peaked at ~143 MB against 177 MB here)
    need = rows * (2 * 4.0 * p + 32.0 * nb.k) + anchors * (SLNE_BYTES_PER_EDGE - 32.0) * nb.k + 4 * 8.0 * p * p
    return (f"{what}: its {rows:,} training rows in {p} dimensions and their {nb.k}-neighbour graph", need,
            "set neighbours.queries (the sampled rows and their neighbours train it), lower input_dim"
            f"{' or member_dim' if spec['method'] == 'slde' else ''}, or raise memory_limit")


def _kernel_slem(spec: dict, info) -> tuple[str, float, str]:
    """Kernel SLEM's pool: an n x n float64 kernel matrix and its factor (Cholesky, KPCA), or an
    n x r pivoted factor (ICD). Measured at n = 5,000 (fit_pool's peak RSS over n^2 x 8 bytes):
    Cholesky 5.0, KPCA 3.8; ICD at r = 200, 1.6 x n r x 8 bytes."""
    from metricpipe.config import SPLIT_NAMES
    neg = spec.get("negatives") or {}
    code = SPLIT_NAMES.index(neg.get("split", "train")) if neg.get("split", "train") in SPLIT_NAMES else 0
    n = int((info.split == code).sum())
    n = n if neg.get("count") is None else min(n, int(neg["count"]))
    if spec.get("decomposition") == "icd":
        r = n if spec.get("rank", "full") == "full" else min(n, int(spec["rank"]))
        need, shape, copies = 2 * 8.0 * n * r, f"{n:,} x {r}", 2
    else:
        need, shape, copies = 5 * 8.0 * n * n, f"{n:,} x {n:,}", 5
    return (f"kernel SLEM's {shape} kernel matrices ({copies} copies, float64)", need,
            "lower its negatives.count, use decomposition: icd with a rank, or raise memory_limit")


def limit_name(cfg) -> str:
    """The setting that sizes the workers: memory_limit (or --memory-limit) for a local cluster; a
    running scheduler's or a spec's workers were started with their own."""
    return cfg.setting("memory_limit") if cfg.cluster == "local" else \
        "the workers' memory limit (dask worker --memory-limit, or the cluster spec's)"


def check_memory(client, info, cfg) -> None:
    """Refuse, before staging, a run whose largest task would not fit a worker (module docstring)."""
    limit = worker_limit(client)
    if limit is None:
        return
    for what, need, fix in needs(info, cfg, limit):
        if need > usable(limit):
            raise InputError(f"{cfg.source_file}: {what} needs ~{need / 1e6:,.0f} MB, over the "
                             f"{usable(limit) / 1e6:,.0f} MB a task may use ({SPILL_FRACTION:.0%} of the smallest "
                             f"worker memory limit, {limit / 1e6:,.0f} MB); {fix.replace('memory_limit', limit_name(cfg))}")


def refuse_without_dense_covariance(est, n_features: int, max_dense_dim: int, where: str) -> None:
    """LDA and linear SLEM are fitted from the D x D covariance, which the statistics stage keeps only
    up to statistics.max_dense_dim features (randomized PCA above)."""
    if getattr(est, "needs_dense_covariance", False) and n_features > max_dense_dim:
        raise InputError(f"{where} needs the D x D covariance, but D = {n_features} is above statistics."
                         f"max_dense_dim ({max_dense_dim}); raise statistics.max_dense_dim (memory: D^2 x 8 "
                         f"bytes) or drop it{' (a kernel SLEM does without)' if est.method == 'slem' else ''}")


__all__ = ["BLOCKS_PER_TASK", "PAUSE_FRACTION", "SPILL_FRACTION", "WORKER_RESIDENT", "check_memory", "index_budget",
           "needs", "refuse_without_dense_covariance", "task_budget", "worker_limit"]
