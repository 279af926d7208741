"""Shared by the benchmark scripts (run from the repository root: python benchmarks/bench_*.py)."""

import time


def timed(f, repeat=5):
    """(mean seconds per call over ``repeat`` calls after one warm-up call, the last result)."""
    f()
    t = time.perf_counter()
    for _ in range(repeat):
        out = f()
    return (time.perf_counter() - t) / repeat, out


def interleaved_min(fs: dict, repeat: int = 9) -> dict:
    """{name: the least seconds of ``repeat`` calls} for each callable in ``fs``, called in turn
    (a, b, a, b, ...) after one warm-up call each: on a VM whose memory speed drifts within a run,
    a ratio of two such minima compares the two at the same moments."""
    best = {}
    for name, f in fs.items():
        f()
        best[name] = float("inf")
    for _ in range(repeat):
        for name, f in fs.items():
            t = time.perf_counter()
            f()
            best[name] = min(best[name], time.perf_counter() - t)
    return best


def fashion_subset(n_train: int, n_test: int, seed: int = 0, dtype=None):
    """(X_train, y_train, X_test, y_test): seeded subsets of Fashion-MNIST's train and test splits,
    l2-normalised pixels (METRICPIPE_DATA, ../shared or the Debian path), labels as given."""
    import numpy as np

    from metricpipe.config import parse_config
    from metricpipe.sources import open_source

    src = open_source(parse_config({"data": {"source": "fashion-mnist"}}).data)
    X = src.reader.read(0, src.reader.shape[0]).astype(dtype or np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    rng = np.random.default_rng(seed)
    tr = rng.choice(np.flatnonzero(src.split == "train"), n_train, replace=False)
    te = rng.choice(np.flatnonzero(src.split == "test"), n_test, replace=False)
    return X[tr], src.labels[tr], X[te], src.labels[te]


def retrieval(Z, y, ks=(10,), score: str = "euclidean") -> dict:
    """Category retrieval on codes Z: each row queries all the others, relevant = same label, scored
    by the pipeline's own metrics (`tasks.metrics`). Returns {"map": ..., "mprec@K": ...}."""
    import numpy as np

    from metricpipe.tasks import metrics

    Z = np.asarray(Z, np.float32)
    dist = metrics.sq_distances(Z, Z) if score == "euclidean" else -(Z @ Z.T)
    own = np.eye(len(Z), dtype=bool)
    dist[own] = np.inf
    rel = (y[:, None] == y[None, :]) & ~own
    out = metrics.retrieval_scores(dist, rel, ks)
    res = {"map": float(np.nanmean(out["ap"]))}
    for j, k in enumerate(ks):
        res[f"mprec@{k}"] = float(metrics.class_average(out["prec"][:, j], y))
    return res
