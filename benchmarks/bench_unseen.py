"""The unseen-class protocol (issue 45, item 3): learners trained on 8 classes, scored on the 2 classes
they never saw (``data.split.classes``), beside their figures on the 8 seen classes.

    METRICPIPE_DATA=/path/to/fashion-mnist python benchmarks/bench_unseen.py \
        [--sets digits fashion] [--max-train 20000] [--max-test 5000] [--seed 3] [--out DIR] [--table-only]

Data sets: scikit-learn's digits, l2-normalised, 80/20 split; Fashion-MNIST pixels, l2-normalised,
its own train/test split (``--max-train`` / ``--max-test``: stratified seeded subsets, 0 = all).
Each set is one ``metricpipe run`` with ``data.split: {classes: 0.2, seed: SEED}``: two classes
drawn with the seed are held out of everything the learners and baselines see (statistics, pools,
validation rows). Models: l2 features (identity), PCA-32, NCMML-32, NCMC-32 and linear ML-32, their
parameters chosen on validation rows of the seen classes. On the unseen classes: retrieval among
their test rows, kNN over their train rows, NCM (NCMC) with means (centroids) from their train rows.
Prints the table in Markdown and writes DIR/table.md and DIR/NAME.json.
"""

import argparse
import json
import time
from pathlib import Path

from bench_defaults import make_set
from distributed import Client, LocalCluster

from metricpipe.config import parse_config
from metricpipe.runner import run_pipeline

METHODS = [
    {"method": "identity"},
    {"method": "pca", "dim": 32},
    {"method": "ncmml", "dim": 32},
    {"method": "ncmc", "dim": 32},
    {"method": "linear-ml", "dim": 32},
]
LABELS = {
    "identity": "l2 features",
    "pca": "PCA-32",
    "ncmml": "NCMML-32",
    "ncmc": "NCMC-32",
    "linear-ml": "linear ML-32",
}
# (metric, classifier, column label); NCMC's error for the NCMC model (its own classifier) only
COLUMNS = [
    ("map", None, "mAP"),
    ("top1_error", "ncm", "NCM error"),
    ("top1_error", "ncmc", "NCMC error"),
    ("top1_error", "knn1", "kNN-1 error"),
]


def config(name: str, data: dict, store: str, seed: int) -> dict:
    split = {**data.get("split", {}), "classes": 0.2, "seed": seed}
    return {
        "store": store,
        "workers": 2,
        "dashboard": False,
        "data": {**data, "split": split},
        "methods": METHODS,
        "evaluate": {"retrieval": {"k": [10], "queries": 2000}, "classification": {"classifiers": ["knn1", "ncm"]}},
    }


def run(name: str, args, client) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = make_set("digits-l2" if name == "digits" else name, out, args.max_train, args.max_test)
    cfg = parse_config(config(name, data, str(out / f"store-{name}"), args.seed))
    t0 = time.perf_counter()
    run_pipeline(cfg, client=client, log=lambda m: None)
    seconds = time.perf_counter() - t0
    doc = json.loads((out / f"store-{name}" / "report" / "metrics.json").read_text())
    manifest = json.loads((out / f"store-{name}" / "runs" / "latest.json").read_text())
    held = doc["held_out_classes"]
    result = {
        "set": name,
        "seconds": round(seconds, 1),
        "unseen_classes": held["classes"],
        "splits": manifest["dataset"]["splits"],
        "records": doc["records"] + held["records"],
    }
    (out / f"{name}.json").write_text(json.dumps(result, indent=1))
    return result


def value(records, method, classes, metric, classifier):
    hits = [
        r["value"]
        for r in records
        if r["method"] == method
        and r.get("classes") == classes
        and r["metric"] == metric
        and r["classifier"] == classifier
        and r["params"].get("view") in (None, "codes")
    ]
    return hits[0] if hits else None


def table(results: list) -> str:
    head = "| set (held-out classes) | model | " + " | ".join(f"{c} seen | {c} unseen" for *_, c in COLUMNS) + " |"
    lines = [head, "|" + " --- |" * (2 + 2 * len(COLUMNS))]
    for res in results:
        where = f"{res['set']} ({', '.join(map(str, res['unseen_classes']))})"
        for m in METHODS:
            cells = []
            for metric, classifier, _ in COLUMNS:
                for classes in ("seen", "unseen"):
                    v = value(res["records"], m["method"], classes, metric, classifier)
                    cells.append("" if v is None else f"{v:.4f}")
            lines.append(f"| {where} | {LABELS[m['method']]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sets", nargs="+", default=["digits", "fashion"])
    p.add_argument("--max-train", type=int, default=20000)
    p.add_argument("--max-test", type=int, default=5000)
    p.add_argument("--seed", type=int, default=3, help="data.split.seed: which 2 of the 10 classes are held out")
    p.add_argument("--out", default="/tmp/bench-unseen")
    p.add_argument("--table-only", action="store_true", help="print the table from DIR/NAME.json of earlier runs")
    args = p.parse_args()
    if args.table_only:
        results = [json.loads((Path(args.out) / f"{s}.json").read_text()) for s in args.sets]
    else:
        results = []
        with (
            LocalCluster(
                n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0", memory_limit="3GB"
            ) as cluster,
            Client(cluster) as client,
        ):
            for name in args.sets:
                results.append(run(name, args, client))
                print(
                    f"{name}: {results[-1]['seconds']} s, held out {results[-1]['unseen_classes']}, "
                    f"splits {results[-1]['splits']}",
                    flush=True,
                )
    text = table(results)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
