"""The report's verdict: per headline metric and per family of them, the best learned model against the
best baseline (``registry.BASELINES``); each objective's winner; and the closing lines a run prints."""

import math
import re

from metricpipe.config import OBJECTIVES
from metricpipe.report.data import (
    RECALL_RULE,
    definition,
    headline_metrics,
    mean_value,
    recall_hidden,
    repeat_count,
    report_rows,
    row_label,
    sample_sd,
    swept_params,
)
from metricpipe.tasks import evaluation, registry
from metricpipe.tasks.compare import paired_interval

# Headline metrics vote in families, one vote each, so that no objective counts twice: retrieval
# (mAP and MAP@R) and, per classifier kind, the top-1 errors of its classifiers.
KINDS = {"knn": "kNN", "softvote": "soft-vote", evaluation.NCM: "NCM", evaluation.NCMC: "NCMC"}
LEVEL = 0.95  # the paired t interval over repeats
ITEM_OF = {"retrieval": "queries", "classification": "classified test rows"}


def families(records: list) -> list[dict]:
    """The headline metrics grouped into families, one vote each: ``retrieval`` (mAP and MAP@R) and,
    per classifier kind, the top-1 errors of its classifiers (knnK together, softvoteK together, ncm,
    ncmc). A model's score on a family is the mean of its members."""
    out = {}
    for metric, classifier in headline_metrics(records):
        key = "retrieval" if classifier is None else (re.sub(r"\d+$", "", classifier) or classifier)
        fam = out.setdefault(
            key, {"family": key, "objective": "retrieval" if classifier is None else "classification", "metrics": []}
        )
        fam["metrics"].append((metric, classifier))
    for fam in out.values():
        names = [definition(m)[0] if c is None else c for m, c in fam["metrics"]]
        if fam["family"] == "retrieval":
            fam["label"] = "retrieval, " + (names[0] if len(names) == 1 else f"mean of {_and(names)}")
        else:
            kind = f"{KINDS.get(fam['family'], fam['family'])} top-1 error"
            fam["label"] = (
                kind
                if names == [fam["family"]]
                else f"{kind} ({names[0]})"
                if len(names) == 1
                else f"{kind}, mean of {_and(names)}"
            )
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
    return {
        "label": row_label(row, swept),
        "method": row["method"],
        "dim": row["dim"],
        "params": row["params"],
        "model": row["model"],
        "models": row["models"],
        "baseline": row["baseline"],
        "value": mean_value(scores),
        "sd": None if once else sample_sd(scores),
        "values": scores,
    }


def _top(rows: list, metrics: list, higher: bool, swept: frozenset) -> dict | None:
    """The row with the best mean score on ``metrics`` as a side of a comparison; exact ties go to the
    smaller code, then to a baseline, then to the label."""
    have = [(r, s) for r in rows if (s := _scores(r, metrics)) is not None]
    if not have:
        return None
    sign = -1 if higher else 1
    row, scores = min(
        have, key=lambda t: (sign * mean_value(t[1]), t[0]["dim"] or 0, not t[0]["baseline"], row_label(t[0], swept))
    )
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
    rows = list(report_rows(records).values())
    swept = swept_params(rows)
    learned, baselines = [r for r in rows if not r["baseline"]], [r for r in rows if r["baseline"]]
    repeats = repeat_count(records)
    headline = []
    for metric, classifier in headline_metrics(records):
        label, higher, _ = definition(metric)
        tol = _tolerance(items, "retrieval" if classifier is None else "classification")
        headline.append(
            {
                "metric": metric,
                "classifier": classifier,
                "label": label + (f" ({classifier})" if classifier else ""),
                "higher_is_better": higher,
                **_contest(learned, baselines, [(metric, classifier)], higher, tol, swept),
            }
        )
    fams = []
    for fam in families(records):
        higher, tol = definition(fam["metrics"][0][0])[1], _tolerance(items, fam["objective"])
        e = {
            **fam,
            "metrics": [list(mc) for mc in fam["metrics"]],
            "higher_is_better": higher,
            "tolerance": tol,
            **_contest(learned, baselines, fam["metrics"], higher, tol, swept),
            "raw": _top([r for r in baselines if r["method"] == registry.RAW], fam["metrics"], higher, swept),
        }
        e["vote"] = (
            {"better": e["model"], "worse": e["baseline"], "tie": None}.get(e["verdict"])
            if e["verdict"]
            else e["model"] or e["baseline"]
        )
        e["tied"] = [e["model"], e["baseline"]] if e["verdict"] == "tie" else []
        fams.append(e)
    row_of = {(row_label(r, swept), r["model"]): r for r in rows}
    objectives = [
        _objective(o, [f for f in fams if f["objective"] == o], row_of)
        for o in OBJECTIVES
        if any(f["objective"] == o for f in fams)
    ]
    return {
        "repeats": repeats,
        "tie_rule": tie_rule(items, repeats),
        "items": items,
        "headline": headline,
        "families": fams,
        "objectives": objectives,
        "objective": objective,
        "learned_models": len(learned),
        "baselines": len(baselines),
        "recall_rule": RECALL_RULE,
        "recall_hidden": {str(k): v for k, v in recall_hidden(records).items()},
    }


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
    o = {
        "objective": name,
        "families": len(fams),
        "tied_families": sum(1 for f in fams if f["tied"]),
        "votes": top,
        "winner": leaders[0] if len(leaders) == 1 and not refused else None,
        "tied": tied,
        "refused": refused,
    }
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
            return {"label": side["label"], "model": side["model"], "family": f["label"], "raw": f["raw"]["label"], **c}
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
        text += (
            f"{'' if w or tied else ' but'}{'; ' + r['label'] if w or tied else ''} is worse than raw features "
            f"({r['raw']}) on {r['family']} ({fmt_difference(r['difference'])})"
        )
    return f"Winner ({o['objective']}): {text}"


SHOWN = 1e-4  # differences are shown to 4 decimals


def fmt_difference(v: float) -> str:
    return f"{v:+.4f}" if abs(v) >= SHOWN / 2 else "+0.0000"


def side_value(side: dict) -> str:
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
            ci = (
                ""
                if not f["interval"]
                else f" [{LEVEL:.0%} CI {fmt_difference(f['interval'][0])}, {fmt_difference(f['interval'][1])}]"
            )
            lines.append(
                f"{head}{side_value(m)} {m['label']} [{m['model'] or '?'}] vs baseline {side_value(b)} {b['label']}: "
                f"{fmt_difference(f['difference'])}{ci} ({f['verdict']})"
            )
        elif b or m:
            only = b or m
            lines.append(
                f"{head}{side_value(only)} {only['label']} [{only['model'] or '?'}]"
                + ("; no learned model in this run" if b else "; no baseline in this run")
            )
    if lines:
        lines.insert(0, f"Best learned model vs best baseline per family ({summary['tie_rule']}):")
    for o in summary.get("objectives") or []:
        if summary.get("objective") in (None, o["objective"]):
            lines.append(o["text"])
    return lines
