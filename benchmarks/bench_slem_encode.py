"""Encoding throughput of linear SLEM against the ESVM baseline at equal negatives (issue #7).

Both encoders take the same pool of negatives and the same images, one thread each. Linear SLEM's
offline step (moments, Cholesky of A) is timed apart from its online step (one triangular solve pair
per block of images); ESVM (hinge loss, SGD, the paper's reference) has no offline step and trains
one classifier per image, many images at once. Also prints kernel SLEM's offline and online costs at
full rank. Prints images per second and the ratio, measured in one run; asserts nothing about time.

    python benchmarks/bench_slem_encode.py [--negatives 15000] [--dim 784] [--images 2000] [--epochs 2]
"""

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from timing import timed  # noqa: E402

from metricpipe.tasks import slem  # noqa: E402
from metricpipe.tasks.synthetic import SyntheticSpec  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--negatives", type=int, default=15000)
    p.add_argument("--dim", type=int, default=784)
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--epochs", type=int, default=2, help="ESVM's passes over the negatives (the pipeline default)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--kernel-negatives", type=int, default=5000)
    a = p.parse_args()
    spec = SyntheticSpec(a.negatives + a.images, a.dim, 10, seed=0)
    Xneg = spec.rows(0, a.negatives).astype(np.float64)
    X = spec.rows(a.negatives, a.negatives + a.images).astype(np.float64)

    t = time.perf_counter()
    enc = slem.SLEM(lam=0.1, negatives={"count": None}).fit(Xneg)
    offline = time.perf_counter() - t
    t_slem, codes = timed(lambda: enc.transform(X), repeat=3)

    esvm = slem.ESVM(lam=0.1, theta=1.0, epochs=a.epochs, batch=a.batch, negatives={"count": None}, random_state=0).fit(
        Xneg
    )
    few = X[: max(64, a.images // 10)]  # ESVM is slow: time a tenth of the images
    t_esvm, _ = timed(lambda: esvm.transform(few), repeat=1)  # many classifiers per SGD step
    one = X[:20]
    t_one, _ = timed(lambda: [esvm.transform(x[None]) for x in one], repeat=1)  # one image at a time

    r_slem, r_esvm, r_one = a.images / t_slem, len(few) / t_esvm, len(one) / t_one
    print(f"negatives n = {a.negatives}, D = {a.dim}, one thread")
    print(f"linear SLEM: offline {offline:.3f} s (covariance + Cholesky), online {r_slem:,.0f} images/s")
    print(
        f"ESVM (SGD, {a.epochs} epochs, batch {a.batch}), per image as the paper's reference: {r_one:,.1f} images/s"
        f" -> SLEM / ESVM {r_slem / r_one:,.0f}x"
    )
    print(
        f"ESVM, {len(few)} images' SGD batched into each step (metricpipe's esvm encoder): {r_esvm:,.1f} images/s"
        f" -> SLEM / ESVM {r_slem / r_esvm:,.0f}x"
    )

    Kneg = Xneg[: a.kernel_negatives] / np.linalg.norm(Xneg[: a.kernel_negatives], axis=1, keepdims=True)
    Xk = X[:500] / np.linalg.norm(X[:500], axis=1, keepdims=True)
    t = time.perf_counter()
    km = slem.KernelSLEM(lam=0.1, kernel="gaussian", gamma=1.0).fit_pool(Kneg)
    k_off = time.perf_counter() - t
    t_k, _ = timed(lambda: km.transform(Xk), repeat=1)
    print(
        f"kernel SLEM (Gaussian, full rank, n = {a.kernel_negatives}): offline {k_off:.1f} s, "
        f"online {len(Xk) / t_k:,.0f} images/s"
    )


if __name__ == "__main__":
    main()
