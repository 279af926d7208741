"""How close `metricpipe plan`'s estimates come to the fits' measured times.

Two parts, both in CPU seconds of the fit (so that other work on the machine does not count; the plan
turns a cost into wall seconds with the share of a core the machine's load leaves a task):

1. in process, on scikit-learn's digits: every built-in learner fitted with small settings, its
   ``fit_cost`` over a GEMM timed on one BLAS thread, against the fit's CPU time;
2. with ``--store STORE --config CONFIG...``: the runs of those configs already in STORE (e.g. the
   Fashion-MNIST examples): each model record's ``cpu_seconds`` (and wall ``fit_seconds``) against the
   plan's estimate of that fit.

    python benchmarks/bench_plan.py
    METRICPIPE_DATA=/path/to/fashion-mnist python benchmarks/bench_plan.py \\
        --store runs/fashion --config examples/fashion-mnist-slde.yaml examples/fashion-mnist-sparse.yaml

A ratio (measured / estimate) between 0.5 and 2 is what the plan promises; "at most" estimates count
the most steps early stopping allows, so a fit that stopped early comes in under them.
"""

import argparse
import time

import numpy as np
from sklearn.datasets import load_digits
from threadpoolctl import threadpool_limits

from metricpipe import stages
from metricpipe.checks import check_methods
from metricpipe.config import load_config
from metricpipe.estimate import estimate, gemm_rate
from metricpipe.store import Store
from metricpipe.store.models import model_units
from metricpipe.tasks import registry

IN_PROCESS = [
    {"method": "pca", "dim": 16},
    {"method": "lda"},
    {"method": "ncmml", "dim": 16, "iters": 300, "early_stopping": False, "lr": 30.0},
    {"method": "ncmc", "dim": 16, "iters": 300, "early_stopping": False, "lr": 30.0},
    {"method": "knnml", "dim": 16, "iters": 300, "early_stopping": False, "lr": 0.1},
    {"method": "linear-ml", "dim": 16, "iters": 60000, "pairs": 30000, "validation": 0},
    {"method": "nml", "dim": 16, "iters": 20000, "pairs": 20000, "validation": 0},
    {"method": "sparse", "dim": 16, "train_size": 600, "max_iter": 40, "validation": 0},
    {"method": "slem", "negatives": {"split": "train", "count": 1000}},
    {"method": "slem", "kernel": "gaussian", "negatives": {"split": "train", "count": 1000}},
]


# Fits this short both ways are listed but not counted: their time is the fixed costs' noise.
SHORT = 1.0


def ratio_line(name, role, est_s, at_most, cpu, wall=None, exact=None) -> str:
    bound = "at most " if at_most else ""
    w = "" if wall is None else f" | {wall:.1f}"
    e = "" if exact is None else f" | {exact:.2f}, {cpu / max(exact, 1e-9):.2f}"
    return f"| {name} | {role} | {bound}{est_s:.2f} | {cpu:.2f} | {cpu / max(est_s, 1e-9):.2f}{e}{w} |"


def in_process(rate: float) -> None:
    X, y = load_digits(return_X_y=True)
    X = (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32)
    print("| model (digits, in process) | fit | estimate (CPU s) | CPU (s) | CPU / estimate |")
    print("| --- | --- | --- | --- | --- |")
    for spec in IN_PROCESS:
        est = registry.make(spec)
        with threadpool_limits(1):
            t0 = time.process_time()
            est.fit(X, y)
            cpu = time.process_time() - t0
        cost = est.fit_cost(len(X), X.shape[1], 10)
        if cost is None:
            print(f"| {registry.model_name(spec)} | model | unknown | {cpu:.2f} | |")
            continue
        print(ratio_line(registry.model_name(spec), "model", cost.madds / rate, cost.at_most, cpu))


def from_store(store: str, configs: list[str], rate: float) -> None:
    records = {u.key: m for u, m in model_units(Store(store)) if "cpu_seconds" in m}
    print(
        "| model | fit | plan's estimate (CPU s) | CPU (s) | CPU / estimate | its steps: estimate, CPU / it | wall (s) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    ratios, exact_ratios = [], []
    for path in configs:
        cfg = load_config(path)
        data = stages.prepare_data(cfg, Store(cfg.store))
        cfg = check_methods(cfg, data.info, lambda m: None)
        plan = estimate(cfg, data.info, rate)
        fitted = {(registry.model_name(f.spec), f.role != "refit"): f for f in plan.fits if not f.same_as_earlier}
        refits = {(f.n, f.repeat): f for f in plan.fits if f.role == "refit"}
        for key, m in sorted(records.items(), key=lambda kv: registry.model_name(kv[1]["spec"])):
            origin = records.get(m.get("refit_of")) if m.get("refit_of") else None
            if m.get("refit_of") and origin is None:
                continue
            name = registry.model_name((origin or m)["spec"])
            f = fitted.get((name, True))
            if f is not None and origin is not None:
                f = refits.get((f.n, f.repeat))
            if f is None or f.cost is None:
                continue
            est_s, cpu = f.cost.madds / rate, m["cpu_seconds"]
            # a refit's record holds the steps it was given: the same formula, no longer a bound
            own = (
                registry.make(m["spec"]).fit_cost(f.rows, data.info.n_features, len(data.info.classes or []))
                if origin
                else None
            )
            exact = None if own is None else own.madds / rate
            if max(est_s, cpu) >= SHORT:
                ratios.append(cpu / est_s)
                exact_ratios.append(cpu / (exact if exact is not None else est_s))
            print(ratio_line(name, f.role, est_s, f.cost.at_most, cpu, m.get("fit_seconds"), exact))
        records = {k: m for k, m in records.items() if registry.model_name(m["spec"]) not in {n for n, _ in fitted}}
    for what, values in (("the plan's estimate", ratios), ("the estimate with a refit's own steps", exact_ratios)):
        if values:
            r = np.array(values)
            inside = ((r >= 0.5) & (r <= 2.0)).mean()
            print(
                f"{len(r)} fits of {SHORT:g} s or more: CPU / {what} from {r.min():.2f} to {r.max():.2f} "
                f"(median {np.median(r):.2f}), {inside:.0%} within 2x, {(r <= 2.0).mean():.0%} at most 2x over"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--store", help="a store holding runs of --config (model records with cpu_seconds)")
    p.add_argument("--config", nargs="+", default=[], help="the configs whose fits the store holds")
    p.add_argument("--no-digits", action="store_true", help="skip the in-process digits part")
    args = p.parse_args()
    rate = gemm_rate(1.0)
    print(f"GEMM on one BLAS thread: {rate / 1e9:.1f} G multiply-adds per CPU second\n")
    if not args.no_digits:
        in_process(rate)
        print()
    if args.store:
        from_store(args.store, args.config, rate)


if __name__ == "__main__":
    main()
