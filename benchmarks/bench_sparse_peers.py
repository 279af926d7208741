"""Sparse projectors against scikit-learn's SparsePCA on the same Fashion-MNIST images (issue #9,
item 5). Prints fit times, their ratio, non-zeros and retrieval mAP measured in one run; asserts
nothing about time.

    METRICPIPE_DATA=/path/to/fashion-mnist PYTHONPATH=. python benchmarks/bench_sparse_peers.py [--alphas 1 2]

Protocol (the sparse example's, scaled down): l2-normalised pixels, centred on the training subset's
mean; R = 64 projectors learnt from a seeded 2,000-image training subset, started from PCA;
metricpipe's projector (`tasks.sparse.SparseProjector`, P = 100, 200 iterations, continuation over
the first half) at tau = 0.9 (78 non-zeros per column). SparsePCA (scikit-learn, l1 penalty alpha)
learns from the same rows without labels, the closest unsupervised peer; its sparsity follows alpha,
so a few alphas are run and their non-zeros printed. "PCA, top-M": the PCA projectors cut to the same
78 largest entries per column (the l0 projection of the start). Test images query each other; every
projection is scored by the inner product of its codes, as the pipeline scores sparse models.
"""

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from sklearn.decomposition import SparsePCA  # noqa: E402
from timing import fashion_subset, retrieval  # noqa: E402

from metricpipe.tasks import sparse  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--train", type=int, default=2000)
    p.add_argument("--test", type=int, default=2000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--sparsity", type=float, default=0.9)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--alphas", type=float, nargs="+", default=[0.05, 0.1])
    a = p.parse_args()
    Xtr, ytr, Xte, yte = fashion_subset(a.train, a.test, 0, np.float64)
    mean = Xtr.mean(0)
    Xtr, Xte = Xtr - mean, Xte - mean
    D = Xtr.shape[1]
    m = sparse.nonzeros_per_column(D, a.sparsity)
    rows = []

    def add(name, U, seconds):
        rows.append((name, seconds, int(np.count_nonzero(U)), retrieval(Xte @ U, yte, score="inner")))

    t = time.perf_counter()
    U0 = np.linalg.svd(Xtr, full_matrices=False)[2][: a.dim].T
    t_pca = time.perf_counter() - t
    add(f"PCA-{a.dim}", U0, t_pca)
    add(f"PCA-{a.dim}, top-{m} per column", sparse.unit_columns(sparse.project_l0(U0, m)), t_pca)
    t = time.perf_counter()
    U, _, _ = sparse.rank_projectors(
        Xtr, ytr, U0, sparsity=a.sparsity, queries=100, max_iter=a.iters, anneal=0.5, seed=0, record_every=a.iters
    )
    t_ours = time.perf_counter() - t
    add(f"sparse projector tau {a.sparsity} (metricpipe)", U.astype(np.float64), t_ours)
    t_peer = {}
    for alpha in a.alphas:
        t = time.perf_counter()
        spca = SparsePCA(a.dim, alpha=alpha, random_state=0, max_iter=100).fit(Xtr)
        t_peer[alpha] = time.perf_counter() - t
        U = spca.components_.T
        add(f"SparsePCA alpha {alpha:g} (scikit-learn)", sparse.unit_columns(U), t_peer[alpha])

    print(f"{a.train} train / {a.test} test images, D = {D}, R = {a.dim}, one thread")
    print(f"{'model':<40}{'fit s':>9}{'non-zeros':>11}{'mAP':>9}")
    for name, sec, nnz, r in rows:
        print(f"{name:<40}{sec:>9.2f}{nnz:>11,}{r['map']:>9.4f}")
    print(
        "SparsePCA / sparse projector fit time: "
        + ", ".join(f"alpha {k:g} {v / t_ours:.2f}x" for k, v in t_peer.items())
    )


if __name__ == "__main__":
    main()
