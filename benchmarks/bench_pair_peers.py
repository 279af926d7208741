"""NML and linear ML (pairs) against scikit-learn's NCA and LDA on the same Fashion-MNIST subset
(issue #9, item 5). Prints fit times, their ratios and retrieval figures measured in one run;
asserts nothing about time.

    METRICPIPE_DATA=/path/to/fashion-mnist PYTHONPATH=. python benchmarks/bench_pair_peers.py [--dim 16]

Protocol (the NML example's, scaled down): seeded subsets of the train and test splits,
l2-normalised pixels (784-d; NML l1-normalises them itself). The pipeline's estimators
(`tasks.nml.LinearML`, `tasks.nml.NML`) learn from the training labels with ``fit(X, y)``: pairs
drawn inside the pools of the seeded row layout (half similar; ``--pairs`` per pass over the
rows), seen in mini-batches of 64: linear ML plain SGD from PCA (lr 3, b = 1, m = 0.2; its fit
time includes the PCA of the start), NML Adam from uniform(-0.5, 0.5) (lr 0.001, b = 0.1,
m = 0.02). NCA (scikit-learn, PCA init, 50 iterations) and LDA (9 components) learn from the
labels of the same images, so they see more supervision than a pair list. Each test image queries
the other test images: mAP and mprec@10 (precision@10 averaged per class). metric-learn's pair
learners (ITML, MMC) need scikit-learn < 1.6 and are not run here.
"""

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis  # noqa: E402
from sklearn.neighbors import NeighborhoodComponentsAnalysis  # noqa: E402
from timing import fashion_subset, retrieval  # noqa: E402

from metricpipe.tasks.nml import NML, LinearML  # noqa: E402


def train_pairs(est, X, labels):
    """The pipeline's estimator fitted in memory on the labelled rows: (estimator, seconds)."""
    t = time.perf_counter()
    est.fit(X.astype(np.float32), labels)
    return est, time.perf_counter() - t


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--train", type=int, default=5000)
    p.add_argument("--test", type=int, default=2000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--pairs", type=int, default=200_000, help="pairs drawn from the labels per pass over the rows")
    p.add_argument("--seen", type=int, default=400_000, help="pairs seen by SGD")
    a = p.parse_args()
    Xtr, ytr, Xte, yte = fashion_subset(a.train, a.test, 0, np.float64)
    rows, fits = [], {}

    t = time.perf_counter()
    mean = Xtr.mean(0)
    P = np.linalg.svd(Xtr - mean, full_matrices=False)[2]
    fits["PCA"] = time.perf_counter() - t
    rows.append(("raw pixels (784-d)", None, retrieval(Xte, yte)))
    rows.append((f"PCA-{a.dim}", fits["PCA"], retrieval((Xte - mean) @ P[: a.dim].T, yte)))

    common = {"dim": a.dim, "pairs": a.pairs, "iters": a.seen, "batch": 64, "random_state": 0}
    lin, fits["linear ML"] = train_pairs(LinearML(lr=3.0, bias=1.0, margin=0.2, optimizer="sgd", **common), Xtr, ytr)
    rows.append((f"linear ML d={a.dim} (metricpipe)", fits["linear ML"], retrieval(lin.transform(Xte), yte)))
    nm, fits["NML"] = train_pairs(NML(lr=0.001, bias=0.1, margin=0.02, optimizer="adam", **common), Xtr, ytr)
    rows.append((f"NML d={a.dim} (metricpipe)", fits["NML"], retrieval(nm.transform(Xte), yte)))

    t = time.perf_counter()
    nca = NeighborhoodComponentsAnalysis(a.dim, init="pca", max_iter=50, random_state=0).fit(Xtr, ytr)
    fits["NCA"] = time.perf_counter() - t
    rows.append((f"NCA d={a.dim} (scikit-learn)", fits["NCA"], retrieval(nca.transform(Xte), yte)))
    t = time.perf_counter()
    C = len(np.unique(ytr))
    lda = LinearDiscriminantAnalysis(n_components=C - 1).fit(Xtr, ytr)
    fits["LDA"] = time.perf_counter() - t
    rows.append((f"LDA d={C - 1} (scikit-learn)", fits["LDA"], retrieval(lda.transform(Xte), yte)))

    print(f"{a.train} train / {a.test} test images; {a.pairs:,} pairs drawn per pass, {a.seen:,} seen; one thread")
    print(f"{'model':<34}{'fit s':>9}{'mAP':>9}{'mprec@10':>10}")
    for name, sec, r in rows:
        print(f"{name:<34}{'' if sec is None else f'{sec:.2f}':>9}{r['map']:>9.4f}{r['mprec@10']:>10.4f}")
    print(
        f"NCA / linear ML fit time: {fits['NCA'] / fits['linear ML']:.1f}x; NCA / NML fit time: "
        f"{fits['NCA'] / fits['NML']:.1f}x"
    )


if __name__ == "__main__":
    main()
