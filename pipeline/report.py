"""The report: metrics.json (records + timings + run facts) and a self-contained index.html with
tables and one metric-vs-dimension plot per metric."""
import base64
import html
import io
import platform
from importlib import metadata

from metricpipe.storage import Store, to_json
from metricpipe.tasks.errors import InputError

PACKAGES = ("metricpipe", "numpy", "scipy", "dask", "distributed", "zarr", "xarray", "scikit-learn")


def package_versions() -> dict:
    out = {"python": platform.python_version()}
    for p in PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


def build_report(store: Store, manifest: dict) -> str:
    """Collect the run's evaluation units, write report/metrics.json and report/index.html."""
    records = []
    for rel in manifest["evaluation_units"]:
        kind, key = rel.split("/")
        unit = store.unit(kind, key)
        if not unit.done():  # wiped or half-written by a later, interrupted run: never read it
            raise InputError(f"{store.url}: {rel} of the last run is not committed (a later run was interrupted?); "
                             f"rerun 'metricpipe run CONFIG --resume' to recompute it")
        records += unit.read_json("records.json")
    doc = {"run": {k: manifest[k] for k in ("config", "dataset", "store", "versions", "started", "seconds")},
           "records": records, "timings": manifest["timings"]}
    curves = training_curves(store, manifest)
    doc["model_timings"] = model_timings(store, manifest)
    doc["selection"] = selections(store, manifest)
    doc["skipped"] = manifest.get("skipped", [])   # default classifiers a model cannot serve
    store.write_text("report/metrics.json", to_json({**doc, "training": curves}))
    store.write_text("report/index.html", render_html(doc, curves))
    return store.path("report", "index.html")


def selections(store: Store, manifest: dict) -> list[dict]:
    """Each parameter selection of the run: metric, every candidate's validation score, the choice."""
    out = []
    for rel in manifest["units"].get("selection", []):
        unit = store.unit(*rel.split("/"))
        if unit.done():
            m = unit.meta()
            out.append({k: m.get(k) for k in ("method", "metric", "higher_is_better", "validation_rows", "candidates",
                                              "chosen", "spec", "grid")})
    return out


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
        parts.append(f"<p>{esc(s['method'])}: {esc(s['metric'])} on {s['validation_rows']:,} validation rows "
                     f"({best} wins)</p><table><tr><th>parameters</th><th>validation {esc(s['metric'])}</th>"
                     f"<th></th><th>model</th></tr>{rows}</table>")
    return ("<h2>Parameter selection</h2><p>Candidates trained on the train split and scored on the validation "
            "split; the test split was not read. Test metrics above are the chosen models'.</p>" + "".join(parts))


def model_timings(store: Store, manifest: dict) -> list[dict]:
    """Measured costs a learner recorded (SLEM / ESVM: offline seconds, online seconds per image). Kept
    apart from the records, which hold only what is the same on every rerun."""
    out = []
    for rel in manifest["units"].get("models", []):
        kind, key = rel.split("/")
        unit = store.unit(kind, key)
        if unit.done():
            meta = unit.meta()
            timed = {k: meta[k] for k in ("offline_seconds", "online_seconds_per_image") if k in meta}
            if timed:
                out.append({"model": meta["spec"], **timed})
    return out


def training_curves(store: Store, manifest: dict) -> list[dict]:
    """Per model, the learner's recorded history (objective, train mAP, hinge...) if it has one."""
    from metricpipe.storage import read_attrs
    out = []
    for rel in manifest["units"].get("models", []):
        kind, key = rel.split("/")
        if not store.unit(kind, key).done():
            continue
        attrs = read_attrs(store.unit(kind, key).url)
        state = attrs.get("state") or {}   # the estimator's fitted attributes (history_: its training curve)
        history = state.get("history_") or []
        if history and "member" in history[0]:   # an ensemble (SL-DE): its first member's curve
            history = history[0]["history"]
        if history:
            out.append({"model": attrs["spec"], "history": history})
    return out


