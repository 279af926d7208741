"""The report's figures: panels (a metric against the code dimension or K, a training curve) drawn as
small multiples in one matplotlib figure with one legend beside them, a base64 PNG the page embeds at
the size it was drawn for (so its fonts show at their point size).

Every model keeps one look in every panel: learned models a colour and a filled marker, baselines a
grey dashed line and a hollow marker; no two models of a figure share a colour and marker
(:func:`model_styles`)."""

import base64
import html
import io
import math
import textwrap
from typing import NamedTuple

from metricpipe.report.data import DEFINITIONS, at_k, definition, model_label, swept_params
from metricpipe.tasks.registry import BASELINES

#: Learned models: matplotlib's tab10 colours (its grey made navy: grey is the baselines') and 7 filled
#: markers; 10 and 7 are coprime, so model i's (colour i % 10, marker i % 7) pairs are distinct for 70
#: models, and neighbours differ in both.
LEARNED_COLOURS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#393b79", "#bcbd22", "#17becf",
)  # fmt: skip
LEARNED_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
#: Baselines: two greys and 9 hollow markers (coprime: 18 distinct pairs), dashed lines.
BASELINE_COLOURS = ("#404040", "#8c8c8c")
BASELINE_MARKERS = ("o", "s", "^", "D", "v", "<", ">", "p", "h")
#: Font sizes in points at the rendered size: the page shows the PNG at DPI pixels per inch.
FONT, TITLE_FONT, DPI = 11, 12, 96
#: The layout in inches: each panel's axes, the gaps between them (tick labels, axis label, a title of
#: up to two lines), the figure's margins.
AX_W, AX_H, GAP_W, GAP_H = 3.6, 2.3, 1.15, 1.2
LEFT, RIGHT, TOP, BOTTOM, LEGEND_PAD = 1.1, 0.25, 0.7, 0.65, 0.2
#: A dimension axis is logarithmic when its values span this ratio or more (8 to 32: 8, 16, 32 evenly).
LOG_SPAN = 4


class Png(NamedTuple):
    """A figure as base64 PNG ``data`` and the ``width`` and ``height`` (CSS pixels) to show it at."""

    data: str
    width: int
    height: int


def model_styles(labels, baselines=frozenset()) -> dict:
    """{label: Line2D keyword arguments}: a colour, a marker and a line per model, learned models (in
    the given order) coloured with filled markers and solid lines, ``baselines`` grey, hollow and dashed.
    No two labels share a (colour, marker) pair up to 70 learned models and 18 baselines; past them the
    pairs repeat with a dotted (learned) or dash-dot (baseline) line."""
    styles = {}
    learned = [lab for lab in labels if lab not in baselines]
    base = [lab for lab in labels if lab in baselines]
    for i, lab in enumerate(learned):
        styles[lab] = {
            "color": LEARNED_COLOURS[i % len(LEARNED_COLOURS)],
            "marker": LEARNED_MARKERS[i % len(LEARNED_MARKERS)],
            "linestyle": "-" if i < len(LEARNED_COLOURS) * len(LEARNED_MARKERS) else ":",
            "markersize": 7,
        }
    for i, lab in enumerate(base):
        styles[lab] = {
            "color": BASELINE_COLOURS[i % len(BASELINE_COLOURS)],
            "marker": BASELINE_MARKERS[i % len(BASELINE_MARKERS)],
            "linestyle": "--" if i < len(BASELINE_COLOURS) * len(BASELINE_MARKERS) else "-.",
            "fillstyle": "none",
            "markeredgewidth": 1.5,
            "markersize": 8,
        }
    return styles


def log_axis(values) -> bool:
    """Whether an axis over ``values`` (None and non-positive ones ignored) is logarithmic: they span
    LOG_SPAN times or more."""
    xs = [v for v in values if v is not None and v > 0]
    return bool(xs) and max(xs) >= LOG_SPAN * min(xs)


def curve_panels(curve: dict, swept: frozenset = frozenset(), named: dict | None = None) -> list[dict]:
    """One panel per recorded quantity (objective, validation error...) of a model's training history
    (titled as the tables name the model: ``named`` {model key: a record of it}, else its own spec, e.g.
    a candidate selection did not keep; ``swept`` as in :func:`model_label`). A refit is named as its
    records name it: by the candidate it refits, not by the steps it was given."""
    hist = curve["history"]
    xkey = "iter" if "iter" in hist[0] else "epoch"
    keys = list(dict.fromkeys(k for h in hist for k in h if k != xkey and isinstance(h[k], (int, float))))
    record = (named or {}).get(curve.get("key")) or {
        "method": curve["model"]["method"],
        "params": {k: v for k, v in curve["model"].items() if k != "method"},
    }
    title = model_label(record, swept)
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


