"""A whole run at scale: stage times, total, peak RSS per process and accuracy, with faiss's IVF on
the same data in the same run as the reference for the neighbours stage (issue 21).

    python benchmarks/bench_scale.py                      # 1M x 128, 100 classes, 2 workers of 2 GB
    python benchmarks/bench_scale.py --all-rows           # identity, an all-rows IVF graph, knn1 of every test row
    python benchmarks/bench_scale.py --samples 6000000 --memory 1GB --methods pca,ncmml   # the memory rule at 6M

The default run: stage, statistics, a sampled IVF graph (20,000 train rows), identity + PCA-32 +
NCMML-32 (lr 100) + SL-DE (step 0.02; both as a --select run's validation split chose them, SL-DE's
by validation mAP), encode, evaluate (1,000 retrieval queries, a 20,000-row stratified sample
classified by knn1, knn10 and ncm), report. The data is `metricpipe synth`'s (made once, kept in
--dir). faiss runs after the pipeline, in this process with 2 threads, on the staged (normalised)
train rows: the index the stage chose, trained on a sample of the same size, searched with the
same query rows and nprobe.
"""

import argparse
import json
import os
import resource
import shutil
import time

import numpy as np


def _synth(path: str, n: int, dim: int, classes: int, memory: str) -> float:
    from distributed import Client, LocalCluster

    from metricpipe.commands.synth import write_synthetic

    if os.path.exists(path):
        return 0.0
    t0 = time.perf_counter()
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, memory_limit=memory, host="127.0.0.1", dashboard_address=None
        ) as lc,
        Client(lc) as client,
    ):
        write_synthetic(client, path, n, dim, classes, log=lambda m: None)
    return time.perf_counter() - t0


def _config(args, data: str, store: str) -> dict:
    ev_ret = {"k": [10], "queries": 1000}
    if args.all_rows:
        return {
            "store": store,
            "workers": args.workers,
            "memory_limit": args.memory,
            "dashboard": None,
            "data": {"path": data, "normalize": "l2", "split": {"test": 0.2, "seed": 0}},
            "neighbours": {"k": 10, "method": "ivf"},
            "methods": [{"method": "identity"}],
            "evaluate": {"retrieval": ev_ret, "classification": {"classifiers": ["knn1"]}},
        }
    return {
        "store": store,
        "workers": args.workers,
        "memory_limit": args.memory,
        "dashboard": None,
        "data": {"path": data, "normalize": "l2", "split": {"test": 0.2, "seed": 0}},
        "neighbours": {"k": 10, "method": "ivf", "queries": 20000},
        # lr and step as the validation split of the default run's selection chose them (the
        # grids of issue 18 train 5 NCMML and 4 SL-DE candidates: --select to run them). SL-DE's
        # step by validation mAP, the benchmark's headline: its default metric, the soft-vote
        # error, is ~1.3% for every step on this data and picked 0.05, which overshoots
        # (benchmarks/README.md)
        "methods": [
            m
            for m in [
                {"method": "identity"},
                {"method": "pca", "dim": 32},
                {"method": "ncmml", "dim": 32, "iters": args.ncmml_iters, **({} if args.select else {"lr": 100.0})},
                {
                    "method": "slde",
                    "member_dim": 16,
                    "members": 4,
                    "input_dim": 64,
                    **({"select": {"metric": "map"}} if args.select else {"step": 0.02}),
                },
            ]
            if m["method"] in args.methods.split(",")
        ],
        "evaluate": {
            "retrieval": ev_ret,
            "classification": {"classifiers": ["knn1", "knn10", "ncm"], "queries": 20000},
        },
    }


