"""NML and linear ML (pairs) against scikit-learn's NCA and LDA on the same Fashion-MNIST subset
(issue #9, item 5). Prints fit times, their ratios and retrieval figures measured in one run;
asserts nothing about time.

    METRICPIPE_DATA=/path/to/fashion-mnist PYTHONPATH=. python benchmarks/bench_pair_peers.py [--dim 16]

Protocol (the NML example's, scaled down): seeded subsets of the train and test splits,
l2-normalised pixels (784-d; NML l1-normalises them itself). Pairs are sampled from the training
labels by the pipeline's sampler (half similar) and seen in mini-batches of 64 by the pipeline's
learner (`tasks.nml.PairSGD`): linear ML plain SGD from PCA (lr 3, b = 1, m = 0.2), NML Adam from
uniform(-0.5, 0.5) (lr 0.001, b = 0.1, m = 0.02). NCA (scikit-learn, PCA init, 50 iterations) and
LDA (9 components) learn from the labels of the same images, so they see more supervision than a
pair list. Each test image queries the other test images: mAP and mprec@10 (precision@10 averaged
per class). metric-learn's pair learners (ITML, MMC) need scikit-learn < 1.6 and are not run here.
"""
import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis  # noqa: E402
from sklearn.neighbors import NeighborhoodComponentsAnalysis  # noqa: E402

from metricpipe.nml_train import sample_pairs  # noqa: E402
from metricpipe.tasks import nml  # noqa: E402
from metricpipe.tasks.normalize import normalize_rows  # noqa: E402
from timing import fashion_subset, retrieval  # noqa: E402


def train_pairs(kind, L0, X, labels, pairs, seen, lr, bias, margin, optimizer, seed=0):
    """The pipeline's pair SGD on in-memory rows: (learner, seconds)."""
    i, j, y = sample_pairs(labels, np.zeros(len(labels), np.int8), pairs, seed)
    rng = np.random.default_rng([seed, 19])
    Xin = normalize_rows(X, "l1").astype(np.float32) if kind == "nml" else X.astype(np.float32)
    sgd = nml.PairSGD(L0, kind, lr, bias, margin, optimizer=optimizer)
    t = time.perf_counter()
    while sgd.pairs_seen < seen:
        order = rng.permutation(len(y))
        for s in range(0, len(order), 64):
            b = order[s:s + 64]
            sgd.step(Xin[i[b]], Xin[j[b]], y[b].astype(np.float32))
            if sgd.pairs_seen >= seen:
                break
    return sgd, time.perf_counter() - t


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--train", type=int, default=5000)
    p.add_argument("--test", type=int, default=2000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--pairs", type=int, default=200_000, help="pairs sampled from the training labels")
    p.add_argument("--seen", type=int, default=400_000, help="pairs seen by SGD")
    a = p.parse_args()
    Xtr, ytr, Xte, yte = fashion_subset(a.train, a.test, 0, np.float64)
    rows, fits = [], {}

    t = time.perf_counter()
    mean = Xtr.mean(0)
    P = np.linalg.svd(Xtr - mean, full_matrices=False)[2]
    fits["PCA"] = time.perf_counter() - t
    rows.append(("raw pixels (784-d)", None, retrieval(Xte, yte)))
    rows.append((f"PCA-{a.dim}", fits["PCA"], retrieval((Xte - mean) @ P[:a.dim].T, yte)))

    lin, fits["linear ML"] = train_pairs("linear", P[:a.dim], Xtr, ytr, a.pairs, a.seen, 3.0, 1.0, 0.2, "sgd")
    rows.append((f"linear ML d={a.dim} (metricpipe)", fits["linear ML"], retrieval(lin.embed(Xte.astype(np.float32)), yte)))
    L0 = np.random.default_rng([0, 19]).uniform(-0.5, 0.5, (a.dim, Xtr.shape[1]))
    nm, fits["NML"] = train_pairs("nml", L0, Xtr, ytr, a.pairs, a.seen, 0.001, 0.1, 0.02, "adam")
    rows.append((f"NML d={a.dim} (metricpipe)", fits["NML"],
                 retrieval(nm.embed(normalize_rows(Xte, "l1").astype(np.float32)), yte)))

    t = time.perf_counter()
    nca = NeighborhoodComponentsAnalysis(a.dim, init="pca", max_iter=50, random_state=0).fit(Xtr, ytr)
    fits["NCA"] = time.perf_counter() - t
    rows.append((f"NCA d={a.dim} (scikit-learn)", fits["NCA"], retrieval(nca.transform(Xte), yte)))
    t = time.perf_counter()
    C = len(np.unique(ytr))
    lda = LinearDiscriminantAnalysis(n_components=C - 1).fit(Xtr, ytr)
    fits["LDA"] = time.perf_counter() - t
    rows.append((f"LDA d={C - 1} (scikit-learn)", fits["LDA"], retrieval(lda.transform(Xte), yte)))

    print(f"{a.train} train / {a.test} test images; {a.pairs:,} pairs sampled, {a.seen:,} seen; one thread")
    print(f"{'model':<34}{'fit s':>9}{'mAP':>9}{'mprec@10':>10}")
    for name, sec, r in rows:
        print(f"{name:<34}{'' if sec is None else f'{sec:.2f}':>9}{r['map']:>9.4f}{r['mprec@10']:>10.4f}")
    print(f"NCA / linear ML fit time: {fits['NCA'] / fits['linear ML']:.1f}x; NCA / NML fit time: "
          f"{fits['NCA'] / fits['NML']:.1f}x")


if __name__ == "__main__":
    main()
