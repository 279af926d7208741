"""The report's page, a self-contained index.html (:func:`render_html`): the verdict first, then one row
per model with its key and the headline metrics; secondary metrics, other views, costs, definitions,
parameter selections and plots follow."""

import html

from metricpipe.report.data import (
    COST_METRICS,
    RECALL_RULE,
    at_k,
    definition,
    headline_metrics,
    kept_ks,
    model_label,
    recall_hidden,
    repeat_count,
    report_rows,
    row_label,
    swept_params,
)
from metricpipe.report.plots import curve_panels, figure_html, panel_over_dim, panel_over_k
from metricpipe.report.quality import quality_html
from metricpipe.report.verdict import LEVEL, fmt_difference, side_value, summarize
from metricpipe.store import to_json
from metricpipe.tasks.registry import BASELINES

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
            for i, c in enumerate(s["candidates"])
        )
        beyond = (
            f"; {s['extended']} candidate(s) beyond the grid, where the best sat on its edge"
            if s.get("extended")
            else ""
        )
        edge = "".join(
            f"; <b>{esc(k)} {s['spec'][k]:g} is still the {'largest' if side == 'upper' else 'smallest'} "
            f"value tried</b>: the best may lie further"
            for k, side in (s.get("edge") or {}).items()
        )
        parts.append(
            f"<p>{esc(s.get('label') or s['method'])}: {esc(s['metric'])} on "
            f"{s['validation_rows']:,} validation rows "
            f"({best} wins{beyond}{edge})</p><table><tr><th>parameters</th><th>validation {esc(s['metric'])}</th>"
            f"<th></th><th>model</th></tr>{rows}</table>"
        )
    return (
        "<h2>Parameter selection</h2><p>Candidates trained on the train split and scored on the validation "
        "split; the test split was not read. Test metrics above are the chosen models'.</p>" + "".join(parts)
    )


def _best(rows: list, mc: tuple, higher: bool) -> dict | None:
    """The row with the best value of ``mc`` (its mean over the repeats); exact ties go to the smaller
    code, then to a baseline (a learned model has to beat it), then to the label."""
    have = [r for r in rows if mc in r["values"] and r["values"][mc] == r["values"][mc]]  # NaN never wins
    if not have:
        return None
    swept = swept_params(rows)
    sign = -1 if higher else 1
    best = min(have, key=lambda r: (sign * r["values"][mc], r["dim"] or 0, not r["baseline"], row_label(r, swept)))
    return {
        "label": row_label(best, swept),
        "method": best["method"],
        "dim": best["dim"],
        "params": best["params"],
        "model": best["model"],
        "value": best["values"][mc],
    }


def _main_columns(records: list) -> list[tuple]:
    """The main table's columns: the headline metrics, the UKB score, and precision@K for up to 4 K."""
    have = {(r["metric"], r["classifier"]) for r in records}
    ks = sorted(k for k in kept_ks(records) if ("mprec@%d" % k, None) in have)
    if len(ks) > 4:
        ks = [k for k in ks if k in (1, 10, 50, 100)][:4] or ks[:4]
    head = headline_metrics(records)
    return head[:2] + [mc for mc in [("ukb4", None)] + [(f"mprec@{k}", None) for k in ks] if mc in have] + head[2:]


def _other_columns(records: list, main: list) -> list[tuple]:
    """Every other metric the tables keep: not a cost, a kept K, and recall@K only where informative."""
    kept, hidden = kept_ks(records), recall_hidden(records)
    cols = set()
    for r in records:
        at = at_k(r["metric"])
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


