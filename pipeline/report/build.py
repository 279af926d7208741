"""Building the report: read the last run's committed units, each checked against its commit as a run
checks a unit it reuses, and write report/metrics.json and report/index.html."""

from metricpipe.report.data import (
    definition,
    definitions_of,
    headline_metrics,
    held_out_classes,
    model_label,
    repeat_table,
    swept_params,
    view_of,
)
from metricpipe.report.html import render_html
from metricpipe.report.quality import best_per_size, quality_rows
from metricpipe.report.verdict import summarize
from metricpipe.stages.common import spec_params
from metricpipe.store import Store, read_attrs, to_json
from metricpipe.store.models import model_units
from metricpipe.tasks.errors import InputError


def build_report(store: Store, manifest: dict) -> str:
    """Collect the run's evaluation units, write report/metrics.json and report/index.html. Each unit
    read is checked against its commit first, as a run checks a unit it reuses (an edited
    records.json is refused, not reported)."""
    facts = ("units", "evaluation_units", "config", "dataset", "store", "versions", "started", "seconds", "timings")
    missing = [k for k in facts if k not in manifest]
    if missing:
        raise InputError(
            f"{store.url}: runs/latest.json is corrupt (no {', '.join(missing)}); rerun 'metricpipe run "
            f"CONFIG' to rewrite it"
        )
    records = []
    # the evaluate stage makes one evaluation unit per codes unit, in the manifest's order
    for rel, codes, serves in zip(manifest["evaluation_units"], _codes_units(manifest), _serves(manifest)):
        model = _model_of(store, codes)
        served = {} if serves is None else {"serves": serves}  # [[config entry, repeat], ...]
        records += [{**r, "model": model, **served} for r in _records_of(store, rel)]
    held = held_out_classes(records, manifest["dataset"].get("unseen_classes"))
    records = [r for r in records if r.get("classes") != "unseen"]  # the tables, summary and plots: seen classes
    doc = {
        "run": {k: manifest[k] for k in ("config", "dataset", "store", "versions", "started", "seconds")},
        "summary": summarize(records, items=manifest.get("test_items"), objective=manifest.get("objective")),
        "definitions": definitions_of(records),
        "records": records,
        "repeats": repeat_table(records),
        "timings": manifest["timings"],
    }
    curves = training_curves(store, manifest)
    doc["models"] = run_models(store, manifest)
    doc["extended_models"] = extended_models(store, doc["models"])
    doc["model_timings"] = model_timings(store, manifest)
    doc["selection"] = selections(store, manifest)
    doc["skipped"] = manifest.get("skipped", [])  # default classifiers a model cannot serve
    if held:
        doc["held_out_classes"] = held
    encoded = quality_per_byte(store, manifest)
    if encoded:
        doc["quality_per_byte"] = encoded
    store.write_text("report/metrics.json", to_json({**doc, "training": curves}))
    store.write_text("report/index.html", render_html(doc, curves))
    return store.path("report", "index.html")


def _records_of(store: Store, rel: str) -> list[dict]:
    """The metric records of the last run's evaluation unit ``rel``, checked against its commit."""
    unit = store.unit(*rel.split("/"))
    if not unit.done():  # wiped or half-written by a later, interrupted run: never read it
        raise InputError(
            f"{store.url}: {rel} of the last run is not committed (a later run was interrupted?); "
            f"rerun 'metricpipe run CONFIG --resume' to recompute it"
        )
    _verified(unit)
    try:
        found = unit.read_json("records.json")
    except ValueError:  # (a unit committed before markers listed their files: not checked above)
        found = None
    if not isinstance(found, list) or not all(isinstance(r, dict) for r in found):
        raise InputError(
            f"{store.url}: {rel}/records.json is not a list of metric records; rerun 'metricpipe run "
            f"CONFIG --repair' to recompute it"
        )
    return found


def quality_per_byte(store: Store, manifest: dict) -> dict | None:
    """The encoded databases' records (encode.pq; each with ``pq_bytes`` and its model's key, None for
    the raw features' OPQ + PQ), the best method at each size, and the models left out; None without."""
    units = manifest["units"]
    records = []
    for rel, pq_rel in zip(units.get("pq_evaluation") or [], units.get("pq") or []):
        pq_unit = store.unit(*pq_rel.split("/"))
        model = pq_unit.meta().get("model") if pq_unit.done() else None
        records += [{**r, "model": model} for r in _records_of(store, rel)]
    if not records:
        return None
    return {"records": records, "best": best_per_size(quality_rows(records)), "skipped": manifest.get("pq_skipped", [])}


def _verified(unit, keep=None) -> None:
    """Refuse a unit of the last run whose files are not those of its commit (``keep``: the files to
    check, e.g. only the group's metadata of a large codes unit)."""
    bad = unit.verify(keep=keep)
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise InputError(
            f"{unit.store.url}: {bad[0]}{more}; the last run's results are damaged: rerun 'metricpipe "
            f"run CONFIG --repair' to recompute them"
        )


def _metadata(rel: str) -> bool:
    return rel == "zarr.json"


def read_summary(store: Store) -> dict:
    """The summary of the store's report (what :func:`winner_lines` prints)."""
    return store.read_json("report/metrics.json")["summary"]