def _curve_plot(curve: dict) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hist = curve["history"]
    xkey = "iter" if "iter" in hist[0] else "epoch"
    keys = list(dict.fromkeys(k for h in hist for k in h if k != xkey and isinstance(h[k], (int, float))))
    fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys), 2.6), squeeze=False)
    for ax, k in zip(axes[0], keys):
        have = [h for h in hist if isinstance(h.get(k), (int, float))]   # e.g. val_error also at the start
        ax.plot([h[xkey] for h in have], [h[k] for h in have], ".-")
        ax.set_xlabel(xkey)
        ax.set_ylabel(k)
        if k in ("objective", "hinge") and min(h[k] for h in have) > 0:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    fig.suptitle(_label({"method": curve["model"]["method"], "params": {k: v for k, v in curve["model"].items()
                                                                      if k not in ("method",)}}), fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _label(r: dict) -> str:
    """Method plus the parameters that differ from their defaults (the legend of a plot)."""
    from metricpipe.tasks import registry
    declared = registry.defaults(registry.estimator_class(r["method"], r["params"])) \
        if r["method"] in registry.METHODS else {}
    extra = [f"{k}={v}" for k, v in r["params"].items() if k not in declared or v != declared[k]]
    return " ".join([r["method"], *extra])


def _lines_png(series: dict, xlabel: str, ylabel: str, marker: str, log2_x: bool = False) -> str:
    """One line per label from {label: [(x, y), ...]}, as a base64 PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for label, pts in sorted(series.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker, label=label)
    if log2_x:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _plot(records: list, metric: str, classifier) -> str:
    series = {}
    for r in records:
        if r["metric"] == metric and r["classifier"] == classifier:
            series.setdefault(_label(r), []).append((r["dim"], r["value"]))
    return _lines_png(series, "dimension", metric if classifier is None else f"{metric} ({classifier})", "o-",
                      log2_x=True)


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


def _plot_over_k(records: list, name: str, dim) -> str:
    """``name``@K against K for every model of dimension ``dim`` (the NML paper's Fig. 3)."""
    series = {}
    for r in records:
        at = _at_k(r["metric"])
        if at and at[0] == name and r["dim"] == dim and r["classifier"] is None:
            series.setdefault(_label(r), []).append((at[1], r["value"]))
    return _lines_png(series, "K", f"{name}@K (d = {dim})", ".-")


def render_html(doc: dict, curves: list | None = None) -> str:
    records = doc["records"]
    kept = _kept_ks(records)
    columns = sorted({(r["metric"], r["classifier"]) for r in records
                      if not _at_k(r["metric"]) or _at_k(r["metric"])[1] in kept},
                     key=lambda mc: (mc[1] is not None, mc[1] or "", mc[0]))
    rows = {}
    for r in records:
        ident = (r["method"], r["dim"], to_json(r["params"]))
        rows.setdefault(ident, {})[(r["metric"], r["classifier"])] = r["value"]
    esc = html.escape
    head = "".join(f"<th>{esc(m)}{'' if c is None else '<br>' + esc(c)}</th>" for m, c in columns)
    body = ""
    for (method, dim, params), vals in sorted(rows.items(), key=lambda x: (x[0][0], x[0][1], x[0][2])):
        cells = "".join(f"<td>{vals[c]:.4f}</td>" if c in vals else "<td></td>" for c in columns)
        p = "" if params == "{}" else esc(params.replace("\n", ""))
        body += f"<tr><td>{esc(method)}</td><td>{dim}</td><td><small>{p}</small></td>{cells}</tr>\n"
    plots = "".join(f'<figure><img src="data:image/png;base64,{_plot(records, m, c)}"></figure>' for m, c in columns)
    all_ks = {_at_k(r["metric"])[1] for r in records if _at_k(r["metric"])}
    if len(all_ks) > 6:  # precision against K, one plot per dimension
        dims = sorted({r["dim"] for r in records if _at_k(r["metric"])}, key=lambda d: (d is None, d or 0))
        plots += "".join(f'<figure><img src="data:image/png;base64,{_plot_over_k(records, "mprec", d)}"></figure>'
                         for d in dims)
    training = "".join(f'<figure><img src="data:image/png;base64,{_curve_plot(c)}"></figure>' for c in curves or [])
    training = f"<h2>Training curves</h2>{training}" if training else ""
    def stage_note(t):
        return " ".join(x for x in (t.get("note", ""), f"{t['tasks']} tasks" if t.get("tasks") else "") if x)

    timings = "".join(f"<tr><td>{esc(t['stage'])}</td><td>{t['seconds']:.2f}</td><td>{esc(stage_note(t))}</td></tr>"
                      for t in doc["timings"])
    timings += "".join(f"<tr><td>{esc(_label({'method': t['model']['method'], 'params': t['model']}))}</td>"
                       f"<td>{t.get('offline_seconds', 0):.3f}</td><td>offline; online "
                       f"{t.get('online_seconds_per_image', 0) * 1e3:.3f} ms per image</td></tr>"
                       for t in doc.get("model_timings", []))
    run = doc["run"]
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>metricpipe report</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;
padding:3px 8px;text-align:right}}figure{{display:inline-block;margin:4px}}pre{{background:#f6f6f6;padding:1em}}</style>
</head><body><h1>metricpipe report</h1>
<p>Dataset: {esc(str(run['dataset'].get('source')))} &mdash; {run['dataset'].get('n_samples')} samples x
{run['dataset'].get('n_features')} features, {run['dataset'].get('n_classes')} classes,
splits {esc(to_json(run['dataset'].get('splits')))}, fingerprint <code>{esc(run['dataset'].get('key', ''))}</code>.
Run took {run['seconds']:.1f} s.</p>
<h2>Metrics</h2><table><tr><th>method</th><th>dim</th><th>params</th>{head}</tr>{body}</table>
{"".join(f"<p>Skipped: {esc(s['classifier'])} for {esc(s['model'])} ({esc(s['reason'])}).</p>" for s in doc.get("skipped", []))}
{_selection_html(doc.get("selection", []))}
<h2>Plots</h2>{plots}
{training}
<h2>Stage timings</h2><table><tr><th>stage</th><th>seconds</th><th></th></tr>{timings}</table>
<h2>Config</h2><pre>{esc(to_json(run['config']))}</pre>
<h2>Versions</h2><pre>{esc(to_json(run['versions']))}</pre>
</body></html>"""