def panels_figure(panels: list[dict], ncols: int = 2):
    """Small multiples: the panels ({series: {label: [(x, y), ...]}, xlabel, ylabel, title, log2_x,
    log_y, discrete_x, marker, baselines: the labels that are baselines}; None leaves a gap) in one matplotlib
    figure, with one legend beside them (learned models first, then baselines). Sized in inches for
    :data:`DPI`; the caller closes it. One figure drawn once costs a quarter of a figure per panel,
    each with its own legend, drawn twice for a tight bounding box."""
    import matplotlib  # deferred: matplotlib loads only for a page with plots

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    baselines = frozenset(lab for p in panels if p for lab in p.get("baselines", ()))
    labels = sorted(
        {lab for p in panels if p for lab in p["series"] if lab is not None}, key=lambda lab: (lab in baselines, lab)
    )
    styles = model_styles(labels, baselines)
    ncols = max(1, min(ncols, len(panels)))
    nrows = math.ceil(len(panels) / ncols)
    width = LEFT + ncols * AX_W + (ncols - 1) * GAP_W + RIGHT
    height = TOP + nrows * AX_H + (nrows - 1) * GAP_H + BOTTOM
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), dpi=DPI, squeeze=False)
    fig.subplots_adjust(
        left=LEFT / width,
        right=1 - RIGHT / width,
        top=1 - TOP / height,
        bottom=BOTTOM / height,
        wspace=GAP_W / AX_W,
        hspace=GAP_H / AX_H,
    )
    for ax, p in zip(axes.flat, panels):
        if p is None:  # a gap (a row's end)
            ax.set_visible(False)
            continue
        _draw_panel(ax, p, styles)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    if labels:
        _legend_beside(fig, styles, labels, baselines, width, height)
    return fig


def panels_png(panels: list[dict], ncols: int = 2) -> Png:
    """:func:`panels_figure` as a PNG, with the size that shows its fonts at their point size."""
    import matplotlib.pyplot as plt  # deferred: matplotlib loads only for a page with plots

    fig = panels_figure(panels, ncols)
    width, height = fig.get_size_inches()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)  # fixed margins, no bbox_inches="tight" (a second draw)
    plt.close(fig)
    return Png(base64.b64encode(buf.getvalue()).decode(), round(width * DPI), round(height * DPI))


def figure_html(panels: list[dict], ncols: int = 2) -> str:
    """The panels as one image; its alt text lists them."""
    if not panels:
        return ""
    alt = html.escape("; ".join(f"{p['title']}: {p['ylabel']} against {p['xlabel']}" for p in panels if p), quote=True)
    png = panels_png(panels, ncols)  # shown at the size it was drawn for: its fonts at their point size
    return (
        f'<figure><img alt="{alt}" width="{png.width}" height="{png.height}" '
        f'src="data:image/png;base64,{png.data}"></figure>'
    )


def _draw_panel(ax, p: dict, styles: dict) -> None:
    """Draw panel ``p``'s series on ``ax`` in the models' ``styles``, its axes and title."""
    for lab, pts in p["series"].items():
        pts = sorted(pts, key=lambda q: (q[0] is None, q[0] or 0))  # a dimension may be unknown (None)
        style = styles.get(lab, {"color": LEARNED_COLOURS[0], "marker": p.get("marker", "o"), "markersize": 4})
        ax.plot([q[0] for q in pts], [q[1] for q in pts], label=lab, **style)
    _scale_axes(ax, p)
    ax.set_xlabel(p["xlabel"], fontsize=FONT)
    ax.set_ylabel(p["ylabel"], fontsize=FONT)
    ax.set_title(_wrap(p["title"]), fontsize=TITLE_FONT)
    ax.tick_params(labelsize=FONT)
    ax.grid(alpha=0.3)


def _wrap(title: str) -> str:
    """``title`` in at most two lines as wide as a panel and its gap (the rest cut with an ellipsis)."""
    lines = textwrap.wrap(title, width=int((AX_W + 0.8 * GAP_W) * 72 / (0.55 * TITLE_FONT)))
    return "\n".join(lines[:2]) + (" ..." if len(lines) > 2 else "")