def model_headlines(store: Store) -> tuple[list[str], dict]:
    """The headline metrics of each model of the last run's report (report/metrics.json): the column
    names (mAP, MAP@R, then each classifier's top-1 error as "knn1 err") and {model key: [value or None
    per column]}, the mean over the repeats of the codes view. ([], {}) when the store has no report or
    it is not one metricpipe wrote."""
    try:
        records = store.read_json("report/metrics.json")["records"]
        records = [r for r in records if isinstance(r.get("model"), str) and view_of(r) == "codes"]
        columns = headline_metrics(records)
        sums = {}
        for r in records:
            if (r["metric"], r["classifier"]) in columns and isinstance(r["value"], (int, float)):
                s = sums.setdefault((r["model"], r["metric"], r["classifier"]), [0.0, 0])
                s[0], s[1] = s[0] + r["value"], s[1] + 1
    except FileNotFoundError:
        return [], {}
    except (ValueError, KeyError, TypeError, AttributeError):  # an edited or foreign file: no figures
        return [], {}
    names = [definition(m)[0] if c is None else f"{c} err" for m, c in columns]
    out = {}
    for (model, metric, classifier), (total, n) in sums.items():
        out.setdefault(model, [None] * len(columns))[columns.index((metric, classifier))] = total / n
    return names, out


def _codes_units(manifest: dict) -> list:
    codes = manifest["units"].get("codes") or []
    return codes if len(codes) == len(manifest["evaluation_units"]) else [None] * len(manifest["evaluation_units"])


def _serves(manifest: dict) -> list:
    """Per evaluation unit, the [config entry, repeat] pairs its model serves (None: a manifest
    written before repeats)."""
    serves = manifest.get("serves") or []
    return serves if len(serves) == len(manifest["evaluation_units"]) else [None] * len(manifest["evaluation_units"])


def _model_of(store: Store, codes_rel: str | None) -> str | None:
    """The key of the model whose codes an evaluation unit scored (the codes unit names it)."""
    if codes_rel is None:
        return None
    unit = store.unit(*codes_rel.split("/"))
    if not unit.done():  # a codes unit a later run wiped: the report goes on without the key
        return None
    _verified(unit, _metadata)
    try:
        return read_attrs(unit.url).get("model")
    except (OSError, KeyError, ValueError):
        return None


def _committed(store: Store, rels: list) -> list:
    """(unit, commit record) of each of ``rels`` ("kind/key") that is committed."""
    units = [store.unit(*rel.split("/")) for rel in rels or []]
    return [(u, u.meta()) for u in units if u.done()]


def run_models(store: Store, manifest: dict) -> list[dict]:
    """The run's models: key, spec, code dimension and fit seconds."""
    return [
        {"key": u.key, "spec": m.get("spec"), "dim": m.get("dim"), "fit_seconds": m.get("fit_seconds")}
        for u, m in _committed(store, manifest["units"].get("models"))
    ]


def extended_models(store: Store, models: list[dict]) -> list[dict]:
    """Models that ``metricpipe add-classes`` made from the run's models (or from one of those copies)."""
    run = {m["key"]: m for m in models}
    found = {u.key: m for u, m in model_units(store) if m.get("extends")}

    def row(spec):  # as the run's records carry the model
        return {"method": (spec or {}).get("method", "?"), "params": spec_params(spec)}

    swept = swept_params([row(m["spec"]) for m in models])  # labelled as the run labels the models they extend
    out, todo = [], [k for k in found if found[k]["extends"] in run]
    while todo:  # a copy extended again names the copy it extends
        key = todo.pop(0)
        m = found[key]
        out.append(
            {
                "key": key,
                "extends": m["extends"],
                "added": list(m.get("added") or []),
                "images": m.get("images"),
                "label": f"{model_label(row(m.get('spec')), swept)} d={m.get('dim')}",
            }
        )
        todo += [k for k in found if found[k]["extends"] == key]
    return out


def selections(store: Store, manifest: dict) -> list[dict]:
    """Each parameter selection of the run: metric, every candidate's validation score, the choice."""
    return [
        {
            k: m.get(k)
            for k in (
                "method",
                "label",
                "metric",
                "higher_is_better",
                "validation_rows",
                "candidates",
                "chosen",
                "spec",
                "grid",
                "repeat",
                "extended",
                "edge",
            )
        }
        for _, m in _committed(store, manifest["units"].get("selection"))
    ]


def model_timings(store: Store, manifest: dict) -> list[dict]:
    """Measured costs a learner recorded (SLEM / ESVM: offline seconds, online seconds per image). Kept
    apart from the records, which hold only what is the same on every rerun."""
    out = []
    for unit, meta in _committed(store, manifest["units"].get("models")):
        timed = {k: meta[k] for k in ("offline_seconds", "online_seconds_per_image") if k in meta}
        if timed:
            out.append({"model": meta["spec"], "key": unit.key, **timed})
    return out


def training_curves(store: Store, manifest: dict) -> list[dict]:
    """Per model, the learner's recorded history (objective, train mAP, hinge...) if it has one."""
    out = []
    for rel in manifest["units"].get("models", []):
        unit = store.unit(*rel.split("/"))
        if not unit.done():
            continue
        _verified(unit, _metadata)
        attrs = read_attrs(unit.url)
        state = attrs.get("state") or {}  # the estimator's fitted attributes (history_: its training curve)
        history = state.get("history_") or []
        if history and "member" in history[0]:  # an ensemble (SL-DE): its first member's curve
            history = history[0]["history"]
        if history:
            out.append({"model": attrs["spec"], "key": unit.key, "history": history})
    return out
