"""Train-stage driver for sparse projectors: a seeded, stratified subset of the train split (bounded
by ``train_size``, so read in one task) goes to :meth:`SparseProjector.fit_subset` with the
statistics stage's mean and PCA basis, and the validation rows for early stopping (the val split's,
or the share of train the in-memory ``fit`` holds out, then left out of the subset); no learning
here."""
import re
import time
import warnings

import numpy as np
from sklearn.base import clone

from metricpipe.folds import Fold, fold_split
from metricpipe.storage import array_names, load_arrays, open_array, read_rows, save_model
from metricpipe.tasks.base import seed_of
from metricpipe.stream_train import validation_rows
from metricpipe.tasks.sparse import stratified_subset
from metricpipe.tasks.splits import TRAIN


def training_subset(split: np.ndarray, labels: np.ndarray, size: int, seed) -> np.ndarray:
    """Sorted global indices of about ``size`` train rows, the same share of every class (seeded);
    :func:`metricpipe.tasks.sparse.stratified_subset` among the train split."""
    return stratified_subset(labels, size, seed, among=np.flatnonzero(np.asarray(split) == TRAIN))


def _train_sparse(est, spec, data_url, stats_url, model_url, fold) -> dict:
    est = clone(est)  # fitted here, never the caller's object (a threaded worker shares it)
    stats, _ = load_arrays(stats_url)
    split = fold_split(data_url, fold)
    labels = open_array(f"{data_url}/label")[:]
    key = open_array(f"{data_url}/group")[:] if "group" in array_names(data_url) else labels
    seed = seed_of(est.random_state)
    val = {}
    among = np.flatnonzero(split == TRAIN)
    if est.validates():   # the val split's rows, or the share of train that fit() holds out in memory
        row_keys = open_array(f"{data_url}/row_key")[:][among]
        vrows, keep, _ = validation_rows(est, split, labels, among, np.ones(len(among), bool), row_keys, seed)
        val = {"X_val": read_rows(f"{data_url}/features", vrows), "key_val": key[vrows]}
        among = among[keep]
    rows = stratified_subset(labels, est.train_size, seed, among=among)
    X = read_rows(f"{data_url}/features", rows)
    t0 = time.perf_counter()
    with warnings.catch_warnings():     # check_methods printed the data's shape notes before staging
        for note in est.shape_notes(X.shape[1], len(np.unique(key))):
            warnings.filterwarnings("ignore", message=re.escape(note), category=UserWarning)
        est.fit_subset(X, key[rows], stats["mean"], stats["pca_components"], **val)
    seconds = time.perf_counter() - t0
    return save_model(model_url, est, spec, seconds, final=est.history_[-1], best_iter=est.best_iter_,
                      val_map=est.val_map_)


def submit(ctx, spec: dict, est, data, stats, neighbours, unit, name: str, fold: Fold):
    """Submit the one task that trains a sparse projector; returns the future of its record."""
    return ctx.submit(_train_sparse, est, spec, data.url, stats.url, unit.url, fold, name=f"train-{name}")
