"""Staging, statistics and encoding against plain single-process references (issue #9, items 1, 2, 4).

On N x D float32 synthetic features saved as one .npy file, measured in one run:

1. staging (read, validate, normalise none, write Zarr) in MB/s against a plain sequential copy of
   the same bytes: numpy.load (memory-mapped) then a Zarr array written chunk by chunk, same codec;
2. the statistics stage (mean, covariance, class means, scatters, PCA) against numpy's mean and
   Xc^T Xc / (n - 1) plus eigh on the train rows held in memory: time ratio and max |difference|;
3. the encode stage of a PCA-64 model against, per row-block, reading the staged block and one numpy
   matmul x W + b (issue 21: at most 2x): the stage's wall time x workers / blocks against the mean of
   (read + matmul) over the blocks in this process; and against one matmul in memory (issue 9's figure).

The stage times exclude the cluster's start-up and one-time imports (scikit-learn's, for the split,
and the stages' own modules on each worker: ~1 s each, once per run); the store is fresh each time,
and the page cache's dirty pages are written out (os.sync) before each timed section, so that no
section pays for another's writes. Asserts nothing.

4. the encode stage of ``--models`` PCA models (default 8): each block read once per model (a task per
   model and block, as before) against once per group of models (a task per block and group, now).

Each ratio is also given in CPU seconds (the workers' and the client's user + system time against the
reference's): on a machine shared with other jobs, wall time compares a 2-worker stage with a
one-process reference under whatever share of the cores each got, while CPU time does not move with
the load (it leaves out what wall time adds: waiting, and cores left idle).

    PYTHONPATH=. python benchmarks/bench_stages.py [--samples 1000000] [--dim 256] [--workers 2] [--models 8]
"""

import argparse
import os
import shutil
import tempfile
import time

import numpy as np
from distributed import Client, LocalCluster
from threadpoolctl import threadpool_limits

from metricpipe import stages
from metricpipe.config import parse_config
from metricpipe.context import StageContext
from metricpipe.stages.common import load_features
from metricpipe.store import Store, chunk_rows_for, create_array, load_arrays, load_estimator, open_array
from metricpipe.tasks.synthetic import SyntheticSpec


def cpu_seconds(client=None) -> float:
    """User + system CPU seconds of this process, and of the cluster's workers when ``client`` is given."""
    import psutil

    def own():
        t = psutil.Process().cpu_times()
        return t.user + t.system

    return own() + (sum(client.run(own).values()) if client is not None else 0.0)


def _import_stages():
    """What a worker imports for its first task of a run (once per run, not per block)."""
    import zarr  # noqa: F401

    import metricpipe.stages  # noqa: F401


