"""NCMML against scikit-learn's NCA and LDA on the same Fashion-MNIST subset (issue #9, item 5).
Prints fit times, their ratios and nearest-class-mean / 1-NN errors measured in one run; asserts
nothing about time.

    METRICPIPE_DATA=/path/to/fashion-mnist PYTHONPATH=. python benchmarks/bench_ncmml_peers.py [--train 5000]

Protocol: seeded subsets of the train and test splits, l2-normalised pixels (784-d). NCMML learns a
32 x 784 W from the PCA start with the pipeline's learner (`tasks.ncmml.MetricSGD`, lr 30, batches
of 1,000, 2,000 steps, no early stopping). NCA (scikit-learn, n_components 32, PCA init, max_iter
50) and LDA (9 components: classes - 1) are fitted on the same images. Every projection is scored
by the nearest class mean of the projected training images and by 1-NN.
"""

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis  # noqa: E402
from sklearn.neighbors import KNeighborsClassifier, NearestCentroid, NeighborhoodComponentsAnalysis  # noqa: E402
from timing import fashion_subset  # noqa: E402

from metricpipe.tasks import ncmml  # noqa: E402


def load(n_train, n_test, seed=0):
    Xtr, ytr, Xte, yte = fashion_subset(n_train, n_test, seed, np.float64)
    classes = np.unique(np.concatenate([ytr, yte]))
    return Xtr, np.searchsorted(classes, ytr), Xte, np.searchsorted(classes, yte)


def errors(Ztr, ytr, Zte, yte):
    ncm = 1 - NearestCentroid().fit(Ztr, ytr).score(Zte, yte)
    nn1 = 1 - KNeighborsClassifier(1).fit(Ztr, ytr).score(Zte, yte)
    return ncm, nn1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--train", type=int, default=5000)
    p.add_argument("--test", type=int, default=2000)
    a = p.parse_args()
    Xtr, ytr, Xte, yte = load(a.train, a.test)
    C = int(ytr.max()) + 1

    t = time.perf_counter()
    mean = Xtr.mean(0)
    W0 = np.linalg.svd(Xtr - mean, full_matrices=False)[2][:32]
    means = np.stack([Xtr[ytr == c].mean(0) for c in range(C)])
    sgd = ncmml.MetricSGD(W0, "ncm", 30.0, means, np.arange(C), C)
    rng = np.random.default_rng(0)
    for _ in range(2000):
        b = rng.choice(len(Xtr), 1000, replace=False)
        sgd.step(Xtr[b], ytr[b])
    t_ours = time.perf_counter() - t
    ours = errors(Xtr @ sgd.W.T, ytr, Xte @ sgd.W.T, yte)

    t = time.perf_counter()
    nca = NeighborhoodComponentsAnalysis(32, init="pca", max_iter=50, random_state=0).fit(Xtr, ytr)
    t_nca = time.perf_counter() - t
    nca_err = errors(nca.transform(Xtr), ytr, nca.transform(Xte), yte)

    t = time.perf_counter()
    lda = LinearDiscriminantAnalysis(n_components=C - 1).fit(Xtr, ytr)
    t_lda = time.perf_counter() - t
    lda_err = errors(lda.transform(Xtr), ytr, lda.transform(Xte), yte)
    raw = errors(Xtr, ytr, Xte, yte)

    print(f"{a.train} train / {a.test} test images, 784-d, one thread")
    print(f"{'model':<28}{'fit s':>9}{'NCM error':>11}{'1-NN error':>12}")
    for name, sec, (e1, e2) in (
        ("raw pixels", 0.0, raw),
        ("NCMML d=32 (metricpipe)", t_ours, ours),
        ("NCA d=32 (scikit-learn)", t_nca, nca_err),
        ("LDA d=9 (scikit-learn)", t_lda, lda_err),
    ):
        print(f"{name:<28}{sec:>9.2f}{e1:>11.4f}{e2:>12.4f}")
    print(f"NCA / NCMML fit time: {t_nca / t_ours:.1f}x")


if __name__ == "__main__":
    main()
