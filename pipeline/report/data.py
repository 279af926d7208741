"""The report's data, what metrics.json holds beside the run's facts: records -> rows (one per model, or
per config entry over the repeats), the models' labels, what each metric means, the repeats table and the
held-out classes' figures."""

import math
import platform
from importlib import metadata

from metricpipe import __version__
from metricpipe.store import to_json
from metricpipe.tasks import registry
from metricpipe.tasks.registry import BASELINES, param_text

PACKAGES = (
    "metricpipe",
    "numpy",
    "scipy",
    "dask",
    "distributed",
    "zarr",
    "xarray",
    "scikit-learn",
    "numba",
    "faiss-cpu",
)


def package_versions() -> dict:
    out = {"python": platform.python_version()}
    for p in PACKAGES:
        try:
            out[p] = __version__ if p == "metricpipe" else metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


def _declared(r: dict) -> dict:
    return (
        registry.defaults(registry.estimator_class(r["method"], r["params"]), r["params"])
        if r["method"] in registry.METHODS
        else {}
    )


def _stated(params: dict, declared: dict) -> dict:
    """``params`` with a parameter left None as the value it stands for (an unset lr: its grid's first)."""
    return {k: declared.get(k) if v is None else v for k, v in params.items()}


def model_label(r: dict, swept: frozenset = frozenset()) -> str:
    """Method plus the parameters that differ from their defaults (the legend of a plot), and those in
    ``swept`` ((method, parameter) pairs that take several values in the run: see :func:`swept_params`) even
    at their default, so that a sweep's default member is told from the others."""
    declared = _declared(r)
    params = {
        **{k: declared[k] for m, k in swept if m == r["method"] and k in declared},
        **_stated(r["params"], declared),
    }
    order = {k: i for i, k in enumerate(declared)}  # the class's order, whichever a row set
    extra = [
        f"{k}={param_text(v)}"
        for k, v in sorted(params.items(), key=lambda kv: order.get(kv[0], len(order)))
        if (k not in declared or v != declared[k] or (r["method"], k) in swept)
        and k != "score"
        and (k, v) != ("view", "codes")
    ]  # the score follows from the method
    return " ".join([r["method"], *extra])


def swept_params(rows) -> frozenset:
    """(method, parameter) pairs whose value differs between the given rows (or records) of a method,
    a parameter a row does not set counting as its default."""
    seen, by_method = set(), {}
    for r in rows:
        ident = (r["method"], to_json(r["params"]))
        if ident not in seen:  # records repeat a model's params once per metric
            seen.add(ident)
            declared = _declared(r)
            by_method.setdefault(r["method"], []).append((_stated(r["params"], declared), declared))
    out = set()
    for method, have in by_method.items():
        for k in {k for params, _ in have for k in params} - {"view", "score"}:  # not parameters: see _ident
            if len({to_json(params.get(k, defaults.get(k))) for params, defaults in have}) > 1:
                out.add((method, k))
    return frozenset(out)


def at_k(metric: str):
    """(name, K) of a metric@K, else None."""
    name, _, k = metric.partition("@")
    return (name, int(k)) if k.isdigit() else None


def kept_ks(records: list) -> set:
    """With many K (e.g. 1..50), tables and per-metric plots show a few; the curves over K show all."""
    ks = sorted({at_k(r["metric"])[1] for r in records if at_k(r["metric"])})
    if len(ks) <= 6:
        return set(ks)
    return {k for k in ks if k in (1, 5, 10, 20, 50, 100)} | {ks[0], ks[-1]}


