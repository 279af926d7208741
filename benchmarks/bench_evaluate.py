"""``metricpipe evaluate`` on 1,000,000 x 128 float32 embeddings of 100 classes, 10,000 queries against
all, on 2 workers of 2 GB; then pytorch-metric-learning's AccuracyCalculator (CPU) on the same input
in a subprocess whose address space is capped, so a failure cannot take the machine down.

    python benchmarks/bench_evaluate.py [--store /tmp/synth1m.zarr] [--pml-cap-gb 4] [--pml-only --pml-k max_bin_count]

The PML part needs the `pml` extra (pip install -e ".[pml]"); without it that part is reported as
not run. Prints wall time and peak RSS per process (the command's own line) for metricpipe, and
time, peak RSS and the outcome of PML's default k (every reference) and of k="max_bin_count".
"""

import argparse
import json
import os
import subprocess
import sys
import time

PML_CHILD = r"""
import resource, sys, time, json
cap = int(sys.argv[1]); store = sys.argv[2]; queries = sys.argv[3]; k = sys.argv[4]
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
import numpy as np, zarr
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
rows = np.load(queries)
t0 = time.perf_counter()
out = {"k": k}
try:
    g = zarr.open_group(store=store, mode="r")
    X, y = g["X"][:], g["y"][:]
    rest = np.setdiff1d(np.arange(len(y)), rows)
    order = np.r_[rows, rest]                       # PML's layout: the queries first in the reference
    calc = AccuracyCalculator(include=("mean_average_precision_at_r", "r_precision", "precision_at_1",
                                       "mean_reciprocal_rank", "NMI", "AMI"),
                              k=None if k == "None" else k, device=__import__("torch").device("cpu"))
    res = calc.get_accuracy(X[rows], y[rows], X[order], y[order], ref_includes_query=True)
    out.update(ok=True, metrics=res)
except BaseException as e:
    out.update(ok=False, error=f"{type(e).__name__}: {str(e)[:200]}")
out["seconds"] = time.perf_counter() - t0
out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", default="/tmp/synth1m.zarr")
    ap.add_argument("--out", default="/tmp/bench_evaluate_metrics.json")
    ap.add_argument("--pml-cap-gb", type=float, default=4.0)
    ap.add_argument("--pml-k", nargs="+", default=["None", "max_bin_count"], help="PML's k values to try.")
    ap.add_argument("--pml-only", action="store_true", help="Skip the metricpipe run (PML figures only).")
    args = ap.parse_args()
    if not os.path.exists(args.store):
        cmd = [
            "metricpipe",
            "synth",
            "--samples",
            "1000000",
            "--dim",
            "128",
            "--classes",
            "100",
            "--store",
            args.store,
            "--workers",
            "2",
            "--memory-limit",
            "2GB",
        ]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    cmd = [
        "metricpipe",
        "evaluate",
        args.store,
        "--queries",
        "10000",
        "--workers",
        "2",
        "--memory-limit",
        "2GB",
        "--out",
        args.out,
    ]
    if not args.pml_only:
        print("$", " ".join(cmd), flush=True)
        t0 = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True)
        print(res.stdout + res.stderr, flush=True)
        print(
            f"metricpipe evaluate: exit {res.returncode}, {time.perf_counter() - t0:.1f} s wall (cluster start "
            f"included)"
        )
        if res.returncode:
            sys.exit(res.returncode)
    # the same queries for PML: metricpipe's stratified sample
    import numpy as np
    import zarr

    from metricpipe.tasks.sparse import stratified_subset

    y = zarr.open_group(store=args.store, mode="r")["y"][:]
    qpath = "/tmp/bench_evaluate_queries.npy"
    np.save(qpath, stratified_subset(y, 10000, [0, 20]))
    if os.path.exists(args.out):
        ours = {r["metric"]: r["value"] for r in json.loads(open(args.out).read())}
        print("metricpipe:", {k: round(v, 6) for k, v in ours.items()})
    import importlib.util

    if importlib.util.find_spec("pytorch_metric_learning") is None:
        print("PML: not run (pip install -e '.[pml]')")
        return
    cap = int(args.pml_cap_gb * 2**30)
    for k in args.pml_k:
        r = subprocess.run(
            [sys.executable, "-c", PML_CHILD, str(cap), args.store, qpath, k], capture_output=True, text=True
        )
        line = (r.stdout.strip().splitlines() or [""])[-1]
        try:
            print(
                f"PML AccuracyCalculator k={k} (address space capped at {args.pml_cap_gb} GB):",
                json.loads(line),
                flush=True,
            )
        except json.JSONDecodeError:
            print(
                f"PML AccuracyCalculator k={k}: exit {r.returncode} (killed: signal {-r.returncode})"
                if r.returncode < 0
                else f"PML k={k}: exit {r.returncode}: {r.stderr.strip()[-300:]}"
            )


if __name__ == "__main__":
    main()
