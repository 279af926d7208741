"""The report: metrics.json (records + summary + timings + run facts) and a self-contained index.html.

The page decides first: the best learned model per headline metric against the best baseline
(``registry.BASELINES``), then one row per model with its key and the headline metrics; secondary
metrics, other views, costs, definitions and plots follow."""
import base64
import html
import io
import math
import platform
import re
from importlib import metadata

from metricpipe import __version__
from metricpipe.config import OBJECTIVES
from metricpipe.store import Store, read_attrs, to_json
from metricpipe.tasks.compare import paired_interval
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.registry import BASELINES, RAW, param_text

PACKAGES = ("metricpipe", "numpy", "scipy", "dask", "distributed", "zarr", "xarray", "scikit-learn", "numba", "faiss-cpu")


def package_versions() -> dict:
    out = {"python": platform.python_version()}
    for p in PACKAGES:
        try:
            out[p] = __version__ if p == "metricpipe" else metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


def build_report(store: Store, manifest: dict) -> str:
    """Collect the run's evaluation units, write report/metrics.json and report/index.html. Each unit
    read is checked against its commit first, as a run checks a unit it reuses (an edited
    records.json is refused, not reported)."""
    facts = ("units", "evaluation_units", "config", "dataset", "store", "versions", "started", "seconds", "timings")
    missing = [k for k in facts if k not in manifest]
    if missing:
        raise InputError(f"{store.url}: runs/latest.json is corrupt (no {', '.join(missing)}); rerun 'metricpipe run "
                         f"CONFIG' to rewrite it")
    records = []
    # the evaluate stage makes one evaluation unit per codes unit, in the manifest's order
    for rel, codes, serves in zip(manifest["evaluation_units"], _codes_units(manifest), _serves(manifest)):
        kind, key = rel.split("/")
        unit = store.unit(kind, key)
        if not unit.done():  # wiped or half-written by a later, interrupted run: never read it
            raise InputError(f"{store.url}: {rel} of the last run is not committed (a later run was interrupted?); "
                             f"rerun 'metricpipe run CONFIG --resume' to recompute it")
        _verified(unit)
        model = _model_of(store, codes)
        try:
            found = unit.read_json("records.json")
        except ValueError:   # (a unit committed before markers listed their files: not checked above)
            found = None
        if not isinstance(found, list) or not all(isinstance(r, dict) for r in found):
            raise InputError(f"{store.url}: {rel}/records.json is not a list of metric records; rerun 'metricpipe run "
                             f"CONFIG --repair' to recompute it")
        served = {} if serves is None else {"serves": serves}   # [[config entry, repeat], ...]
        records += [{**r, "model": model, **served} for r in found]
    held = held_out_classes(records, manifest["dataset"].get("unseen_classes"))
    records = [r for r in records if r.get("classes") != "unseen"]   # the tables, summary and plots: seen classes
    doc = {"run": {k: manifest[k] for k in ("config", "dataset", "store", "versions", "started", "seconds")},
           "summary": summarize(records, items=manifest.get("test_items"), objective=manifest.get("objective")),
           "definitions": definitions_of(records), "records": records, "repeats": repeat_table(records),
           "timings": manifest["timings"]}
    curves = training_curves(store, manifest)
    doc["models"] = run_models(store, manifest)
    doc["extended_models"] = extended_models(store, doc["models"])
    doc["model_timings"] = model_timings(store, manifest)
    doc["selection"] = selections(store, manifest)
    doc["skipped"] = manifest.get("skipped", [])   # default classifiers a model cannot serve
    if held:
        doc["held_out_classes"] = held
    store.write_text("report/metrics.json", to_json({**doc, "training": curves}))
    store.write_text("report/index.html", render_html(doc, curves))
    return store.path("report", "index.html")


def _verified(unit, keep=None) -> None:
    """Refuse a unit of the last run whose files are not those of its commit (``keep``: the files to
    check, e.g. only the group's metadata of a large codes unit)."""
    bad = unit.verify(keep=keep)
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise InputError(f"{unit.store.url}: {bad[0]}{more}; the last run's results are damaged: rerun 'metricpipe "
                         f"run CONFIG --repair' to recompute them")


def _metadata(rel: str) -> bool:
    return rel == "zarr.json"


def read_summary(store: Store) -> dict:
    """The summary of the store's report (what :func:`winner_lines` prints)."""
    return store.read_json("report/metrics.json")["summary"]


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
    if not unit.done():   # a codes unit a later run wiped: the report goes on without the key
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
    return [{"key": u.key, "spec": m.get("spec"), "dim": m.get("dim"), "fit_seconds": m.get("fit_seconds")}
            for u, m in _committed(store, manifest["units"].get("models"))]


def extended_models(store: Store, models: list[dict]) -> list[dict]:
    """Models that ``metricpipe add-classes`` made from the run's models (or from one of those copies)."""
    from metricpipe.store.models import model_units
    run = {m["key"]: m for m in models}
    found = {u.key: m for u, m in model_units(store) if m.get("extends")}
    from metricpipe.stages.common import spec_params

    def row(spec):   # as the run's records carry the model
        return {"method": (spec or {}).get("method", "?"), "params": spec_params(spec)}
    swept = _swept([row(m["spec"]) for m in models])   # labelled as the run labels the models they extend
    out, todo = [], [k for k in found if found[k]["extends"] in run]
    while todo:   # a copy extended again names the copy it extends
        key = todo.pop(0)
        m = found[key]
        out.append({"key": key, "extends": m["extends"], "added": list(m.get("added") or []), "images": m.get("images"),
                    "label": f"{_label(row(m.get('spec')), swept)} d={m.get('dim')}"})
        todo += [k for k in found if found[k]["extends"] == key]
    return out


def selections(store: Store, manifest: dict) -> list[dict]:
    """Each parameter selection of the run: metric, every candidate's validation score, the choice."""
    return [{k: m.get(k) for k in ("method", "label", "metric", "higher_is_better", "validation_rows", "candidates",
                                   "chosen", "spec", "grid", "repeat", "extended", "edge")}
            for _, m in _committed(store, manifest["units"].get("selection"))]


BOLD = ' style="font-weight:bold"'


def _selection_html(sel: list[dict]) -> str:
    if not sel:
        return ""
    esc = html.escape
    parts = []
    for s in sel:
        best = "highest" if s["higher_is_better"] else "lowest"
        rows = "".join(
            f"<tr{BOLD if i == s['chosen'] else ''}><td>{esc(to_json(c['params']))}</td>"
            f"<td>{'failed: ' + esc(c['error']) if c['score'] is None else format(c['score'], '.4f')}</td>"
            f"<td>{'chosen' if i == s['chosen'] else ''}</td><td><code>{esc(c['model'][:12])}</code></td></tr>"
            for i, c in enumerate(s["candidates"]))
        beyond = (f"; {s['extended']} candidate(s) beyond the grid, where the best sat on its edge"
                  if s.get("extended") else "")
        edge = "".join(f"; <b>{esc(k)} {s['spec'][k]:g} is still the {'largest' if side == 'upper' else 'smallest'} "
                       f"value tried</b>: the best may lie further" for k, side in (s.get("edge") or {}).items())
        parts.append(f"<p>{esc(s.get('label') or s['method'])}: {esc(s['metric'])} on "
                     f"{s['validation_rows']:,} validation rows "
                     f"({best} wins{beyond}{edge})</p><table><tr><th>parameters</th><th>validation {esc(s['metric'])}</th>"
                     f"<th></th><th>model</th></tr>{rows}</table>")
    return ("<h2>Parameter selection</h2><p>Candidates trained on the train split and scored on the validation "
            "split; the test split was not read. Test metrics above are the chosen models'.</p>" + "".join(parts))


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
    from metricpipe.store import read_attrs
    out = []
    for rel in manifest["units"].get("models", []):
        unit = store.unit(*rel.split("/"))
        if not unit.done():
            continue
        _verified(unit, _metadata)
        attrs = read_attrs(unit.url)
        state = attrs.get("state") or {}   # the estimator's fitted attributes (history_: its training curve)
        history = state.get("history_") or []
        if history and "member" in history[0]:   # an ensemble (SL-DE): its first member's curve
            history = history[0]["history"]
        if history:
            out.append({"model": attrs["spec"], "history": history})
    return out