# What each metric means and which way is better. Metrics of the form name@K take their K from the name.
DEFINITIONS = {
    "map": ("mAP", True, "mean average precision: each test query ranks the other test rows; relevant = same class"),
    "map@r": (
        "MAP@R",
        True,
        "mean average precision over the first R results, R = the query's relevant rows (pytorch-metric-learning)",
    ),
    "r_precision": (
        "R-precision",
        True,
        "share of relevant rows among the first R results, R = the query's relevant rows",
    ),
    "precision@1": ("precision@1", True, "share of queries whose nearest result is relevant"),
    "mrr": ("MRR", True, "mean over queries of 1 / the rank of the first relevant result"),
    "nmi": ("NMI", True, "normalised mutual information between k-means clusters of the codes and the classes"),
    "ami": ("AMI", True, "adjusted (for chance) mutual information between k-means clusters and the classes"),
    "ukb4": ("UKB score", True, "relevant rows among the first 4 results (UKBench's score, 4 at best)"),
    "mprec": (
        "mprec@{k}",
        True,
        "share of relevant rows among the first {k} results, averaged per class, then "
        "over classes (the precision@1 metric averages over queries instead)",
    ),
    "recall": ("recall@{k}", True, "share of the query's relevant rows found among the first {k} results"),
    "top1_error": ("top-1 error", False, "share of test rows whose predicted class is wrong"),
    "knn_recall": (
        "kNN recall",
        True,
        "share of each test row's exact k nearest train codes that the kNN "
        "classifier voted over (the stored graph or an IVF index, "
        "metrics.json's 'search'; 1 when exact)",
    ),
    "top5_error": (
        "top-5 error",
        False,
        "share of test rows whose class is not among the 5 best-scored (a kNN or "
        "soft vote scores only the classes its voters name)",
    ),
    "storage_bytes": ("model bytes", False, "bytes of the encoder's parameters"),
    "nnz": ("non-zeros", False, "non-zero parameters of the encoder"),
    "flops_per_image": ("FLOPs / image", False, "multiply-adds x 2 to encode one image"),
}
NEW_CLASSES = "_new_classes"
# Sizes and costs of the encoder: same on every rerun, so they are records, but shown in the cost table.
COST_METRICS = ("storage_bytes", "nnz", "flops_per_image")
# recall@K is left out where it tells nothing: below RECALL_FLOOR for every model (a class holds many
# more rows than K), or within RECALL_SPREAD of one value for every model (nothing to tell them apart).
RECALL_FLOOR = 0.01
RECALL_SPREAD = 0.001
RECALL_RULE = (
    f"recall@K is shown for a K when some model reaches {RECALL_FLOOR} and, with two models or more, "
    f"the models' values differ by {RECALL_SPREAD} or more; metrics.json keeps every value"
)


def definition(metric: str) -> tuple[str, bool, str]:
    """(label, higher is better, what it measures) of ``metric``; an unknown name is taken as a score
    (higher is better) unless it names an error, a cost or seconds."""
    if metric in DEFINITIONS:
        return DEFINITIONS[metric]
    if metric.endswith(NEW_CLASSES):  # top1_error_new_classes: a model trained on some classes only
        label, higher, text = definition(metric[: -len(NEW_CLASSES)])
        return (
            f"{label}, new classes",
            higher,
            (
                f"{text}, over the test rows of the classes a model with "
                f"classes: [...] left out of training (every other model is "
                f"scored on the same rows, as a control)"
            ),
        )
    at = at_k(metric)
    if at and at[0] in DEFINITIONS:
        label, higher, text = DEFINITIONS[at[0]]
        return label.format(k=at[1]), higher, text.format(k=at[1])
    lower = any(w in metric for w in ("error", "seconds", "bytes", "flops", "loss"))
    return metric, not lower, ""


def view_of(r: dict) -> str:
    """The view a record scores: the codes, or an extra one (SL-NE/SL-DE's exact bilinear score)."""
    return r["params"].get("view") or "codes"


def _ident(r: dict) -> tuple:
    """A model's row: its cost records carry no view or score, its metric records for the codes view may."""
    params = {k: v for k, v in r["params"].items() if k != "score" and (k, v) != ("view", "codes")}
    return r["method"], r["dim"], to_json(params)


def repeat_count(records: list) -> int:
    """The run's repeats, from its records' ``serves`` ([config entry, repeat] pairs; 1 without)."""
    return 1 + max((rep for r in records for _, rep in r.get("serves") or ()), default=0)


