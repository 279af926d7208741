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
    n_classes = len(getattr(info, "classes", None) or []) or 2
    learners = [registry.make(cand) for spec in cfg.methods for cand in registry.candidates(spec)]
    if cfg.evaluate.retrieval and learners:
        d = max(est.code_dim(D, n_classes) for est in learners)
        out.append((f"a retrieval task's database (the {n_test:,} test rows' codes, up to {d} dimensions)",
                    n_test * d * 4.0 + stages.EVAL_BUDGET - stages.RETRIEVAL_DB_BYTES,
                    "set evaluate.retrieval: false, lower data.split's test share, or raise memory_limit"))
    if any(c.startswith("softvote") for c in cfg.evaluate.classifiers) and learners and n_train:
        from metricpipe.stages.evaluate import CLASSIFY_QUERIES
        from metricpipe.tasks.evaluation import SOFTVOTE_GROUP_BYTES
        d = max(est.view_dim(D, n_classes) for est in learners)   # (SL-NE's exact view too)
        k = (cfg.neighbours or NeighboursConfig()).k
        rows = min(n_train, CLASSIFY_QUERIES * k)
        out.append((f"a soft-vote task ({CLASSIFY_QUERIES:,} queries' {k} stored neighbours: {rows:,} rows of codes up "
                    f"to {d} dimensions)", (rows + CLASSIFY_QUERIES) * d * 4.0 + SOFTVOTE_GROUP_BYTES,
                    "lower neighbours.k, drop the softvote classifiers, or raise memory_limit"))
    out += _learner_tasks(learners, info, cfg, n_train, n_classes)
    nb = cfg.neighbours or NeighboursConfig()
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


def _learner_tasks(learners: list, info, cfg, n_train: int, n_classes: int) -> list:
    """What each learner says its largest task holds, fed what the train stage's feeder of its kind
    hands it (``stages.train.fed_rows``), with the setting of the run that shrinks it."""
    from metricpipe.stages.train import fed_rows
    out, seen = [], set()
    for est in learners:
        fed = fed_rows(est, info, cfg, n_train)
        task = est.largest_task(fed.rows, info.n_features, n_classes, fed.k, fed.anchors) if fed else None
        if task is not None and task[0] not in seen:
            seen.add(task[0])
            what, need, fix = task
            fixes = [x for x in (fed.fix, fix) if x]
            out.append((what, need, ", ".join(fixes) + ", or raise memory_limit"))
    return out


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
                         f"bytes) or drop it{f' ({est.dense_alternative})' if est.dense_alternative else ''}")


__all__ = ["BLOCKS_PER_TASK", "PAUSE_FRACTION", "SPILL_FRACTION", "WORKER_RESIDENT", "check_memory", "index_budget",
           "needs", "refuse_without_dense_covariance", "task_budget", "worker_limit"]
