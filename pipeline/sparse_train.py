"""Train-stage wiring for sparse projectors: a seeded, stratified subset of the train split is read
block by block and centred; the learner starts from the PCA projectors of the statistics stage."""
import time

import numpy as np
import scipy.sparse

from metricpipe.storage import array_names, load_arrays, open_array, read_rows, save_arrays
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.models import LinearModel
from metricpipe.tasks.sparse import SparseProjector

TRAIN = 0


def training_subset(split: np.ndarray, labels: np.ndarray, size: int, seed: int) -> np.ndarray:
    """Sorted global indices of ``size`` train rows, the same share of every class (seeded)."""
    train = np.flatnonzero(split == TRAIN)
    if size >= len(train):
        return train
    rng = np.random.default_rng(seed)
    picked = []
    for c in np.unique(labels[train]):
        rows = train[labels[train] == c]
        picked.append(rng.choice(rows, max(1, int(round(size * len(rows) / len(train)))), replace=False))
    return np.sort(np.concatenate(picked))


def _train_sparse(spec, data_url, stats_url, model_url) -> dict:
    stats, _ = load_arrays(stats_url)
    split = open_array(f"{data_url}/split")[:]
    labels = open_array(f"{data_url}/label")[:]
    key = open_array(f"{data_url}/group")[:] if "group" in array_names(data_url) else labels
    rows = training_subset(split, labels, spec["train_size"], spec["seed"])
    mean = stats["mean"]
    X = read_rows(f"{data_url}/features", rows).astype(np.float64) - mean
    if spec["dim"] > len(stats["pca_components"]):
        raise InputError(f"The 'dim' parameter of sparse must be <= {len(stats['pca_components'])}, the PCA "
                         f"projectors available to start from. Got {spec['dim']} instead.")
    U0 = stats["pca_components"][:spec["dim"]].T
    t0 = time.perf_counter()
    learner = SparseProjector(sparsity=spec["sparsity"], queries=spec["queries"], epsilon=spec["epsilon"],
                              max_iter=spec["max_iter"], anneal=spec["anneal"], seed=spec["seed"],
                              record_every=max(1, spec["max_iter"] // 50)).fit(X, key[rows], U0)
    seconds = time.perf_counter() - t0
    U = learner.U_
    W = scipy.sparse.csc_array(U) if spec["sparsity"] > 0 else U
    model = LinearModel(W, (-mean.astype(np.float32) @ U).astype(np.float32),
                        {"history": learner.history}, score="inner")
    cost = model.cost(len(mean))
    save_arrays(model_url, model.arrays(), {"spec": spec, "dim": int(U.shape[1]), "fit_meta": model.meta,
                                            "identity": False, "score": "inner"})
    return {"dim": int(U.shape[1]), "score": "inner", "fit_seconds": seconds, "cost": cost,
            "final": learner.history[-1]}


def submit(ctx, spec, data, stats, unit, name):
    return ctx.submit(_train_sparse, spec, data.url, stats.url, unit.url, name=f"train-{name}")