def _faiss_reference(store: str, manifest: dict, nprobe: int, k: int) -> dict:
    """faiss alone on the graph's job: train the stage's index on a sample of the same size, add the
    train rows, search the same query rows; 2 threads."""
    import faiss
    import zarr

    from metricpipe import ivf

    faiss.omp_set_num_threads(2)
    data = zarr.open_group(f"{store}/{manifest['units']['data']}", mode="r")
    graph = zarr.open_group(f"{store}/{manifest['units']['neighbours']}", mode="r")
    from metricpipe.store import MARKER_SUFFIX, Store

    factory = Store(store).read_json(manifest["units"]["neighbours"] + MARKER_SUFFIX)["index"]
    split = data["split"][:]
    train = np.flatnonzero(split == 0)
    X = np.ascontiguousarray(data["features"][:][train])
    queries = graph["query_rows"][:] if "query_rows" in graph else np.arange(len(split))
    Q = np.ascontiguousarray(data["features"][:][queries])
    nlist = int(factory.split(",")[0][3:].split("_")[0])
    t0 = time.perf_counter()
    index = faiss.index_factory(X.shape[1], factory)
    sample = np.random.default_rng(0).choice(len(X), ivf.sample_rows(len(X), nlist), replace=False)
    index.train(X[np.sort(sample)])
    t_train = time.perf_counter() - t0
    index.add(X)
    t_add = time.perf_counter() - t0 - t_train
    faiss.extract_index_ivf(index).nprobe = nprobe
    t1 = time.perf_counter()
    index.search(Q, k + 1)
    t_search = time.perf_counter() - t1
    return {
        "factory": factory,
        "train_s": t_train,
        "add_s": t_add,
        "search_s": t_search,
        "total_s": time.perf_counter() - t0,
        "queries": int(len(Q)),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--memory", default="2GB")
    ap.add_argument("--ncmml-iters", type=int, default=500)
    ap.add_argument("--all-rows", action="store_true", help="identity, all-rows IVF graph, knn1 of every test row")
    ap.add_argument("--dir", default="/tmp/bench-scale")
    ap.add_argument("--no-faiss", action="store_true")
    ap.add_argument("--methods", default="identity,pca,ncmml,slde", help="a subset of the four, comma-separated")
    ap.add_argument("--select", action="store_true", help="select NCMML's lr and SL-DE's step on validation")
    ap.add_argument("--out", default=None, help="write the figures as JSON")
    args = ap.parse_args()

    from metricpipe.config import parse_config
    from metricpipe.runner import run_pipeline

    os.makedirs(args.dir, exist_ok=True)
    data = f"{args.dir}/s{args.samples}x{args.dim}c{args.classes}.zarr"
    synth_s = _synth(data, args.samples, args.dim, args.classes, args.memory)
    store = (
        f"{args.dir}/run-{'all' if args.all_rows else 'main'}-{args.samples}x{args.dim}-{args.memory}-{args.methods}"
    )
    shutil.rmtree(store, ignore_errors=True)
    lines = []
    t0 = time.perf_counter()
    run_pipeline(parse_config(_config(args, data, store), where="bench_scale"), resume=False, log=lines.append)
    wall = time.perf_counter() - t0
    manifest = json.load(open(f"{store}/runs/latest.json"))
    metrics = json.load(open(f"{store}/report/metrics.json")) if os.path.exists(f"{store}/report/metrics.json") else {}
    peaks = next((ln for ln in lines if ln.startswith("Peak RSS")), "Peak RSS: ?")
    out = {
        "samples": args.samples,
        "dim": args.dim,
        "workers": args.workers,
        "memory": args.memory,
        "synth_s": round(synth_s, 1),
        "wall_s": round(wall, 1),
        "timings": manifest["timings"],
        "peak_rss": peaks,
        "bench_process_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    print(
        f"{args.samples:,} x {args.dim}, {args.classes} classes, {args.workers} workers of {args.memory}: "
        f"run {wall:.1f} s (synth {synth_s:.1f} s, not counted)"
    )
    for t in manifest["timings"]:
        print(f"  {t['stage']:<11} {t['seconds']:8.1f} s  {t.get('note', '')}")
    print(f"  {peaks}")
    for ln in lines:
        if "recall@" in ln:
            print(f"  {ln.strip()}")
    recs = metrics.get("records", [])
    acc = {}
    for r in recs:
        if r["metric"] in ("map", "map@r", "knn_recall") or (r["metric"] == "top1_error" and r["classifier"]):
            view = (r.get("params") or {}).get("view", "codes")
            name = f"{r['method']}-{r['dim']}" + ("" if view == "codes" else f" ({view})")
            acc.setdefault(name, {})[r["metric"] + (f" {r['classifier']}" if r["classifier"] else "")] = r["value"]
    for name, vals in acc.items():
        print(f"  {name:<20} " + ", ".join(f"{k} {v:.4f}" for k, v in sorted(vals.items()) if v is not None))
    out["accuracy"] = acc
    stage_s = {t["stage"]: t["seconds"] for t in manifest["timings"]}
    if not args.no_faiss and manifest["units"].get("neighbours"):
        nb = _faiss_reference(store, manifest, 16, 10)
        out["faiss"] = nb
        print(
            f"  faiss {nb['factory']} alone (2 threads): train {nb['train_s']:.1f} s, add {nb['add_s']:.1f} s, "
            f"search {nb['queries']:,} queries {nb['search_s']:.1f} s, total {nb['total_s']:.1f} s; "
            f"neighbours stage / faiss = {stage_s['neighbours'] / nb['total_s']:.2f}"
        )
    if "neighbours" in stage_s:
        print(f"  evaluate / neighbours = {stage_s['evaluate'] / stage_s['neighbours']:.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
