"""How much of each stage's wall time goes to scheduling (issue #9): measured in one run.

1. Dask's cost per task on this machine, through the pipeline's own submit/gather path: 2,000 no-op
   tasks on the same LocalCluster; per-task overhead = wall / tasks x threads.
2. A real run of CONFIG on that cluster, recording each stage's wall time, its number of tasks and
   (Dask's task stream) the compute time of those tasks.

Per stage it prints two shares of wall x threads: the estimated scheduling share (tasks x per-task
overhead) and an upper bound, everything that was not task compute (it also counts threads idle for
want of work, e.g. one model training while the other worker waits). Asserts nothing.

    METRICPIPE_DATA=/path/to/fashion-mnist PYTHONPATH=. python benchmarks/bench_scheduler.py [CONFIG]
"""

import argparse
import tempfile
import time

from distributed import Client, LocalCluster, get_task_stream

from metricpipe import stages
from metricpipe.config import load_config
from metricpipe.context import StageContext
from metricpipe.store import Store


def _noop(i):
    return i


def main():
    p = argparse.ArgumentParser()
    p.add_argument("config", nargs="?", default="examples/fashion-mnist.yaml")
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args()
    cfg = load_config(a.config).with_overrides(store=tempfile.mkdtemp(prefix="mp-sched-"), workers=a.workers)
    with (
        LocalCluster(
            n_workers=a.workers, threads_per_worker=1, host="127.0.0.1", dashboard_address="127.0.0.1:0"
        ) as lc,
        Client(lc) as c,
    ):
        store = Store(cfg.store)
        store.check_writable()
        ctx = StageContext(c, store, cfg, log=lambda m: None)
        ctx.gather([ctx.submit(_noop, i, name="noop") for i in range(200)], "warm-up")
        t = time.perf_counter()
        n = 2000
        ctx.gather([ctx.submit(_noop, i, name="noop") for i in range(n)], "noop")
        per_task = (time.perf_counter() - t) * a.workers / n
        print(f"Dask overhead per task (submit, run, gather; {a.workers} workers): {per_task * 1e3:.2f} ms")

        plan = stages.prepare_data(cfg, store)
        data = plan.info
        rows = []

        def stage(name, fn, *args):
            tasks0 = ctx.tasks
            with get_task_stream(c) as ts:
                t0 = time.perf_counter()
                out = fn(*args)
                wall = time.perf_counter() - t0
            compute = sum(
                ss["stop"] - ss["start"] for task in ts.data for ss in task["startstops"] if ss["action"] == "compute"
            )
            rows.append((name, wall, ctx.tasks - tasks0, compute))
            return out

        data = stage("stage", stages.run_stage, ctx, plan)
        stats = stage("statistics", stages.run_statistics, ctx, data)
        graph = (
            stage("neighbours", stages.run_neighbours, ctx, data) if "neighbours" in stages.stage_names(cfg) else None
        )
        models = stage("train", stages.run_train, ctx, data, stats, graph)
        codes = stage("encode", stages.run_encode, ctx, data, models)
        stage("evaluate", stages.run_evaluate, ctx, data, codes, graph)
    print(f"{'stage':<12}{'wall s':>8}{'tasks':>7}{'scheduling (est.)':>19}{'not compute (bound)':>21}")
    for name, wall, tasks, compute in rows:
        cap = wall * a.workers
        print(f"{name:<12}{wall:>8.2f}{tasks:>7}{tasks * per_task / cap:>18.1%}{max(0.0, 1 - compute / cap):>21.1%}")


if __name__ == "__main__":
    main()