def table_html(rows: dict, columns: list, extended: dict, bold: bool = True) -> str:
    """Rows (learned models first) x columns; the best value of each column in bold."""
    best = {}
    for mc in columns if bold else []:
        found = _best(list(rows.values()), mc, definition(mc[0])[1])
        best[mc] = found["value"] if found else None
    body, swept = [], swept_params(rows.values())
    for row in sorted(rows.values(), key=lambda r: (r["baseline"], r["method"], r["dim"] or 0, to_json(r["params"]))):
        cells = "".join(_cell(row, mc, best.get(mc)) for mc in columns)
        tag = ' <span class="b">baseline</span>' if row["baseline"] else ""
        body.append(
            f"<tr><td class=l>{html.escape(model_label(row, swept))}{tag}</td><td>{row['dim']}</td>"
            f"{_key_cell(row['model'], extended, row.get('models'))}{cells}</tr>"
        )
    head = "".join(_th(mc) for mc in columns)
    return f"<table><tr><th class=l>model</th><th>d</th><th class=l>key</th>{head}</tr>{''.join(body)}</table>"


def _side_html(x: dict | None) -> str:
    if not x:
        return "<td>&mdash;</td><td></td><td></td>"
    key = _key_cell(x.get("model"), {}, x.get("models"))
    value = html.escape(side_value(x)).replace("+/-", "&plusmn;")
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
        note = f" This run has no baseline ({', '.join(BASELINES)}): no comparison."
    rows = []
    for f in fams:
        arrow = "higher" if f["higher_is_better"] else "lower"
        diff = ""
        if f["difference"] is not None:
            ci = (
                ""
                if not f["interval"]
                else f"<br><small>{LEVEL:.0%} CI {fmt_difference(f['interval'][0])} to "
                f"{fmt_difference(f['interval'][1])}</small>"
            )
            diff = f"{fmt_difference(f['difference'])} ({f['verdict']}){ci}"
        cls = {"better": ' class="win"', "worse": ' class="lose"'}.get(f["verdict"], "")
        raw = "&mdash;" if not f["raw"] else esc(side_value(f["raw"])).replace("+/-", "&plusmn;")
        rows.append(
            f"<tr><td class=l>{esc(f['label'])} <small>({arrow} is better)</small></td>"
            f"{_side_html(f['model'])}{_side_html(f['baseline'])}<td>{raw}</td><td{cls}>{diff}</td></tr>"
        )
    repeats = summary.get("repeats") or 1
    over = (
        f" Values are means &plusmn; the sample standard deviation over the {repeats} repeats (a model without "
        f"seed is computed once: one value); the verdict reads the {LEVEL:.0%} paired t interval of the "
        f"per-repeat differences, and a difference whose interval holds 0 is a tie."
        if repeats > 1
        else ""
    )
    worth = (
        "A difference below one test item's worth is a tie: 1/N of a top-1 error (N classified test rows), "
        "1/Q of mAP or MAP@R (a query's AP lies in [0, 1]; Q queries)"
        if summary.get("items")
        else "A difference below the 4 decimals shown is a tie"
    )
    winners = "".join(f'<p class="winner">{esc(o["text"])}</p>' for o in summary["objectives"])
    return (
        f"<h2>Summary</h2>{winners}"
        + (f"<p>{note.strip()}</p>" if note else "")
        + f'<table class="summary"><tr><th class=l>family (one vote)</th><th class=l>best learned model</th>'
        f"<th class=l>key</th><th>value</th><th class=l>best baseline</th><th class=l>key</th><th>value</th>"
        f"<th>raw features</th><th>model &minus; baseline</th></tr>{''.join(rows)}</table>"
        f"<p><small>One vote per family: mAP and MAP@R are one (retrieval), the knnK classifiers one, the "
        f"softvoteK one, ncm and ncmc one each; a family's score is the mean of its members. {worth}.{over} "
        f"An objective's winner takes the most votes (a tied family gives none, the better side of a family "
        f"its one); equal votes are a tie, and a learned model worse than raw features (identity) on one of "
        f"the objective's families is not named. Keys are what <code>metricpipe predict --model KEY</code>, "
        f"<code>encode</code> and <code>export</code> take (a prefix is enough; <code>metricpipe models "
        f"STORE</code> lists them). Only the codes view competes.</small></p>"
    )


