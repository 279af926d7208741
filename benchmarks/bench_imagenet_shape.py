"""The papers' shape: 1,000 classes of 4,096-d descriptors, out of core, every learner (issue 48, item 1).

    python benchmarks/bench_imagenet_shape.py                  # 500,000 x 4,096, 1,000 classes, 2 workers of 8 GB
    python benchmarks/bench_imagenet_shape.py --plan           # the models and the plan's estimates only
    python benchmarks/bench_imagenet_shape.py --samples 20000 --dim 512 --classes 100 --memory 3GB   # a smoke run

Data: ``metricpipe synth --nuisance 2 --overlap 1`` (the class structure of the 128-d default kept
at 4,096 dimensions, hard enough for raw features' mAP to stay between 0.2 and 0.6 and l2 NCM's top-5
error above 0.2), made once and kept in ``--dir`` (not counted), staged from that file with
``normalize: l2``, 20 % test, no validation split (each learner that stops early holds out its own
share, so no refit doubles the train stage). Two runs (``PASSES``): ``main``, every learner but NML:
identity, PCA-512, LDA, NCMML-512, NCMC-512 (k = 10), k-NN ML-512, SL-DE (8 members of 64 dimensions
over all 4,096), sparse projectors (R = 256, tau 0.9 and 0.99), linear ML-128, linear SLEM and a
Gaussian kernel SLEM (incomplete Cholesky, rank 256: the full kernel of 15,000 negatives is refused
by the memory rule at 8 GB workers); ``nonnegative``, NML-128 (its chi2 needs non-negative rows) beside identity and
PCA-512 on the same recipe with ``--nonnegative``. The SGD learners' steps are capped (and scaled by
``--iters-scale``) so that the runs take hours, not days; ``--plan`` prints how long each fit may take.

Each stage is set against the machine's limit, measured in this process before the run (one thread,
as a worker runs; the limit of the stage is its work at that rate on ``--workers`` processes):

- stage: a plain copy of the synth file's feature chunks (read + write of the same bytes);
- statistics: the covariance's N D^2 multiply-adds at the float64 GEMM rate;
- neighbours: the exact search's queries x train rows x D multiply-adds at the float32 GEMM rate;
- train: each fit's CPU seconds against the plan's estimate of it (its learner's ``fit_cost`` on the
  rows the plan gives it: a SLEM's pool, a candidate's share) at the GEMM rate, the stage against the
  sum of the estimates;
- encode: reading the staged features once per model, plus each model's ``transform_cost``;
- evaluate: retrieval's queries x test rows and kNN's queries x train rows, at each code's width.

A ratio above 1 is that many times the limit's time. Peak RSS per process is the run's own line. The
accuracy table: mAP, MAP@R, NCM top-1 / top-5 error and kNN-1 error of each model, beside PCA's and
the raw features'. ``--out`` writes every figure as JSON.
"""

import argparse
import json
import os
import shutil
import time

import numpy as np
from threadpoolctl import threadpool_limits

D_PCA, D_NCM, D_PAIRS, R_SPARSE = 512, 512, 128, 256
METHODS = [
    {"method": "identity"},
    {"method": "pca", "dim": D_PCA},
    {"method": "lda"},
    {"method": "ncmml", "dim": D_NCM, "iters": 2000},
    {"method": "ncmc", "dim": D_NCM, "centroids": 10, "iters": 500},
    {"method": "knnml", "dim": D_NCM, "iters": 1000},
    {"method": "slde", "members": 8, "member_dim": 64, "epochs": 1},
    {"method": "sparse", "dim": R_SPARSE, "sparsity": [0.9, 0.99], "max_iter": 100},
    {"method": "linear-ml", "dim": D_PAIRS, "iters": 1000000},
    {"method": "slem"},
    # the full 15,000 x 15,000 kernel needs ~9 GB (5 float64 copies): over the memory rule's 4.8 GB of
    # an 8 GB worker, refused before staging in one line; incomplete Cholesky of rank 256 fits
    {"method": "slem", "kernel": "gaussian", "decomposition": "icd", "rank": 256},
]
NML = {"method": "nml", "dim": D_PAIRS, "iters": 300000, "pairs": 300000}
#: pass -> (non-negative rows, its models)
PASSES = {"main": (False, METHODS), "nonnegative": (True, [*METHODS[:2], NML])}
RECIPE = {"nuisance": 2.0, "overlap": 1.0}
STEPS = ("iters", "max_iter")  # what --iters-scale scales


