"""Every learner with ``{method: NAME}`` alone against its baseline, on four data sets: the table of
issue 18 (defaults vs parameters selected on the validation split).

    METRICPIPE_DATA=/path/to/fashion-mnist python benchmarks/bench_defaults.py \
        [--sets digits digits-l2 fashion fashion14 hog] [--max-train 10000] [--max-test 5000] [--out DIR] \
        [--learners METHOD ...]

Data sets: scikit-learn's digits (raw pixels 0..16, no normalisation; ``digits-l2``: the same rows
l2-normalised, as the other sets are); Fashion-MNIST pixels,
Fashion-MNIST mean-pooled to 14 x 14 and HOG descriptors of Fashion-MNIST (scikit-image, 9
orientations, 7 x 7 cells, 2 x 2 blocks: 324 non-negative dimensions), each l2-normalised.
``--max-train`` / ``--max-test`` take stratified, seeded subsets of the Fashion sets' train and test
splits (0 = all). Each set runs once with every learner twice: selected (the default) and
``select: false`` (the defaults as they are); the default candidate is the same model unit, so it
trains once. Prints the table in Markdown and writes DIR/table.md and DIR/NAME.json.
"""

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from distributed import Client, LocalCluster

from metricpipe.config import parse_config
from metricpipe.runner import run_pipeline
from metricpipe.tasks.errors import InputError

LEARNERS = [
    {"method": "slne"},
    {"method": "slde"},
    {"method": "ncmml"},
    {"method": "ncmc"},
    {"method": "knnml"},
    {"method": "slem", "kernel": "linear"},
]
CLASSIFIERS = ["knn1", "knn5", "knn10", "knn20", "softvote10", "ncm", "ncmc"]


def _subset(y, split, max_train, max_test, seed=0):
    rng = np.random.default_rng(seed)
    keep = np.zeros(len(y), bool)
    for name, cap in (("train", max_train), ("test", max_test)):
        rows = np.flatnonzero(split == name)
        if cap and cap < len(rows):
            take = []
            for c in np.unique(y[rows]):
                r = rows[y[rows] == c]
                take.append(rng.choice(r, max(1, round(cap * len(r) / len(rows))), replace=False))
            rows = np.concatenate(take)
        keep[rows] = True
    return np.flatnonzero(keep)


def fashion_arrays():
    from metricpipe.sources import open_source

    src = open_source(parse_config({"data": {"source": "fashion-mnist"}}).data)
    X = src.reader.read(0, src.reader.shape[0]).reshape(-1, 28, 28).astype(np.float32) / 255.0
    return X, np.asarray(src.labels), np.asarray(src.split)


def make_set(name: str, out: Path, max_train: int, max_test: int) -> dict:
    """The data section of a config for set ``name`` (derived sets cached as npz in ``out``)."""
    if name in ("digits", "digits-l2"):
        return {
            "source": "digits",
            "normalize": "none" if name == "digits" else "l2",
            "split": {"test": 0.2, "seed": 0},
        }
    path = out / f"{name}-{max_train}-{max_test}.npz"
    if not path.exists():
        X, y, split = fashion_arrays()
        idx = _subset(y, split, max_train, max_test)
        X, y, split = X[idx], y[idx], split[idx]
        if name == "fashion":
            F = X.reshape(len(X), -1)
        elif name == "fashion14":
            F = X.reshape(len(X), 14, 2, 14, 2).mean((2, 4)).reshape(len(X), -1)
        elif name == "hog":
            from skimage.feature import hog

            F = np.stack([hog(im, orientations=9, pixels_per_cell=(7, 7), cells_per_block=(2, 2)) for im in X])
        else:
            raise SystemExit(f"unknown set {name}")
        np.savez(path, X=F.astype(np.float32), y=y, split=split)
    return {"path": str(path), "normalize": "l2", "split": {"column": "split"}}


