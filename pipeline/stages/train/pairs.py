"""The feeder of the learners fed pairs (NML, linear ML). Pairs from the labels: the stream feeder's
task (:mod:`metricpipe.stages.train.stream`; the learner draws them inside each pool). The user's
pairs (the staged arrays ``pair_i``, ``pair_j``, ``pair_y``, global rows): mapped to layout positions
of the shuffled copy and handed with a reader of the copy's blocks to ``fit_pair_blocks``, which holds
at most two blocks at a time; the start of L is what the learner reads of the statistics (``start``).
"""

import time

import numpy as np
from sklearn.base import clone

from metricpipe.folds import Fold
from metricpipe.stages.train import shuffle, stream
from metricpipe.stages.train.stream import fit_facts
from metricpipe.store import array_names, load_arrays, open_array, save_model
from metricpipe.tasks.base import seed_of


def _train_user_pairs(
    est, spec: dict, data_url: str, stats_url: str, copy_url: str, block_rows: int, model_url: str
) -> dict:
    """On a worker: fit ``est`` from the user's pairs (global staged rows, mapped to the shuffled copy's
    layout positions), holding at most two of the copy's blocks at a time."""
    init, scale = est.start(load_arrays(stats_url, est.reads_statistics)[0])
    features = open_array(f"{copy_url}/features")
    n, D = features.shape
    row = open_array(f"{copy_url}/row")[:]
    order = np.argsort(row)  # global staged row -> layout position
    pairs = np.stack(
        [order[np.searchsorted(row[order], open_array(f"{data_url}/{k}")[:])] for k in ("pair_i", "pair_j")], axis=1
    )
    y = open_array(f"{data_url}/pair_y")[:]
    t0, c0 = time.perf_counter(), time.thread_time()
    est.fit_pair_blocks(
        pairs, y, lambda b: features[b * block_rows : (b + 1) * block_rows], n, block_rows, D, init, scale
    )
    seconds = time.perf_counter() - t0
    return save_model(model_url, est, spec, seconds, cpu_seconds=time.thread_time() - c0, **fit_facts(est, seconds))


def submit(ctx, spec: dict, est, data, stats, neighbours, unit, name: str, fold: Fold):
    """The train task of one pair learner: its shuffled copy on the client, then one worker task (pairs
    from the labels: :mod:`metricpipe.stages.train.stream`'s; the user's pairs: their own, which every
    fold keeps whole: the rows they join stay train)."""
    seed = seed_of(est.random_state)
    if "pair_i" not in array_names(data.url):
        return stream.submit(ctx, spec, est, data, stats, neighbours, unit, name, fold)
    copy = shuffle.shuffled(ctx, data, seed)
    est = clone(est).set_params(random_state=seed)  # the copy's seed, also when given a RandomState
    return ctx.submit(
        _train_user_pairs, est, spec, data.url, stats.url, copy.url, data.chunk_rows, unit.url, name=f"train-{name}"
    )


def fed(est, info, cfg, n_train: int):
    """Pools of one row-block (or two blocks of the user's pairs): nothing beyond a row-block task."""
    return None


def reads(est, info, cfg, n_rows: int) -> int:
    """Nothing beyond the pools the learner reads (its ``fit_cost`` counts them)."""
    return 0
