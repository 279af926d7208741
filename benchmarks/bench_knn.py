"""Exact kNN graph: our kernel and our neighbours stage against the machine's float32 GEMM rate and
against faiss IndexFlatL2, measured in one run. Prints ratios; asserts nothing about time.

    python benchmarks/bench_knn.py [--n 30000] [--dim 784] [--k 50]

The GEMM rate is measured here with numpy on the same tile shapes the kernel uses. The kernel and
faiss run single-threaded (as each Dask worker does); the stage runs on a LocalCluster of two
single-threaded workers and is compared with two cores' GEMM rate.
"""
import argparse
import os
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from tasks import knn  # noqa: E402
from tasks.synthetic import SyntheticSpec  # noqa: E402


def gemm_rate(D: int, repeat: int = 5) -> float:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((knn.QUERY_TILE, D), dtype=np.float32)
    b = rng.standard_normal((knn.DB_TILE, D), dtype=np.float32)
    a @ b.T
    t = time.perf_counter()
    for _ in range(repeat):
        a @ b.T
    return repeat * 2 * a.shape[0] * b.shape[0] * D / (time.perf_counter() - t)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=30000)
    p.add_argument("--dim", type=int, default=784)
    p.add_argument("--k", type=int, default=50)
    args = p.parse_args()
    n, D, k = args.n, args.dim, args.k
    X = SyntheticSpec(n, D, 10, seed=0).rows(0, n)
    flops = 2.0 * n * n * D
    peak = gemm_rate(D)
    print(f"float32 GEMM (numpy, 1 thread, {knn.QUERY_TILE}x{knn.DB_TILE}x{D}): {peak / 1e9:.1f} GFLOP/s")

    t = time.perf_counter()
    d_ours, i_ours = knn.block_topk(X, X, k, q_ids=np.arange(n), x_ids=np.arange(n), exclude_self=True)
    t_ours = time.perf_counter() - t
    print(f"kernel block_topk, {n} x {n} x {D}, k={k}: {t_ours:.2f} s = {flops / t_ours / 1e9:.1f} GFLOP/s "
          f"= {flops / t_ours / peak:.2f} x GEMM rate")

    try:
        import faiss
        faiss.omp_set_num_threads(1)
        index = faiss.IndexFlatL2(D)
        index.add(X)
        t = time.perf_counter()
        d_f, i_f = index.search(X, k + 1)
        t_f = time.perf_counter() - t
        agree = np.mean([len(set(a) & set(b[b != q][:k])) / k for q, (a, b) in enumerate(zip(i_ours[:500], i_f))])
        print(f"faiss IndexFlatL2 (1 thread): {t_f:.2f} s; ours / faiss time = {t_ours / t_f:.2f}; "
              f"neighbour sets agree on {agree:.4f} of the first 500 queries")
    except ImportError:
        print("faiss not installed (pip install faiss-cpu) - no faiss comparison")

    from distributed import Client, LocalCluster

    from pipeline.config import parse_config
    from pipeline.context import StageContext
    from pipeline.stages import run_neighbours, run_stage
    from pipeline.storage import Store

    with tempfile.TemporaryDirectory() as tmp, \
            LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as lc, Client(lc) as client:
        np.savez(f"{tmp}/x.npz", X=X, y=np.arange(n) % 10)
        cfg = parse_config({"data": {"path": f"{tmp}/x.npz", "split": {"test": 0.001}}, "neighbours": {"k": k}})
        ctx = StageContext(client, Store(f"{tmp}/store"), cfg, log=lambda m: None)
        data = run_stage(ctx)
        n_train = int((data.split == 0).sum())
        t = time.perf_counter()
        run_neighbours(ctx, data)
        t_stage = time.perf_counter() - t
        f_stage = 2.0 * n_train * n_train * D
        print(f"neighbours stage, 2 workers x 1 thread: {t_stage:.2f} s = {f_stage / t_stage / 1e9:.1f} GFLOP/s "
              f"= {f_stage / t_stage / (2 * peak):.2f} x two cores' GEMM rate")


if __name__ == "__main__":
    main()