def report_rows(records: list, views: bool = False) -> dict:
    """The report's rows over the codes view (``views``: the other views instead): {id: {"method",
    "dim", "params", "model", "models", "baseline", "values": {(metric, classifier): value}, "runs":
    {(metric, classifier): [value per repeat]}, "sd": {...}}}. With one repeat, one row per model;
    with several, one per config entry (:func:`_entry_rows`): ``values`` their means, ``sd`` their
    sample standard deviation, ``model`` repeat 0's key."""
    repeats = repeat_count(records)
    if repeats > 1:
        return _entry_rows(records, views, repeats)
    rows = {}
    for r in records:
        if (view_of(r) != "codes") != views:
            continue
        row = rows.setdefault(
            _ident(r),
            {
                "method": r["method"],
                "dim": r["dim"],
                "params": r["params"],
                "model": r.get("model"),
                "models": [r.get("model")],
                "baseline": r["method"] in BASELINES,
                "values": {},
                "runs": {},
                "sd": {},
            },
        )
        row["values"][(r["metric"], r["classifier"])] = r["value"]
        row["runs"][(r["metric"], r["classifier"])] = [r["value"]]
    return rows


def _entry_rows(records: list, views: bool, repeats: int) -> dict:
    """One row per config entry and view, its values over the repeats (a record counts for every
    [entry, repeat] its model serves: a baseline without seed is computed once and serves every
    repeat). Entries that ended with the same model in every repeat share a row. The row's params
    are those every repeat has (a seed, or a parameter chosen per repeat, differs)."""
    per = {}
    for r in records:
        if (view_of(r) != "codes") != views:
            continue
        for n, rep in r.get("serves") or ():
            per.setdefault((n, view_of(r)), {}).setdefault(rep, []).append(r)
    rows, seen = {}, {}
    for (n, view), by_rep in sorted(per.items()):
        firsts = [by_rep[rep][0] if rep in by_rep else None for rep in range(repeats)]
        models = [f.get("model") if f else None for f in firsts]
        if (tuple(models), view) in seen:
            seen[(tuple(models), view)]["entries"].append(n)
            continue
        have = [f for f in firsts if f]
        params = {k: v for k, v in have[0]["params"].items() if all(f["params"].get(k) == v for f in have)}
        dims = {f["dim"] for f in have}
        runs = {}
        for rep, recs in by_rep.items():
            for r in recs:
                runs.setdefault((r["metric"], r["classifier"]), [None] * repeats)[rep] = r["value"]
        once = len(set(models)) == 1  # the same model in every repeat: computed once, no spread
        row = {
            "method": have[0]["method"],
            "dim": dims.pop() if len(dims) == 1 else None,
            "params": params,
            "model": models[0],
            "models": models,
            "baseline": have[0]["method"] in BASELINES,
            "entries": [n],
            "runs": runs,
            "values": {mc: mean_value(v) for mc, v in runs.items()},
            "sd": {} if once else {mc: sample_sd(v) for mc, v in runs.items()},
        }
        rows[(n, view)] = seen[(tuple(models), view)] = row
    return rows


def mean_value(values: list) -> float:
    have = [v for v in values if v is not None]
    return sum(have) / len(have) if have else math.nan


def sample_sd(values: list) -> float | None:
    """Sample standard deviation (n - 1) over the repeats that have a value; None below two."""
    have = [v for v in values if v is not None]
    if len(have) < 2:
        return None
    m = sum(have) / len(have)
    return math.sqrt(sum((v - m) ** 2 for v in have) / (len(have) - 1))


def repeat_table(records: list) -> dict:
    """metrics.json's ``repeats``: the count, and per row of the report (per config entry with several
    repeats, per model with one) each metric's value in every repeat, their mean and sample standard
    deviation."""
    out = []
    for views in (False, True):
        rows = list(report_rows(records, views).values())
        swept = swept_params(rows)
        for row in rows:
            out.append(
                {
                    "label": row_label(row, swept),
                    "method": row["method"],
                    "dim": row["dim"],
                    "params": row["params"],
                    "baseline": row["baseline"],
                    "entries": row.get("entries"),
                    "models": row["models"],
                    "metrics": [
                        {
                            "metric": m,
                            "classifier": c,
                            "values": v,
                            "mean": row["values"][(m, c)],
                            "sd": row["sd"].get((m, c)),
                        }
                        for (m, c), v in row["runs"].items()
                    ],
                }
            )
    return {"count": repeat_count(records), "spread": SPREAD, "rows": out}


