"""The memory rule: what one task may hold, checked before staging against the workers' limits; and
the disk rule: what a run writes to its store, checked against the store's free space.

A task holds at most BLOCKS_PER_TASK row-blocks of the staged features (a kNN piece: its queries, one
database block and the distance tile; NML: the two blocks of a pair group) plus the evaluation's
budget (stages.EVAL_BUDGET: a retrieval task's database and distances). Tasks that hold more than
row-blocks are counted too, each stage saying what its largest tasks hold (its ``largest_tasks``), the
train stage asking each learner (``Learner.largest_task``):

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

import os
import shutil

from metricpipe.tasks.errors import InputError

BLOCKS_PER_TASK = 4
SPILL_FRACTION = 0.6
PAUSE_FRACTION = 0.8  # Dask pauses a worker above this share of its limit (distributed's default)
WORKER_RESIDENT = 2.5e8  # a worker process before any task (Python, numpy, faiss, zarr; measured)
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


def limit_name(cfg) -> str:
    """The setting that sizes the workers: memory_limit (or --memory-limit) for a local cluster; a
    running scheduler's or a spec's workers were started with their own."""
    return (
        cfg.setting("memory_limit")
        if cfg.cluster == "local"
        else "the workers' memory limit (dask worker --memory-limit, or the cluster spec's)"
    )


def check_memory(client, cfg, needs) -> None:
    """Refuse, before staging, a run whose largest task would not fit a worker (module docstring):
    ``needs(limit)`` lists (what, bytes, the setting to change) of every kind of task the run's stages
    hold at their largest (each stage's ``largest_tasks``) for workers of that limit."""
    limit = worker_limit(client)
    if limit is None:
        return
    for what, need, fix in needs(limit):
        if need > usable(limit):
            raise InputError(
                f"{cfg.source_file}: {what} needs ~{need / 1e6:,.0f} MB, over the "
                f"{usable(limit) / 1e6:,.0f} MB a task may use ({SPILL_FRACTION:.0%} of the smallest "
                f"worker memory limit, {limit / 1e6:,.0f} MB); {fix.replace('memory_limit', limit_name(cfg))}"
            )


#: Kept free besides what the stages count (the neighbour graph, models, evaluations, logs, the
#: report): a few MB, and a share of the counted bytes (a 4,096-d run's models took 0.3% of them).
DISK_MARGIN, DISK_SHARE = 8e6, 0.01


def disk_margin(need: float) -> float:
    """Bytes the disk rule keeps free beside ``need`` counted bytes."""
    return DISK_MARGIN + DISK_SHARE * max(need, 0.0)


def disk_free(store) -> float | None:
    """Bytes free on a local store's file system (None: object storage, which does not say)."""
    if not getattr(store, "local", False):
        return None
    path = os.path.abspath(store.root)
    while not os.path.exists(path):  # a store not made yet: the folder it will be made in
        path = os.path.dirname(path)
    return float(shutil.disk_usage(path).free)


def check_disk(store, cfg, needs: list, held: float = 0.0, who: str = "the run") -> None:
    """The disk rule: refuse, before writing, what would fill the store's file system. ``needs`` lists
    (what, bytes, how to shrink it) of the units ``who`` writes at their largest (each stage's
    ``stored_bytes``); ``held`` bytes of them the store already holds (units a resume reuses)."""
    free = disk_free(store)
    need = sum(b for _, b, _ in needs) - held
    if free is None or need <= 0 or need + disk_margin(need) <= free:  # (nothing new: nothing to refuse)
        return
    what, most, fix = max(needs, key=lambda n: n[1])
    raise InputError(
        f"{cfg.source_file}: {who} writes ~{_size(need)} to the store {store.url} (and keeps "
        f"{_size(disk_margin(need))} for models, logs and the report), but its file system has {_size(free)} "
        f"free; the most is {what} (~{_size(most)}): {fix + ', or ' if fix else ''}free space there or use a "
        f"store on a larger disk"
    )


def _size(b: float) -> str:
    return f"{b / 1e9:,.1f} GB" if abs(b) >= 1e9 else f"{b / 1e6:,.1f} MB"


def row_block(info) -> float:
    """Bytes of one staged row-block of ``info`` (a small set is one block)."""
    return block_bytes(min(info.chunk_rows, len(info.split)), info.n_features)


def refuse_without_dense_covariance(est, n_features: int, max_dense_dim: int, where: str) -> None:
    """LDA and linear SLEM are fitted from the D x D covariance, which the statistics stage keeps only
    up to statistics.max_dense_dim features (randomized PCA above)."""
    if getattr(est, "needs_dense_covariance", False) and n_features > max_dense_dim:
        raise InputError(
            f"{where} needs the D x D covariance, but D = {n_features} is above statistics."
            f"max_dense_dim ({max_dense_dim}); raise statistics.max_dense_dim (memory: D^2 x 8 "
            f"bytes) or drop it{f' ({est.dense_alternative})' if est.dense_alternative else ''}"
        )


__all__ = [
    "BLOCKS_PER_TASK",
    "DISK_MARGIN",
    "DISK_SHARE",
    "INDEX_BLOCKS",
    "PAUSE_FRACTION",
    "SPILL_FRACTION",
    "WORKER_RESIDENT",
    "block_bytes",
    "check_disk",
    "check_memory",
    "disk_free",
    "disk_margin",
    "index_budget",
    "limit_name",
    "refuse_without_dense_covariance",
    "row_block",
    "task_budget",
    "usable",
    "worker_limit",
]
