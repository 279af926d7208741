"""Train-stage driver for SLEM (linear and kernel) and the ESVM baseline (`tasks.slem`): it selects
the negative pool's rows, reads them and hands them to the estimator's entry point.

The negative pool is a seeded sample of ``negatives.count`` rows of the split ``negatives.split``
(never test; :func:`metricpipe.tasks.slem.pool_positions`, the same draw as in-memory ``fit``).
Linear SLEM needs only the pool's mean and covariance: when the pool is the whole train split they
come from the statistics stage (:meth:`SLEM.fit_moments`), otherwise the pool's rows are streamed
block by block into :meth:`SLEM.fit_blocks` (the pool is never gathered). Kernel SLEM and ESVM hold
the pool itself (count x D; kernel SLEM by Cholesky or KPCA also its n x n kernel matrix), so the
pool size is capped at MAX_POOL and the pool goes to their ``fit_pool``; ICD never forms the n x n
matrix, so its cap is ICD_POOL_BYTES of pool and n x r factor.

The fit records the offline cost (the fit: moments or factorisation and solve setup) and the online
cost per image, measured by encoding up to ONLINE_SAMPLE pool images with the fitted estimator; both
go to the train record beside the fit time.
"""

import time

import numpy as np
from sklearn.base import clone

from metricpipe.budget import refuse_without_dense_covariance
from metricpipe.folds import Fold, fold_split
from metricpipe.stages.common import Fed
from metricpipe.store import load_arrays, open_array, read_rows, save_model
from metricpipe.tasks import slem
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.splits import SPLIT_NAMES, TRAIN

MAX_POOL = 20000  # n x n float64 kernel matrix: 3.2 GB at this size
ICD_POOL_BYTES = 8e8  # ICD holds the pool and its n x r factor (float64), never the n x n matrix
ONLINE_SAMPLE = 256


def negative_rows(split: np.ndarray, neg: dict, where: str) -> np.ndarray:
    """Sorted global rows of the negative pool: the rows of ``neg["split"]``, sampled by
    :func:`metricpipe.tasks.slem.pool_positions`."""
    neg = slem.check_negatives(neg)
    code = SPLIT_NAMES.index(neg["split"])
    rows = np.flatnonzero(split == code)
    if len(rows) < 2:
        have = ", ".join(f"{SPLIT_NAMES[c]} ({n})" for c, n in enumerate(np.bincount(split)) if n)
        raise InputError(
            f"{where}: negatives.split {neg['split']!r} holds {len(rows)} image(s); SLEM needs a pool "
            f"of at least 2; the data has {have}"
        )
    return rows[slem.pool_positions(len(rows), neg)]


def _by_block(chunks, rows):
    """(start, stop, local positions) of the row-blocks holding ``rows``."""
    for a, b in chunks:
        lo, hi = np.searchsorted(rows, [a, b])
        if hi > lo:
            yield a, b, rows[lo:hi] - a


def _pool_blocks(data_url: str, chunks, rows):
    """The pool's rows, one row-block's worth at a time (as stored, float32)."""
    X = open_array(f"{data_url}/features")
    for a, b, local in _by_block(chunks, rows):
        yield X[a:b][local]


def _gather(data_url: str, rows) -> np.ndarray:
    return read_rows(f"{data_url}/features", rows).astype(np.float64)


def _train(est, spec: dict, data_url: str, stats_url: str, chunks, model_url: str, where: str, fold: Fold) -> dict:
    est = clone(est)
    split = fold_split(data_url, fold)  # a candidate's pool leaves the rows its selection borrowed
    neg = slem.check_negatives(est.negatives)
    rows = negative_rows(split, neg, where)
    facts = {"negatives": int(len(rows)), "negatives_split": neg["split"]}
    linear = isinstance(est, slem.SLEM)
    icd = getattr(est, "decomposition", None) == "icd"
    if icd:  # no n x n matrix: the pool and the n x r factor
        D = open_array(f"{data_url}/features").shape[1]
        r = len(rows) if est.rank == "full" else min(int(est.rank), len(rows))
        if len(rows) * (D + r) * 8 > ICD_POOL_BYTES:
            raise InputError(
                f"{where}: negatives.count {len(rows)} with rank {r} needs "
                f"{len(rows) * (D + r) * 8 / 1e9:.1f} GB for ICD's pool and factor, above "
                f"{ICD_POOL_BYTES / 1e9:.1f} GB; lower negatives.count or rank"
            )
    elif not linear and len(rows) > MAX_POOL:
        raise InputError(
            f"{where}: negatives.count {len(rows)} is above {MAX_POOL} for {spec['method']} "
            f"{getattr(est, 'kernel', '')} (it holds the pool, and kernel SLEM its n x n kernel "
            f"matrix; decomposition icd has no such matrix); lower negatives.count"
        )
    t0, c0 = time.perf_counter(), time.thread_time()
    try:
        if linear and fold.borrow is None and neg["split"] == "train" and len(rows) == np.count_nonzero(split == TRAIN):
            stats, _ = load_arrays(stats_url)  # the statistics stage's moments
            est.fit_moments(stats["mean"], stats["covariance"], int(stats["n_samples"]), ddof=1)
            facts["moments"] = "statistics stage"
        elif linear:
            est.fit_blocks(_pool_blocks(data_url, chunks, rows))
            facts["moments"] = "pool, streamed"
        else:
            est.fit_pool(_gather(data_url, rows))
    except InputError as e:
        raise InputError(f"{where}: {e}") from None
    offline, cpu = time.perf_counter() - t0, time.thread_time() - c0
    sample = _gather(data_url, rows[:ONLINE_SAMPLE])
    t1 = time.perf_counter()
    est.transform(sample)
    online = (time.perf_counter() - t1) / len(sample)
    facts.update(cpu_seconds=cpu, offline_seconds=offline, online_seconds_per_image=online)
    return save_model(model_url, est, spec, offline, **facts)


def submit(ctx, spec: dict, est, data, stats, neighbours, unit, name: str, fold: Fold):
    """One task that fits ``est`` (SLEM, KernelSLEM or ESVM) on its negative pool and saves it."""
    where = f"{ctx.config.source_file}: {name}"
    if not stats.meta().get("dense", True):
        refuse_without_dense_covariance(
            est, data.n_features, ctx.config.statistics.max_dense_dim, f"{ctx.config.source_file}: methods: linear slem"
        )
    return ctx.submit(_train, est, spec, data.url, stats.url, data.chunks, unit.url, where, fold, name=f"train-{name}")


def fed(est, info, cfg, n_train: int) -> Fed:
    """Its pool: negatives.count images of negatives.split (all of them when it holds fewer)."""
    neg = est.negatives or {}
    split = neg.get("split", "train")
    n = int((info.split == SPLIT_NAMES.index(split)).sum()) if split in SPLIT_NAMES else 0
    return Fed(n if neg.get("count") is None else min(n, int(neg["count"])))


def reads(est, info, cfg, n_rows: int) -> int:
    """The row-blocks holding its pool (spread over its split: every block), unless the statistics
    stage's moments are the pool's (every row of the split, a learner fitted from the covariance)."""
    every = (est.negatives or {}).get("count") is None
    return 0 if every and est.needs_dense_covariance else info.n_samples
