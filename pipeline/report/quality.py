"""The report's "Quality per byte" section (``encode.pq``): each method's retrieval and kNN quality
through its encoded database at each size, a table that names the best method at each size, and mAP
against the bytes per vector, one line per method (the plots' conventions: a colour and marker per
learned model, baselines and faiss's unsupervised OPQ + PQ of the raw features grey and dashed)."""

import html

from metricpipe.report.data import model_label, swept_params
from metricpipe.report.plots import figure_html, series_panel
from metricpipe.tasks.pq import ANCHOR
from metricpipe.tasks.registry import BASELINES

#: The table's columns: (metric, classifier), heading, higher is better (None: not ranked).
COLUMNS = (
    (("map", None), "mAP", True),
    (("map@r", None), "MAP@R", True),
    (("top1_error", "knn1"), "kNN-1 error", False),
    (("bytes_per_vector", None), "bytes / vector", None),
    (("qps", None), "queries / s", None),
)
ANCHOR_LABEL = f"{ANCHOR} (raw)"


def method_label(r: dict, swept: frozenset) -> str:
    """A method as the section names it: the model's label and code dimension, or the anchor's."""
    return ANCHOR_LABEL if r["method"] == ANCHOR else f"{model_label(r, swept)} d={r['dim']}"


def quality_rows(records: list) -> list[dict]:
    """One row per method and size: {label, pq_bytes, baseline, models, values {(metric, classifier):
    the mean over the method's models (repeats)}}, by size then label."""
    swept = swept_params([r for r in records if r["method"] != ANCHOR])
    groups = {}
    for r in records:
        if isinstance(r.get("value"), (int, float)):
            key = (method_label(r, swept), r["pq_bytes"])
            row = groups.setdefault(
                key,
                {
                    "label": key[0],
                    "pq_bytes": key[1],
                    "baseline": r["method"] in BASELINES or r["method"] == ANCHOR,
                    "models": [],
                    "sums": {},
                },
            )
            if r.get("model") not in row["models"]:
                row["models"].append(r.get("model"))
            s = row["sums"].setdefault((r["metric"], r["classifier"]), [0.0, 0])
            s[0], s[1] = s[0] + r["value"], s[1] + 1
    rows = sorted(groups.values(), key=lambda g: (g["pq_bytes"], g["label"]))
    for g in rows:
        g["values"] = {mc: total / n for mc, (total, n) in g.pop("sums").items()}
    return rows


def best_per_size(rows: list) -> list[dict]:
    """Per size, the best method by mAP (by kNN-1 error when the run measured no retrieval)."""
    out = []
    for size in sorted({r["pq_bytes"] for r in rows}):
        for mc, name, higher in COLUMNS[:3:2]:  # mAP, else kNN-1 error
            have = [r for r in rows if r["pq_bytes"] == size and mc in r["values"]]
            if have:
                best = max(have, key=lambda r: r["values"][mc] if higher else -r["values"][mc])
                out.append({"pq_bytes": size, "label": best["label"], "metric": name, "value": best["values"][mc]})
                break
    return out


def quality_panel(rows: list) -> dict:
    """mAP (kNN-1 error without retrieval) against the bytes per vector, one line per method."""
    (mc, name, higher) = COLUMNS[0] if any(COLUMNS[0][0] in r["values"] for r in rows) else COLUMNS[2]
    series, baselines = {}, set()
    for r in rows:
        if mc in r["values"]:
            series.setdefault(r["label"], []).append((r["values"][("bytes_per_vector", None)], r["values"][mc]))
            if r["baseline"]:
                baselines.add(r["label"])
    title = f"{name} through the encoded database ({'higher' if higher else 'lower'} is better)"
    return series_panel(series, baselines, "bytes per vector", name, title, log2_x=True)


def _cell(row: dict, mc: tuple, best: dict) -> str:
    v = row["values"].get(mc)
    if v is None:
        return "<td></td>"
    bold = ' style="font-weight:bold"' if best.get((row["pq_bytes"], mc)) == v else ""
    return f"<td{bold}>{v:,.0f}</td>" if mc[0] in ("qps", "bytes_per_vector") else f"<td{bold}>{v:.4f}</td>"


def quality_html(section: dict | None) -> str:
    """The section from metrics.json's ``quality_per_byte`` (empty without encode.pq)."""
    if not section or not section.get("records"):
        return ""
    esc, rows = html.escape, quality_rows(section["records"])
    best = {}  # {(size, column): its best value}, the ranked columns only
    for mc, _, higher in (c for c in COLUMNS if c[2] is not None):
        for r in (r for r in rows if mc in r["values"]):
            old = best.get((r["pq_bytes"], mc), r["values"][mc])
            best[(r["pq_bytes"], mc)] = max(old, r["values"][mc]) if higher else min(old, r["values"][mc])
    head = "".join(f"<th>{esc(name)}</th>" for _, name, _ in COLUMNS)
    body = "".join(
        f"<tr><td>{r['pq_bytes']}</td><td class=l>{esc(r['label'])}"
        f"{' <span class=b>baseline</span>' if r['baseline'] else ''}</td>"
        f"{''.join(_cell(r, mc, best) for mc, _, _ in COLUMNS)}</tr>"
        for r in rows
    )
    named = "; ".join(
        f"{b['pq_bytes']} bytes: <b>{esc(b['label'])}</b> ({b['metric']} {b['value']:.4f})" for b in section["best"]
    )
    skipped = "".join(
        f"<p><small>No encoded database of {esc(s['model'])}: {esc(s['reason'])}.</small></p>"
        for s in section.get("skipped", [])
    )
    return (
        "<h2>Quality per byte</h2><p><small>Each method's codes compressed by a faiss product quantiser of "
        "encode.pq bytes per vector (trained on a sample of its train codes), and faiss's own OPQ + PQ of the "
        f"raw features ({ANCHOR_LABEL}): the test rows query the compressed database with their "
        "uncompressed codes (asymmetric distances). Retrieval as in the tables above; kNN-1 against the "
        "compressed train rows; queries / s of that kNN search on one thread. Bold: the best at each "
        f"size.</small></p>{f'<p>Best at each size: {named}.</p>' if named else ''}"
        f"<table><tr><th>bytes (encode.pq)</th><th class=l>method</th>{head}</tr>{body}</table>{skipped}"
        f"{figure_html([quality_panel(rows)], ncols=1)}"
    )