def _curve_panels(curve: dict, swept: frozenset = frozenset()) -> list[dict]:
    """One panel per recorded quantity (objective, validation error...) of a model's training history
    (titled as the tables name the model: ``swept`` as in :func:`_label`)."""
    hist = curve["history"]
    xkey = "iter" if "iter" in hist[0] else "epoch"
    keys = list(dict.fromkeys(k for h in hist for k in h if k != xkey and isinstance(h[k], (int, float))))
    title = _label({"method": curve["model"]["method"],
                    "params": {k: v for k, v in curve["model"].items() if k != "method"}}, swept)
    panels = []
    for k in keys:
        have = [h for h in hist if isinstance(h.get(k), (int, float))]   # e.g. val_error also at the start
        lo, hi = min(h[k] for h in have), max(h[k] for h in have)
        log_y = k in ("objective", "hinge") and lo > 0 and hi > 10 * lo   # a log axis over a decade or more
        panels.append({"series": {None: [(h[xkey], h[k]) for h in have]}, "xlabel": xkey, "ylabel": k,
                       "title": title, "log_y": log_y, "marker": "."})
    return panels


def _declared(r: dict) -> dict:
    from metricpipe.tasks import registry
    return registry.defaults(registry.estimator_class(r["method"], r["params"]), r["params"]) \
        if r["method"] in registry.METHODS else {}


def _label(r: dict, swept: frozenset = frozenset()) -> str:
    """Method plus the parameters that differ from their defaults (the legend of a plot), and those in
    ``swept`` ((method, parameter) pairs that take several values in the run: see :func:`_swept`) even
    at their default, so that a sweep's default member is told from the others."""
    declared = _declared(r)
    params = {**{k: declared[k] for m, k in swept if m == r["method"] and k in declared}, **r["params"]}
    order = {k: i for i, k in enumerate(declared)}    # the class's order, whichever a row set
    extra = [f"{k}={param_text(v)}" for k, v in sorted(params.items(), key=lambda kv: order.get(kv[0], len(order)))
             if (k not in declared or v != declared[k] or (r["method"], k) in swept)
             and k != "score" and (k, v) != ("view", "codes")]   # the score follows from the method
    return " ".join([r["method"], *extra])


def _swept(rows) -> frozenset:
    """(method, parameter) pairs whose value differs between the given rows (or records) of a method,
    a parameter a row does not set counting as its default."""
    seen, by_method = set(), {}
    for r in rows:
        ident = (r["method"], to_json(r["params"]))
        if ident not in seen:     # records repeat a model's params once per metric
            seen.add(ident)
            by_method.setdefault(r["method"], []).append((r["params"], _declared(r)))
    out = set()
    for method, have in by_method.items():
        for k in {k for params, _ in have for k in params} - {"view", "score"}:   # not parameters: see _ident
            if len({to_json(params.get(k, defaults.get(k))) for params, defaults in have}) > 1:
                out.add((method, k))
    return frozenset(out)