def _costs_html(rows: dict, doc: dict, extended: dict) -> str:
    """Bytes, FLOPs and seconds per model, apart from the quality metrics."""
    info = {m["key"]: m for m in doc.get("models", [])}
    timed = {t.get("key"): t for t in doc.get("model_timings", [])}
    body, swept = [], swept_params(rows.values())
    for row in sorted(rows.values(), key=lambda r: (r["baseline"], r["method"], r["dim"] or 0, to_json(r["params"]))):
        v, key = row["values"], row["model"]
        cost = [v.get((m, None)) for m in COST_METRICS]
        fit = (info.get(key) or {}).get("fit_seconds")
        t = timed.get(key) or {}
        if all(c is None for c in cost) and fit is None and not t:
            continue
        cells = [f"{row['dim'] * 4:,}" if isinstance(row["dim"], int) else ""]
        cells += ["" if c is None else f"{c:,.0f}" for c in cost]
        cells += [
            "" if fit is None else f"{fit:.3f}",
            "" if "offline_seconds" not in t else f"{t['offline_seconds']:.3f}",
            "" if "online_seconds_per_image" not in t else f"{t['online_seconds_per_image'] * 1e3:.4f}",
        ]
        body.append(
            f"<tr><td class=l>{html.escape(model_label(row, swept))}</td><td>{row['dim']}</td>"
            f"{_key_cell(key, extended)}{''.join(f'<td>{c}</td>' for c in cells)}</tr>"
        )
    if not body:
        return ""
    return (
        "<h2>Costs</h2><p><small>Code bytes: one float32 code. Model bytes, non-zeros and FLOPs: the encoder "
        "(0 for the identity). Train s: the learner's fit; offline / online: SLEM and ESVM's own timings. "
        "Seconds vary between reruns; the rest does not.</small></p><table><tr><th class=l>model</th><th>d</th>"
        "<th class=l>key</th><th>code bytes</th><th>model bytes</th><th>non-zeros</th><th>FLOPs / image</th>"
        f"<th>train s</th><th>offline s</th><th>online ms / image</th></tr>{''.join(body)}</table>"
    )


def _extended_html(ext: list) -> str:
    if not ext:
        return ""
    esc = html.escape
    rows = "".join(
        f"<tr><td class=l><code>{esc(e['key'])}</code></td><td class=l><code>{esc(str(e['extends']))}</code></td>"
        f"<td class=l>{esc(e['label'])}</td><td class=l>{esc(', '.join(map(str, e['added'][:10])))}"
        f"{' ...' if len(e['added']) > 10 else ''} ({len(e['added'])})</td><td>{e.get('images', '')}</td></tr>"
        for e in ext
    )
    return (
        "<h2>Models extended by add-classes</h2><p><small>Copies of a run's NCM model with more classes "
        "(<code>metricpipe add-classes</code>); W is unchanged, so their codes are the extended model's. They are "
        "not evaluated by the run: use their key with <code>metricpipe predict</code>.</small></p><table><tr>"
        "<th class=l>key</th><th class=l>extends</th><th class=l>model</th><th class=l>classes added</th>"
        f"<th>images</th></tr>{rows}</table>"
    )


def _definitions_html(records: list) -> str:
    names = sorted({r["metric"] for r in records}, key=lambda m: (m in COST_METRICS, m))
    rows = "".join(
        f"<tr><td class=l>{html.escape(m)}</td><td class=l>{html.escape(definition(m)[0])}</td>"
        f"<td class=l>{'higher' if definition(m)[1] else 'lower'}</td>"
        f"<td class=l>{html.escape(definition(m)[2])}</td></tr>"
        for m in names
    )
    return (
        "<h2>Metric definitions</h2><table><tr><th class=l>record name</th><th class=l>shown as</th>"
        f"<th class=l>better</th><th class=l>meaning</th></tr>{rows}</table>"
    )


