"""Linear SLEM against exemplar SVMs fitted by scikit-learn's LinearSVC (liblinear, the solver the
paper's ESVM baseline used) on the same Fashion-MNIST images (issue #9, item 5). Prints per-image
fit times, their ratio and retrieval mAP measured in one run; asserts nothing about time.

    METRICPIPE_DATA=/path/to/fashion-mnist PYTHONPATH=. python benchmarks/bench_slem_peers.py [--images 300]

Protocol (the SLEM example's, scaled down): l2-normalised pixels; negatives are seeded training
images; a seeded set of test images query each other (mAP, relevance = same class). Every image is
encoded by its exemplar classifier against the negatives, code = the unit-norm weight vector, ranked
by cosine. Linear SLEM (Eq. 6, lambda = 0.3): the negatives' covariance and its Cholesky factor
once (offline), then one triangular solve pair per block of images. ESVM (Eq. 1 with the hinge loss,
lambda = 0.1, theta = 1) per image with LinearSVC: sample weights theta for the exemplar and 1/n for
each negative, C = 1/lambda, so liblinear minimises the same objective up to its regularised
intercept. metricpipe's own ESVM encoder (SGD, 2 epochs, all images' steps batched) for reference.
"""

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from sklearn.svm import LinearSVC  # noqa: E402
from timing import fashion_subset, retrieval  # noqa: E402

from metricpipe.tasks import slem  # noqa: E402


def liblinear_esvm(X: np.ndarray, Xneg: np.ndarray, lam: float, theta: float) -> np.ndarray:
    """One LinearSVC per row of X against the negatives; unit-norm weight vectors (m, D)."""
    n = len(Xneg)
    y = np.r_[1, -np.ones(n)]
    w = np.r_[theta, np.full(n, 1.0 / n)]
    W = np.empty_like(X)
    for k, x in enumerate(X):
        svc = LinearSVC(C=1.0 / lam, loss="hinge", dual=True, max_iter=10000, tol=1e-4)
        svc.fit(np.vstack([x[None], Xneg]), y, sample_weight=w)
        W[k] = svc.coef_[0]
    return slem.unit_rows(W)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--negatives", type=int, default=15000)
    p.add_argument("--images", type=int, default=300, help="test images that query each other")
    a = p.parse_args()
    Xneg, _, X, y = fashion_subset(a.negatives, a.images, 0, np.float64)
    rows = [("raw pixels (cosine)", None, None, retrieval(X, y, score="inner"))]

    t = time.perf_counter()
    enc = slem.SLEM(lam=0.3, negatives={"count": None}).fit(Xneg)
    offline = time.perf_counter() - t
    t = time.perf_counter()
    codes = enc.transform(X)
    t_slem = (time.perf_counter() - t) / len(X)
    rows.append(("linear SLEM lambda 0.3 (metricpipe)", offline, t_slem, retrieval(codes, y)))

    t = time.perf_counter()
    codes = (
        slem.ESVM(lam=0.1, theta=1.0, epochs=2, batch=64, negatives={"count": None}, random_state=0)
        .fit(Xneg)
        .transform(X)
    )
    rows.append(("ESVM SGD lambda 0.1 (metricpipe)", None, (time.perf_counter() - t) / len(X), retrieval(codes, y)))

    t = time.perf_counter()
    codes = liblinear_esvm(X, Xneg, 0.1, 1.0)
    t_svc = (time.perf_counter() - t) / len(X)
    rows.append(("ESVM LinearSVC lambda 0.1 (scikit-learn)", None, t_svc, retrieval(codes, y)))

    print(f"{a.negatives:,} negatives, {a.images} query images, D = {X.shape[1]}, one thread")
    print(f"{'model':<42}{'offline s':>10}{'s / image':>11}{'mAP':>9}")
    for name, off, per, r in rows:
        print(
            f"{name:<42}{'' if off is None else f'{off:.2f}':>10}{'' if per is None else f'{per:.2e}':>11}"
            f"{r['map']:>9.4f}"
        )
    print(
        f"LinearSVC ESVM / linear SLEM time per image: {t_svc / t_slem:,.0f}x online; "
        f"{t_svc * len(X) / (offline + t_slem * len(X)):,.0f}x with SLEM's offline step, for {len(X)} images"
    )


if __name__ == "__main__":
    main()