def _scale_axes(ax, p: dict) -> None:
    """Log axes where panel ``p`` asks for them (log2_x, log_y); x ticks at the plotted values of a
    ``discrete_x`` axis (dimensions, K) when there are a few, else at round numbers (powers of 2 on a
    log axis); tick labels as plain numbers (no mathtext to parse and draw), thousands as k."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullFormatter, NullLocator  # deferred

    xs = sorted({q[0] for pts in p["series"].values() for q in pts if q[0] is not None and q[0] > 0})
    if p.get("log2_x"):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_minor_locator(NullLocator())
    if xs and p.get("discrete_x") and len(xs) <= 8:
        ax.xaxis.set_major_locator(FixedLocator(xs))
    elif xs and p.get("log2_x"):
        ax.xaxis.set_major_locator(
            FixedLocator([2.0**e for e in range(math.floor(math.log2(xs[0])), math.ceil(math.log2(xs[-1])) + 1)])
        )
    else:
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=all(float(x).is_integer() for x in xs)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1000:g}k" if abs(v) >= 10000 else f"{v:g}"))
    if p.get("log_y"):
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())


def _legend_beside(fig, styles: dict, labels: list, baselines: frozenset, width: float, height: float) -> None:
    """One legend for every panel, right of them (the figure widened to hold it): learned models, then
    baselines, each under a heading when both are drawn."""
    from matplotlib.lines import Line2D  # deferred: matplotlib loads only for a page with plots

    handles, names, headings = [], [], []
    for group, heading in ((False, "learned"), (True, "baselines")):
        members = [lab for lab in labels if (lab in baselines) == group]
        if members and len(members) < len(labels):
            headings.append(len(names))
            handles.append(Line2D([], [], linestyle="none"))
            names.append(heading)
        handles += [Line2D([], [], **styles[lab]) for lab in members]
        names += members
    legend = fig.legend(
        handles, names, loc="upper left", fontsize=FONT, frameon=False, handlelength=2.6, borderaxespad=0
    )
    for i in headings:
        legend.get_texts()[i].set_fontweight("bold")
    extent = legend.get_window_extent(fig.canvas.get_renderer())  # text measured, not drawn
    total_w = width + LEGEND_PAD + extent.width / fig.dpi
    total_h = max(height, TOP + extent.height / fig.dpi + 0.1)  # a long legend: room under the panels
    fig.set_size_inches(total_w, total_h)
    fig.subplots_adjust(
        left=LEFT / total_w,
        right=(width - RIGHT) / total_w,
        top=1 - TOP / total_h,
        bottom=(total_h - height + BOTTOM) / total_h,
    )
    legend.set_bbox_to_anchor(((width + LEGEND_PAD) / total_w, 1 - TOP / total_h), fig.transFigure)


def panel_over_dim(records: list, metric: str, classifier) -> dict:
    """``metric`` (with ``classifier``) against the code dimension, a line per model; the axis is
    logarithmic when the dimensions span LOG_SPAN times or more."""
    series, baselines, swept = {}, set(), swept_params(records)
    for r in records:
        if r["metric"] == metric and r["classifier"] == classifier:
            label = model_label(r, swept)
            series.setdefault(label, []).append((r["dim"], r["value"]))
            if r["method"] in BASELINES:
                baselines.add(label)
    label, higher, _ = definition(metric)
    label += "" if classifier is None else f" ({classifier})"
    title = f"{label} ({'higher' if higher else 'lower'} is better)"
    log2_x = log_axis(x for pts in series.values() for x, _ in pts)
    return series_panel(series, baselines, "code dimension", label, title, log2_x=log2_x)


def panel_over_k(records: list, name: str, dim) -> dict:
    """``name``@K against K for every model of dimension ``dim`` (the NML paper's Fig. 3)."""
    series, baselines, swept = {}, set(), swept_params(records)
    for r in records:
        at = at_k(r["metric"])
        if at and at[0] == name and r["dim"] == dim and r["classifier"] is None:
            label = model_label(r, swept)
            series.setdefault(label, []).append((at[1], r["value"]))
            if r["method"] in BASELINES:
                baselines.add(label)
    title = f"{DEFINITIONS[name][0].format(k='K')} against K, d = {dim}"
    return series_panel(series, baselines, "K", f"{name}@K", title, marker=".")


def series_panel(series: dict, baselines, xlabel: str, ylabel: str, title: str, **style) -> dict:
    """A panel of one line per model over discrete x values (``series``: label -> [(x, y)]), the
    ``baselines`` among them drawn apart; ``style``: ``log2_x``, ``marker``."""
    return dict(
        series=series,
        baselines=frozenset(baselines),
        xlabel=xlabel,
        ylabel=ylabel,
        discrete_x=True,
        title=title,
        **style,
    )