def sparse_r(name: str) -> int:
    """The sparse projectors' R: 64, or a quarter of the dimensions of a small descriptor."""
    return min(64, {"digits": 64, "digits-l2": 64, "fashion": 784, "fashion14": 196, "hog": 324}[name] // 4)


def learners(name: str, only=None) -> list[dict]:
    """Every learner of the table (``only``: those methods alone)."""
    r, d = sparse_r(name), 16  # sparse projectors' R; NML / linear ML code size (the papers' small codes)
    every = LEARNERS + [
        {"method": "sparse", "dim": r, "sparsity": 0.0},
        {"method": "sparse", "dim": r, "sparsity": 0.9},
        {"method": "nml", "dim": d},
        {"method": "linear-ml", "dim": d},
    ]
    return [e for e in every if not only or e["method"] in only]


def config(name: str, data: dict, store: str, methods: list | None = None, only=None) -> dict:
    """The selected run: baselines and every learner (``only``: those methods) with its parameters
    chosen on validation (``methods``: another list, e.g. one learner with ``select: false``)."""
    r = sparse_r(name)
    if methods is None:
        methods = [
            {"method": "identity"},
            {"method": "pca", "dim": 16},
            {"method": "pca", "dim": r},
            {"method": "pcaw"},
            {"method": "lda"},
        ] + learners(name, only)
    return {
        "store": store,
        "workers": 2,
        "data": data,
        "methods": methods,
        "neighbours": {"k": 50},
        "evaluate": {"retrieval": {"k": [10], "queries": 2000}, "classification": {"classifiers": CLASSIFIERS}},
    }


def kernel_config(base: dict, methods: list | None = None) -> dict:
    """Kernel SLEM beside linear SLEM (its codes are compared by Eq. 16: kNN classifiers only)."""
    methods = methods or [{"method": "slem", "kernel": "gaussian"}, {"method": "slem", "kernel": "linear"}]
    return {
        **base,
        "methods": methods,
        "evaluate": {"retrieval": {"k": [10], "queries": 2000}, "classification": {"classifiers": ["knn1"]}},
    }


def value(records, method, metric, classifier=None, **params):
    """The record of ``method`` whose parameters include ``params`` (codes view)."""
    hits = [
        r["value"]
        for r in records
        if r["method"] == method
        and r["metric"] == metric
        and r["classifier"] == classifier
        and r["params"].get("view") in (None, "codes")
        and all((r["dim"] if k == "dim" else r["params"].get(k)) == v for k, v in params.items())
    ]
    return hits[0] if hits else None


def default_and_selected(doc, defaults, method, metric, classifier=None, **fixed):
    """(value with every default, value with the parameters selected on validation) of ``method``
    with the ``fixed`` parameters; a default whose training failed is its one-line error."""
    selected = None
    for s in doc["selection"]:
        spec = s["spec"]
        if s["method"] == method and all(spec.get(k) == v for k, v in fixed.items()):
            params = {k: v for k, v in spec.items() if k not in ("method", "dim")}
            selected = value(doc["records"], method, metric, classifier, **params)
    if selected is None:  # nothing was searched (e.g. dense sparse projectors): the one model
        selected = value(doc["records"], method, metric, classifier, **fixed)
    default = None
    for entry, got in defaults:
        if entry["method"] == method and all(entry.get(k) == v for k, v in fixed.items()):
            default = got if isinstance(got, str) else value(got, method, metric, classifier, **fixed)
    return default, selected


def rows_for(name: str, doc: dict, kdoc: dict | None, r: int, defaults: list) -> list[tuple]:
    """(learner, criterion, baseline, default, selected, holds) for one data set; ``r``: the sparse
    projectors' R."""
    rec = doc["records"]
    out = []

    def dim_value(method, dim, metric):
        return next(
            (x["value"] for x in rec if x["method"] == method and x["dim"] == dim and x["metric"] == metric), None
        )

    def lower(s, base):
        return isinstance(s, float) and isinstance(base, float) and s < base

    best_knn = min(value(rec, "identity", "top1_error", f"knn{k}") for k in (1, 5, 10, 20))
    for m in ("slne", "slde"):
        d, s = default_and_selected(doc, defaults, m, "top1_error", "softvote10")
        out.append((m, "softvote10 error < best Euclidean kNN", best_knn, d, s, lower(s, best_knn)))
    pca_r = dim_value("pca", r, "map")
    d0, s0 = default_and_selected(doc, defaults, "sparse", "map", sparsity=0.0)
    out.append(("sparse (dense)", f"mAP > PCA-{r}", pca_r, d0, s0, lower(pca_r, s0)))
    d9, s9 = default_and_selected(doc, defaults, "sparse", "map", sparsity=0.9)
    out.append(
        (
            "sparse tau 0.9",
            "mAP >= 97% of dense",
            None if s0 is None else 0.97 * s0,
            d9,
            s9,
            s9 is not None and s0 is not None and s9 >= 0.97 * s0,
        )
    )
    ident, pcaw = value(rec, "identity", "map"), value(rec, "pcaw", "map")
    d, s = default_and_selected(doc, defaults, "slem", "map", kernel="linear")
    out.append(
        (
            "slem",
            "mAP >= raw + 0.01 and > PCAw",
            max(ident + 0.01, pcaw),
            d,
            s,
            s is not None and s >= ident + 0.01 and s > pcaw,
        )
    )
    if kdoc:
        lin = default_and_selected(kdoc, defaults, "slem", "map", kernel="linear")[1]
        kd, ks = default_and_selected(kdoc, defaults, "slem", "map", kernel="gaussian")
        out.append(("kernel slem", "mAP >= linear SLEM", lin, kd, ks, ks is not None and lin is not None and ks >= lin))
    l2ncm, lda = value(rec, "identity", "top1_error", "ncm"), value(rec, "lda", "top1_error", "ncm")
    d, s = default_and_selected(doc, defaults, "ncmml", "top1_error", "ncm")
    out.append(("ncmml", "NCM error < l2 NCM and LDA", min(l2ncm, lda), d, s, lower(s, min(l2ncm, lda))))
    ncmml_sel = s
    d, s = default_and_selected(doc, defaults, "ncmc", "top1_error", "ncmc")
    out.append(("ncmc", "NCMC error < NCMML", ncmml_sel, d, s, lower(s, ncmml_sel)))
    base = value(rec, "identity", "top1_error", "knn5")
    d, s = default_and_selected(doc, defaults, "knnml", "top1_error", "knn5")
    out.append(("knnml", "kNN-5 error < Euclidean kNN-5", base, d, s, lower(s, base)))
    pca16 = dim_value("pca", 16, "mprec@10")
    for m in ("nml", "linear-ml"):
        d, s = default_and_selected(doc, defaults, m, "mprec@10", None, dim=16)
        out.append((m, "mprec@10 > PCA-16", pca16, d, s, lower(pca16, s)))
    return out


def fmt(x):
    if isinstance(x, str):
        return "failed: " + x.split(": ")[-1][:60]
    return "" if x is None else f"{x:.4f}"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sets", nargs="+", default=["digits", "fashion14", "hog", "fashion"])
    p.add_argument("--max-train", type=int, default=0)
    p.add_argument("--max-test", type=int, default=0)
    p.add_argument("--out", default="/tmp/bench-defaults")
    p.add_argument("--no-kernel", action="store_true", help="skip kernel SLEM (its n x n kernel is the slow part)")
    p.add_argument("--table-only", action="store_true", help="print the table from DIR/NAME.json of earlier runs")
    p.add_argument(
        "--learners",
        nargs="+",
        metavar="METHOD",
        help="only these methods' rows (ncmc brings ncmml: NCMC's criterion reads NCMML's selected error)",
    )
    args = p.parse_args()
    only = set(args.learners or ())
    if "ncmc" in only:  # NCMC's criterion reads NCMML's selected error
        only.add("ncmml")

    def shown(learner):  # a row's learner ("sparse tau 0.9", "kernel slem") by its method
        method = {"kernel slem": "slem"}.get(learner, learner.split(" ")[0])
        return not only or method in only

    if args.table_only:
        table = [
            "| data set | learner | criterion | baseline | default | selected | holds |",
            "|---|---|---|---|---|---|---|",
        ]
        for name in args.sets:
            saved = json.loads((Path(args.out) / f"{name}.json").read_text())
            for learner, crit, base, d, s, ok in rows_for(
                name, saved["main"], saved["kernel"], sparse_r(name), saved["defaults"]
            ):
                if not shown(learner):
                    continue
                table.append(
                    f"| {name} | {learner} | {crit} | {fmt(base)} | {fmt(d)} | {fmt(s)} | {'yes' if ok else 'no'} |"
                )
        print("\n".join(table))
        return
    if "hog" in args.sets:  # before an hour of other sets, not after them
        try:
            import skimage  # noqa: F401
        except ImportError:
            raise SystemExit("--sets hog computes HOG descriptors with scikit-image: pip install '.[bench]'") from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = [
        "| data set | learner | criterion | baseline | default | selected | holds |",
        "|---|---|---|---|---|---|---|",
    ]
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address="127.0.0.1:0") as lc, Client(lc) as client:
        for name in args.sets:
            data = make_set(name, out, args.max_train, args.max_test)
            store = str(out / f"store-{name}-{args.max_train}-{args.max_test}")
            t0 = time.perf_counter()

            def run(raw, tag):
                path = run_pipeline(
                    parse_config(raw), client=client, log=lambda m: print(f"[{name} {tag}] {m}", flush=True)
                )
                return json.loads(Path(path).with_name("metrics.json").read_text())

            doc = run(config(name, data, store, only=only), "selected")
            with_kernel = not args.no_kernel and (not only or "slem" in only)
            kdoc = run(kernel_config(config(name, data, store)), "kernel") if with_kernel else None
            defaults = []  # each learner with every default, in a run of its own (a default may diverge)
            extra = [{"method": "slem", "kernel": "gaussian"}] if with_kernel else []
            for entry in learners(name, only) + extra:
                raw = config(name, data, store, [{**entry, "select": False}])
                if entry.get("kernel") == "gaussian":
                    raw = kernel_config(raw, [{**entry, "select": False}])
                try:
                    defaults.append((entry, run(raw, "default")["records"]))
                except InputError as e:
                    defaults.append((entry, str(e)))
            (out / f"{name}.json").write_text(json.dumps({"main": doc, "kernel": kdoc, "defaults": defaults}))
            n = doc["run"]["dataset"]
            print(
                f"{name}: {n['n_samples']} rows x {n['n_features']}, splits {n['splits']}: "
                f"{time.perf_counter() - t0:.0f} s",
                flush=True,
            )
            for learner, crit, base, d, s, ok in rows_for(name, doc, kdoc, sparse_r(name), defaults):
                if not shown(learner):
                    continue
                table.append(
                    f"| {name} | {learner} | {crit} | {fmt(base)} | {fmt(d)} | {fmt(s)} | {'yes' if ok else 'no'} |"
                )
            (out / "table.md").write_text("\n".join(table) + "\n")
            print("\n".join(table), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
