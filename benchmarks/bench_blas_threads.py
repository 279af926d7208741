"""Threaded BLAS for one large SGD fit (issue 48, item 2): what a second BLAS thread gives NCMML's and
NCMC's step, and whether it changes the step's bits.

The pipeline's SGD loops run on one BLAS thread (``tasks.base.one_blas_thread``), so that a model is
the same whatever the cluster. A thread count decided by the idle cores would only be allowed if the
products gave the same bits on one thread and on two. This measures both, on the step the learners
take (``tasks.ncmml.objectives.log_likelihood_and_gradient``, float64, one batch of ``--batch`` rows),
at the ImageNet shape by default: D = 4,096, d = 512, 1,000 classes with one centroid each (NCMML) and
ten each (NCMC), and on a sweep of single products at the shapes of the SGD steps. Asserts nothing.

    python benchmarks/bench_blas_threads.py [--dim 4096] [--out-dim 512] [--classes 1000] [--batch 1000]
"""

import argparse
import time

import numpy as np
from threadpoolctl import threadpool_limits

from metricpipe.tasks.ncmml.objectives import log_likelihood_and_gradient


def timed(f, threads: int, repeat: int = 3):
    """(the best of ``repeat`` wall times, the result) of f() on ``threads`` BLAS threads."""
    with threadpool_limits(threads, user_api="blas"):
        out = f()
        best = np.inf
        for _ in range(repeat):
            t = time.perf_counter()
            f()
            best = min(best, time.perf_counter() - t)
    return best, out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dim", type=int, default=4096)
    p.add_argument("--out-dim", type=int, default=512)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--batch", type=int, default=1000)
    a = p.parse_args()
    rng = np.random.default_rng(0)
    D, d, C, B = a.dim, a.out_dim, a.classes, a.batch
    W = rng.standard_normal((d, D)) / np.sqrt(D)
    X = rng.standard_normal((B, D))
    y = rng.integers(0, C, B)
    for name, per_class in (("NCMML", 1), ("NCMC, 10 centroids a class", 10)):
        centroids = rng.standard_normal((C * per_class, D))
        owner = np.repeat(np.arange(C), per_class)

        def step():
            return log_likelihood_and_gradient(W, X, y, centroids, owner, C)

        t1, (v1, g1) = timed(step, 1)
        t2, (v2, g2) = timed(step, 2)
        print(
            f"{name} step, D = {D}, d = {d}, {C * per_class} centroids, batch {B}: 1 thread {t1:.3f} s, "
            f"2 threads {t2:.3f} s ({t1 / t2:.2f} x); gradient bitwise equal: {np.array_equal(g1, g2)} "
            f"(max |difference| {np.abs(g1 - g2).max():.1e})"
        )

    differ, total = [], 0
    for D in (256, 784, 1024, 4096):
        for B in (64, 300, 1000):
            for d in (32, 128, 512):
                for dtype in (np.float32, np.float64):
                    Xs = rng.standard_normal((B, D)).astype(dtype)
                    Ws = rng.standard_normal((D, d)).astype(dtype)
                    G = rng.standard_normal((B, d)).astype(dtype)
                    for name, f in (("X W", lambda: Xs @ Ws), ("X^T G", lambda: Xs.T @ G)):
                        total += 1
                        with threadpool_limits(1, user_api="blas"):
                            r1 = f()
                        with threadpool_limits(2, user_api="blas"):
                            r2 = f()
                        if not np.array_equal(r1, r2):
                            differ.append(f"{name} {np.dtype(dtype).name} ({B} x {D}, d = {d})")
    print(f"single products: {len(differ)} of {total} differ in their bits between 1 and 2 BLAS threads")
    for line in differ[:8]:
        print(f"   e.g. {line}")


if __name__ == "__main__":
    main()
