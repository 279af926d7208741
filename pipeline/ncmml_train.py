"""Train-stage wiring for NCMML, NCMC and k-NN metric learning (`tasks.ncmml`).

Out of core: the task never holds the training set. SGD visits the row-blocks of the staged store
in a seeded random order each epoch and draws its minibatches from the block in hand (the block's
train rows in a seeded permutation, m at a time; k-NN metric learning samples each batch as in
Section 4.2 from the block). Early stopping reads a bounded validation set once: the `val` split
when the store has one, otherwise a seeded, stratified share of the train split that SGD then
never sees. NCMC's centroids come from k-means per class in the input space: k-means++ on a
bounded per-class sample, then Lloyd passes that stream the blocks.
"""
import time

import numpy as np

from metricpipe.storage import load_arrays, open_array, read_attrs, read_rows, save_arrays
from metricpipe.sparse_train import training_subset
from metricpipe.tasks import knn, metrics, ncmml
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.models import LinearModel

TRAIN, VAL = 0, 2
KMEANS_SAMPLE = 2000  # rows per class k-means++ seeds from


def _validation_rows(split, labels, allowed, size, seed):
    val = np.flatnonzero((split == VAL) & allowed)
    if len(val):
        return val[np.sort(np.random.default_rng([seed, 7]).permutation(len(val))[:size])], False
    sub = split.copy()
    sub[~allowed] = -1
    # held out of the train split: at most a fifth of it, so that SGD keeps most of its rows
    size = min(size, int((sub == TRAIN).sum()) // 5)
    return training_subset(sub, labels, size, seed + 1), True


def _read(data_url, rows):
    """Training rows (sorted global indices) as float64."""
    return read_rows(f"{data_url}/features", rows).astype(np.float64)


def _kmeans(data_url, chunks, split, labels, classes, k, iters, seed):
    """k centroids per class (input space): seeds from a stratified sample, Lloyd over the blocks."""
    train = (split == TRAIN) & np.isin(labels, classes)
    sample = training_subset(np.where(train, TRAIN, -1), labels, KMEANS_SAMPLE * len(classes), seed + 2)

    def blocks():
        for a, b in chunks:
            rows = np.flatnonzero(train[a:b])
            if len(rows):
                yield open_array(f"{data_url}/features")[a:b][rows].astype(np.float64), labels[a:b][rows]

    return ncmml.class_kmeans(_read(data_url, sample), labels[sample], classes, k, blocks, iters,
                              np.random.default_rng([seed, 11]))


def _error(sgd, spec, Xv, yv, ref):
    """Top-1 validation error of the current W: kNN (k-NN ML, against the reference rows) or the
    model's own class rule."""
    if spec["method"] == "knnml":
        Xr, yr = ref
        _, nb = knn.block_topk((Xv @ sgd.W.T).astype(np.float32), (Xr @ sgd.W.T).astype(np.float32), spec["k"])
        rank = metrics.knn_class_ranking(yr[nb], sgd.n_classes, spec["k"])
        return float((rank[:, 0] != yv).mean())
    return float((sgd.classify(Xv) != yv).mean())


def _train(spec, data_url, stats_url, chunks, model_url) -> dict:
    stats, _ = load_arrays(stats_url)
    split = open_array(f"{data_url}/split")[:]
    labels = open_array(f"{data_url}/label")[:].astype(np.int64)
    C = len(stats["class_means"])
    classes = np.arange(C) if spec.get("classes") is None else np.array(sorted(set(spec["classes"])))
    if classes.min() < 0 or classes.max() >= C:
        raise InputError(f"The 'classes' parameter of {spec['method']} must list class indices in 0..{C - 1}. "
                         f"Got {spec['classes']} instead.")
    if spec["dim"] > len(stats["pca_components"]):
        raise InputError(f"The 'dim' parameter of {spec['method']} must be <= {len(stats['pca_components'])}, "
                         f"the PCA directions W starts from. Got {spec['dim']} instead.")
    allowed = np.isin(labels, classes)
    val, held_out = _validation_rows(split, labels, allowed, spec["validation"], spec["seed"])
    if len(np.unique(labels[val])) < len(classes):
        raise InputError(f"{spec['method']}: the validation rows miss some classes; raise 'validation' "
                         f"(now {spec['validation']})")
    Xv, yv = _read(data_url, val), labels[val]
    sgd_rows = (split == TRAIN) & allowed
    if held_out:
        sgd_rows[val] = False
    t0 = time.perf_counter()
    W0 = stats["pca_components"][:spec["dim"]]
    ref = None
    if spec["method"] == "ncmml":
        cents, owner = stats["class_means"][classes], classes
        sgd = ncmml.MetricSGD(W0, "dot" if spec["objective"] == "dot" else "ncm", spec["lr"], cents, owner, C)
    elif spec["method"] == "ncmc":
        # centroids of every class (a class left out of training is a new class at test time)
        cents, owner = _kmeans(data_url, chunks, split, labels, np.arange(C), spec["centroids"],
                               spec["kmeans_iters"], spec["seed"])
        if spec["train_centroids"] == 1:  # NCMC-test: the metric learns with one mean per class
            sgd = ncmml.MetricSGD(W0, "ncm", spec["lr"], stats["class_means"][classes], classes, C)
        else:
            mine = np.isin(owner, classes)
            sgd = ncmml.MetricSGD(W0, "ncm", spec["lr"], cents[mine], owner[mine], C)
    else:
        sgd = ncmml.MetricSGD(W0, "knn", spec["lr"], n_classes=C, targets=spec["targets"], k=spec["k"])
        ref_rows = training_subset(np.where(sgd_rows, TRAIN, -1), labels, spec["validation"], spec["seed"] + 3)
        ref = (_read(data_url, ref_rows), labels[ref_rows])
    rng = np.random.default_rng([spec["seed"], 5])
    blocks = [(a, b) for a, b in chunks if sgd_rows[a:b].any()]
    if not blocks:
        raise InputError(f"{spec['method']}: no training rows left for SGD after the validation rows")
    sgd.record(_error(sgd, spec, Xv, yv, ref), None)  # the PCA start is a candidate too
    value = np.nan
    while sgd.steps < spec["iters"]:
        for i in rng.permutation(len(blocks)):
            a, b = blocks[i]
            rows = np.flatnonzero(sgd_rows[a:b])
            X, y = open_array(f"{data_url}/features")[a:b][rows], labels[a:b][rows]
            if spec["method"] == "knnml":
                # fixed targets: each row's k nearest same-class rows (l2) within the block in hand
                tl2 = ncmml.l2_targets(X, y, spec["k"]) if spec["targets"] == "fixed" else None
                batches = []
                for _ in range(max(1, len(rows) // spec["batch"])):
                    drawn = (ncmml.sample_fixed_batch(y, tl2, spec["batch"], 2.0 / 3.0, rng) if tl2 is not None
                             else ncmml.sample_triplet_batch(y, spec["batch"], 2.0 / 3.0, rng))
                    if drawn is not None:
                        batches.append(drawn)
            else:
                perm = rng.permutation(len(rows))
                batches = [(perm[s:s + spec["batch"]], None, None) for s in range(0, len(perm), spec["batch"])]
            for sel, is_pos, fixed in batches:
                with np.errstate(over="ignore", invalid="ignore"):
                    value = sgd.step(X[sel], y[sel], is_pos, fixed)
                if sgd.steps % spec["validate_every"] == 0 or sgd.steps == spec["iters"]:
                    sgd.record(_error(sgd, spec, Xv, yv, ref), value)
                if sgd.steps >= spec["iters"]:
                    break
            if sgd.steps >= spec["iters"]:
                break
    seconds = time.perf_counter() - t0
    err, W, bias, at = sgd.best
    arrays = {}
    if spec["method"] != "knnml":
        arrays = {"centroids": (cents if spec["method"] == "ncmc" else stats["class_means"][classes]).astype(np.float32),
                  "centroid_class": np.asarray(owner if spec["method"] == "ncmc" else classes, np.int32)}
        if bias is not None:
            arrays["class_bias"] = np.full(C, np.nan, np.float32)
            arrays["class_bias"][classes] = bias  # the dot form's biases follow ``classes``
    model = LinearModel(W.T.astype(np.float32), None, {"history": sgd.history, "best_iter": at,
                                                       "val_error": err, "held_out_validation": held_out})
    save_arrays(model_url, {**model.arrays(), **arrays},
                {"spec": spec, "dim": int(W.shape[0]), "fit_meta": model.meta, "identity": False,
                 "score": "euclidean", "class_names": read_attrs(data_url)["classes"],
                 "normalize": read_attrs(data_url)["normalize"]})
    return {"dim": int(W.shape[0]), "score": "euclidean", "fit_seconds": seconds, "best_iter": at,
            "val_error": err}


def submit(ctx, spec, data, stats, unit, name):
    return ctx.submit(_train, spec, data.url, stats.url, data.chunks, unit.url, name=f"train-{name}")
