"""Train-stage wiring for NML and the linear ML baseline (`tasks.nml`).

Supervision is a list of pairs (i, j, y = +-1) over training rows: sampled from the labels (half
similar, half dissimilar, seeded) unless the store carries user pairs. Out of core: the pairs are
grouped by the row-blocks of their two images, and SGD visits the groups in a seeded random
order, holding only the (at most two) blocks of the group in hand; within a group the pairs are
shuffled and taken ``batch`` at a time. NML's input rows are l1-normalised (the chi2 kernel compares
histograms) and must be non-negative.
"""
import time

import numpy as np

from metricpipe.storage import array_names, load_arrays, open_array, save_arrays
from metricpipe.tasks import nml
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.normalize import normalize_rows
from metricpipe.tasks.models import LinearModel

TRAIN = 0


def sample_pairs(labels: np.ndarray, split: np.ndarray, count: int, seed: int):
    """``count`` pairs of distinct training rows, half with equal labels (y = +1), half not (y = -1)."""
    rng = np.random.default_rng([seed, 17])
    train = np.flatnonzero(split == TRAIN)
    y_tr = labels[train]
    n_pos = count // 2
    i = rng.choice(train, count)
    j = np.empty(count, np.int64)
    by_class = {c: train[y_tr == c] for c in np.unique(y_tr)}
    for c, rows in by_class.items():
        mine = np.flatnonzero(labels[i[:n_pos]] == c)
        if len(rows) < 2:
            raise InputError(f"class {c} has one training image; similar pairs need two")
        j[mine] = rows[rng.integers(0, len(rows), len(mine))]
        other = np.flatnonzero(labels[i[n_pos:]] == c) + n_pos
        pool = train[y_tr != c]
        j[other] = pool[rng.integers(0, len(pool), len(other))]
    keep = i != j  # a row paired with itself is dropped
    y = np.where(np.arange(count) < n_pos, 1, -1).astype(np.int8)
    return i[keep], j[keep], y[keep]


def check_pairs(i, j, y, split, where: str):
    """User pairs: integer indices of training rows, y in {-1, +1}."""
    n = len(split)
    if not (len(i) == len(j) == len(y)) or len(i) == 0:
        raise InputError(f"{where}: pairs need arrays i, j, y of one equal, non-zero length; got "
                         f"{len(i)}, {len(j)}, {len(y)}")
    for name, a in (("i", i), ("j", j)):
        if not np.issubdtype(np.asarray(a).dtype, np.integer):
            raise InputError(f"{where}: pairs '{name}' must hold integer row indices; got {np.asarray(a).dtype}")
        bad = (a < 0) | (a >= n)
        if bad.any():
            raise InputError(f"{where}: pair index {name}={int(a[bad][0])} is out of range 0..{n - 1} "
                             f"(pair {int(np.flatnonzero(bad)[0])}); fix or drop it")
        if (split[a] != TRAIN).any():
            k = int(np.flatnonzero(split[a] != TRAIN)[0])
            raise InputError(f"{where}: pair {k} uses row {int(a[k])}, which is not in the train split; pairs "
                             f"must only join training images")
    if not np.isin(y, (-1, 1)).all():
        raise InputError(f"{where}: pair labels y must be +1 (similar) or -1 (dissimilar); got "
                         f"{sorted(set(np.unique(y).tolist()) - {-1, 1})[:3]}")


def _block(data_url, chunks, b, kind):
    a, z = chunks[b]
    X = open_array(f"{data_url}/features")[a:z]
    if kind == "nml":
        nml.check_nonnegative(X, f"{data_url}/features rows {a}..{z - 1}")
        X = normalize_rows(X, "l1")
    return np.asarray(X, np.float32)