def held_out_html(held: dict | None) -> str:
    """The held-out classes' section: per model, each headline metric on the seen and the unseen classes."""
    if not held:
        return ""
    esc = html.escape
    head = "".join(
        f"<th colspan=2>{esc(c['label'])} {'&uarr;' if c['higher_is_better'] else '&darr;'}</th>"
        for c in held["columns"]
    )
    sub = "<th>seen</th><th>unseen</th>" * len(held["columns"])
    tag = ' <span class="b">baseline</span>'
    body = "".join(
        f"<tr><td class=l>{esc(r['label'])}{tag if r['baseline'] else ''}</td>"
        + "".join("".join("<td></td>" if v is None else f"<td>{v:.4f}</td>" for v in pair) for pair in r["values"])
        + "</tr>"
        for r in held["rows"]
    )
    names = ", ".join(esc(str(c)) for c in held["classes"])
    return (
        f"<h2>Held-out classes</h2><p><small>data.split.classes holds out {names or 'classes'}: no learner, "
        f"baseline or statistic sees their rows. Unseen: retrieval among their test rows, kNN over their "
        f"train rows, NCM (NCMC) with means (centroids) from their train rows. Seen: the tables "
        f"above.</small></p><table><tr><th class=l rowspan=2>model</th>{head}</tr><tr>{sub}</tr>{body}</table>"
    )


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


def _mean_records(*row_sets: dict) -> list[dict]:
    """One record per row and metric, its value the mean over the repeats (what the plots draw)."""
    return [
        {
            "method": row["method"],
            "dim": row["dim"],
            "params": row["params"],
            "model": row["model"],
            "classifier": c,
            "metric": m,
            "value": v,
        }
        for rows in row_sets
        for row in rows.values()
        for (m, c), v in row["values"].items()
    ]


def _repeats_note(records: list) -> str:
    n = repeat_count(records)
    return (
        ""
        if n == 1
        else (
            f" One row per config entry over its {n} repeats: the mean &plusmn; the sample standard "
            f"deviation (n &minus; 1) of the repeats, each training every learned model with its "
            f"own seed and validation rows; a model without seed is computed once (no &plusmn;). "
            f"metrics.json's <code>repeats</code> holds every repeat's value."
        )
    )


def _skipped_html(skipped: list) -> str:
    esc = html.escape
    return "".join(
        f"<p>Skipped: {esc(s['classifier'])} for {esc(s['model'])} ({esc(s['reason'])}).</p>" for s in skipped
    )


def _more_html(summary: dict, rows: dict, views: dict, main: list, other: list, extended: dict) -> str:
    """The recall rule's note and, folded under it, the other metrics and the other views."""
    esc = html.escape
    hidden = summary.get("recall_hidden") or {}
    recall_note = (
        f"<p><small>{esc(RECALL_RULE)}. Left out: "
        f"{'; '.join(f'recall@{k} ({esc(why)})' for k, why in hidden.items())}.</small></p>"
        if hidden
        else f"<p><small>{esc(RECALL_RULE)}.</small></p>"
    )
    more = ""
    if other:
        more += f"<h3>Other metrics</h3>{table_html(rows, other, extended)}"
    if views:
        more += (
            "<h3>Other views</h3><p><small>SL-NE / SL-DE's exact bilinear score (the codes' loss from "
            f"factoring shows against the rows above).</small></p>{table_html(views, main + other, extended)}"
        )
    return (
        f"<details><summary>More metrics ({len(other)} columns{', other views' if views else ''})</summary>"
        f"{recall_note}{more}</details>"
        if more
        else recall_note
    )


def _plots_html(records: list, rows: dict, views: dict, main: list) -> str:
    """Each headline metric against the code dimension (and precision against K when there are many K)."""
    shown = _mean_records(rows, views) if repeat_count(records) > 1 else records  # a point per row
    panels = [panel_over_dim(shown, m, c) for m, c in main]
    all_ks = {at_k(r["metric"])[1] for r in shown if at_k(r["metric"])}
    if len(all_ks) > 6:  # precision against K, one panel per dimension
        dims = sorted({r["dim"] for r in shown if at_k(r["metric"])}, key=lambda d: (d is None, d or 0))
        panels += [panel_over_k(shown, "mprec", d) for d in dims]
    plots = figure_html(panels)
    if plots:
        plots = (
            "<p><small>Each headline metric against the code dimension d, one line per model: learned "
            "models in colour with filled markers, baselines grey, dashed, with hollow markers; models "
            "with equal values draw over each other (the tables above have every value)."
            "</small></p>" + plots
        )
    return plots


