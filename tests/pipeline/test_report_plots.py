"""The report's plots, checked on the matplotlib figure: one look per model, baselines told apart,
a log dimension axis when the dimensions span, titled panels, readable fonts, the legend beside."""

import base64
import re

import matplotlib.pyplot as plt
import pytest
from matplotlib.colors import to_rgb

from metricpipe.report import render_html
from metricpipe.report.plots import DPI, panel_over_dim, panels_figure, panels_png

BASELINE_DIMS = {"identity": [64], "pca": [8, 16, 32], "pcaw": [16], "lda": [9], "random": [16]}


def _records(dims=(8, 16, 32), n_learned=12):
    """``n_learned`` NCMML models (a swept lr each) at ``dims`` and the five baselines, mAP and ncm error."""
    recs = []

    def add(method, dim, i, **params):
        for metric, classifier in (("map", None), ("top1_error", "ncm")):
            recs.append(
                {
                    "method": method,
                    "dim": dim,
                    "params": params,
                    "classifier": classifier,
                    "metric": metric,
                    "value": 0.5 + 0.01 * i,
                    "model": f"{method}{dim}{params}",
                }
            )

    for i in range(n_learned):
        for d in dims:
            add("ncmml", d, i, lr=float(i + 1))
    for i, (method, ds) in enumerate(BASELINE_DIMS.items()):
        for d in ds:
            add(method, d, i)
    return recs


def _doc(records):
    """metrics.json's content around ``records``."""
    dataset = {"source": "x", "n_samples": 1, "n_features": 1, "n_classes": 2, "splits": {}}
    run = {"dataset": dataset, "seconds": 1.0, "config": {}, "versions": {}}
    return {"records": records, "run": run, "timings": []}


@pytest.fixture
def figure():
    recs = _records()
    fig = panels_figure([panel_over_dim(recs, "map", None), panel_over_dim(recs, "top1_error", "ncm")])
    yield fig
    plt.close(fig)


def _looks(fig):
    """{label: (colour, marker, linestyle, fillstyle)} of every drawn line, checked equal in every panel."""
    looks = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            look = (line.get_color(), line.get_marker(), line.get_linestyle(), line.get_fillstyle())
            assert looks.setdefault(line.get_label(), look) == look, line.get_label()
    return looks


def test_every_model_has_its_own_colour_and_marker_in_every_panel(figure):
    looks = _looks(figure)
    assert len(looks) == 12 + 5
    pairs = [(colour, marker) for colour, marker, _, _ in looks.values()]
    assert len(set(pairs)) == len(pairs)


def test_baselines_are_grey_dashed_and_hollow_in_the_panels_and_the_legend(figure):
    looks = _looks(figure)
    for label, (colour, _, linestyle, fill) in looks.items():
        baseline = label.split()[0] in BASELINE_DIMS
        assert (linestyle, fill) == (("--", "none") if baseline else ("-", "full")), label
        red, green, blue = to_rgb(colour)
        assert (red == green == blue) == baseline, (label, colour)  # baselines grey, learned models not
    [legend] = figure.legends
    shown = {t.get_text(): h for t, h in zip(legend.get_texts(), legend.legend_handles)}
    assert shown["lda"].get_linestyle() == "--" and shown["lda"].get_fillstyle() == "none"  # a single point
    assert shown["ncmml lr=1.0"].get_linestyle() == "-" and shown["ncmml lr=1.0"].get_fillstyle() == "full"
    names = [t.get_text() for t in legend.get_texts()]
    assert names.index("learned") < names.index("ncmml lr=1.0") < names.index("baselines") < names.index("lda")


def test_the_legend_is_beside_the_panels_not_below(figure):
    figure.canvas.draw()
    [legend] = figure.legends
    box = legend.get_window_extent().transformed(figure.transFigure.inverted())
    axes = [ax.get_position() for ax in figure.axes if ax.get_visible()]
    assert box.x0 >= max(a.x1 for a in axes)  # right of every panel
    assert box.y1 > min(a.y0 for a in axes) and box.y1 <= 1  # level with them, inside the figure
    assert box.x1 <= 1 and box.y0 >= 0  # the figure was widened (and heightened) to hold it


@pytest.mark.parametrize(
    ("dims", "scale"), [((16, 32), "linear"), ((10, 30), "linear"), ((8, 16, 32), "log"), ((25, 32, 2048), "log")]
)
def test_the_dimension_axis_is_logarithmic_when_the_dimensions_span_four_times_or_more(dims, scale):
    recs = [r for r in _records(dims, 2) if r["method"] == "ncmml"]
    fig = panels_figure([panel_over_dim(recs, "map", None)])
    try:
        [ax] = fig.axes
        assert ax.get_xscale() == scale
        assert [float(t) for t in ax.get_xticks()] == [float(d) for d in dims]  # ticks at the dimensions
    finally:
        plt.close(fig)


def test_every_panel_is_titled_and_every_text_is_at_least_11_points_where_the_page_shows_it(figure):
    for ax in figure.axes:
        if ax.get_visible():
            assert ax.get_title()
            texts = [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.get_xticklabels(), *ax.get_yticklabels()]
            assert min(t.get_fontsize() for t in texts) >= 11
    assert min(t.get_fontsize() for t in figure.legends[0].get_texts()) >= 11


def test_the_page_shows_the_png_at_the_size_it_was_drawn_for():
    """The <img>'s CSS size is the figure's inches at 96 px (CSS's inch), so a point is a point."""
    recs = _records()
    png = panels_png([panel_over_dim(recs, "map", None)])
    fig = panels_figure([panel_over_dim(recs, "map", None)])
    width, height = fig.get_size_inches()
    plt.close(fig)
    assert DPI == 96 and (png.width, png.height) == (round(width * 96), round(height * 96))
    img = re.search(
        r'<img alt="[^"]*" width="(\d+)" height="(\d+)" src="data:image/png;base64,([^"]+)"', render_html(_doc(recs))
    )
    data = base64.b64decode(img.group(3))
    pixels = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (int(img.group(1)), int(img.group(2))) == pixels


def test_models_with_one_training_curve_share_a_row():
    curves = [{"model": {"method": "ncmml", "lr": float(i)}, "history": [{"iter": 1, "batch": -0.1}]} for i in range(3)]
    page = render_html(_doc([]), curves)
    training = page[page.index("<h2>Training curves</h2>") :]
    width, height = (int(v) for v in re.search(r'width="(\d+)" height="(\d+)"', training).groups())
    assert width > height  # two rows of two panels, not three rows of one
