"""Train-stage driver for NML and the linear ML baseline (`metricpipe.tasks.nml.NML`, `LinearML`).

The estimator does all the learning; this module only moves rows to it. On the client the training
rows get their shuffled copy (`metricpipe.shuffle.shuffled`: the seeded layout of
`tasks.stream.layout`, one row-block per layout block). One worker task then feeds the estimator:

- pairs from labels: the endless pools of the copy (`metricpipe.shuffle.stream_pools`, each a
  uniform sample of the training rows) to ``est.fit_stream``, which draws pairs inside each pool;
- user pairs (the staged arrays ``pair_i``, ``pair_j``, ``pair_y``, global row indices): mapped to
  layout positions through the copy's ``row`` array and handed with a reader of the copy's blocks
  to ``est.fit_pair_blocks``, which holds at most two blocks at a time.

LinearML starts from the statistics stage's PCA components; NML from its seeded uniform start.
"""
import time

import numpy as np

from metricpipe import shuffle
from metricpipe.folds import Fold, fold_split
from metricpipe.storage import array_names, load_scalar, open_array, read_rows, save_model
from metricpipe.stream_train import validation_rows
from metricpipe.tasks import moments
from metricpipe.tasks.base import seed_of
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.nml import check_pair_indices
from metricpipe.tasks.splits import SPLIT_NAMES, TRAIN


def check_pairs(i, j, y, split, where: str, random_split: bool = True):
    """User pairs (data.pairs): integer indices of training rows, y in {-1, +1} (``random_split``:
    the split was drawn by data.split.test, not read from the data's split column)."""
    check_pair_indices(i, j, y, len(split), where)
    for name, a in (("i", np.asarray(i)), ("j", np.asarray(j))):
        if (split[a] != TRAIN).any():
            k = int(np.flatnonzero(split[a] != TRAIN)[0])
            part = SPLIT_NAMES[int(split[a[k]])] if 0 <= int(split[a[k]]) < len(SPLIT_NAMES) else "another"
            how = (" (data.split.test draws the test rows at random: give the data a split column to choose "
                   "the training rows)" if part == "test" and random_split else "")
            raise InputError(f"{where}: pair {k} uses row {int(a[k])}, which is in the {part} split, not train; "
                             f"pairs must only join training images{how}")


def _init(est, stats_url: str):
    """LinearML's start and the rows' RMS norm it reads ``lr`` by: the statistics stage's leading PCA
    components (``dim`` rows; fewer when the stage kept fewer, which the estimator refuses) and
    :func:`~metricpipe.tasks.moments.row_scale`; (None, 1.0) for NML."""
    if est.method != "linear-ml":
        return None, 1.0
    scale = moments.row_scale({"mean_sq_norm": load_scalar(stats_url, "mean_sq_norm")})
    comps = open_array(f"{stats_url}/pca_components")
    return comps[:est.resolved_dim(comps.shape[0])], scale


def _train(est, spec: dict, data_url: str, stats_url: str, copy_url: str, block_rows: int, user_pairs: bool,
           model_url: str, fold: Fold) -> dict:
    """On a worker: fit ``est`` from the shuffled copy at ``copy_url`` and save it at ``model_url``."""
    init, scale = _init(est, stats_url)
    features = open_array(f"{copy_url}/features")
    n, D = features.shape
    t0 = time.perf_counter()
    if user_pairs:   # the rows pairs join stay train in every fold (metricpipe.folds)
        row = open_array(f"{copy_url}/row")[:]
        order = np.argsort(row)                 # global staged row -> layout position
        pairs = np.stack([order[np.searchsorted(row[order], open_array(f"{data_url}/{k}")[:])]
                          for k in ("pair_i", "pair_j")], axis=1)
        y = open_array(f"{data_url}/pair_y")[:]
        est.fit_pair_blocks(pairs, y, lambda b: features[b * block_rows:(b + 1) * block_rows], n, block_rows, D,
                            init, scale)
    else:
        keep_pos, n, val = _rows(est, data_url, copy_url, fold)
        t0 = time.perf_counter()
        est.fit_stream(shuffle.stream_pools(copy_url, block_rows, est.random_state, keep_pos), n, D, init, **val,
                       row_scale=scale)
    seconds = time.perf_counter() - t0
    return save_model(model_url, est, spec, seconds, samples_per_second=est.pairs_seen_ / max(seconds, 1e-9),
                      pairs=int(est.n_pairs_), pair_source=est.pair_source_, best_iter=est.best_iter_,
                      val_map=est.val_map_)


def _rows(est, data_url: str, copy_url: str, fold: Fold):
    """(keep mask over the copy's layout or None for every row, rows SGD sees, {X_val, y_val}): the
    fold's train rows less, when ``est`` validates, the share of them ``fit`` holds out in memory
    where the fold has no val rows (its val rows: the user's, or those a selection borrowed)."""
    stored = open_array(f"{data_url}/split")[:]
    split = fold_split(data_url, fold)
    labels = open_array(f"{data_url}/label")[:].astype(np.int64)
    train = np.flatnonzero(stored == TRAIN)
    keys = open_array(f"{data_url}/row_key")[:][train]
    seed = seed_of(est.random_state)
    val, keep, _ = validation_rows(est, split, labels, train, split[train] == TRAIN, keys, seed)
    layout_rows = open_array(f"{copy_url}/row")[:]
    keep_pos = None if keep.all() else keep[np.searchsorted(train, layout_rows)]
    rows = {"X_val": read_rows(f"{data_url}/features", val), "y_val": labels[val]} if len(val) else {}
    return keep_pos, int(keep.sum()), rows


def submit(ctx, spec: dict, est, data, stats, neighbours, unit, name: str, fold: Fold):
    """The train task of one NML / linear ML model: shuffled copy on the client, then one worker task."""
    from sklearn.base import clone
    seed = seed_of(est.random_state)
    copy = shuffle.shuffled(ctx, data, seed)
    user_pairs = "pair_i" in array_names(data.url)
    est = clone(est).set_params(random_state=seed)  # the copy's seed, also when given a RandomState
    return ctx.submit(_train, est, spec, data.url, stats.url, copy.url, data.chunk_rows, user_pairs, unit.url, fold,
                      name=f"train-{name}")
