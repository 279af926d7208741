"""Exact kNN graph: our kernel and our neighbours stage against the machine's float32 GEMM rate and
against faiss IndexFlatL2, measured in one run. Prints ratios; asserts nothing about time.

    python benchmarks/bench_knn.py [--n 30000] [--dim 784] [--k 50]

The GEMM rate is measured here with numpy on a large GEMM (1024 x 8192 x D), whatever the kernel's
tiles (the best of three rounds). The kernel's compiled pass is loaded before it is timed, in this
process and on each worker (numba's cache: once per process). The kernel and
faiss run single-threaded (as each Dask worker does) and are compared with one thread's rate; the
stage runs on a LocalCluster of two single-threaded workers and is compared with the machine's rate,
measured as two single-threaded processes running the GEMM at once (and, for reference, with twice
one thread's rate, which ignores the caches and memory bandwidth the two cores share). On a machine
shared with other jobs the stage's rate is also given per CPU second (its workers' and the client's
user + system time) against one thread's GEMM rate per CPU second, which the load does not move.
"""

import argparse
import os
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from metricpipe.tasks import knn  # noqa: E402
from metricpipe.tasks.synthetic import SyntheticSpec  # noqa: E402

GEMM_SHAPE = (1024, 8192)  # rows of the two operands of the reference GEMM (a large one, whatever our tiles)


def gemm_rate(D: int, repeat: int = 5, cpu: bool = False, rounds: int = 3) -> float:
    """FLOP per second of wall time (``cpu``: per CPU second of this process) of the reference GEMM:
    the best of ``rounds`` rounds of ``repeat`` products into one output buffer (as the kernel's tiles
    are; a fresh 32 MB output per product is page-faulted in each time). One round moved by +-15%
    between runs on the Intel VM, so a single round made every ratio below as noisy."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((GEMM_SHAPE[0], D), dtype=np.float32)
    b = rng.standard_normal((GEMM_SHAPE[1], D), dtype=np.float32)
    out = np.matmul(a, b.T)
    clock = time.process_time if cpu else time.perf_counter
    best = 0.0
    for _ in range(rounds):
        t = clock()
        for _ in range(repeat):
            np.matmul(a, b.T, out=out)
        best = max(best, repeat * 2 * a.shape[0] * b.shape[0] * D / (clock() - t))
    return best


def cpu_seconds(client=None) -> float:
    """User + system CPU seconds of this process, and of the cluster's workers when ``client`` is given."""
    import psutil

    def own():
        t = psutil.Process().cpu_times()
        return t.user + t.system

    return own() + (sum(client.run(own).values()) if client is not None else 0.0)


def _gemm_worker(D, barrier, out):
    barrier.wait()
    out.put(gemm_rate(D, repeat=20))


def machine_gemm_rate(D: int, processes: int = 2) -> float:
    """The machine's float32 GEMM rate as the stage's workers see it: ``processes`` single-threaded
    processes running the same GEMM at once (shared caches and memory bandwidth included)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=_gemm_worker, args=(D, barrier, out)) for _ in range(processes)]
    for p in procs:
        p.start()
    rates = [out.get() for _ in procs]
    for p in procs:
        p.join()
    return float(sum(rates))


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
    print(f"float32 GEMM (numpy, 1 thread, {GEMM_SHAPE[0]}x{GEMM_SHAPE[1]}x{D}): {peak / 1e9:.1f} GFLOP/s")

    knn.block_topk(X[:8], X[:64], k)  # compiles the push pass (once per process; numba caches it on disk)
    t = time.perf_counter()
    d_ours, i_ours = knn.block_topk(X, X, k, q_ids=np.arange(n), x_ids=np.arange(n), exclude_self=True)
    t_ours = time.perf_counter() - t
    print(
        f"kernel block_topk, {n} x {n} x {D}, k={k}: {t_ours:.2f} s = {flops / t_ours / 1e9:.1f} GFLOP/s "
        f"= {flops / t_ours / peak:.2f} x GEMM rate"
    )

    try:
        import faiss

        faiss.omp_set_num_threads(1)
        index = faiss.IndexFlatL2(D)
        index.add(X)
        t = time.perf_counter()
        d_f, i_f = index.search(X, k + 1)
        t_f = time.perf_counter() - t
        agree = np.mean([len(set(a) & set(b[b != q][:k])) / k for q, (a, b) in enumerate(zip(i_ours[:500], i_f))])
        print(
            f"faiss IndexFlatL2 (1 thread): {t_f:.2f} s; ours / faiss time = {t_ours / t_f:.2f}; "
            f"neighbour sets agree on {agree:.4f} of the first 500 queries"
        )
    except ImportError:
        print("faiss not installed (pip install faiss-cpu) - no faiss comparison")

    machine = machine_gemm_rate(D, 2)
    print(
        f"float32 GEMM, 2 single-threaded processes at once: {machine / 1e9:.1f} GFLOP/s "
        f"(= {machine / peak:.2f} x one thread's rate)"
    )

    from distributed import Client, LocalCluster

    from metricpipe.config import parse_config
    from metricpipe.context import StageContext
    from metricpipe.stages import run_neighbours, run_stage
    from metricpipe.store import Store

    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address="127.0.0.1:0") as lc,
        Client(lc) as client,
    ):
        np.savez(f"{tmp}/x.npz", X=X, y=np.arange(n) % 10)
        cfg = parse_config({"data": {"path": f"{tmp}/x.npz", "split": {"test": 0.001}}, "neighbours": {"k": k}})
        ctx = StageContext(client, Store(f"{tmp}/store"), cfg, log=lambda m: None)
        data = run_stage(ctx)
        n_train = int((data.split == 0).sum())
        client.run(lambda: knn.block_topk(X[:8], X[:64], k))  # each worker loads the compiled pass once
        t, c = time.perf_counter(), cpu_seconds(client)
        run_neighbours(ctx, data)
        t_stage, c_stage = time.perf_counter() - t, cpu_seconds(client) - c
        peak_cpu = gemm_rate(D, cpu=True)
        f_stage = 2.0 * n_train * n_train * D
        print(
            f"neighbours stage, 2 workers x 1 thread: {t_stage:.2f} s = {f_stage / t_stage / 1e9:.1f} GFLOP/s "
            f"= {f_stage / t_stage / machine:.2f} x the machine's GEMM rate (2 processes at once); "
            f"{f_stage / t_stage / (2 * peak):.2f} x twice one thread's rate"
        )
        print(
            f"   per CPU second: {f_stage / c_stage / 1e9:.1f} GFLOP ({c_stage:.2f} CPU s) against one thread's "
            f"GEMM {peak_cpu / 1e9:.1f} GFLOP per CPU second = {f_stage / c_stage / peak_cpu:.2f} x"
        )


if __name__ == "__main__":
    main()