def config(args, data_path: str, store: str, models: list) -> dict:
    methods = []
    for m in models:
        if args.methods and m["method"] not in args.methods.split(","):
            continue
        m = dict(m, select=False)
        if "dim" in m:  # (a smoke run's smaller D)
            m["dim"] = min(m["dim"], args.dim // 2)
        if "member_dim" in m:
            m["member_dim"] = min(m["member_dim"], args.dim // (2 * m["members"]))
        for k in STEPS:
            if k in m:
                m[k] = max(1, int(m[k] * args.iters_scale))
        methods.append(m)
    return {
        "store": store,
        "workers": args.workers,
        "memory_limit": args.memory,
        "dashboard": None,
        "data": {"path": data_path, "normalize": "l2", "split": {"test": 0.2, "val": 0, "seed": 0}},
        "neighbours": {"k": 10, "method": "exact", "queries": min(args.graph_queries, args.samples // 2)},
        "methods": methods,
        "evaluate": {
            "retrieval": {"k": [10], "queries": args.queries},
            "classification": {"queries": args.classify_queries},
        },
        **({"encode": {"pq": [int(m) for m in args.pq.split(",")]}} if args.pq else {}),
    }


def synth(path: str, args, nonnegative: bool) -> float:
    """The synthetic file (once); its seconds, 0 when it was there."""
    from distributed import Client, LocalCluster

    from metricpipe.commands.synth import write_synthetic

    if os.path.exists(path):
        return 0.0
    t0 = time.perf_counter()
    with (
        LocalCluster(
            n_workers=args.workers, threads_per_worker=1, memory_limit=args.memory, dashboard_address=None
        ) as lc,
        Client(lc) as client,
    ):
        write_synthetic(
            client, path, args.samples, args.dim, args.classes, nonnegative=nonnegative, log=print, **RECIPE
        )
    return time.perf_counter() - t0


def gemm_rates() -> dict:
    """Multiply-adds per CPU second of one thread: float64 (the unit of ``fit_cost``) and float32."""
    from metricpipe.estimate import gemm_rate

    a = np.random.default_rng(0).standard_normal((2048, 2048)).astype(np.float32)
    with threadpool_limits(1):
        a @ a
        t, n = time.process_time(), 0
        while time.process_time() - t < 2.0:
            a @ a
            n += 1
        f32 = n * 2048**3 / (time.process_time() - t)
        f64 = gemm_rate()
    return {"float64": f64, "float32": f32}


def copy_rate(path: str, scratch: str, limit_bytes: float = 2e9) -> float:
    """Bytes per second of a plain copy of the synth file's feature chunks (read, write, fsync), up to
    ``limit_bytes`` of them."""
    src = os.path.join(path, "X")
    files = sorted(f for f in os.listdir(src) if not f.startswith(".") and not f.endswith(".json"))
    if not files:  # zarr v3: chunks under c/
        src = os.path.join(src, "c")
    os.makedirs(scratch, exist_ok=True)
    done, t0 = 0, time.perf_counter()
    for root, _, names in os.walk(src):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                b = f.read()
            with open(os.path.join(scratch, f"{done}"), "wb") as g:
                g.write(b)
                g.flush()
                os.fsync(g.fileno())
            done += len(b)
            if done >= limit_bytes:
                break
        if done >= limit_bytes:
            break
    seconds = time.perf_counter() - t0
    shutil.rmtree(scratch, ignore_errors=True)
    return done / seconds


def stage_limits(store: str, manifest: dict, rates: dict, copy_bps: float, workers: int) -> dict:
    """Each stage's limit in seconds (its work at the machine's rates on ``workers`` processes)."""
    from metricpipe.tasks import registry

    ds = manifest["dataset"]
    n, D, C = ds["n_samples"], ds["n_features"], ds["n_classes"]
    n_train, n_test = ds["splits"]["train"], ds["splits"]["test"]
    graph_q = min((manifest["config"].get("neighbours") or {}).get("queries") or n_train, n_train)
    specs = [m["spec"] for m in json.load(open(f"{store}/report/metrics.json"))["models"]]
    codes = [registry.make(s).code_dim(D, C) for s in specs] or [D]
    ev = manifest["config"]["evaluate"]
    rq = min(ev["retrieval"].get("queries") or n_test, n_test)
    cq = min(ev["classification"].get("queries") or n_test, n_test)
    encode = sum(registry.make(s).transform_cost(n, D, C) for s in specs) / rates["float64"]
    encode += len(specs) * n * D * 4 / copy_bps
    search = sum(rq * n_test * d + cq * n_train * d for d in codes) / rates["float32"]
    return {
        "stage": n * D * 4 / copy_bps,
        "statistics": n_train * D * D / rates["float64"] / workers,
        "neighbours": graph_q * n_train * D / rates["float32"] / workers,
        "encode": encode / workers,
        "evaluate": search / workers,
    }


def fits(cfg, rate64: float) -> list:
    """(model, CPU seconds of its fit, the plan's estimate in seconds, ratio) of every fit the run's
    records hold: the estimate is `metricpipe plan`'s for that fit (its rows: a SLEM's pool, a
    candidate's share), at the float64 GEMM rate measured before the run."""
    from metricpipe import stages
    from metricpipe.checks import check_methods
    from metricpipe.estimate import estimate
    from metricpipe.store import Store
    from metricpipe.store.models import model_units
    from metricpipe.tasks import registry

    data = stages.prepare_data(cfg, Store(cfg.store))
    plan = estimate(check_methods(cfg, data.info, lambda m: None), data.info, rate64)
    planned = {registry.model_name(f.spec): f for f in plan.fits if f.role != "refit" and not f.same_as_earlier}
    rows = []
    for _, rec in model_units(Store(cfg.store)):
        cpu, name = rec.get("cpu_seconds"), registry.model_name(rec["spec"])
        f = planned.get(name)
        if cpu is None or rec.get("refit_of"):
            continue
        est = None if f is None or f.cost is None else f.cost.madds / rate64
        rows.append(
            (
                name + (" (at most)" if f is not None and f.cost and f.cost.at_most else ""),
                cpu,
                est,
                None if not est else cpu / est,
            )
        )
    return rows


def accuracy(store: str) -> dict:
    """{model name: {metric: value}}: mAP, MAP@R, top-1 / top-5 error of NCM (of NCMC for NCMC), kNN-1."""
    from metricpipe.tasks import registry

    m = json.load(open(f"{store}/report/metrics.json"))
    names = {x["key"]: registry.model_name(x["spec"]) for x in m["models"]}
    out = {}
    for r in m["records"]:
        key = r["metric"] + (f" {r['classifier']}" if r["classifier"] else "")
        if r["classifier"] == "ncmc":
            key = key.replace("ncmc", "ncm")  # NCMC's own classifier in the NCM columns
        if key in ACCURACY and r["model"] in names:
            out.setdefault(names[r["model"]], {})[key] = r["value"]
    return out


ACCURACY = ("map", "map@r", "top1_error ncm", "top5_error ncm", "top1_error knn1")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=500_000)
    ap.add_argument("--dim", type=int, default=4096)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--memory", default="8GB", help="each worker's memory limit")
    ap.add_argument("--methods", default="", help="a comma-separated subset of METHODS' methods")
    ap.add_argument("--iters-scale", type=float, default=1.0, help="times the SGD learners' steps in METHODS")
    ap.add_argument("--graph-queries", type=int, default=20_000, help="rows of the neighbour graph (SL-DE, k-NN ML)")
    ap.add_argument("--queries", type=int, default=2000, help="retrieval queries")
    ap.add_argument("--classify-queries", type=int, default=20_000, help="test rows classified")
    ap.add_argument("--dir", default="/tmp/bench-imagenet")
    ap.add_argument("--plan", action="store_true", help="print the plan only")
    ap.add_argument("--passes", default="main,nonnegative", help="which of PASSES to run, in order")
    ap.add_argument("--out", default=None, help="write the figures as JSON")
    ap.add_argument("--pq", default="", help="encode.pq: bytes per vector, comma-separated (e.g. 8,16,32)")
    ap.add_argument("--resume", action="store_true", help="resume the pass's store (its finished units reused)")
    args = ap.parse_args()

    from metricpipe.config import parse_config
    from metricpipe.runner import run_pipeline

    os.makedirs(args.dir, exist_ok=True)
    rates = None
    for name in args.passes.split(","):
        nonnegative, models = PASSES[name]
        data = f"{args.dir}/s{args.samples}x{args.dim}c{args.classes}{'-nn' if nonnegative else ''}.zarr"
        store = f"{args.dir}/run-{name}-{args.samples}x{args.dim}c{args.classes}"
        cfg = config(args, data, store, models)
        if args.plan:
            plan(cfg, args, nonnegative)
            continue
        synth_s = synth(data, args, nonnegative)
        if rates is None:
            rates = gemm_rates()
            copy_bps = copy_rate(data, f"{args.dir}/copy-scratch")
            print(
                f"machine, one thread: GEMM float64 {rates['float64'] / 1e9:.1f} G multiply-adds/s, float32 "
                f"{rates['float32'] / 1e9:.1f}; a plain copy {copy_bps / 1e6:,.0f} MB/s"
            )
        if not args.resume:
            shutil.rmtree(store, ignore_errors=True)
        lines = []
        t0 = time.perf_counter()
        run_pipeline(
            parse_config(cfg, where=f"bench_imagenet_shape {name}"),
            resume=args.resume,
            log=lambda s: (lines.append(s), print(s)),
        )
        wall = time.perf_counter() - t0
        print(f"\n## pass {name} (synth {synth_s:.0f} s, not counted)")
        report(args, parse_config(cfg, where=f"bench_imagenet_shape {name}"), store, lines, wall, rates, copy_bps, name)


def plan(cfg: dict, args, nonnegative: bool) -> None:
    """`metricpipe plan` of a pass's config, on data.source: synthetic of the same shape (the synth file
    need not exist)."""
    from metricpipe.commands.plan import plan_lines
    from metricpipe.config import parse_config

    shape = {"samples": args.samples, "dim": args.dim, "classes": args.classes, "nonnegative": nonnegative}
    data = {**cfg["data"], "source": "synthetic", "synthetic": {**shape, **RECIPE}}
    data.pop("path")
    for line in plan_lines(parse_config({**cfg, "data": data, "store": f"{args.dir}/plan-store"}, where="bench")):
        print(line)


def report(args, cfg, store: str, lines: list, wall: float, rates: dict, copy_bps: float, name: str) -> None:
    manifest = json.load(open(f"{store}/runs/latest.json"))
    limits = stage_limits(store, manifest, rates, copy_bps, args.workers)
    fit_rows = fits(cfg, rates["float64"])
    limits["train"] = sum(r[2] or 0.0 for r in fit_rows) / args.workers  # the plan's estimates
    peaks = next((ln for ln in lines if ln.startswith("Peak RSS")), "Peak RSS: ?")
    print(
        f"\n{args.samples:,} x {args.dim}, {args.classes} classes, {args.workers} workers of {args.memory}: {wall:.0f} s"
    )
    print("| stage | seconds | limit (s) | stage / limit |\n| --- | --- | --- | --- |")
    stage_rows = []
    for t in manifest["timings"]:
        lim = limits.get(t["stage"])
        ratio = None if not lim else t["seconds"] / lim
        stage_rows.append({"stage": t["stage"], "seconds": t["seconds"], "limit": lim, "ratio": ratio})
        print(
            f"| {t['stage']} | {t['seconds']:.1f} | {'' if lim is None else f'{lim:.1f}'} | {'' if ratio is None else f'{ratio:.2f}'} |"
        )
    print(f"\n{peaks}\n\n| fit | CPU (s) | plan's estimate (s) | CPU / estimate |\n| --- | --- | --- | --- |")
    for fit, cpu, est, r in fit_rows:
        print(f"| {fit} | {cpu:.1f} | {'' if est is None else f'{est:.1f}'} | {'' if r is None else f'{r:.2f}'} |")
    acc = accuracy(store)
    cols = ACCURACY
    print("\n| model (NCM columns: NCMC's own classifier for NCMC) | " + " | ".join(cols) + " |")
    print("| --- |" + " --- |" * len(cols))
    for model, vals in acc.items():
        print(f"| {model} | " + " | ".join("" if vals.get(c) is None else f"{vals[c]:.4f}" for c in cols) + " |")
    encoded = per_byte(store)
    if encoded:
        print("\n| method | bytes | mAP | MAP@R | kNN-1 error | queries / s |\n| --- | --- | --- | --- | --- | --- |")
        for r in encoded:
            print(f"| {r['label']} | {r['pq_bytes']} | " + " | ".join(r["cells"]) + " |")
    if args.out:
        with open(args.out.replace(".json", f"-{name}.json"), "w") as f:
            out = {"wall": wall, "rates": rates, "copy_bps": copy_bps, "stages": stage_rows, "per_byte": encoded}
            json.dump({**out, "peaks": peaks, "fits": fit_rows, "accuracy": acc}, f, indent=1, default=str)


def per_byte(store: str) -> list:
    """The report's quality-per-byte rows (encode.pq): {label, pq_bytes, cells} by size, then method."""
    from metricpipe.report.quality import quality_rows

    m = json.load(open(f"{store}/report/metrics.json"))
    if "quality_per_byte" not in m:
        return []
    cols = [("map", None), ("map@r", None), ("top1_error", "knn1"), ("qps", None)]
    out = []
    for r in quality_rows(m["quality_per_byte"]["records"]):
        cells = [r["values"].get(c) for c in cols]
        cells = ["" if v is None else (f"{v:,.0f}" if c[0] == "qps" else f"{v:.4f}") for c, v in zip(cols, cells)]
        out.append({"label": r["label"], "pq_bytes": r["pq_bytes"], "cells": cells})
    return out


if __name__ == "__main__":
    main()
