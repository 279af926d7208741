"""SL-DE's train stage on 1 and on 2 workers, in one run: prints the time ratio (the design's promise
is ensemble members trained in parallel) and checks the models are bit-identical.

    METRICPIPE_DATA=/path/to/fashion-mnist python benchmarks/bench_slde_parallel.py [--store /tmp/slde-bench]

Uses Fashion-MNIST (60k train, l2-normalised, k = 50 graph) and SL-DE with 8 members of 64 PCA
dimensions; stage, statistics and neighbours are computed once (or reused from --store).
"""

import argparse
import time

import numpy as np
from distributed import Client, LocalCluster

from metricpipe import stages
from metricpipe.config import parse_config
from metricpipe.context import StageContext
from metricpipe.store import Store, load_arrays

CONFIG = {
    "data": {"source": "fashion-mnist", "normalize": "l2", "split": {"column": "split"}},
    "methods": [{"method": "slde", "members": 8, "member_dim": 64, "step": 0.02, "epochs": 3}],
    "neighbours": {"k": 50},
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--store", default="/tmp/slde-bench")
    args = p.parse_args()
    cfg = parse_config(CONFIG)
    store = Store(args.store)
    store.check_writable()
    times, models = {}, {}
    for workers in (2, 1, 2):
        with (
            LocalCluster(
                n_workers=workers, threads_per_worker=1, host="127.0.0.1", dashboard_address="127.0.0.1:0"
            ) as lc,
            Client(lc) as c,
        ):
            ctx = StageContext(c, store, cfg, log=lambda m: None)
            data = stages.run_stage(ctx)
            stat = stages.run_statistics(ctx, data)
            graph = stages.run_neighbours(ctx, data)
            ctx.resume = False  # retrain every time
            t = time.perf_counter()
            [(spec, unit)] = stages.run_train(ctx, data, stat, graph)
            times[workers] = time.perf_counter() - t  # the second 2-worker run (warm page cache) counts
            models[workers] = load_arrays(unit.url)[0]
            print(
                f"train stage, {workers} worker(s): {times[workers]:.1f} s; members "
                f"{[round(s, 1) for s in unit.meta()['member_seconds']]} s each"
            )
    same = all(np.array_equal(models[1][k], models[2][k]) for k in models[1])
    print(f"2 workers / 1 worker time = {times[2] / times[1]:.2f}; models bit-identical: {same}")


if __name__ == "__main__":
    main()
