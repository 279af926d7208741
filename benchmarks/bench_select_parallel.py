"""Parameter selection's candidates run concurrently: the train stage of an 8-candidate SL-NE
selection on 1 and on 2 workers, in one run; prints the time ratio and checks both choose the same
candidate with the same validation scores.

    METRICPIPE_DATA=/path/to/fashion-mnist python benchmarks/bench_select_parallel.py [--store DIR]

Fashion-MNIST (l2-normalised, k = 50 graph, the val split carved from train), SL-NE in a 128-d PCA
input space with a grid of 4 steps x 2 margins. Stage, statistics and neighbours are computed once
(or reused from --store); the train stage is recomputed for every measurement.
"""

import argparse
import time

from distributed import Client, LocalCluster

from metricpipe import stages
from metricpipe.config import parse_config
from metricpipe.context import StageContext
from metricpipe.store import Store

CONFIG = {
    "data": {"source": "fashion-mnist", "normalize": "l2", "split": {"column": "split"}},
    "methods": [
        {"method": "slne", "input_dim": 128, "select": {"step": [0.2, 0.05, 0.02, 0.005], "margin": [0.02, 0.05]}}
    ],
    "neighbours": {"k": 50},
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--store", default="/tmp/select-bench")
    args = p.parse_args()
    cfg = parse_config(CONFIG)
    store = Store(args.store)
    store.check_writable()
    times, chosen = {}, {}
    for workers in (2, 1, 2):
        with (
            LocalCluster(n_workers=workers, threads_per_worker=1, dashboard_address="127.0.0.1:0") as lc,
            Client(lc) as c,
        ):
            ctx = StageContext(c, store, cfg, log=lambda m: None)
            data = stages.run_stage(ctx, stages.prepare_data(cfg, store))
            stat = stages.run_statistics(ctx, data)
            graph = stages.run_neighbours(ctx, data)
            ctx.resume = False  # retrain every candidate every time
            t = time.perf_counter()
            [(spec, unit)] = stages.run_train(ctx, data, stat, graph)
            times[workers] = time.perf_counter() - t  # the second 2-worker run (warm page cache) counts
            sel = store.unit(*ctx.selections[-1].split("/")).meta()
            chosen[workers] = (sel["chosen"], [c["score"] for c in sel["candidates"]])
            print(
                f"train stage, {workers} worker(s), {len(sel['candidates'])} candidates: {times[workers]:.1f} s; "
                f"chose {sel['candidates'][sel['chosen']]['params']} "
                f"(softvote10 error {sel['candidates'][sel['chosen']]['score']:.4f})",
                flush=True,
            )
    print(
        f"1 worker / 2 workers time = {times[1] / times[2]:.2f}x speed-up; same choice and scores: "
        f"{chosen[1] == chosen[2]}"
    )


if __name__ == "__main__":
    main()