def many_models(c, store, cfg, data, stats_unit, a):
    """4. the encode stage of ``a.models`` PCA models: each block read once per model (a task per model
    and block, as before) against once for a group of models (a task per block and group)."""
    from metricpipe.stages import encode

    dims = [max(4, 64 - 4 * i) for i in range(a.models)]
    cfg = parse_config({**cfg.raw, "methods": [{"method": "pca", "dim": d} for d in dims]})
    ctx = StageContext(c, store, cfg, log=lambda m: None)
    models = stages.run_train(ctx, data, stats_unit, None)
    figures = {}
    for label, per_task in (("a read per model", 1), ("a read per group", encode.MODELS_PER_TASK)):
        encode.MODELS_PER_TASK = per_task
        shutil.rmtree(f"{store.root}/codes", ignore_errors=True)  # fresh codes units: nothing reused
        os.sync()
        t, c0 = time.perf_counter(), cpu_seconds(c)
        stages.run_encode(ctx, data, models)
        figures[label] = (time.perf_counter() - t, cpu_seconds(c) - c0)
    (w1, c1), (w2, c2) = figures.values()
    print(
        f"4. encode stage of {a.models} PCA models ({len(data.chunks)} blocks): a read per model {w1:.2f} s "
        f"({c1:.2f} CPU s), a read per block for a group of models {w2:.2f} s ({c2:.2f} CPU s): "
        f"{w1 / w2:.2f} x the wall time, {c1 / c2:.2f} x the CPU time"
    )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--dir", default=None, help="scratch directory (default: a temporary one)")
    p.add_argument("--models", type=int, default=8, help="models of part 4 (0: leave it out)")
    a = p.parse_args()
    tmp = a.dir or tempfile.mkdtemp(prefix="mp-bench-")
    os.makedirs(tmp, exist_ok=True)
    n, D = a.samples, a.dim
    spec = SyntheticSpec(n, D, 10, seed=0)
    X = np.lib.format.open_memmap(f"{tmp}/X.npy", mode="w+", dtype=np.float32, shape=(n, D))
    for s in range(0, n, 100_000):
        X[s : s + 100_000] = spec.rows(s, min(s + 100_000, n))
    X.flush()
    del X
    np.save(f"{tmp}/y.npy", spec.labels())
    mb = n * D * 4 / 1e6
    print(f"{n:,} x {D} float32 = {mb:,.0f} MB, {a.workers} workers, {os.cpu_count()} cores")

    # 1. a plain sequential copy: memory-mapped .npy into a Zarr array of the same chunking
    cfg = parse_config(
        {
            "store": f"{tmp}/store",
            "data": {"path": f"{tmp}/X.npy", "labels": f"{tmp}/y.npy", "split": {"test": 0.1, "seed": 0}},
            "methods": [{"method": "pca", "dim": 64}],
            "evaluate": {"classification": {"classifiers": []}},
        }
    )
    rows = chunk_rows_for(D, cfg.data.chunk_mb)
    os.sync()
    t, c0 = time.perf_counter(), cpu_seconds()
    src = np.load(f"{tmp}/X.npy", mmap_mode="r")
    out = create_array(
        f"{tmp}/copy.zarr", (n, D), (rows, D), np.float32, rows=True, sample=np.asarray(src[:4096])
    )  # the stage's codec choice
    for s in range(0, n, rows):
        out[s : s + rows] = np.asarray(src[s : s + rows])
    t_copy, c_copy = time.perf_counter() - t, cpu_seconds() - c0

    import sklearn.model_selection  # noqa: F401 -- imported once per process by a run, not per stage

    with (
        LocalCluster(
            n_workers=a.workers, threads_per_worker=1, host="127.0.0.1", dashboard_address="127.0.0.1:0"
        ) as lc,
        Client(lc) as c,
    ):
        store = Store(cfg.store)
        store.check_writable()
        ctx = StageContext(c, store, cfg, log=lambda m: None)
        c.run(_import_stages)
        os.sync()
        t, c0 = time.perf_counter(), cpu_seconds(c)
        data = stages.run_stage(ctx)
        t_stage, c_stage = time.perf_counter() - t, cpu_seconds(c) - c0
        print(
            f"1. staging: {mb / t_stage:,.0f} MB/s; plain sequential copy {mb / t_copy:,.0f} MB/s; "
            f"staging / copy throughput = {t_copy / t_stage:.2f} (in CPU seconds {c_stage:.2f} against "
            f"{c_copy:.2f}: {c_copy / c_stage:.2f})"
        )

        os.sync()
        t, cs = time.perf_counter(), cpu_seconds(c)
        stats_unit = stages.run_statistics(ctx, data)
        t_stats, c_stats = time.perf_counter() - t, cpu_seconds(c) - cs
        stats, _ = load_arrays(stats_unit.url)
        train = np.flatnonzero(data.split == 0)
        t = time.perf_counter()
        Xt = np.load(f"{tmp}/X.npy")[train].astype(np.float64)
        t_load = time.perf_counter() - t
        X0 = Xt.copy()
        t = time.perf_counter()
        mean = Xt.mean(0)
        Xt -= mean
        cov = Xt.T @ Xt / (len(Xt) - 1)
        np.linalg.eigh(cov)
        t_np = time.perf_counter() - t
        with threadpool_limits(1):  # CPU seconds on one thread: idle BLAS threads spin, which counts
            cs = cpu_seconds()
            X0 -= X0.mean(0)
            np.linalg.eigh(X0.T @ X0 / (len(X0) - 1))
            c_np = cpu_seconds() - cs
        del X0
        diff = max(np.abs(stats["mean"] - mean).max(), np.abs(stats["covariance"] - cov).max())
        print(
            f"2. statistics stage {t_stats:.2f} s; numpy in memory {t_np:.2f} s (+ {t_load:.2f} s to load); "
            f"stage / numpy time = {t_stats / t_np:.2f} (CPU seconds {c_stats:.2f} / {c_np:.2f} on one thread = "
            f"{c_stats / c_np:.2f}); max |difference| {diff:.1e}"
        )
        del Xt

        models = stages.run_train(ctx, data, stats_unit, None)
        os.sync()
        t, ce = time.perf_counter(), cpu_seconds(c)
        codes = stages.run_encode(ctx, data, models)
        t_enc, c_enc = time.perf_counter() - t, cpu_seconds(c) - ce
        est = load_estimator(models[0][1].url)  # PCA: codes (x - mean) W = x W + b
        arrays = {"W": est.components_, "b": est.offset_}
        Xa = np.load(f"{tmp}/X.npy")
        t = time.perf_counter()
        ref = Xa @ arrays["W"] + arrays["b"]  # the PCA model: (x - mean) W = x W + b
        t_mm = time.perf_counter() - t
        err = np.abs(open_array(f"{codes[0][1].url}/codes")[:1000] - ref[:1000]).max()
        del ref, Xa
        with threadpool_limits(1):  # as in a worker: one thread
            t, cb = time.perf_counter(), cpu_seconds()
            for a0, b0 in data.chunks:  # the plain per-block work: read the staged block, one matmul
                load_features(data.url, a0, b0) @ arrays["W"] + arrays["b"]
            t_block, c_block = (time.perf_counter() - t) / len(data.chunks), (cpu_seconds() - cb) / len(data.chunks)
        per_block = t_enc * a.workers / len(data.chunks)
        print(
            f"3. encode stage (PCA-64) {t_enc:.2f} s = {n / t_enc:,.0f} rows/s; numpy matmul in memory "
            f"{t_mm:.2f} s; stage / matmul time = {t_enc / t_mm:.2f}; max |difference| {err:.1e}"
        )
        print(
            f"   per block ({len(data.chunks)} blocks): stage {per_block:.3f} s (wall x {a.workers} workers / blocks); "
            f"read + matmul {t_block:.3f} s; stage / (read + matmul) = {per_block / t_block:.2f} (CPU seconds "
            f"per block {c_enc / len(data.chunks):.3f} / {c_block:.3f} = {c_enc / len(data.chunks) / c_block:.2f})"
        )
        if a.models > 1:
            many_models(c, store, cfg, data, stats_unit, a)
    if a.dir is None:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
