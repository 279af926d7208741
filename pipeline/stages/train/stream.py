"""The feeder of the learners fed a stream of pools (NCMML, NCMC, k-NN ML) and of those fed pairs
drawn from the labels (NML, linear ML): the fold's training rows (:class:`StoreRows`) over the
shuffled copy of the stored train rows (``shuffle``), and the statistics the learner reads; the
learner's ``fit_rows`` decides everything else, as its in-memory ``fit`` does. The task holds one
pool, the validation rows and what the learner reads besides (NCMC's k-means sample); never the
training set."""

import time

from sklearn.base import clone

from metricpipe.folds import Fold
from metricpipe.stages.common import labels_list
from metricpipe.stages.train import shuffle
from metricpipe.stages.train.rows import StoreRows
from metricpipe.store import load_arrays, save_model
from metricpipe.tasks.base import seed_of


def _train(
    est,
    spec: dict,
    data_url: str,
    stats_url: str,
    copy_url: str,
    chunks: list,
    block_rows: int,
    model_url: str,
    names: list,
    fold: Fold,
) -> dict:
    """On a worker: fit ``est`` from the fold's rows and save it at ``model_url``."""
    est = clone(est)  # fitted here, never the caller's object (a threaded worker shares it)
    stats = load_arrays(stats_url, est.reads_statistics)[0]
    rows = StoreRows(data_url, fold, chunks, copy_url, block_rows)
    t0, c0 = time.perf_counter(), time.thread_time()
    est.fit_rows(rows, stats, labels=names)
    seconds = time.perf_counter() - t0
    return save_model(model_url, est, spec, seconds, cpu_seconds=time.thread_time() - c0, **fit_facts(est, seconds))


def fit_facts(est, seconds: float) -> dict:
    """The learner's facts of its fit for the model's record, and its rate (samples per second)."""
    facts = {k: v for k, v in est.fit_facts().items() if v is not None}
    samples = facts.pop("samples", None)
    return {**facts, **({} if samples is None else {"samples_per_second": samples / max(seconds, 1e-9)})}


def submit(ctx, spec, est, data, stats, neighbours, unit, name, fold: Fold):
    """The one task that trains ``est`` (its shuffled copy made first, on the client)."""
    copy = shuffle.shuffled(ctx, data, seed_of(est.random_state))
    return ctx.submit(
        _train,
        est,
        spec,
        data.url,
        stats.url,
        copy.url,
        data.chunks,
        data.chunk_rows,
        unit.url,
        labels_list(data.classes),
        fold,
        name=f"train-{name}",
    )


def fed(est, info, cfg, n_train: int):
    """Pools of one row-block: nothing beyond a row-block task (None)."""
    return None


def reads(est, info, cfg, n_rows: int) -> int:
    """Nothing beyond the pools the learner reads (its ``fit_cost`` counts them)."""
    return 0
