"""Train driver for the SGD learners that take pools of training rows (NCMML, NCMC, k-NN ML).

The estimator does the learning (``est.fit_stream``); this driver only moves data to it on a
worker: the statistics stage's result (W's PCA start, class means), the validation rows (the
``val`` split when the data has one, else the stratified share of the train split that
``tasks.stream.validation_split`` holds out, exactly as ``est.fit`` does in memory), and the pools
of the shuffled copy of the training rows (``pipeline.shuffle``). The task holds one pool, the
validation rows and, for NCMC's k-means, a bounded sample; never the training set.
"""
import time

import numpy as np

from metricpipe import shuffle
from metricpipe.folds import Fold, fold_split
from metricpipe.storage import load_arrays, open_array, read_rows, save_model
from metricpipe.tasks import moments, stream
from metricpipe.tasks.base import seed_of
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.splits import TRAIN, VAL


def validation_rows(est, split, labels, train, allowed_train, keys, seed, names=None):
    """(global validation rows, keep mask over train positions, whether they were held out of the
    train split) for an estimator with ``validation`` rows at most: none when it does not validate
    (a refit); else the ``val`` rows of ``split`` (the user's, or those a selection borrowed; of the
    classes it trains on: ``names``, the class names in code order, are those NCMML's ``classes``
    lists), else the stratified share of its train rows that its in-memory ``fit`` holds out too.
    ``train``: the stored train rows; ``allowed_train``: those it may fit; ``keys``: their content keys."""
    keep = allowed_train.copy()
    if not est.validates():
        return np.zeros(0, np.int64), keep, False
    classes = est.trained_classes(names) if hasattr(est, "trained_classes") else np.unique(labels)
    val = np.flatnonzero((split == VAL) & np.isin(labels, classes))
    if len(val):  # a seeded sample of at most ``validation`` rows
        return stream.seeded_sample(val, est.validation, seed), keep, False
    pos = np.flatnonzero(allowed_train)
    vpos = pos[stream.validation_split(labels[train][pos], est.validation, keys[pos], seed)]
    keep[vpos] = False
    return train[vpos], keep, True


def kmeans_centroids(est, data_url: str, chunks: list, rows: np.ndarray, labels: np.ndarray, n_classes: int):
    """NCMC's k centroids per class (``est.kmeans``) over the staged rows where ``rows`` (n_rows,) is
    True: k-means++ on a stratified sample of them, Lloyd passes over the row-blocks (the task holds
    the sample and one block). Returns (centroids in the input space, their class codes)."""
    D = open_array(f"{data_url}/features").shape[1]
    fit_rows = np.flatnonzero(rows)
    sample = fit_rows[est.kmeans_sample(labels[fit_rows], open_array(f"{data_url}/row_key")[:][fit_rows],
                                        seed_of(est.random_state), est.kmeans_per_class(n_classes, D), est.centroids)]

    def blocks():
        for a, b in chunks:
            mine = np.flatnonzero(rows[a:b])
            if len(mine):
                yield open_array(f"{data_url}/features")[a:b][mine].astype(np.float64), labels[a:b][mine]
    return est.kmeans(read_rows(f"{data_url}/features", sample), labels[sample], blocks, n_classes,
                      np.bincount(labels[fit_rows], minlength=n_classes))


def _train(est, spec: dict, data_url: str, stats_url: str, shuffled_url: str, chunks: list, block_rows: int,
           model_url: str, names: list, fold: Fold) -> dict:
    stats, _ = load_arrays(stats_url)
    stored = open_array(f"{data_url}/split")[:]
    split = fold_split(data_url, fold)      # the rows this model may fit: stored train less borrowed rows
    labels = open_array(f"{data_url}/label")[:].astype(np.int64)
    seed = seed_of(est.random_state)
    C = len(stats["class_means"])
    train = np.flatnonzero(stored == TRAIN)   # the statistics' rows and the shuffled copy's
    allowed = np.isin(labels[train], est.trained_classes(names)) & (split[train] == TRAIN)
    keys = open_array(f"{data_url}/row_key")[:][train]
    val, keep, held_out = validation_rows(est, split, labels, train, allowed, keys, seed, names)
    if not keep.any():
        raise InputError(f"{spec['method']}: no training rows left for SGD after the validation rows")
    Xv, yv = (read_rows(f"{data_url}/features", val), labels[val]) if len(val) else (None, None)
    layout_rows = open_array(f"{shuffled_url}/row")[:]
    keep_pos = keep[np.searchsorted(train, layout_rows)]
    extra = {}
    # rows that score (validation; the new classes' monitor) or that a selection borrowed leave the
    # class means and NCMC's centroids, as in-memory fit leaves them out: a class mean holding its own
    # validation rows makes their error optimistic
    scoring = split.copy()
    if held_out:
        scoring[val] = VAL
    if hasattr(est, "kmeans"):  # NCMC: centroids by k-means over the train rows
        extra["centroids"] = kmeans_centroids(est, data_url, chunks, scoring == TRAIN, labels, C)
    elif getattr(est, "classes", None) is not None and est.method == "ncmml" and est.validates():
        others = ~np.isin(labels, est.trained_classes(names))     # monitor the other classes
        new = np.flatnonzero((split == VAL) & others)
        carved = not len(new)
        if carved:
            pos = np.flatnonzero(others[train] & (split[train] == TRAIN))
            new = train[pos[stream.validation_split(labels[train][pos], est.validation, keys[pos], seed)]]
        new = stream.seeded_sample(new, est.validation, seed)
        if carved:
            scoring[new] = VAL
        extra.update(X_new=read_rows(f"{data_url}/features", new), y_new=labels[new])
    elif hasattr(est, "reference_rows") and est.validates():  # k-NN ML: the rows validation queries search
        ref = train[est.reference_rows(labels[train], keep, keys, est.validation, seed)]
        extra["reference"] = (read_rows(f"{data_url}/features", ref), labels[ref])
    out = np.flatnonzero((stored == TRAIN) & (scoring != TRAIN))   # (sorted, as in-memory fit's X[~rows])
    if len(out):   # at most the borrowed share of train (10,000 rows) and ``validation`` rows more
        stats = moments.without_rows(stats, read_rows(f"{data_url}/features", out), labels[out])
    t0 = time.perf_counter()
    est.fit_stream(stats, shuffle.stream_pools(shuffled_url, block_rows, seed, keep_pos), Xv, yv, labels=names,
                   **extra)
    extra_facts = {k: getattr(est, f"{k}_") for k in ("val_error_new_classes", "best_iter_new_classes")
                   if getattr(est, f"{k}_", None) is not None}
    return save_model(model_url, est, spec, time.perf_counter() - t0, best_iter=est.best_iter_,
                      val_error=est.val_error_, held_out_validation=held_out, **extra_facts)


def submit(ctx, spec, est, data, stats, neighbours, unit, name, fold: Fold):
    shuffled = shuffle.shuffled(ctx, data, seed_of(est.random_state))
    return ctx.submit(_train, est, spec, data.url, stats.url, shuffled.url, data.chunks, data.chunk_rows, unit.url,
                      [c.item() if hasattr(c, "item") else c for c in data.classes], fold, name=f"train-{name}")
