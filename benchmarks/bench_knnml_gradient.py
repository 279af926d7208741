"""The k-NN metric learning gradient by sorting (Algorithm 1, Eqs. 40-43) against enumerating the
triplets, for one SGD batch of m images (2/3 from one class, Section 4.2), W (d, D). Prints the time
ratios measured in one run; asserts nothing about time. All three give the same gradient.

    python benchmarks/bench_knnml_gradient.py [--m 300] [--dim 784] [--d 32]

References: (1) a Python loop over every (q, p, n) triplet, accumulating the same coefficients
(timed on a few queries and scaled: it is linear in the number of queries); (2) numpy enumerating
every triplet at once as a (queries, targets, negatives) boolean array.
"""

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from timing import timed  # noqa: E402

from metricpipe.tasks import ncmml  # noqa: E402


def loop_counts(dq, targets, negatives, queries):
    cp, cn = np.zeros(dq.shape, np.int64), np.zeros(dq.shape, np.int64)
    for q in queries:
        P, N = np.flatnonzero(targets[q]).tolist(), np.flatnonzero(negatives[q]).tolist()
        row = dq[q].tolist()
        for p in P:
            for n in N:
                if 1.0 + row[p] - row[n] > 0:
                    cp[q, p] += 1
                    cn[q, n] += 1
    return cp, cn


def enumerated_counts(dq, targets, negatives):
    hinge = (1.0 + dq[:, :, None] - dq[:, None, :] > 0) & targets[:, :, None] & negatives[:, None, :]
    return hinge.sum(2), hinge.sum(1)


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--m", type=int, default=300)
    a.add_argument("--dim", type=int, default=784)
    a.add_argument("--d", type=int, default=32)
    a.add_argument("--targets", default="all", choices=("all", "dynamic"))
    args = a.parse_args()
    rng = np.random.default_rng(0)
    X = rng.normal(size=(args.m, args.dim))
    W = rng.normal(size=(args.d, args.dim)) / np.sqrt(args.dim)
    n_pos = int(round(2 * args.m / 3))
    is_pos = np.arange(args.m) < n_pos
    Y = X @ W.T
    targets = ncmml.choose_targets(Y, n_pos, 5, args.targets)
    negatives = np.broadcast_to(~is_pos, targets.shape)
    dq = ncmml.sqdist(Y[:n_pos], Y)

    def ours():
        cp, cn = ncmml.triplet_counts(dq, targets, negatives)
        return ncmml.triplet_gradient(W, X, np.arange(n_pos), cp, cn)

    def enumerated():
        cp, cn = enumerated_counts(dq, targets, negatives)
        return ncmml.triplet_gradient(W, X, np.arange(n_pos), cp, cn)

    t_ours, G = timed(ours, 3)
    t_enum, G2 = timed(enumerated, 3)
    few = np.arange(min(10, n_pos))
    t0 = time.perf_counter()
    cp, cn = loop_counts(dq, targets, negatives, few)
    t_loop = (time.perf_counter() - t0) * n_pos / len(few)
    full_cp, full_cn = ncmml.triplet_counts(dq, targets, negatives)
    same = np.allclose(G, G2) and np.array_equal(cp[few], full_cp[few]) and np.array_equal(cn[few], full_cn[few])
    n_trip = int((targets.sum(1) * negatives.sum(1)).sum())
    print(
        f"m={args.m} ({n_pos} queries, targets={args.targets}: {n_trip:,} triplets), D={args.dim}, d={args.d}, "
        f"1 thread; same coefficients and gradient: {same}"
    )
    print(f"sorting (Algorithm 1) + 2 W X^T A X: {t_ours * 1e3:.1f} ms")
    print(f"numpy enumeration of all triplets:  {t_enum * 1e3:.1f} ms -> sorting is {t_enum / t_ours:.1f}x faster")
    print(
        f"Python loop over triplets (scaled from {len(few)} queries): {t_loop * 1e3:.0f} ms -> sorting is "
        f"{t_loop / t_ours:.0f}x faster"
    )


if __name__ == "__main__":
    main()
