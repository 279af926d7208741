"""Train-stage wiring for SLEM (linear and kernel) and the ESVM baseline (`tasks.slem`).

The negative pool is a seeded sample of ``negatives.count`` rows of the split ``negatives.split``
(never test). Linear SLEM needs only the pool's mean and covariance: when the pool is the whole train
split they come from the statistics stage, otherwise they are accumulated block by block (the pool is
never gathered). Kernel SLEM and ESVM hold the pool itself (count x D; kernel SLEM also its n x n
kernel matrix), so the pool size is capped at MAX_POOL.

The fit records the offline cost (moments or factorisation and solve setup) and the online cost per
image, measured by encoding up to ONLINE_SAMPLE pool images with the fitted encoder; the report
lists them with the stage timings.
"""
import time

import numpy as np

from metricpipe.config import SPLIT_NAMES
from metricpipe.storage import load_arrays, open_array, read_rows, save_arrays
from metricpipe.tasks import moments, slem
from metricpipe.tasks.errors import InputError

TRAIN = SPLIT_NAMES.index("train")
MAX_POOL = 20000        # n x n float64 kernel matrix: 3.2 GB at this size
ONLINE_SAMPLE = 256


def negative_rows(split: np.ndarray, neg: dict, where: str) -> np.ndarray:
    """Sorted global rows of the negative pool."""
    code = SPLIT_NAMES.index(neg["split"])
    rows = np.flatnonzero(split == code)
    if len(rows) < 2:
        have = ", ".join(f"{SPLIT_NAMES[c]} ({n})" for c, n in enumerate(np.bincount(split)) if n)
        raise InputError(f"{where}: negatives.split {neg['split']!r} holds {len(rows)} image(s); SLEM needs a pool "
                         f"of at least 2; the data has {have}")
    if neg["count"] is not None and neg["count"] < len(rows):
        rng = np.random.default_rng([neg["seed"], 29])
        rows = np.sort(rng.choice(rows, neg["count"], replace=False))
    return rows


def _by_block(chunks, rows):
    """(start, stop, local positions) of the row-blocks holding ``rows``."""
    for a, b in chunks:
        lo, hi = np.searchsorted(rows, [a, b])
        if hi > lo:
            yield a, b, rows[lo:hi] - a


def _gather(data_url: str, rows) -> np.ndarray:
    return read_rows(f"{data_url}/features", rows).astype(np.float64)


def _pool_moments(data_url: str, chunks, rows) -> tuple[np.ndarray, np.ndarray]:
    """(mean, biased covariance) of the pool, one row-block at a time, folded as they come (one D x D
    scatter in hand)."""
    X = open_array(f"{data_url}/features")
    m = None
    for a, b, local in _by_block(chunks, rows):
        part = moments.partial_moments(X[a:b][local], np.zeros(len(local), np.int64), 1)
        m = part if m is None else moments.combine_moments(m, part)
    return m.mean, m.m2 / m.n


def _train(spec, data_url, stats_url, chunks, model_url, where) -> dict:
    split = open_array(f"{data_url}/split")[:]
    neg = spec["negatives"]
    rows = negative_rows(split, neg, where)
    D = open_array(f"{data_url}/features").shape[1]
    rank = None if spec.get("rank") in (None, "full") else int(spec["rank"])
    kernel = spec.get("kernel", "linear")
    if spec["method"] == "esvm" or kernel != "linear":
        if len(rows) > MAX_POOL:
            raise InputError(f"{where}: negatives.count {len(rows)} is above {MAX_POOL} for {spec['method']} "
                             f"{kernel} (it holds the pool, and kernel SLEM its n x n kernel matrix); lower "
                             f"negatives.count")
    t0 = time.perf_counter()
    meta = {"negatives": int(len(rows)), "negatives_split": neg["split"]}
    if spec["method"] == "esvm":
        Xneg = _gather(data_url, rows)
        model = slem.ESVMEncoder(Xneg, spec["lambda"], spec["theta"], spec["epochs"], spec["batch"], spec["seed"], meta)
    elif kernel == "linear":
        if neg["split"] == "train" and len(rows) == np.count_nonzero(split == TRAIN):  # the statistics stage's
            stats, _ = load_arrays(stats_url)
            n = int(stats["n_samples"])
            mu, cov = stats["mean"], stats["covariance"] * ((n - 1) / n)
            meta["moments"] = "statistics stage"
        else:
            mu, cov = _pool_moments(data_url, chunks, rows)
            meta["moments"] = "pool, streamed"
        A = slem.regularised_covariance(cov, spec["lambda"])
        model = slem.LinearSLEM(mu, slem.factor(A, where), meta)
        Xneg = None
    else:
        Xneg = _gather(data_url, rows)
        model = slem.KernelSLEM.fit(Xneg, spec["lambda"], kernel, spec["gamma"], spec["decomposition"], rank, meta)
    offline = time.perf_counter() - t0
    sample = rows[:ONLINE_SAMPLE]
    Xs = _gather(data_url, sample)
    t1 = time.perf_counter()
    model.transform(Xs)
    online = (time.perf_counter() - t1) / len(sample)
    model.meta.update({"offline_seconds": offline, "online_seconds_per_image": online})
    dim = model.n_components(D)
    save_arrays(model_url, model.arrays(), {"spec": spec, "dim": dim, "fit_meta": model.meta, "identity": False,
                                            "kind": model.kind, "score": model.score, **model.attrs()})
    # the measured times go to the model's fit_meta (the report's timings table), not to the records,
    # which must be the same on every rerun
    return {"dim": dim, "score": model.score, "fit_seconds": offline, "cost": model.cost(D)}


def submit(ctx, spec, data, stats, unit, name):
    if spec["method"] == "slem" and spec["kernel"] == "linear" and not stats.meta().get("dense", True):
        raise InputError(f"{ctx.config.source_file}: methods: linear slem needs the D x D covariance, but D = "
                         f"{data.n_features} is above statistics.max_dense_dim; raise statistics.max_dense_dim "
                         f"(memory: D^2 x 8 bytes) or use a kernel SLEM")
    return ctx.submit(_train, spec, data.url, stats.url, data.chunks, unit.url, f"{ctx.config.source_file}: {name}",
                      name=f"train-{name}")
