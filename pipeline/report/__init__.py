"""The report: metrics.json (records + summary + timings + run facts) and a self-contained index.html.

The page decides first: the best learned model per headline metric against the best baseline
(``registry.BASELINES``), then one row per model with its key and the headline metrics; secondary
metrics, other views, costs, definitions and plots follow.

Modules, each using only those before it: ``data`` (records -> rows, labels, metric definitions,
repeats, held-out classes), ``verdict`` (the summary and the closing lines), ``plots`` (matplotlib),
``quality`` (quality per byte of the encoded databases), ``html`` (the page), ``build`` (reads the
run's units, writes both files)."""

from metricpipe.report.build import build_report, extended_models, model_headlines, read_summary, run_models
from metricpipe.report.data import (
    RECALL_FLOOR,
    RECALL_SPREAD,
    definition,
    headline_metrics,
    package_versions,
    recall_hidden,
    repeat_table,
)
from metricpipe.report.html import CURVES, render_html
from metricpipe.report.verdict import summarize, winner_lines

__all__ = [
    "CURVES",
    "RECALL_FLOOR",
    "RECALL_SPREAD",
    "build_report",
    "definition",
    "extended_models",
    "headline_metrics",
    "model_headlines",
    "package_versions",
    "read_summary",
    "recall_hidden",
    "render_html",
    "repeat_table",
    "run_models",
    "summarize",
    "winner_lines",
]