def _train(spec, data_url, stats_url, chunks, model_url) -> dict:
    kind = "nml" if spec["method"] == "nml" else "linear"
    split = open_array(f"{data_url}/split")[:]
    labels = open_array(f"{data_url}/label")[:]
    if "pair_i" in array_names(data_url):
        i, j, y = (open_array(f"{data_url}/{k}")[:] for k in ("pair_i", "pair_j", "pair_y"))
        source = "user"
    else:
        i, j, y = sample_pairs(labels, split, spec["pairs"], spec["seed"])
        source = "labels"
    i, j, y = i.astype(np.int64), j.astype(np.int64), y.astype(np.float32)
    starts = np.array([a for a, _ in chunks])
    bi, bj = np.searchsorted(starts, i, "right") - 1, np.searchsorted(starts, j, "right") - 1
    lo, hi = np.minimum(bi, bj), np.maximum(bi, bj)
    # pairs sorted by the pair of blocks they join: group g is by_group[bounds[g]:bounds[g + 1]]
    group = lo * len(chunks) + hi
    by_group = np.argsort(group, kind="stable")
    bounds = np.flatnonzero(np.r_[True, np.diff(group[by_group]) != 0, True])
    rng = np.random.default_rng([spec["seed"], 19])
    D = open_array(f"{data_url}/features").shape[1]
    if kind == "nml":
        L0 = rng.uniform(-0.5, 0.5, (spec["dim"], D))               # Algorithm 1's initialisation
    else:
        stats, _ = load_arrays(stats_url)
        if spec["dim"] > len(stats["pca_components"]):
            raise InputError(f"The 'dim' parameter of linear-ml must be <= {len(stats['pca_components'])}. "
                             f"Got {spec['dim']} instead.")
        L0 = stats["pca_components"][:spec["dim"]]
    sgd = nml.PairSGD(L0, kind, spec["lr"], spec["bias"], spec["margin"], spec["learn_bias"], spec["optimizer"],
                      spec.get("threads", 1))
    history, every = [], max(1, spec["iters"] // 50)
    t0 = time.perf_counter()
    losses = []
    while sgd.pairs_seen < spec["iters"]:
        for g in rng.permutation(len(bounds) - 1):
            sel = by_group[bounds[g]:bounds[g + 1]]
            b1, b2 = int(lo[sel[0]]), int(hi[sel[0]])
            held = [b1] if b1 == b2 else [b1, b2]
            cat = np.concatenate([_block(data_url, chunks, b, kind) for b in held])  # the group's rows
            offset = np.zeros(len(chunks), np.int64)
            for k, b in enumerate(held):
                offset[b] = sum(chunks[h][1] - chunks[h][0] for h in held[:k]) - chunks[b][0]
            pi, pj = i[sel] + offset[bi[sel]], j[sel] + offset[bj[sel]]    # rows of ``cat``
            order = rng.permutation(len(sel))
            sel, pi, pj = sel[order], pi[order], pj[order]
            for s in range(0, len(sel), spec["batch"]):
                p = sel[s:s + spec["batch"]]
                Xi, Xj = cat[pi[s:s + spec["batch"]]], cat[pj[s:s + spec["batch"]]]
                losses.append(sgd.step(Xi, Xj, y[p]))
                if sgd.pairs_seen // every != (sgd.pairs_seen - len(p)) // every:
                    history.append({"iter": int(sgd.pairs_seen), "hinge": float(np.mean(losses))})
                    losses = []
                if sgd.pairs_seen >= spec["iters"]:
                    break
            if sgd.pairs_seen >= spec["iters"]:
                break
    seconds = time.perf_counter() - t0
    meta = {"history": history, "pairs": int(len(y)), "pair_source": source, "bias": sgd.bias}
    if kind == "nml":
        model = nml.ChiEmbedding(sgd.L, meta)
        attrs = {"kind": "chi2-embedding"}
    else:
        model = LinearModel(sgd.L.T.astype(np.float32), None, meta)
        attrs = {}
    save_arrays(model_url, model.arrays(), {"spec": spec, "dim": int(spec["dim"]), "fit_meta": meta,
                                            "identity": False, "score": "euclidean", **attrs})
    return {"dim": int(spec["dim"]), "score": "euclidean", "fit_seconds": seconds,
            "samples_per_second": sgd.pairs_seen / max(seconds, 1e-9), "cost": model.cost(D)}


def submit(ctx, spec, data, stats, unit, name):
    return ctx.submit(_train, spec, data.url, stats.url, data.chunks, unit.url, name=f"train-{name}")
