"""Encoding with a sparse projector against the dense matrix of the same R, on a synthetic
D = 16384 block (issue #4). Prints time and storage ratios measured in one run, and the floor that
any kernel reading the block must pay (one pass over it). Asserts nothing about time.

    python benchmarks/bench_sparse_encode.py [--dim 16384] [--r 64] [--sparsity 0.99] [--n 2048]
"""
import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import scipy.sparse  # noqa: E402

from tasks.models import LinearModel  # noqa: E402
from tasks.sparse import nonzeros_per_column, project_l0  # noqa: E402
from tasks.synthetic import SyntheticSpec  # noqa: E402


def timed(f, repeat=5):
    f()
    t = time.perf_counter()
    for _ in range(repeat):
        out = f()
    return (time.perf_counter() - t) / repeat, out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dim", type=int, default=16384)
    p.add_argument("--r", type=int, default=64)
    p.add_argument("--sparsity", type=float, default=0.99)
    p.add_argument("--n", type=int, default=2048)
    a = p.parse_args()
    X = SyntheticSpec(a.n, a.dim, 10, seed=0).rows(0, a.n)
    m = nonzeros_per_column(a.dim, a.sparsity)
    U = project_l0(np.random.default_rng(0).standard_normal((a.dim, a.r)).astype(np.float32), m)
    dense, sparse = LinearModel(U), LinearModel(scipy.sparse.csc_array(U))
    t_dense, ref = timed(lambda: dense.transform(X))
    t_sparse, out = timed(lambda: sparse.transform(X))
    t_read, _ = timed(lambda: X.sum(axis=1))
    used = int((U != 0).any(axis=1).sum())
    cd, cs = dense.cost(a.dim), sparse.cost(a.dim)
    print(f"D={a.dim} R={a.r} tau={a.sparsity} (M={m} non-zeros per column; the columns' supports cover "
          f"{used} of {a.dim} input dimensions), {a.n} images, 1 thread")
    print(f"dense X @ U (BLAS): {t_dense * 1e3:.1f} ms; sparse (scipy CSC): {t_sparse * 1e3:.1f} ms; "
          f"sparse / dense speed = {t_dense / t_sparse:.2f}x; same codes: {np.allclose(out, ref, atol=1e-3)}")
    print(f"one read pass over the block: {t_read * 1e3:.1f} ms, so no kernel that reads the block can be more "
          f"than {t_dense / t_read:.1f}x faster than dense here")
    print(f"FLOPs per image: dense {cd['flops_per_image']}, sparse {cs['flops_per_image']} "
          f"({cd['flops_per_image'] / cs['flops_per_image']:.0f}x fewer)")
    print(f"storage: dense {cd['storage_bytes']} B, sparse {cs['storage_bytes']} B "
          f"({cd['storage_bytes'] / cs['storage_bytes']:.1f}x fewer bytes)")


if __name__ == "__main__":
    main()