def _pack_rows(groups: list[list], width: int) -> list:
    """The groups' items in rows of ``width``, a group never split across rows (None fills a row's end):
    models with one or two training curves share a row."""
    out, row = [], []
    for g in groups:
        if len(row) + len(g) > width:
            out += row + [None] * (width - len(row))
            row = []
        row += g
    return out + row


def _training_html(records: list, curves: list | None) -> str:
    """The training curves section: one row per iterative model, one panel per quantity it records."""
    esc = html.escape
    swept = swept_params(records)
    named = {r["model"]: r for r in records if r.get("model")}
    per_model = [curve_panels(c, swept, named) for c in curves or []]
    width = max((len(ps) for ps in per_model), default=1)
    training = figure_html(_pack_rows(per_model, max(2, width)), ncols=max(2, width))
    if training:
        shown = sorted({p["ylabel"] for ps in per_model for p in ps})
        caption = "; ".join(f"<b>{esc(k)}</b>: {esc(CURVES.get(k, 'as recorded by the learner'))}" for k in shown)
        training = (
            f"<h2>Training curves</h2><p><small>One panel per quantity an iterative model records (a "
            f"model's panels side by side, titled with the model), against SGD steps (iter; pairs seen "
            f"for NML and linear ML) or epochs. {caption}. "
            f"The model kept is the state with the best validation value (its best_iter_ in the model's "
            f"record).</small></p>{training}"
        )
    return training


def _stage_note(t: dict) -> str:
    """A stage timing's note and its task count."""
    return " ".join(
        x
        for x in (t.get("note", ""), f"{t['tasks']} task{'s' if t['tasks'] != 1 else ''}" if t.get("tasks") else "")
        if x
    )


def render_html(doc: dict, curves: list | None = None) -> str:
    """index.html of the report ``doc`` (metrics.json's content) and the training ``curves``."""
    records, esc = doc["records"], html.escape
    summary = doc.get("summary") or summarize(records)
    extended = {}
    for e in doc.get("extended_models", []):
        extended.setdefault(e["extends"], []).append(e)
    main = _main_columns(records)
    other = _other_columns(records, main)
    rows, views = report_rows(records), report_rows(records, views=True)
    more = _more_html(summary, rows, views, main, other, extended)
    plots = _plots_html(records, rows, views, main)
    training = _training_html(records, curves)
    timings = "".join(
        f"<tr><td class=l>{esc(t['stage'])}</td><td>{t['seconds']:.2f}</td><td class=l>{esc(_stage_note(t))}</td></tr>"
        for t in doc["timings"]
    )
    run, ds = doc["run"], doc["run"]["dataset"]
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>metricpipe report</title>
<style>{CSS}</style></head><body><h1>metricpipe report</h1>
<p>{esc(str(ds.get("source")))}: {ds.get("n_samples")} samples x {ds.get("n_features")} features,
{ds.get("n_classes")} classes, splits {esc(to_json(ds.get("splits")).replace(chr(10), ""))}; run {run["seconds"]:.1f} s;
data <code>{esc(ds.get("key", ""))}</code>.</p>
{_summary_html(summary)}
<h2>Models</h2><p><small>&uarr; higher is better, &darr; lower is better (definitions below); bold: the best of the
column. Rows with a key are the run's models.{_repeats_note(records)}</small></p>{table_html(rows, main, extended)}
{_skipped_html(doc.get("skipped", []))}
{held_out_html(doc.get("held_out_classes"))}
{more}
{_extended_html(doc.get("extended_models", []))}
{_costs_html(rows, doc, extended)}
{quality_html(doc.get("quality_per_byte"))}
{_definitions_html(records)}
{_selection_html(doc.get("selection", []))}
<h2>Plots</h2>{plots}
{training}
<h2>Stage timings</h2><table><tr><th class=l>stage</th><th>seconds</th><th></th></tr>{timings}</table>
<h2>Config</h2><pre>{esc(to_json(run["config"]))}</pre>
<h2>Versions</h2><pre>{esc(to_json(run["versions"]))}</pre>
</body></html>"""