def _panels_png(panels: list[dict], ncols: int = 2) -> str:
    """Small multiples: the panels ({series: {label: [(x, y), ...]}, xlabel, ylabel, title, log2_x,
    log_y, marker}) in one figure, as a base64 PNG, with one legend for all of them (a model keeps
    its colour in every panel; baselines dashed). One figure drawn once costs a quarter of a figure
    per panel, each with its own legend, drawn twice for a tight bounding box."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    labels = sorted({lab for p in panels if p for lab in p["series"] if lab is not None},
                    key=lambda lab: (lab.split()[0] in BASELINES, lab))
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colour = {lab: cycle[i % len(cycle)] for i, lab in enumerate(labels)}
    style = {lab: "--" if lab.split()[0] in BASELINES else ("-" if i < len(cycle) else ":")
             for i, lab in enumerate(labels)}
    ncols = min(ncols, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    legend_cols = 2 if ncols > 1 else 1
    legend_rows = math.ceil(len(labels) / legend_cols)
    width, height = 4.6 * ncols, 2.7 * nrows
    legend_h = 0.2 * legend_rows + (0.35 if labels else 0)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height + legend_h), squeeze=False)
    handles = {}
    for ax, p in zip(axes.flat, panels):
        if p is None:   # a gap (a row's end)
            ax.set_visible(False)
            continue
        for lab, pts in p["series"].items():
            pts = sorted(pts, key=lambda q: (q[0] is None, q[0] or 0))   # a dimension may be unknown (None)
            line, = ax.plot([q[0] for q in pts], [q[1] for q in pts], marker=p.get("marker", "o"), markersize=4,
                            color=colour.get(lab, cycle[0]), linestyle=style.get(lab, "-"))
            if lab is not None:
                handles.setdefault(lab, line)
        if p.get("log2_x"):   # ticks at the plotted values (or powers of 2 when many), as plain numbers:
            # readable, and no mathtext to parse and draw
            ax.set_xscale("log", base=2)
            xs = sorted({q[0] for pts in p["series"].values() for q in pts if q[0] is not None and q[0] > 0})
            if len(xs) > 8:
                xs = [2.0 ** e for e in range(math.floor(math.log2(xs[0])), math.ceil(math.log2(xs[-1])) + 1)]
            ax.xaxis.set_major_locator(FixedLocator(xs))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        if p.get("log_y"):
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(p["xlabel"], fontsize=8)
        ax.set_ylabel(p["ylabel"], fontsize=8)
        ax.set_title(p["title"], fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    bottom = legend_h / (height + legend_h)
    if handles:
        order = [lab for lab in labels if lab in handles]   # learned models first, as the colours
        fig.legend([handles[lab] for lab in order], order, loc="lower left", bbox_to_anchor=(0.01, 0.0),
                   ncol=legend_cols,
                   fontsize=7, frameon=False, title="dashed: baseline", title_fontsize=7)
    # fixed margins instead of bbox_inches="tight", which draws the figure twice
    fig.subplots_adjust(left=0.8 / width, right=1 - 0.15 / width, top=1 - 0.3 / (height + legend_h),
                        bottom=bottom + 0.5 / (height + legend_h), hspace=0.55, wspace=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _panel_over_dim(records: list, metric: str, classifier) -> dict:
    series, swept = {}, _swept(records)
    for r in records:
        if r["metric"] == metric and r["classifier"] == classifier:
            series.setdefault(_label(r, swept), []).append((r["dim"], r["value"]))
    label, higher, _ = definition(metric)
    label += "" if classifier is None else f" ({classifier})"
    return {"series": series, "xlabel": "code dimension", "ylabel": label, "log2_x": True,
            "title": f"{label} ({'higher' if higher else 'lower'} is better)"}


def _at_k(metric: str):
    """(name, K) of a metric@K, else None."""
    name, _, k = metric.partition("@")
    return (name, int(k)) if k.isdigit() else None


def _kept_ks(records: list) -> set:
    """With many K (e.g. 1..50), tables and per-metric plots show a few; the curves over K show all."""
    ks = sorted({_at_k(r["metric"])[1] for r in records if _at_k(r["metric"])})
    if len(ks) <= 6:
        return set(ks)
    return {k for k in ks if k in (1, 5, 10, 20, 50, 100)} | {ks[0], ks[-1]}


def _panel_over_k(records: list, name: str, dim) -> dict:
    """``name``@K against K for every model of dimension ``dim`` (the NML paper's Fig. 3)."""
    series, swept = {}, _swept(records)
    for r in records:
        at = _at_k(r["metric"])
        if at and at[0] == name and r["dim"] == dim and r["classifier"] is None:
            series.setdefault(_label(r, swept), []).append((at[1], r["value"]))
    return {"series": series, "xlabel": "K", "ylabel": f"{name}@K", "marker": ".",
            "title": f"{DEFINITIONS[name][0].format(k='K')} against K, d = {dim}"}


# What each metric means and which way is better. Metrics of the form name@K take their K from the name.
DEFINITIONS = {
    "map": ("mAP", True, "mean average precision: each test query ranks the other test rows; relevant = same class"),
    "map@r": ("MAP@R", True, "mean average precision over the first R results, R = the query's relevant rows "
                             "(pytorch-metric-learning)"),
    "r_precision": ("R-precision", True, "share of relevant rows among the first R results, R = the query's "
                                         "relevant rows"),
    "precision@1": ("precision@1", True, "share of queries whose nearest result is relevant"),
    "mrr": ("MRR", True, "mean over queries of 1 / the rank of the first relevant result"),
    "nmi": ("NMI", True, "normalised mutual information between k-means clusters of the codes and the classes"),
    "ami": ("AMI", True, "adjusted (for chance) mutual information between k-means clusters and the classes"),
    "ukb4": ("UKB score", True, "relevant rows among the first 4 results (UKBench's score, 4 at best)"),
    "mprec": ("mprec@{k}", True, "share of relevant rows among the first {k} results, averaged per class, then "
                                 "over classes (the precision@1 metric averages over queries instead)"),
    "recall": ("recall@{k}", True, "share of the query's relevant rows found among the first {k} results"),
    "top1_error": ("top-1 error", False, "share of test rows whose predicted class is wrong"),
    "knn_recall": ("kNN recall", True, "share of each test row's exact k nearest train codes that the kNN "
                                       "classifier voted over (the stored graph or an IVF index, "
                                       "metrics.json's 'search'; 1 when exact)"),
    "top5_error": ("top-5 error", False, "share of test rows whose class is not among the 5 best-scored (a kNN or "
                                         "soft vote scores only the classes its voters name)"),
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
RECALL_RULE = (f"recall@K is shown for a K when some model reaches {RECALL_FLOOR} and, with two models or more, "
               f"the models' values differ by {RECALL_SPREAD} or more; metrics.json keeps every value")


def definition(metric: str) -> tuple[str, bool, str]:
    """(label, higher is better, what it measures) of ``metric``; an unknown name is taken as a score
    (higher is better) unless it names an error, a cost or seconds."""
    if metric in DEFINITIONS:
        return DEFINITIONS[metric]
    if metric.endswith(NEW_CLASSES):   # top1_error_new_classes: a model trained on some classes only
        label, higher, text = definition(metric[:-len(NEW_CLASSES)])
        return f"{label}, new classes", higher, (f"{text}, over the test rows of the classes a model with "
                                                 f"classes: [...] left out of training (every other model is "
                                                 f"scored on the same rows, as a control)")
    at = _at_k(metric)
    if at and at[0] in DEFINITIONS:
        label, higher, text = DEFINITIONS[at[0]]
        return label.format(k=at[1]), higher, text.format(k=at[1])
    lower = any(w in metric for w in ("error", "seconds", "bytes", "flops", "loss"))
    return metric, not lower, ""


def _view(r: dict) -> str:
    """The view a record scores: the codes, or an extra one (SL-NE/SL-DE's exact bilinear score)."""
    return r["params"].get("view") or "codes"


def _ident(r: dict) -> tuple:
    """A model's row: its cost records carry no view or score, its metric records for the codes view may."""
    params = {k: v for k, v in r["params"].items() if k != "score" and (k, v) != ("view", "codes")}
    return r["method"], r["dim"], to_json(params)


def repeat_count(records: list) -> int:
    """The run's repeats, from its records' ``serves`` ([config entry, repeat] pairs; 1 without)."""
    return 1 + max((rep for r in records for _, rep in r.get("serves") or ()), default=0)


def _rows(records: list, views: bool = False) -> dict:
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
        if (_view(r) != "codes") != views:
            continue
        row = rows.setdefault(_ident(r), {"method": r["method"], "dim": r["dim"], "params": r["params"],
                                          "model": r.get("model"), "models": [r.get("model")],
                                          "baseline": r["method"] in BASELINES, "values": {}, "runs": {}, "sd": {}})
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
        if (_view(r) != "codes") != views:
            continue
        for n, rep in r.get("serves") or ():
            per.setdefault((n, _view(r)), {}).setdefault(rep, []).append(r)
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
        once = len(set(models)) == 1   # the same model in every repeat: computed once, no spread
        row = {"method": have[0]["method"], "dim": dims.pop() if len(dims) == 1 else None, "params": params,
               "model": models[0], "models": models, "baseline": have[0]["method"] in BASELINES, "entries": [n],
               "runs": runs, "values": {mc: _mean(v) for mc, v in runs.items()},
               "sd": {} if once else {mc: _sd(v) for mc, v in runs.items()}}
        rows[(n, view)] = seen[(tuple(models), view)] = row
    return rows


def _mean(values: list) -> float:
    have = [v for v in values if v is not None]
    return sum(have) / len(have) if have else math.nan


def _sd(values: list) -> float | None:
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
        rows = list(_rows(records, views).values())
        swept = _swept(rows)
        for row in rows:
            out.append({"label": _row_label(row, swept), "method": row["method"], "dim": row["dim"],
                        "params": row["params"], "baseline": row["baseline"], "entries": row.get("entries"),
                        "models": row["models"],
                        "metrics": [{"metric": m, "classifier": c, "values": v, "mean": row["values"][(m, c)],
                                     "sd": row["sd"].get((m, c))} for (m, c), v in row["runs"].items()]})
    return {"count": repeat_count(records), "spread": SPREAD, "rows": out}


SPREAD = ("sd: the sample standard deviation (n - 1) of a metric over the repeats, each repeat training every "
          "learned model with its own seed (random_state + repeat) and validation rows; a model without seed is "
          "computed once and has no spread")


def headline_metrics(records: list) -> list[tuple[str, str | None]]:
    """mAP, MAP@R when present, and the top-1 error of each classifier: the metrics the summary decides on."""
    have = {(r["metric"], r["classifier"]) for r in records}
    classifiers = list(dict.fromkeys(r["classifier"] for r in records
                                     if r["classifier"] is not None and r["metric"] == "top1_error"))
    return [mc for mc in (("map", None), ("map@r", None)) if mc in have] + [("top1_error", c) for c in classifiers]


def _best(rows: list, mc: tuple, higher: bool) -> dict | None:
    """The row with the best value of ``mc`` (its mean over the repeats); exact ties go to the smaller
    code, then to a baseline (a learned model has to beat it), then to the label."""
    have = [r for r in rows if mc in r["values"] and r["values"][mc] == r["values"][mc]]   # NaN never wins
    if not have:
        return None
    swept = _swept(rows)
    sign = -1 if higher else 1
    best = min(have, key=lambda r: (sign * r["values"][mc], r["dim"] or 0, not r["baseline"], _row_label(r, swept)))
    return {"label": _row_label(best, swept), "method": best["method"], "dim": best["dim"], "params": best["params"],
            "model": best["model"], "value": best["values"][mc]}


def _row_label(row: dict, swept: frozenset = frozenset()) -> str:
    return f"{_label(row, swept)} d={row['dim']}"


# --- the verdict --------------------------------------------------------------------------------------
# Headline metrics vote in families, one vote each, so that no objective counts twice: retrieval
# (mAP and MAP@R) and, per classifier kind, the top-1 errors of its classifiers.
KINDS = {"knn": "kNN", "softvote": "soft-vote", "ncm": "NCM", "ncmc": "NCMC"}
LEVEL = 0.95          # the paired t interval over repeats
ITEM_OF = {"retrieval": "queries", "classification": "classified test rows"}


def families(records: list) -> list[dict]:
    """The headline metrics grouped into families, one vote each: ``retrieval`` (mAP and MAP@R) and,
    per classifier kind, the top-1 errors of its classifiers (knnK together, softvoteK together, ncm,
    ncmc). A model's score on a family is the mean of its members."""
    out = {}
    for metric, classifier in headline_metrics(records):
        key = "retrieval" if classifier is None else (re.sub(r"\d+$", "", classifier) or classifier)
        fam = out.setdefault(key, {"family": key, "objective": "retrieval" if classifier is None else "classification",
                                   "metrics": []})
        fam["metrics"].append((metric, classifier))
    for fam in out.values():
        names = [definition(m)[0] if c is None else c for m, c in fam["metrics"]]
        if fam["family"] == "retrieval":
            fam["label"] = "retrieval, " + (names[0] if len(names) == 1 else f"mean of {_and(names)}")
        else:
            kind = f"{KINDS.get(fam['family'], fam['family'])} top-1 error"
            fam["label"] = kind if names == [fam["family"]] else \
                f"{kind} ({names[0]})" if len(names) == 1 else f"{kind}, mean of {_and(names)}"
    return list(out.values())


def _and(names: list) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _scores(row: dict, metrics: list) -> list | None:
    """The row's family score in each repeat: the mean of its values on ``metrics``; None when it lacks
    one (or it is NaN)."""
    runs = [row["runs"].get(mc) for mc in metrics]
    if any(r is None for r in runs):
        return None
    out = []
    for vals in zip(*runs):
        if any(v is None or v != v for v in vals):
            return None
        out.append(sum(vals) / len(vals))
    return out or None


def _side(row: dict, scores: list, swept: frozenset) -> dict:
    once = len(set(row["models"])) == 1
    return {"label": _row_label(row, swept), "method": row["method"], "dim": row["dim"], "params": row["params"],
            "model": row["model"], "models": row["models"], "baseline": row["baseline"], "value": _mean(scores),
            "sd": None if once else _sd(scores), "values": scores}


def _top(rows: list, metrics: list, higher: bool, swept: frozenset) -> dict | None:
    """The row with the best mean score on ``metrics`` as a side of a comparison; exact ties go to the
    smaller code, then to a baseline, then to the label."""
    have = [(r, s) for r in rows if (s := _scores(r, metrics)) is not None]
    if not have:
        return None
    sign = -1 if higher else 1
    row, scores = min(have, key=lambda t: (sign * _mean(t[1]), t[0]["dim"] or 0, not t[0]["baseline"],
                                           _row_label(t[0], swept)))
    return _side(row, scores, swept)


def _tolerance(items: dict | None, objective: str) -> float:
    """One test item's worth on ``objective`` (a classified row moves a top-1 error by 1/N; a query
    moves mAP or MAP@R by at most 1/Q, its AP lying in [0, 1]); without the counts, the 4 decimals
    shown."""
    n = (items or {}).get(objective)
    return max(1.0 / n, SHOWN / 2) if n else SHOWN / 2


def _compare(a: list, b: list, higher: bool, tolerance: float) -> dict:
    """a - b over the repeats (paired), its 95% t interval (two repeats or more), and the verdict in
    the metric's direction: a tie when the mean difference is below ``tolerance`` or the interval
    holds 0."""
    mean, lo, hi = paired_interval(a, b, LEVEL)
    within = len(a) > 1 and lo <= 0 <= hi
    gain = mean if higher else -mean
    verdict = "tie" if abs(mean) < tolerance * (1 - 1e-9) or within else "better" if gain > 0 else "worse"
    return {"difference": mean, "interval": None if math.isnan(lo) else [lo, hi], "verdict": verdict}


def _contest(learned: list, baselines: list, metrics: list, higher: bool, tolerance: float, swept) -> dict:
    """The best learned model against the best baseline on ``metrics``."""
    model, base = _top(learned, metrics, higher, swept), _top(baselines, metrics, higher, swept)
    out = {"model": model, "baseline": base, "difference": None, "interval": None, "verdict": None}
    if model and base:
        out.update(_compare(model["values"], base["values"], higher, tolerance))
    return out


def tie_rule(items: dict | None, repeats: int) -> str:
    """The tie rule of the verdicts, as the closing lines state it."""
    counts = {o: n for o, n in (items or {}).items() if n}
    if not counts:
        worth = "below the 4 decimals shown"
    elif len(set(counts.values())) == 1:
        worth = f"below one test item (1/{next(iter(counts.values())):,})"
    else:
        worth = "below one test item (" + ", ".join(f"1/{n:,} {ITEM_OF.get(o, o)}" for o, n in counts.items()) + ")"
    over = f" or a {LEVEL:.0%} paired t interval over the {repeats} repeats holding 0" if repeats > 1 else ""
    return f"tie: {worth}{over}"


def summarize(records: list, items: dict | None = None, objective: str | None = None) -> dict:
    """The report's verdict. ``headline``: per headline metric, the best learned model against the best
    baseline (``registry.BASELINES``), ``difference`` = model - baseline and ``verdict`` (better / worse
    / tie in the metric's direction). ``families``: the same per family of headline metrics (one vote
    each, :func:`families`), with raw features' (identity's) score and the family's ``vote``: the best
    learned model when better, the best baseline when worse, none for a tie. ``objectives``: per
    objective (retrieval, classification) its ``winner``, the model with the most votes; equal votes
    are a tie; a learned model worse than raw features on one of the objective's families is not named
    (``refused``). A tie: a difference below one test item's worth (``items``: {objective: test rows
    or queries scored}), or with repeats a paired 95% t interval over them that holds 0. ``objective``
    names the objective the closing line reports (None: both). Only the codes view competes: it is
    what a model's key encodes, exports and predicts with."""
    rows = list(_rows(records).values())
    swept = _swept(rows)
    learned, baselines = [r for r in rows if not r["baseline"]], [r for r in rows if r["baseline"]]
    repeats = repeat_count(records)
    headline = []
    for metric, classifier in headline_metrics(records):
        label, higher, _ = definition(metric)
        tol = _tolerance(items, "retrieval" if classifier is None else "classification")
        headline.append({"metric": metric, "classifier": classifier,
                         "label": label + (f" ({classifier})" if classifier else ""), "higher_is_better": higher,
                         **_contest(learned, baselines, [(metric, classifier)], higher, tol, swept)})
    fams = []
    for fam in families(records):
        higher, tol = definition(fam["metrics"][0][0])[1], _tolerance(items, fam["objective"])
        e = {**fam, "metrics": [list(mc) for mc in fam["metrics"]], "higher_is_better": higher, "tolerance": tol,
             **_contest(learned, baselines, fam["metrics"], higher, tol, swept),
             "raw": _top([r for r in baselines if r["method"] == RAW], fam["metrics"], higher, swept)}
        e["vote"] = {"better": e["model"], "worse": e["baseline"], "tie": None}.get(e["verdict"]) \
            if e["verdict"] else e["model"] or e["baseline"]
        e["tied"] = [e["model"], e["baseline"]] if e["verdict"] == "tie" else []
        fams.append(e)
    row_of = {(_row_label(r, swept), r["model"]): r for r in rows}
    objectives = [_objective(o, [f for f in fams if f["objective"] == o], row_of)
                  for o in OBJECTIVES if any(f["objective"] == o for f in fams)]
    return {"repeats": repeats, "tie_rule": tie_rule(items, repeats), "items": items, "headline": headline,
            "families": fams, "objectives": objectives, "objective": objective, "learned_models": len(learned),
            "baselines": len(baselines), "recall_rule": RECALL_RULE,
            "recall_hidden": {str(k): v for k, v in recall_hidden(records).items()}}


def _objective(name: str, fams: list, row_of: dict) -> dict:
    """The winner of objective ``name`` from its families' votes."""
    votes = {}
    for f in fams:
        if f["vote"]:
            votes.setdefault((f["vote"]["label"], f["vote"]["model"]), [f["vote"], 0])[1] += 1
    top = max((n for _, n in votes.values()), default=0)
    leaders = [s for s, n in votes.values() if n == top] if top else []
    refused = [w for s in leaders if not s["baseline"] and (w := _worse_than_raw(s, fams, row_of))]
    tied = leaders if len(leaders) > 1 else fams[0]["tied"] if len(fams) == 1 and not leaders else []
    o = {"objective": name, "families": len(fams), "tied_families": sum(1 for f in fams if f["tied"]), "votes": top,
         "winner": leaders[0] if len(leaders) == 1 and not refused else None, "tied": tied, "refused": refused}
    o["text"] = _objective_text(o)
    return o


def _worse_than_raw(side: dict, fams: list, row_of: dict) -> dict | None:
    """The first family of ``fams`` where the learned model of ``side`` is worse than raw features
    (identity), as the verdict counts it."""
    row = row_of.get((side["label"], side["model"]))
    for f in fams:
        scores = _scores(row, [tuple(mc) for mc in f["metrics"]]) if row and f["raw"] else None
        if scores is None:
            continue
        c = _compare(scores, f["raw"]["values"], f["higher_is_better"], f["tolerance"])
        if c["verdict"] == "worse":
            return {"label": side["label"], "model": side["model"], "family": f["label"], "raw": f["raw"]["label"],
                    **c}
    return None


def _key(side: dict) -> str:
    """A side's model key (repeat 0's, when the repeats trained several)."""
    key = side.get("model") or "?"
    models = side.get("models") or []
    return f"{key}, repeat 0 of {len(models)}" if len(set(models)) > 1 else key


def _objective_text(o: dict) -> str:
    """The closing line of an objective."""
    of = f"{o['families']} famil{'y' if o['families'] == 1 else 'ies'}"
    votes = f": {o['votes']} of {of}" if o["families"] > 1 else ""
    w, tied, refused = o["winner"], o["tied"], o["refused"]
    if w:
        text = f"{w['label']} ({'a baseline' if w['baseline'] else 'learned'}), model key {_key(w)}{votes}"
    elif tied:
        text = "tie between " + _and([f"{s['label']} [{_key(s)}]" for s in tied])
        text += f"{votes} each" if o["votes"] else ": the difference is within the tie rule"
    elif refused:
        text = f"none: {refused[0]['label']} [{refused[0]['model'] or '?'}] takes the most votes{votes}"
    else:
        text = "none: every family is a tie"
    if o["tied_families"] and o["votes"] and o["families"] > 1:
        text += f" ({o['tied_families']} tied)"
    for r in refused:
        text += (f"{'' if w or tied else ' but'}{'; ' + r['label'] if w or tied else ''} is worse than raw features "
                 f"({r['raw']}) on {r['family']} ({_fmt(r['difference'])})")
    return f"Winner ({o['objective']}): {text}"


def recall_hidden(records: list) -> dict:
    """{K: why} for the recall@K that :data:`RECALL_RULE` leaves out of the report's tables."""
    out = {}
    for k in sorted({_at_k(r["metric"])[1] for r in records if r["metric"].startswith("recall@")}):
        vals = [r["value"] for r in records if r["metric"] == f"recall@{k}" and _view(r) == "codes"]
        if not vals:
            continue
        if max(vals) < RECALL_FLOOR:
            out[k] = f"at most {max(vals):.4f} for every model"
        elif len(vals) > 1 and max(vals) - min(vals) < RECALL_SPREAD:
            out[k] = f"{min(vals):.4f} to {max(vals):.4f}: the same for every model"
    return out


SHOWN = 1e-4   # differences are shown to 4 decimals


def _fmt(v: float) -> str:
    return f"{v:+.4f}" if abs(v) >= SHOWN / 2 else "+0.0000"


def _value(side: dict) -> str:
    """A side's value, with its spread over the repeats when it has one."""
    return f"{side['value']:.4f}" + (f" +/- {side['sd']:.4f}" if side.get("sd") is not None else "")


def winner_lines(summary: dict) -> list[str]:
    """The end of a run on the terminal: per family of headline metrics, the best learned model
    against the best baseline with the verdict; then each objective's winner (or only the one
    ``evaluate.objective`` names), with its model key."""
    lines = []
    for f in summary.get("families") or []:
        direction = "higher" if f["higher_is_better"] else "lower"
        m, b = f["model"], f["baseline"]
        head = f"  {f['label']} ({direction} is better): "
        if m and b:
            ci = "" if not f["interval"] else f" [{LEVEL:.0%} CI {_fmt(f['interval'][0])}, {_fmt(f['interval'][1])}]"
            lines.append(f"{head}{_value(m)} {m['label']} [{m['model'] or '?'}] vs baseline {_value(b)} {b['label']}: "
                         f"{_fmt(f['difference'])}{ci} ({f['verdict']})")
        elif b or m:
            only = b or m
            lines.append(f"{head}{_value(only)} {only['label']} [{only['model'] or '?'}]"
                         + ("; no learned model in this run" if b else "; no baseline in this run"))
    if lines:
        lines.insert(0, f"Best learned model vs best baseline per family ({summary['tie_rule']}):")
    for o in summary.get("objectives") or []:
        if summary.get("objective") in (None, o["objective"]):
            lines.append(o["text"])
    return lines


def _main_columns(records: list) -> list[tuple]:
    """The main table's columns: the headline metrics, the UKB score, and precision@K for up to 4 K."""
    have = {(r["metric"], r["classifier"]) for r in records}
    ks = sorted(k for k in _kept_ks(records) if ("mprec@%d" % k, None) in have)
    if len(ks) > 4:
        ks = [k for k in ks if k in (1, 10, 50, 100)][:4] or ks[:4]
    head = headline_metrics(records)
    return head[:2] + [mc for mc in [("ukb4", None)] + [(f"mprec@{k}", None) for k in ks] if mc in have] + head[2:]


def _other_columns(records: list, main: list) -> list[tuple]:
    """Every other metric the tables keep: not a cost, a kept K, and recall@K only where informative."""
    kept, hidden = _kept_ks(records), recall_hidden(records)
    cols = set()
    for r in records:
        at = _at_k(r["metric"])
        if r["metric"] in COST_METRICS or (r["metric"], r["classifier"]) in main:
            continue
        if at and (at[1] not in kept or (at[0] == "recall" and at[1] in hidden)):
            continue
        cols.add((r["metric"], r["classifier"]))
    return sorted(cols, key=lambda mc: (mc[1] is not None, mc[1] or "", mc[0]))


def _th(mc: tuple) -> str:
    label, higher, text = definition(mc[0])
    arrow = "&uarr;" if higher else "&darr;"
    cls = "" if mc[1] is None else f"<br>{html.escape(mc[1])}"
    return f'<th title="{html.escape(text)}">{html.escape(label)} {arrow}{cls}</th>'


def _key_cell(key, extended: dict, models: list | None = None) -> str:
    """A row's model key; a row over repeats that trained several models shows repeat 0's."""
    if not key:
        return "<td></td>"
    more = "".join(f"<br><small>+ classes: <code>{html.escape(e['key'])}</code></small>" for e in extended.get(key, []))
    if models and len(set(models)) > 1:
        more += f"<br><small>repeat 0 of {len(models)} (metrics.json: each)</small>"
    return f"<td class=l><code>{html.escape(key)}</code>{more}</td>"


def _cell(row: dict, mc: tuple, best) -> str:
    """A table cell: the value (the mean over the repeats, with +/- their sample standard deviation)."""
    if mc not in row["values"]:
        return "<td></td>"
    sd = row.get("sd", {}).get(mc)
    spread = "" if sd is None else f" &plusmn; {sd:.4f}"
    return f"<td{BOLD if row['values'][mc] == best else ''}>{row['values'][mc]:.4f}{spread}</td>"


def _table(rows: dict, columns: list, extended: dict, bold: bool = True) -> str:
    """Rows (learned models first) x columns; the best value of each column in bold."""
    best = {}
    for mc in columns if bold else []:
        found = _best(list(rows.values()), mc, definition(mc[0])[1])
        best[mc] = found["value"] if found else None
    body, swept = [], _swept(rows.values())
    for row in sorted(rows.values(), key=lambda r: (r["baseline"], r["method"], r["dim"] or 0, to_json(r["params"]))):
        cells = "".join(_cell(row, mc, best.get(mc)) for mc in columns)
        tag = ' <span class="b">baseline</span>' if row["baseline"] else ""
        body.append(f"<tr><td class=l>{html.escape(_label(row, swept))}{tag}</td><td>{row['dim']}</td>"
                    f"{_key_cell(row['model'], extended, row.get('models'))}{cells}</tr>")
    head = "".join(_th(mc) for mc in columns)
    return (f"<table><tr><th class=l>model</th><th>d</th><th class=l>key</th>{head}</tr>"
            f"{''.join(body)}</table>")


def _side_html(x: dict | None) -> str:
    if not x:
        return "<td>&mdash;</td><td></td><td></td>"
    key = _key_cell(x.get("model"), {}, x.get("models"))
    value = html.escape(_value(x)).replace("+/-", "&plusmn;")
    return f"<td class=l>{html.escape(x['label'])}</td>{key}<td>{value}</td>"


def _summary_html(summary: dict) -> str:
    esc = html.escape
    fams = summary.get("families") or []
    if not fams:
        return "<h2>Summary</h2><p>No headline metric (mAP, top-1 error) in this run's records.</p>"
    note = ""
    if not summary["learned_models"]:
        note = " This run trains baselines only: no learned model to compare."
    elif not summary["baselines"]:
        note = " This run has no baseline (identity, pca, pcaw, lda, random): no comparison."
    rows = []
    for f in fams:
        arrow = "higher" if f["higher_is_better"] else "lower"
        diff = ""
        if f["difference"] is not None:
            ci = "" if not f["interval"] else f"<br><small>{LEVEL:.0%} CI {_fmt(f['interval'][0])} to " \
                                              f"{_fmt(f['interval'][1])}</small>"
            diff = f"{_fmt(f['difference'])} ({f['verdict']}){ci}"
        cls = {"better": ' class="win"', "worse": ' class="lose"'}.get(f["verdict"], "")
        raw = "&mdash;" if not f["raw"] else esc(_value(f["raw"])).replace("+/-", "&plusmn;")
        rows.append(f"<tr><td class=l>{esc(f['label'])} <small>({arrow} is better)</small></td>"
                    f"{_side_html(f['model'])}{_side_html(f['baseline'])}<td>{raw}</td><td{cls}>{diff}</td></tr>")
    repeats = summary.get("repeats") or 1
    over = (f" Values are means &plusmn; the sample standard deviation over the {repeats} repeats (a model without "
            f"seed is computed once: one value); the verdict reads the {LEVEL:.0%} paired t interval of the "
            f"per-repeat differences, and a difference whose interval holds 0 is a tie." if repeats > 1 else "")
    worth = ("A difference below one test item's worth is a tie: 1/N of a top-1 error (N classified test rows), "
             "1/Q of mAP or MAP@R (a query's AP lies in [0, 1]; Q queries)" if summary.get("items") else
             "A difference below the 4 decimals shown is a tie")
    winners = "".join(f'<p class="winner">{esc(o["text"])}</p>' for o in summary["objectives"])
    return (f'<h2>Summary</h2>{winners}' + (f'<p>{note.strip()}</p>' if note else "") +
            f'<table class="summary"><tr><th class=l>family (one vote)</th><th class=l>best learned model</th>'
            f'<th class=l>key</th><th>value</th><th class=l>best baseline</th><th class=l>key</th><th>value</th>'
            f'<th>raw features</th><th>model &minus; baseline</th></tr>{"".join(rows)}</table>'
            f'<p><small>One vote per family: mAP and MAP@R are one (retrieval), the knnK classifiers one, the '
            f'softvoteK one, ncm and ncmc one each; a family\'s score is the mean of its members. {worth}.{over} '
            f'An objective\'s winner takes the most votes (a tied family gives none, the better side of a family '
            f'its one); equal votes are a tie, and a learned model worse than raw features (identity) on one of '
            f'the objective\'s families is not named. Keys are what <code>metricpipe predict --model KEY</code>, '
            f'<code>encode</code> and <code>export</code> take (a prefix is enough; <code>metricpipe models '
            f'STORE</code> lists them). Only the codes view competes.</small></p>')


def _costs_html(rows: dict, doc: dict, extended: dict) -> str:
    """Bytes, FLOPs and seconds per model, apart from the quality metrics."""
    info = {m["key"]: m for m in doc.get("models", [])}
    timed = {t.get("key"): t for t in doc.get("model_timings", [])}
    body, swept = [], _swept(rows.values())
    for row in sorted(rows.values(), key=lambda r: (r["baseline"], r["method"], r["dim"] or 0, to_json(r["params"]))):
        v, key = row["values"], row["model"]
        cost = [v.get((m, None)) for m in COST_METRICS]
        fit = (info.get(key) or {}).get("fit_seconds")
        t = timed.get(key) or {}
        if all(c is None for c in cost) and fit is None and not t:
            continue
        cells = [f"{row['dim'] * 4:,}" if isinstance(row["dim"], int) else ""]
        cells += ["" if c is None else f"{c:,.0f}" for c in cost]
        cells += ["" if fit is None else f"{fit:.3f}", "" if "offline_seconds" not in t else f"{t['offline_seconds']:.3f}",
                  "" if "online_seconds_per_image" not in t else f"{t['online_seconds_per_image'] * 1e3:.4f}"]
        body.append(f"<tr><td class=l>{html.escape(_label(row, swept))}</td><td>{row['dim']}</td>"
                    f"{_key_cell(key, extended)}{''.join(f'<td>{c}</td>' for c in cells)}</tr>")
    if not body:
        return ""
    return ("<h2>Costs</h2><p><small>Code bytes: one float32 code. Model bytes, non-zeros and FLOPs: the encoder "
            "(0 for the identity). Train s: the learner's fit; offline / online: SLEM and ESVM's own timings. "
            "Seconds vary between reruns; the rest does not.</small></p><table><tr><th class=l>model</th><th>d</th>"
            "<th class=l>key</th><th>code bytes</th><th>model bytes</th><th>non-zeros</th><th>FLOPs / image</th>"
            f"<th>train s</th><th>offline s</th><th>online ms / image</th></tr>{''.join(body)}</table>")


def _extended_html(ext: list) -> str:
    if not ext:
        return ""
    esc = html.escape
    rows = "".join(
        f"<tr><td class=l><code>{esc(e['key'])}</code></td><td class=l><code>{esc(str(e['extends']))}</code></td>"
        f"<td class=l>{esc(e['label'])}</td><td class=l>{esc(', '.join(map(str, e['added'][:10])))}"
        f"{' ...' if len(e['added']) > 10 else ''} ({len(e['added'])})</td><td>{e.get('images', '')}</td></tr>"
        for e in ext)
    return ("<h2>Models extended by add-classes</h2><p><small>Copies of a run's NCM model with more classes "
            "(<code>metricpipe add-classes</code>); W is unchanged, so their codes are the extended model's. They are "
            "not evaluated by the run: use their key with <code>metricpipe predict</code>.</small></p><table><tr>"
            "<th class=l>key</th><th class=l>extends</th><th class=l>model</th><th class=l>classes added</th>"
            f"<th>images</th></tr>{rows}</table>")


def _definitions_html(records: list) -> str:
    names = sorted({r["metric"] for r in records}, key=lambda m: (m in COST_METRICS, m))
    rows = "".join(f"<tr><td class=l>{html.escape(m)}</td><td class=l>{html.escape(definition(m)[0])}</td>"
                   f"<td class=l>{'higher' if definition(m)[1] else 'lower'}</td>"
                   f"<td class=l>{html.escape(definition(m)[2])}</td></tr>" for m in names)
    return ("<h2>Metric definitions</h2><table><tr><th class=l>record name</th><th class=l>shown as</th>"
            f"<th class=l>better</th><th class=l>meaning</th></tr>{rows}</table>")


def definitions_of(records: list) -> dict:
    """{metric: {label, higher_is_better, meaning}} for the metrics of ``records`` (metrics.json)."""
    return {m: dict(zip(("label", "higher_is_better", "meaning"), definition(m)))
            for m in sorted({r["metric"] for r in records})}


# ---- the held-out classes (data.split.classes): their figures beside the seen classes' -------------------------

HELD_OUT_METRICS = (("map", None), ("map@r", None))   # then each classifier's top-1 error


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
    table, swept = {}, _swept(unseen)
    for r in records:
        if r.get("classes") not in ("seen", "unseen") or (r["metric"], r["classifier"]) not in columns \
                or (r["params"].get("view") or "codes") != "codes":
            continue
        ident = (r["method"], r["dim"], to_json({k: v for k, v in r["params"].items() if k != "score"}))
        row = table.setdefault(ident, {"label": f"{_label(r, swept)} d={r['dim']}", "method": r["method"],
                                       "dim": r["dim"], "model": r.get("model"), "baseline": r["method"] in BASELINES,
                                       "values": [[None, None] for _ in columns]})
        row["values"][columns.index((r["metric"], r["classifier"]))][r["classes"] == "unseen"] = r["value"]
    rows = sorted(table.values(), key=lambda row: (row["baseline"], row["method"], row["dim"] or 0, row["label"]))
    return {"classes": list(classes or []), "rows": rows, "records": unseen,
            "columns": [{"metric": m, "classifier": c, "label": definition(m)[0] + (f" ({c})" if c else ""),
                         "higher_is_better": definition(m)[1]} for m, c in columns]}


def held_out_html(held: dict | None) -> str:
    """The held-out classes' section: per model, each headline metric on the seen and the unseen classes."""
    if not held:
        return ""
    esc = html.escape
    head = "".join(f'<th colspan=2>{esc(c["label"])} {"&uarr;" if c["higher_is_better"] else "&darr;"}</th>'
                   for c in held["columns"])
    sub = "<th>seen</th><th>unseen</th>" * len(held["columns"])
    tag = ' <span class="b">baseline</span>'
    body = "".join(
        f"<tr><td class=l>{esc(r['label'])}{tag if r['baseline'] else ''}</td>"
        + "".join("".join("<td></td>" if v is None else f"<td>{v:.4f}</td>" for v in pair) for pair in r["values"])
        + "</tr>" for r in held["rows"])
    names = ", ".join(esc(str(c)) for c in held["classes"])
    return (f"<h2>Held-out classes</h2><p><small>data.split.classes holds out {names or 'classes'}: no learner, "
            f"baseline or statistic sees their rows. Unseen: retrieval among their test rows, kNN over their "
            f"train rows, NCM (NCMC) with means (centroids) from their train rows. Seen: the tables "
            f"above.</small></p><table><tr><th class=l rowspan=2>model</th>{head}</tr><tr>{sub}</tr>{body}</table>")


CSS = """body{font-family:sans-serif;font-size:14px;margin:1em 2em;max-width:1340px}h1{font-size:1.4em;margin:.2em 0}
h2{font-size:1.15em;margin:1em 0 .3em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;
text-align:right}th{background:#f3f3f3;font-weight:normal}.l{text-align:left}td.l{max-width:320px}
.b{color:#777;font-size:.8em}.win{color:#060}.lose{color:#a00}.winner{font-size:1.1em;margin:.3em 0}
figure{display:inline-block;margin:4px}pre{background:#f6f6f6;padding:1em}details{margin:.6em 0}
summary{cursor:pointer;font-weight:bold}"""


# What each training-history quantity is (the training curves' caption)
CURVES = {
    "val_error": "top-1 error on the validation rows (the learner's own classifier: NCM, NCMC, kNN or SL-NE's "
                 "soft vote), the early-stopping criterion",
    "val_error_new_classes": "the validation NCM error of the classes left out of training (not used to choose)",
    "val_map": "mAP of the validation rows querying each other, the early-stopping criterion",
    "batch": "the last minibatch before the validation: its mean log-likelihood for NCMML/NCMC (higher is "
             "better), its number of violating triplets for k-NN ML; one batch, so it is noisy",
    "hinge": "the mean hinge loss over the pairs or triplets of the period (SL-NE: per epoch)",
    "violations": "SL-NE's triplets violating the margin in the epoch",
    "objective": "the sparse projectors' training objective, Eq. 7's f_q summed over the queries",
    "train_map": "mAP of the sparse projectors' training sample under the current projector",
}


def _figure(panels: list[dict], ncols: int = 2) -> str:
    """The panels as one image; its alt text lists them."""
    if not panels:
        return ""
    alt = html.escape("; ".join(f"{p['title']}: {p['ylabel']} against {p['xlabel']}" for p in panels if p),
                      quote=True)
    return f'<figure><img alt="{alt}" src="data:image/png;base64,{_panels_png(panels, ncols)}"></figure>'


def _mean_records(*row_sets: dict) -> list[dict]:
    """One record per row and metric, its value the mean over the repeats (what the plots draw)."""
    return [{"method": row["method"], "dim": row["dim"], "params": row["params"], "model": row["model"],
             "classifier": c, "metric": m, "value": v}
            for rows in row_sets for row in rows.values() for (m, c), v in row["values"].items()]


def _repeats_note(records: list) -> str:
    n = repeat_count(records)
    return "" if n == 1 else (f" One row per config entry over its {n} repeats: the mean &plusmn; the sample standard "
                              f"deviation (n &minus; 1) of the repeats, each training every learned model with its "
                              f"own seed and validation rows; a model without seed is computed once (no &plusmn;). "
                              f"metrics.json's <code>repeats</code> holds every repeat's value.")


def render_html(doc: dict, curves: list | None = None) -> str:
    records, esc = doc["records"], html.escape
    summary = doc.get("summary") or summarize(records)
    extended = {}
    for e in doc.get("extended_models", []):
        extended.setdefault(e["extends"], []).append(e)
    main = _main_columns(records)
    other = _other_columns(records, main)
    rows, views = _rows(records), _rows(records, views=True)
    hidden = summary.get("recall_hidden") or {}
    recall_note = (f"<p><small>{esc(RECALL_RULE)}. Left out: "
                   f"{'; '.join(f'recall@{k} ({esc(why)})' for k, why in hidden.items())}.</small></p>"
                   if hidden else f"<p><small>{esc(RECALL_RULE)}.</small></p>")
    more = ""
    if other:
        more += f"<h3>Other metrics</h3>{_table(rows, other, extended)}"
    if views:
        more += ("<h3>Other views</h3><p><small>SL-NE / SL-DE's exact bilinear score (the codes' loss from "
                 f"factoring shows against the rows above).</small></p>{_table(views, main + other, extended)}")
    more = f"<details><summary>More metrics ({len(other)} columns{', other views' if views else ''})</summary>" \
           f"{recall_note}{more}</details>" if more else recall_note
    shown = _mean_records(rows, views) if repeat_count(records) > 1 else records   # a point per row
    panels = [_panel_over_dim(shown, m, c) for m, c in main]
    all_ks = {_at_k(r["metric"])[1] for r in shown if _at_k(r["metric"])}
    if len(all_ks) > 6:  # precision against K, one panel per dimension
        dims = sorted({r["dim"] for r in shown if _at_k(r["metric"])}, key=lambda d: (d is None, d or 0))
        panels += [_panel_over_k(shown, "mprec", d) for d in dims]
    plots = _figure(panels)
    if plots:
        plots = ("<p><small>Each headline metric against the code dimension d, one line per model, baselines "
                 "dashed; models with equal values draw over each other (the tables above have every value)."
                 "</small></p>" + plots)
    swept = _swept(records)
    per_model = [_curve_panels(c, swept) for c in curves or []]
    width = max((len(ps) for ps in per_model), default=1)   # one row per model
    training = _figure([p for ps in per_model for p in ps + [None] * (width - len(ps))], ncols=width)
    if training:
        shown = sorted({p["ylabel"] for ps in per_model for p in ps})
        caption = "; ".join(f"<b>{esc(k)}</b>: {esc(CURVES.get(k, 'as recorded by the learner'))}" for k in shown)
        training = (f"<h2>Training curves</h2><p><small>One row per iterative model, one panel per quantity it "
                    f"records, against SGD steps (iter; pairs seen for NML and linear ML) or epochs. {caption}. "
                    f"The model kept is the state with the best validation value (its best_iter_ in the model's "
                    f"record).</small></p>{training}")

    def stage_note(t):
        return " ".join(x for x in (t.get("note", ""), f"{t['tasks']} task{'s' if t['tasks'] != 1 else ''}" if t.get("tasks") else "") if x)

    timings = "".join(f"<tr><td class=l>{esc(t['stage'])}</td><td>{t['seconds']:.2f}</td>"
                      f"<td class=l>{esc(stage_note(t))}</td></tr>" for t in doc["timings"])
    run, ds = doc["run"], doc["run"]["dataset"]
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>metricpipe report</title>
<style>{CSS}</style></head><body><h1>metricpipe report</h1>
<p>{esc(str(ds.get('source')))}: {ds.get('n_samples')} samples x {ds.get('n_features')} features,
{ds.get('n_classes')} classes, splits {esc(to_json(ds.get('splits')).replace(chr(10), ''))}; run {run['seconds']:.1f} s;
data <code>{esc(ds.get('key', ''))}</code>.</p>
{_summary_html(summary)}
<h2>Models</h2><p><small>&uarr; higher is better, &darr; lower is better (definitions below); bold: the best of the
column. Rows with a key are the run's models.{_repeats_note(records)}</small></p>{_table(rows, main, extended)}
{"".join(f"<p>Skipped: {esc(s['classifier'])} for {esc(s['model'])} ({esc(s['reason'])}).</p>" for s in doc.get("skipped", []))}
{held_out_html(doc.get("held_out_classes"))}
{more}
{_extended_html(doc.get("extended_models", []))}
{_costs_html(rows, doc, extended)}
{_definitions_html(records)}
{_selection_html(doc.get("selection", []))}
<h2>Plots</h2>{plots}
{training}
<h2>Stage timings</h2><table><tr><th class=l>stage</th><th>seconds</th><th></th></tr>{timings}</table>
<h2>Config</h2><pre>{esc(to_json(run['config']))}</pre>
<h2>Versions</h2><pre>{esc(to_json(run['versions']))}</pre>
</body></html>"""
