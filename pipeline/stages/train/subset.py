"""The feeder of the learners fed a bounded sample of the training rows (sparse projectors): the fold's
training rows (:class:`StoreRows`, read in one task: the learner's subset is ``train_size`` rows) and
the statistics it reads; the learner's ``fit_rows`` draws the subset and the validation rows, as its
in-memory ``fit`` does."""

import re
import time
import warnings

from sklearn.base import clone

from metricpipe.folds import Fold
from metricpipe.stages.train.rows import StoreRows
from metricpipe.stages.train.stream import fit_facts
from metricpipe.store import load_arrays, save_model


def _train(est, spec, data_url, stats_url, chunks, model_url, fold) -> dict:
    est = clone(est)  # fitted here, never the caller's object (a threaded worker shares it)
    stats = load_arrays(stats_url, est.reads_statistics)[0]
    rows = StoreRows(data_url, fold, chunks)
    t0, c0 = time.perf_counter(), time.thread_time()
    with warnings.catch_warnings():  # check_methods printed the data's shape notes before staging
        keys = rows.labels if rows.groups is None else rows.groups
        for note in est.shape_notes(rows.n_features, len(set(keys.tolist()))):
            warnings.filterwarnings("ignore", message=re.escape(note), category=UserWarning)
        est.fit_rows(rows, stats)
    seconds = time.perf_counter() - t0
    return save_model(model_url, est, spec, seconds, cpu_seconds=time.thread_time() - c0, **fit_facts(est, seconds))


def submit(ctx, spec: dict, est, data, stats, neighbours, unit, name: str, fold: Fold):
    """The one task that trains ``est``; returns the future of its record."""
    return ctx.submit(_train, est, spec, data.url, stats.url, data.chunks, unit.url, fold, name=f"train-{name}")


def fed(est, info, cfg, n_train: int):
    """A bounded subset read in one task (the learner's own bound, ``train_size``): None."""
    return None


def reads(est, info, cfg, n_rows: int) -> int:
    """Its subset is spread over the train rows: every row-block holding them is read."""
    return info.n_samples
