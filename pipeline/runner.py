"""Runs the stage graph in order, shows progress, records timings, writes the manifest and report.

    stage -> statistics -> [neighbours] -> train -> encode -> evaluate -> report
"""
import contextlib
import time

import numpy as np

from pipeline import stages
from pipeline.cluster import connect
from pipeline.config import SPLIT_NAMES, NeighboursConfig, RunConfig
from pipeline.context import StageContext
from pipeline.report import build_report, package_versions
from pipeline.storage import Store, to_json
from tasks.registry import METHODS


def stage_names(cfg: RunConfig) -> list[str]:
    needs_graph = cfg.neighbours is not None or any("neighbours" in METHODS[m["method"]].inputs for m in cfg.methods) \
        or any(c.startswith("softvote") for c in cfg.evaluate.classifiers)
    return ["stage", "statistics"] + (["neighbours"] if needs_graph else []) + ["train", "encode", "evaluate",
                                                                                  "report"]


def run_pipeline(cfg: RunConfig, resume: bool = True, log=print, performance_report: str | None = None,
                 client=None) -> str:
    """Run every stage of ``cfg``; return the path of the report's index.html."""
    store = Store(cfg.store)
    store.check_writable()
    plan = stages.prepare_data(cfg, store)  # refuse bad input before starting anything
    with contextlib.ExitStack() as stack:
        if client is None:
            client = stack.enter_context(connect(cfg.cluster, cfg.workers, cfg.threads_per_worker, cfg.memory_limit,
                                                 cfg.dashboard))
        log(f"Dashboard: {client.dashboard_link}")
        if performance_report:
            from distributed import performance_report as perf
            stack.enter_context(perf(filename=performance_report))
        return _run(StageContext(client, store, cfg, resume=resume, log=log), plan, log)


def _run(ctx: StageContext, plan, log) -> str:
    cfg = ctx.config
    names = stage_names(cfg)
    timings, started = [], time.time()
    t_run = time.perf_counter()

    def step(i, name, fn, *args):
        log(f"[{i}/{len(names)}] {name} ...")
        t0 = time.perf_counter()
        result = fn(*args)
        seconds = time.perf_counter() - t0
        timings.append({"stage": name, "seconds": round(seconds, 3)})
        log(f"Completed {i} of {len(names)} stages ({name}, {seconds:.1f} s)")
        return result

    i = iter(range(1, len(names) + 1))
    data = step(next(i), "stage", stages.run_stage, ctx, plan)
    stats = step(next(i), "statistics", stages.run_statistics, ctx, data)
    graph = None
    if "neighbours" in names:
        if cfg.neighbours is None:
            cfg = ctx.config = cfg.with_overrides(neighbours=NeighboursConfig())
        graph = step(next(i), "neighbours", stages.run_neighbours, ctx, data)
    models = step(next(i), "train", stages.run_train, ctx, data, stats, graph)
    codes = step(next(i), "encode", stages.run_encode, ctx, data, models)
    evals = step(next(i), "evaluate", stages.run_evaluate, ctx, data, codes, graph)
    manifest = {
        "config": cfg.raw, "store": ctx.store.url, "started": started, "versions": package_versions(),
        "dataset": {"source": data.unit.meta().get("source"), "key": data.unit.key, "n_samples": data.n_samples,
                    "n_features": data.n_features, "n_classes": len(data.classes),
                    "splits": {SPLIT_NAMES[c]: int(n) for c, n in enumerate(np.bincount(data.split)) if n}},
        "units": {"data": data.unit.rel, "statistics": stats.rel, "neighbours": graph.rel if graph else None,
                  "models": [u.rel for _, u in models], "codes": [u.rel for _, u, _ in codes]},
        "evaluation_units": [u.rel for _, u in evals], "timings": timings,
    }
    t0 = time.perf_counter()
    log(f"[{len(names)}/{len(names)}] report ...")
    manifest["seconds"] = time.perf_counter() - t_run
    ctx.store.write_text("runs/latest.json", to_json(manifest))
    path = build_report(ctx.store, manifest)
    timings.append({"stage": "report", "seconds": round(time.perf_counter() - t0, 3)})
    log(f"Completed {len(names)} of {len(names)} stages (report)")
    log(f"Report: {path}")
    return path