SPREAD = (
    "sd: the sample standard deviation (n - 1) of a metric over the repeats, each repeat training every "
    "learned model with its own seed (random_state + repeat) and validation rows; a model without seed is "
    "computed once and has no spread"
)


def headline_metrics(records: list) -> list[tuple[str, str | None]]:
    """mAP, MAP@R when present, and the top-1 error of each classifier: the metrics the summary decides on."""
    have = {(r["metric"], r["classifier"]) for r in records}
    classifiers = list(
        dict.fromkeys(r["classifier"] for r in records if r["classifier"] is not None and r["metric"] == "top1_error")
    )
    return [mc for mc in (("map", None), ("map@r", None)) if mc in have] + [("top1_error", c) for c in classifiers]


def row_label(row: dict, swept: frozenset = frozenset()) -> str:
    return f"{model_label(row, swept)} d={row['dim']}"


def recall_hidden(records: list) -> dict:
    """{K: why} for the recall@K that :data:`RECALL_RULE` leaves out of the report's tables."""
    out = {}
    for k in sorted({at_k(r["metric"])[1] for r in records if r["metric"].startswith("recall@")}):
        vals = [r["value"] for r in records if r["metric"] == f"recall@{k}" and view_of(r) == "codes"]
        if not vals:
            continue
        if max(vals) < RECALL_FLOOR:
            out[k] = f"at most {max(vals):.4f} for every model"
        elif len(vals) > 1 and max(vals) - min(vals) < RECALL_SPREAD:
            out[k] = f"{min(vals):.4f} to {max(vals):.4f}: the same for every model"
    return out


def definitions_of(records: list) -> dict:
    """{metric: {label, higher_is_better, meaning}} for the metrics of ``records`` (metrics.json)."""
    return {
        m: dict(zip(("label", "higher_is_better", "meaning"), definition(m)))
        for m in sorted({r["metric"] for r in records})
    }


# ---- the held-out classes (data.split.classes): their figures beside the seen classes' -------------------------

HELD_OUT_METRICS = (("map", None), ("map@r", None))  # then each classifier's top-1 error


def held_out_classes(records: list, classes: list | None) -> dict | None:
    """The unseen-class protocol's figures beside the seen classes': {"classes": the held-out labels,
    "columns": [{metric, classifier, label, higher_is_better}], "rows": one per model (codes view):
    {label, method, dim, model, baseline, values: [[seen, unseen] per column]}, "records": the unseen
    records}. None when the run holds no class out."""
    unseen = [r for r in records if r.get("classes") == "unseen"]
    if not unseen:
        return None
    have = {(r["metric"], r["classifier"]) for r in unseen}
    cls = dict.fromkeys(r["classifier"] for r in unseen if r["metric"] == "top1_error")
    columns = [mc for mc in HELD_OUT_METRICS if mc in have] + [("top1_error", c) for c in cls]
    table, swept = {}, swept_params(unseen)
    for r in records:
        if (
            r.get("classes") not in ("seen", "unseen")
            or (r["metric"], r["classifier"]) not in columns
            or (r["params"].get("view") or "codes") != "codes"
        ):
            continue
        ident = (r["method"], r["dim"], to_json({k: v for k, v in r["params"].items() if k != "score"}))
        row = table.setdefault(
            ident,
            {
                "label": f"{model_label(r, swept)} d={r['dim']}",
                "method": r["method"],
                "dim": r["dim"],
                "model": r.get("model"),
                "baseline": r["method"] in BASELINES,
                "values": [[None, None] for _ in columns],
            },
        )
        row["values"][columns.index((r["metric"], r["classifier"]))][r["classes"] == "unseen"] = r["value"]
    rows = sorted(table.values(), key=lambda row: (row["baseline"], row["method"], row["dim"] or 0, row["label"]))
    return {
        "classes": list(classes or []),
        "rows": rows,
        "records": unseen,
        "columns": [
            {
                "metric": m,
                "classifier": c,
                "label": definition(m)[0] + (f" ({c})" if c else ""),
                "higher_is_better": definition(m)[1],
            }
            for m, c in columns
        ],
    }
