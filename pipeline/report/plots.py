"""The report's figures: panels (a metric against the code dimension or K, a training curve) drawn as
small multiples in one matplotlib figure, a base64 PNG the page embeds."""

import base64
import io
import math

from metricpipe.report.data import DEFINITIONS, at_k, definition, model_label, swept_params
from metricpipe.tasks.registry import BASELINES


def curve_panels(curve: dict, swept: frozenset = frozenset()) -> list[dict]:
    """One panel per recorded quantity (objective, validation error...) of a model's training history
    (titled as the tables name the model: ``swept`` as in :func:`model_label`)."""
    hist = curve["history"]
    xkey = "iter" if "iter" in hist[0] else "epoch"
    keys = list(dict.fromkeys(k for h in hist for k in h if k != xkey and isinstance(h[k], (int, float))))
    title = model_label(
        {"method": curve["model"]["method"], "params": {k: v for k, v in curve["model"].items() if k != "method"}},
        swept,
    )
    panels = []
    for k in keys:
        have = [h for h in hist if isinstance(h.get(k), (int, float))]  # e.g. val_error also at the start
        lo, hi = min(h[k] for h in have), max(h[k] for h in have)
        log_y = k in ("objective", "hinge") and lo > 0 and hi > 10 * lo  # a log axis over a decade or more
        panels.append(
            {
                "series": {None: [(h[xkey], h[k]) for h in have]},
                "xlabel": xkey,
                "ylabel": k,
                "title": title,
                "log_y": log_y,
                "marker": ".",
            }
        )
    return panels


def panels_png(panels: list[dict], ncols: int = 2) -> str:
    """Small multiples: the panels ({series: {label: [(x, y), ...]}, xlabel, ylabel, title, log2_x,
    log_y, marker}) in one figure, as a base64 PNG, with one legend for all of them (a model keeps
    its colour in every panel; baselines dashed). One figure drawn once costs a quarter of a figure
    per panel, each with its own legend, drawn twice for a tight bounding box."""
    import matplotlib  # deferred: matplotlib loads only for a page with plots

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = sorted(
        {lab for p in panels if p for lab in p["series"] if lab is not None},
        key=lambda lab: (lab.split()[0] in BASELINES, lab),
    )
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colour = {lab: cycle[i % len(cycle)] for i, lab in enumerate(labels)}
    style = {
        lab: "--" if lab.split()[0] in BASELINES else ("-" if i < len(cycle) else ":") for i, lab in enumerate(labels)
    }
    ncols = min(ncols, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    legend_cols = 2 if ncols > 1 else 1
    legend_rows = math.ceil(len(labels) / legend_cols)
    width, height = 4.6 * ncols, 2.7 * nrows
    legend_h = 0.2 * legend_rows + (0.35 if labels else 0)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height + legend_h), squeeze=False)
    handles = {}
    for ax, p in zip(axes.flat, panels):
        if p is None:  # a gap (a row's end)
            ax.set_visible(False)
            continue
        _draw_panel(ax, p, colour, style, cycle[0], handles)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    bottom = legend_h / (height + legend_h)
    if handles:
        _legend(fig, handles, labels, legend_cols)
    # fixed margins instead of bbox_inches="tight", which draws the figure twice
    fig.subplots_adjust(
        left=0.8 / width,
        right=1 - 0.15 / width,
        top=1 - 0.3 / (height + legend_h),
        bottom=bottom + 0.5 / (height + legend_h),
        hspace=0.55,
        wspace=0.3,
    )
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _draw_panel(ax, p: dict, colour: dict, style: dict, default_colour: str, handles: dict) -> None:
    """Draw panel ``p``'s series on ``ax``, its axes and titles; ``handles`` gets each label's first line."""
    for lab, pts in p["series"].items():
        pts = sorted(pts, key=lambda q: (q[0] is None, q[0] or 0))  # a dimension may be unknown (None)
        (line,) = ax.plot(
            [q[0] for q in pts],
            [q[1] for q in pts],
            marker=p.get("marker", "o"),
            markersize=4,
            color=colour.get(lab, default_colour),
            linestyle=style.get(lab, "-"),
        )
        if lab is not None:
            handles.setdefault(lab, line)
    _scale_axes(ax, p)
    ax.set_xlabel(p["xlabel"], fontsize=8)
    ax.set_ylabel(p["ylabel"], fontsize=8)
    ax.set_title(p["title"], fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)


def _scale_axes(ax, p: dict) -> None:
    """Log axes where panel ``p`` asks for them (log2_x, log_y), their ticks as plain numbers."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    if p.get("log2_x"):  # ticks at the plotted values (or powers of 2 when many), as plain numbers:
        # readable, and no mathtext to parse and draw
        ax.set_xscale("log", base=2)
        xs = sorted({q[0] for pts in p["series"].values() for q in pts if q[0] is not None and q[0] > 0})
        if len(xs) > 8:
            xs = [2.0**e for e in range(math.floor(math.log2(xs[0])), math.ceil(math.log2(xs[-1])) + 1)]
        ax.xaxis.set_major_locator(FixedLocator(xs))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    if p.get("log_y"):
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())


def _legend(fig, handles: dict, labels: list, legend_cols: int) -> None:
    """One legend for every panel, below them: learned models first, as the colours."""
    order = [lab for lab in labels if lab in handles]  # learned models first, as the colours
    fig.legend(
        [handles[lab] for lab in order],
        order,
        loc="lower left",
        bbox_to_anchor=(0.01, 0.0),
        ncol=legend_cols,
        fontsize=7,
        frameon=False,
        title="dashed: baseline",
        title_fontsize=7,
    )


def panel_over_dim(records: list, metric: str, classifier) -> dict:
    series, swept = {}, swept_params(records)
    for r in records:
        if r["metric"] == metric and r["classifier"] == classifier:
            series.setdefault(model_label(r, swept), []).append((r["dim"], r["value"]))
    label, higher, _ = definition(metric)
    label += "" if classifier is None else f" ({classifier})"
    return {
        "series": series,
        "xlabel": "code dimension",
        "ylabel": label,
        "log2_x": True,
        "title": f"{label} ({'higher' if higher else 'lower'} is better)",
    }


def panel_over_k(records: list, name: str, dim) -> dict:
    """``name``@K against K for every model of dimension ``dim`` (the NML paper's Fig. 3)."""
    series, swept = {}, swept_params(records)
    for r in records:
        at = at_k(r["metric"])
        if at and at[0] == name and r["dim"] == dim and r["classifier"] is None:
            series.setdefault(model_label(r, swept), []).append((at[1], r["value"]))
    return {
        "series": series,
        "xlabel": "K",
        "ylabel": f"{name}@K",
        "marker": ".",
        "title": f"{DEFINITIONS[name][0].format(k='K')} against K, d = {dim}",
    }
