import numpy as np
import pytest

from metricpipe.report import render_html
from metricpipe.report.data import kept_ks


def _doc(ks):
    recs = [
        {"method": m, "dim": d, "params": {}, "classifier": None, "metric": f"mprec@{k}", "value": 0.5}
        for m in ("pca", "nml")
        for d in (8, 16)
        for k in ks
    ]
    run = {
        "dataset": {"source": "x", "n_samples": 1, "n_features": 1, "n_classes": 2, "splits": {}},
        "seconds": 1.0,
        "config": {},
        "versions": {},
    }
    return {"records": recs, "run": run, "timings": []}


def test_many_k_show_a_few_columns_and_one_curve_over_k_per_dimension():
    ks = list(range(1, 51))
    assert kept_ks(_doc(ks)["records"]) == {1, 5, 10, 20, 50}
    page = render_html(_doc(ks))
    assert ">mprec@10 &uarr;</th>" in page and ">mprec@11 " not in page
    main = page[page.index("<h2>Models</h2>") : page.index("<details>")]
    assert [k for k in ks if f">mprec@{k} " in main] == [1, 10, 50]  # the rest folded
    # one figure: a panel per main-table column against the dimension, then one mprec-vs-K panel per
    # dimension (8 and 16)
    assert page.count("<figure>") == 1
    assert _panels(page) == [f"mprec@{k} against code dimension" for k in (1, 10, 50)] + [
        "mprec@K against K",
        "mprec@K against K",
    ]
    assert "mprec@K against K, d = 8:" in page and "mprec@K against K, d = 16:" in page


def test_few_k_keep_every_column_and_no_curve_over_k():
    page = render_html(_doc([1, 10, 100]))
    assert all(f">mprec@{k} &uarr;</th>" in page for k in (1, 10, 100))
    assert page.count("<figure>") == 1
    assert _panels(page) == [f"mprec@{k} against code dimension" for k in (1, 10, 100)]


def _panels(page):
    """'ylabel against xlabel' of each panel, from the figure's alt text."""
    import html
    import re

    alt = html.unescape(re.search(r'<img alt="([^"]*)"', page).group(1))
    return [p.split(": ", 1)[1] for p in alt.split("; ")]


# --- the summary: records where a known model wins each headline metric -----------------------------


def _rec(method, dim, metric, value, classifier=None, model=None, **params):
    return {
        "method": method,
        "dim": dim,
        "params": params,
        "classifier": classifier,
        "metric": metric,
        "value": value,
        "model": model or f"{method}{dim}",
    }


def _run_doc(records):
    return {**_doc([]), "records": records}


# (method, dim): mAP, knn1 top-1 error, ncm top-1 error, storage bytes
TABLE = {
    ("pca", 16): (0.50, 0.20, 0.30, 4096),
    ("lda", 9): (0.55, 0.25, 0.22, 2304),
    ("ncmml", 16): (0.62, 0.18, 0.26, 4096),
    ("nml", 8): (0.58, 0.15, 0.40, 2048),
}


def _table_records():
    recs = []
    for (m, d), (ap, knn1, ncm, size) in TABLE.items():
        recs += [
            _rec(m, d, "map", ap),
            _rec(m, d, "top1_error", knn1, "knn1"),
            _rec(m, d, "top1_error", ncm, "ncm"),
            _rec(m, d, "top5_error", knn1 / 2, "knn1"),
            _rec(m, d, "storage_bytes", size),
        ]
    return recs


def test_summary_names_the_best_learned_model_and_baseline_per_metric_with_the_signed_difference():
    from metricpipe.report import summarize
    from metricpipe.tasks.registry import BASELINES

    s = summarize(_table_records())
    by = {(e["metric"], e["classifier"]): e for e in s["headline"]}
    assert list(by) == [("map", None), ("top1_error", "knn1"), ("top1_error", "ncm")]
    for j, (mc, higher) in enumerate(
        [(("map", None), True), (("top1_error", "knn1"), False), (("top1_error", "ncm"), False)]
    ):
        pick = max if higher else min
        learned = pick((v[j], k) for k, v in TABLE.items() if k[0] not in BASELINES)
        base = pick((v[j], k) for k, v in TABLE.items() if k[0] in BASELINES)
        e = by[mc]
        assert (e["model"]["method"], e["model"]["dim"]) == learned[1]
        assert (e["baseline"]["method"], e["baseline"]["dim"]) == base[1]
        assert e["model"]["model"] == "%s%d" % learned[1]  # the key predict / export take
        assert e["difference"] == pytest.approx(learned[0] - base[0])
        assert e["higher_is_better"] is higher
    # mAP: ncmml 0.62 vs lda 0.55 -> +0.07 better; knn1: nml 0.15 vs pca 0.20 -> -0.05, lower error: better;
    # ncm: ncmml 0.26 vs lda 0.22 -> +0.04 error: worse
    assert [by[mc]["verdict"] for mc in by] == ["better", "better", "worse"]
    # one winner per objective: retrieval is ncmml's (mAP); classification's families vote nml (kNN) and
    # lda (NCM): one each, a tie, said as such (metric order broke it before)
    retrieval, classification = s["objectives"]
    assert (retrieval["objective"], retrieval["winner"]["method"]) == ("retrieval", "ncmml")
    assert classification["winner"] is None and [t["method"] for t in classification["tied"]] == ["nml", "lda"]
    assert (
        classification["text"] == "Winner (classification): tie between nml d=8 [nml8] and lda d=9 [lda9]: 1 of 2 "
        "families each"
    )


def test_a_baseline_wins_the_objective_whose_families_it_takes():
    from metricpipe.report import summarize

    recs = _table_records() + [
        _rec("pcaw", 16, "top1_error", 0.10, "knn1"),
        _rec("pcaw", 16, "top1_error", 0.05, "ncm"),
        _rec("pcaw", 16, "map", 0.1),
    ]
    s = summarize(recs)
    w = s["objectives"][1]["winner"]
    assert (w["method"], w["baseline"], s["objectives"][1]["votes"]) == ("pcaw", True, 2)
    knn1 = s["headline"][1]
    assert knn1["baseline"]["method"] == "pcaw" and knn1["difference"] == pytest.approx(0.15 - 0.10)
    assert knn1["verdict"] == "worse"


def test_a_swept_parameter_is_named_at_its_default_too():
    """sparsity 0.9 is sparse's default: left out of a lone model's label, named when the run sweeps it."""
    from metricpipe.report import summarize
    from metricpipe.report.data import swept_params
    from metricpipe.report.html import table_html

    lone = summarize([_rec("sparse", 64, "map", 0.6, sparsity=0.9), _rec("pca", 64, "map", 0.5)])
    assert lone["objectives"][0]["winner"]["label"] == "sparse d=64"
    recs = [
        _rec("sparse", 64, "map", 0.6, model="a", sparsity=0.9),
        _rec("sparse", 64, "map", 0.55, model="b", sparsity=0.99),
        _rec("sparse", 64, "map", 0.58, model="c"),
        _rec("pca", 64, "map", 0.5),
        _rec("nml", 8, "map", 0.3, lr=0.1),
    ]
    assert swept_params(recs) == {("sparse", "sparsity")}  # the unset one counts as its default, 0.9
    views = [
        _rec("slne", 8, "map", 0.5, view="codes"),
        _rec("slne", 8, "map", 0.6, view="exact", score="inner"),
        _rec("slne", 8, "storage_bytes", 100),
    ]
    assert swept_params(views) == set()  # views and scores are not parameters
    s = summarize(recs)
    assert s["objectives"][0]["winner"]["label"] == "sparse sparsity=0.9 d=64"
    from metricpipe.report.data import report_rows

    page = table_html(report_rows(recs), [("map", None)], {})
    import re

    labels = re.findall(r"<tr><td class=l>([^<]*)</td>", page)
    assert sorted(labels) == ["nml lr=0.1", "sparse sparsity=0.9", "sparse sparsity=0.9", "sparse sparsity=0.99"]


def test_training_curve_titles_name_a_swept_parameter_like_the_tables():
    from metricpipe.report.data import swept_params
    from metricpipe.report.plots import curve_panels

    recs = [_rec("sparse", 64, "map", 0.6, sparsity=0.9), _rec("sparse", 64, "map", 0.55, sparsity=0.99)]
    curve = {
        "model": {"method": "sparse", "sparsity": 0.9},
        "history": [{"iter": i, "objective": 1.0 / (i + 1)} for i in range(3)],
    }
    assert curve_panels(curve)[0]["title"] == "sparse"  # alone, the default is left out
    assert curve_panels(curve, swept_params(recs))[0]["title"] == "sparse sparsity=0.9"


def test_a_refit_curve_is_titled_as_its_records_name_it_not_by_the_steps_it_was_given():
    from metricpipe.report.plots import curve_panels

    rec = {**_rec("ncmml", 32, "ncm", 0.1, lr=3.0), "model": "abc"}
    curve = {
        "model": {"method": "ncmml", "dim": 32, "lr": 3.0, "early_stopping": False, "iters": 1700},
        "key": "abc",
        "history": [{"iter": i, "objective": 1.0 / (i + 1)} for i in range(3)],
    }
    assert curve_panels(curve, named={"abc": rec})[0]["title"] == "ncmml lr=3.0"
    assert "iters=1700" in curve_panels(curve)[0]["title"]  # without its record: its own spec


def test_summary_ignores_other_views_and_ties_go_to_the_smaller_code():
    from metricpipe.report import summarize

    recs = [
        _rec("pca", 32, "map", 0.5),
        _rec("pca", 8, "map", 0.5),
        _rec("slne", 16, "map", 0.6, view="codes"),
        _rec("slne", 16, "map", 0.9, view="exact", score="inner"),
    ]
    e = summarize(recs)["headline"][0]
    assert e["baseline"]["dim"] == 8 and e["model"]["value"] == 0.6 and e["difference"] == pytest.approx(0.1)


def test_map_at_r_is_a_headline_metric_when_present_and_new_metrics_have_directions():
    from metricpipe.report import definition, headline_metrics

    recs = _table_records() + [_rec("pca", 16, "map@r", 0.3), _rec("ncmml", 16, "map@r", 0.4)]
    assert headline_metrics(recs)[:2] == [("map", None), ("map@r", None)]
    for m in ("map@r", "r_precision", "precision@1", "mrr", "nmi", "ami", "map", "mprec@10", "recall@5"):
        assert definition(m)[1] is True and definition(m)[2], m
    for m in ("top1_error", "top5_error", "top1_error_new_classes", "storage_bytes", "flops_per_image"):
        assert definition(m)[1] is False, m


def test_summary_without_learned_models_or_baselines():
    from metricpipe.report import summarize, winner_lines

    only_base = summarize([_rec("pca", 8, "map", 0.4), _rec("lda", 9, "map", 0.45)])
    e = only_base["headline"][0]
    assert e["model"] is None and e["baseline"]["method"] == "lda" and e["difference"] is None
    assert "no learned model" in winner_lines(only_base)[1]
    only_learned = summarize([_rec("nml", 8, "map", 0.4)])
    assert only_learned["headline"][0]["baseline"] is None
    assert only_learned["objectives"][0]["winner"]["method"] == "nml"


def test_winner_lines_end_with_each_objective_s_winner_and_its_key():
    from metricpipe.report import summarize, winner_lines

    lines = winner_lines(summarize(_table_records()))
    assert lines[-2] == "Winner (retrieval): ncmml d=16 (learned), model key ncmml16"
    assert lines[-1].startswith("Winner (classification): tie between")
    assert lines[0].startswith("Best learned model vs best baseline per family (tie: below the 4 decimals shown")
    assert (
        lines[1] == "  retrieval, mAP (higher is better): 0.6200 ncmml d=16 [ncmml16] vs baseline 0.5500 lda d=9: "
        "+0.0700 (better)"
    )
    assert len(lines) == 6  # a line per family (retrieval, kNN, NCM), one per objective
    only = winner_lines(summarize(_table_records(), objective="retrieval"))  # evaluate.objective
    assert only[-1] == lines[-2] and not any("(classification)" in line for line in only)


# --- recall@K: shown only where informative ------------------------------------------------------------


def test_recall_is_left_out_when_near_zero_or_the_same_for_every_model():
    from metricpipe.report import RECALL_FLOOR, RECALL_SPREAD, recall_hidden

    recs = []
    for i, m in enumerate(("pca", "nml", "lda")):
        recs += [
            _rec(m, 8, "recall@1", RECALL_FLOOR / 2 + i * 1e-4),  # ~0 everywhere
            _rec(m, 8, "recall@10", 0.4 + i * RECALL_SPREAD / 4),  # the same for every model
            _rec(m, 8, "recall@50", 0.4 + i * 0.05),
        ]  # informative
    assert set(recall_hidden(recs)) == {1, 10}
    page = render_html(_run_doc(recs + [_rec(m, 8, "map", 0.5) for m in ("pca", "nml", "lda")]))
    assert ">recall@50 " in page and ">recall@1 " not in page and ">recall@10 " not in page
    assert "recall@K is shown for a K when" in page  # the rule is stated
    # one model: only the floor applies
    assert recall_hidden([_rec("pca", 8, "recall@10", 0.4)]) == {}


# --- the page ---------------------------------------------------------------------------------------------


def test_page_summary_before_the_models_table_keys_shown_and_costs_in_their_own_table():
    import re

    page = render_html(_run_doc(_table_records()))
    summary, models, costs = page.index("<h2>Summary</h2>"), page.index("<h2>Models</h2>"), page.index("<h2>Costs</h2>")
    assert summary < models < costs
    assert "Winner (retrieval): ncmml d=16 (learned), model key ncmml16</p>" in page[summary:models]
    for m, d in TABLE:
        assert f"<code>{m}{d}</code>" in page[models:costs]  # every model's key in the main table
    tables = re.findall(r"<table.*?</table>", page[models:], re.S)
    main = tables[0]
    assert "model bytes" not in main and "4,096" not in main and "4096" not in main
    assert "top-5 error" not in main  # secondary: folded
    assert "top-5 error" in page[page.index("<details>") : page.index("</details>")]
    cost = page[costs:]
    assert "4,096" in cost and "2,304" in cost and "mAP" not in cost[: cost.index("</table>")]


def test_page_lists_models_extended_by_add_classes():
    doc = _run_doc(_table_records())
    doc["extended_models"] = [
        {"key": "ext0001", "extends": "ncmml16", "added": ["cat", "dog"], "images": 40, "label": "ncmml d=16"}
    ]
    page = render_html(doc)
    sect = page[page.index("<h2>Models extended by add-classes</h2>") :]
    assert "<code>ext0001</code>" in sect and "<code>ncmml16</code>" in sect and "cat, dog (2)" in sect
    # the run's model row points at its extension
    models = page[page.index("<h2>Models</h2>") : page.index("<h2>Models extended")]
    assert "+ classes: <code>ext0001</code>" in models


def test_a_tie_goes_to_the_baseline_and_a_models_cost_records_share_its_row():
    from metricpipe.report import summarize

    recs = [
        _rec("pca", 16, "top1_error", 0.1, "knn1"),
        _rec("ncmml", 16, "top1_error", 0.1, "knn1"),
        _rec("slne", 16, "top1_error", 0.2, "knn1", view="codes", score="inner"),
        _rec("slne", 16, "storage_bytes", 777),
    ]  # the evaluate stage writes costs without view
    s = summarize(recs)
    assert s["headline"][0]["verdict"] == "tie" and s["objectives"][0]["winner"] is None
    assert (
        s["objectives"][0]["text"] == "Winner (classification): tie between ncmml d=16 [ncmml16] and pca d=16 "
        "[pca16]: the difference is within the tie rule"
    )
    page = render_html(_run_doc(recs))
    models = page[page.index("<h2>Models</h2>") : page.index("<h2>Costs</h2>")]
    assert models.count("<code>slne16</code>") == 1 and "score=inner" not in page


def test_training_curves_are_one_figure_with_a_row_per_model():
    import base64
    import re

    curves = [
        {
            "model": {"method": "nml", "dim": 8},
            "history": [{"iter": i, "objective": 10.0 / (i + 1), "val_error": 0.3 - 0.01 * i} for i in range(5)],
        },
        {
            "model": {"method": "slne", "input_dim": 24},
            "history": [{"epoch": e, "hinge": 1.0 - e / 10} for e in range(3)],
        },
    ]
    page = render_html(_doc([1, 10]), curves)
    training = page[page.index("<h2>Training curves</h2>") :]
    assert training.count("<figure>") == 1
    assert _panels(training) == ["objective against iter", "val_error against iter", "hinge against epoch"]
    png = base64.b64decode(re.search(r'base64,([^"]+)"', training).group(1))
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width > height * 1.2  # two models' rows of two panels (the second row's right one left blank)


def test_a_model_whose_dimension_is_unknown_is_plotted_beside_the_others():
    """A record without a dimension (None) next to numbered ones of the same label: sorting the
    points compared None with int and the report failed with a TypeError."""
    recs = [_rec("pca", d, "map", v, model="pca") for d, v in ((8, 0.5), (None, 0.6), (16, 0.7))]
    page = render_html(_run_doc(recs))
    assert page.count("<figure>") == 1 and _panels(page) == ["mAP against code dimension"]


def test_a_difference_below_the_shown_precision_is_a_tie_not_minus_zero_worse():
    from metricpipe.report import summarize, winner_lines

    s = summarize([_rec("ncmml", 8, "map", 0.345700), _rec("pca", 8, "map", 0.345704)])
    [entry] = [e for e in s["headline"] if e["metric"] == "map"]
    assert entry["verdict"] == "tie" and entry["difference"] == pytest.approx(-4e-6)
    assert [line for line in winner_lines(s) if "mAP" in line][0].endswith(": +0.0000 (tie)")
    s = summarize([_rec("ncmml", 8, "map", 0.3458), _rec("pca", 8, "map", 0.3457)])
    assert [e["verdict"] for e in s["headline"] if e["metric"] == "map"] == ["better"]


def test_the_training_curves_and_plots_say_what_they_show():
    from html import escape

    from metricpipe.report import CURVES, render_html

    curves = [
        {
            "model": {"method": "ncmml"},
            "history": [{"iter": i, "val_error": 0.3 - 0.01 * i, "batch": -0.2 + i / 100} for i in range(3)],
        },
        {
            "model": {"method": "slne"},
            "history": [{"epoch": 0, "val_error": 0.2}, {"epoch": 1, "val_error": 0.19, "violations": 9, "hinge": 0.1}],
        },
    ]
    page = render_html(_doc([1, 10]), curves)
    for key in ("val_error", "batch", "violations", "hinge"):
        assert f"<b>{key}</b>: {escape(CURVES[key])}" in page
    assert "<b>objective</b>" not in page  # only the quantities drawn
    assert "baselines grey, dashed, with hollow markers; models with equal values draw over each other" in page


def test_a_learned_model_a_hair_above_a_baseline_is_a_tie_for_the_winner_too():
    """mAP 0.2011 against 0.2011 (2.2e-8 apart) read '+0.0000 (tie)', yet the metric counted for the
    learned model in 'Winner: ... best on 2 of 3' (a new-user trial): a tied family gives no vote."""
    from metricpipe.report import summarize

    recs = [
        _rec("ncmml", 32, "map", 0.20110002),
        _rec("pca", 32, "map", 0.2011),
        _rec("ncmml", 32, "top1_error", 0.30, "knn1"),
        _rec("pca", 32, "top1_error", 0.31, "knn1"),
    ]
    s = summarize(recs)
    assert [e["verdict"] for e in s["headline"]] == ["tie", "better"]
    assert s["headline"][0]["model"]["value"] == 0.20110002  # each side still shows its own best value
    retrieval, classification = s["objectives"]
    assert retrieval["winner"] is None and retrieval["text"].startswith("Winner (retrieval): tie between ncmml d=32")
    assert classification["winner"]["method"] == "ncmml"
    recs[0] = _rec("ncmml", 32, "map", 0.2013)  # a difference the report shows does count
    assert summarize(recs)["objectives"][0]["winner"]["method"] == "ncmml"


def test_a_family_s_vote_goes_to_the_side_the_verdict_favours():
    """The best learned model takes the vote when better than the best baseline, the baseline when
    worse; within the 4 decimals shown (no test-item counts known) nobody does."""
    from metricpipe.report import summarize

    recs = [_rec("ncmml", 32, "map", 0.20009), _rec("ncmml", 16, "map", 0.200045), _rec("pca", 32, "map", 0.2)]
    [f] = summarize(recs)["families"]
    assert (f["model"]["value"], f["model"]["dim"], f["verdict"]) == (0.20009, 32, "better")
    assert (f["vote"]["method"], f["vote"]["dim"]) == ("ncmml", 32)
    recs = [_rec("ncmml", 16, "map", 0.20004), _rec("pca", 32, "map", 0.2)]  # shown as 0.2000 both
    [f] = summarize(recs)["families"]
    assert f["verdict"] == "tie" and f["vote"] is None and [t["method"] for t in f["tied"]] == ["ncmml", "pca"]
    [f] = summarize([_rec("ncmml", 16, "map", 0.19), _rec("pca", 32, "map", 0.2)])["families"]
    assert f["verdict"] == "worse" and f["vote"]["method"] == "pca"


# --- the verdict: one vote per family, ties said, raw features, one test item, repeats ----------------


def _repeated(method, dim, n, metrics, seeded=True, **params):
    """Records of config entry ``n`` over the repeats: ``metrics`` {(metric, classifier): [value per
    repeat]}; a seeded learner has a model per repeat (random_state r), else one model serves every
    repeat with its one value (as the train stage trains a baseline without seed once)."""
    repeats = len(next(iter(metrics.values())))
    if not seeded:
        return [
            {**_rec(method, dim, m, v[0], c, **params), "serves": [[n, r] for r in range(repeats)]}
            for (m, c), v in metrics.items()
        ]
    return [
        {**_rec(method, dim, m, v[r], c, model=f"{method}{dim}-{r}", random_state=r, **params), "serves": [[n, r]]}
        for r in range(repeats)
        for (m, c), v in metrics.items()
    ]


def test_two_models_each_best_on_two_headline_metrics_tie_and_say_so():
    """Three data sets with 9-13 entries: 'Winner: nml d=32 ... best on 2 of 5 headline metrics' hid
    that k-NN ML was best on 2 of 5 too (metric order broke the tie), and mAP and MAP@R voted apart."""
    from metricpipe.report import summarize, winner_lines

    table = {
        ("nml", 32): (0.60, 0.50, 0.040, 0.050, 0.20),
        ("knnml", 32): (0.55, 0.45, 0.030, 0.035, 0.25),
        ("pca", 32): (0.50, 0.40, 0.045, 0.055, 0.15),
    }
    recs = [
        _rec(m, d, metric, v, c)
        for (m, d), vals in table.items()
        for (metric, c), v in zip(
            [("map", None), ("map@r", None), ("top1_error", "knn1"), ("top1_error", "knn10"), ("top1_error", "ncm")],
            vals,
        )
    ]
    s = summarize(recs, items={"retrieval": 1500, "classification": 1500})
    assert [f["family"] for f in s["families"]] == ["retrieval", "knn", "ncm"]  # mAP and MAP@R: one vote
    retrieval, classification = s["objectives"]
    assert retrieval["winner"]["method"] == "nml"
    assert classification["winner"] is None and {t["method"] for t in classification["tied"]} == {"knnml", "pca"}
    assert winner_lines(s)[-1] == (
        "Winner (classification): tie between knnml d=32 [knnml32] and pca d=32 [pca32]: 1 of 2 families each"
    )
    # within one objective: A takes kNN and NCM, B soft vote and NCMC: 2 of 4 families each
    both = []
    for m, (k, sv, ncm, ncmc) in {
        "ncmml": (0.03, 0.06, 0.05, 0.07),
        "ncmc": (0.04, 0.05, 0.06, 0.06),
        "pca": (0.05, 0.07, 0.08, None),
    }.items():
        both += [
            _rec(m, 32, "top1_error", v, c)
            for v, c in ((k, "knn1"), (sv, "softvote3"), (ncm, "ncm"), (ncmc, "ncmc"))
            if v is not None
        ]
    [o] = summarize(both)["objectives"]
    assert o["winner"] is None and o["text"] == (
        "Winner (classification): tie between ncmml d=32 [ncmml32] and ncmc d=32 [ncmc32]: 2 of 4 families each"
    )


def test_a_learned_winner_worse_than_raw_features_is_not_named():
    """nml d=32 took the vote count while its kNN-1 error was worse than raw features' (0.0593 against
    0.0523 on 1,500 test rows)."""
    from metricpipe.report import summarize, winner_lines

    recs = [_rec("nml", 32, "top1_error", v, c) for v, c in ((0.0593, "knn1"), (0.100, "ncm"), (0.080, "softvote5"))]
    recs += [
        _rec("identity", 512, "top1_error", v, c) for v, c in ((0.0523, "knn1"), (0.200, "ncm"), (0.090, "softvote5"))
    ]
    recs += [_rec("pca", 32, "top1_error", v, c) for v, c in ((0.0600, "knn1"), (0.150, "ncm"), (0.095, "softvote5"))]
    s = summarize(recs, items={"classification": 1500})
    [o] = s["objectives"]
    assert o["votes"] == 2 and o["winner"] is None
    [r] = o["refused"]
    assert (r["label"], r["raw"], r["family"]) == ("nml d=32", "identity d=512", "kNN top-1 error (knn1)")
    assert r["difference"] == pytest.approx(0.0070)
    assert winner_lines(s)[-1] == (
        "Winner (classification): none: nml d=32 [nml32] takes the most votes: 2 of 3 "
        "families but is worse than raw features (identity d=512) on kNN top-1 error (knn1) "
        "(+0.0070)"
    )
    [f] = [f for f in s["families"] if f["family"] == "knn"]
    assert f["raw"]["value"] == 0.0523 and f["vote"]["method"] == "identity"
    # retrieval alone: a learned model below raw features' mAP is not its winner either
    ret = [
        _rec("nml", 32, "map", 0.50),
        _rec("pca", 32, "map", 0.45),
        _rec("identity", 512, "map", 0.52),
        _rec("nml", 32, "top1_error", 0.1, "ncm"),
        _rec("identity", 512, "top1_error", 0.2, "ncm"),
    ]
    assert summarize(ret)["objectives"][0]["winner"]["method"] == "identity"


def test_a_learner_better_on_one_seed_of_five_is_not_a_win():
    """linear-ml's mAP on one held-out set: 0.3633, 0.3658 and 0.3537 with random_state 0, 1 and 2,
    a spread larger than many margins the verdict declared a win by, which read one seed."""
    from metricpipe.report import summarize, winner_lines

    lucky = [0.60, 0.49, 0.50, 0.495, 0.50]  # better than PCA in repeat 0 only
    recs = _repeated("pca", 16, 0, {("map", None): [0.50] * 5}, seeded=False) + _repeated(
        "nml", 16, 1, {("map", None): lucky}
    )
    s = summarize(recs, items={"retrieval": 360})
    [f] = s["families"]
    assert f["difference"] == pytest.approx(np.mean(lucky) - 0.50) and f["difference"] > 1 / 360
    lo, hi = f["interval"]
    assert lo < 0 < hi and f["verdict"] == "tie" and f["vote"] is None
    assert s["objectives"][0]["winner"] is None and s["repeats"] == 5
    assert f["model"]["sd"] == pytest.approx(np.std(lucky, ddof=1)) and f["baseline"]["sd"] is None
    assert "95% paired t interval over the 5 repeats holding 0" in winner_lines(s)[0]
    assert "+/- " in winner_lines(s)[1] and "[95% CI " in winner_lines(s)[1]
    # repeat 0 alone (the seed a one-repeat run reads) called it a win
    one = summarize(
        [{**r, "serves": r["serves"][:1]} for r in recs if r["serves"][0][1] == 0], items={"retrieval": 360}
    )
    assert one["families"][0]["verdict"] == "better"
    steady = _repeated("nml", 16, 1, {("map", None): [0.52, 0.53, 0.51, 0.52, 0.525]})
    s = summarize(recs[:1] + steady, items={"retrieval": 360})
    assert s["families"][0]["verdict"] == "better" and s["objectives"][0]["winner"]["method"] == "nml"


def test_a_difference_below_one_test_item_s_worth_is_a_tie():
    """'+0.0013 worse' was 2 of 1,500 test images: one item's worth, 1/N, sets the tie."""
    from metricpipe.report import summarize

    errs = [_rec("nml", 32, "top1_error", 0.0520, "knn1"), _rec("pca", 32, "top1_error", 0.0520 + 2 / 1500, "knn1")]
    assert summarize(errs, items={"classification": 1500})["families"][0]["verdict"] == "better"  # 2 items
    assert summarize(errs, items={"classification": 1000})["families"][0]["verdict"] == "better"  # 1.33 of 1,000
    assert summarize(errs, items={"classification": 500})["families"][0]["verdict"] == "tie"  # 0.67 of 500
    maps = [_rec("nml", 32, "map", 0.5020), _rec("pca", 32, "map", 0.5000)]  # mAP: one query's AP, 1/Q
    assert summarize(maps)["families"][0]["verdict"] == "better"  # counts unknown: 4 decimals
    s = summarize(maps, items={"retrieval": 360})
    assert s["families"][0]["verdict"] == "tie" and s["families"][0]["tolerance"] == pytest.approx(1 / 360)
    assert s["tie_rule"] == "tie: below one test item (1/360)"


def test_rows_over_repeats_are_one_per_config_entry_with_mean_and_spread():
    from metricpipe.report import render_html, repeat_table
    from metricpipe.report.data import report_rows

    recs = _repeated(
        "pca", 16, 0, {("map", None): [0.5] * 3, ("top1_error", "knn1"): [0.1] * 3}, seeded=False
    ) + _repeated(
        "ncmml", 16, 1, {("map", None): [0.6, 0.62, 0.64], ("top1_error", "knn1"): [0.09, 0.08, 0.07]}, lr=3.0
    )
    for r in recs:  # config entry 2 is identical to entry 1 (the same model in every repeat): one row
        if r["method"] == "ncmml":
            r["serves"] = r["serves"] + [[2, r["serves"][0][1]]]
    rows = report_rows(recs)
    assert len(rows) == 2
    nc = rows[(1, "codes")]
    assert nc["entries"] == [1, 2] and nc["params"] == {"lr": 3.0}  # random_state differs: left out
    assert nc["values"][("map", None)] == pytest.approx(0.62) and nc["sd"][("map", None)] == pytest.approx(0.02)
    assert nc["runs"][("map", None)] == [0.6, 0.62, 0.64] and nc["models"] == ["ncmml16-0", "ncmml16-1", "ncmml16-2"]
    assert rows[(0, "codes")]["sd"] == {} and rows[(0, "codes")]["models"] == ["pca16"] * 3
    table = repeat_table(recs)
    assert table["count"] == 3 and "sample standard deviation" in table["spread"]
    [m] = [m for row in table["rows"] if row["method"] == "ncmml" for m in row["metrics"] if m["metric"] == "map"]
    assert m["values"] == [0.6, 0.62, 0.64] and m["mean"] == pytest.approx(0.62) and m["sd"] == pytest.approx(0.02)
    page = render_html(_run_doc(recs))
    models = page[page.index("<h2>Models</h2>") : page.index("</table>", page.index("<h2>Models</h2>"))]
    assert "0.6200 &plusmn; 0.0200" in models and ">0.5000</td>" in models  # a baseline without seed: one value
    assert "ncmml lr=3.0</td>" in models and "random_state" not in models
    assert "repeat 0 of 3" in models and "over its 3 repeats" in models
    assert models.count("<tr>") == 3  # the header and two rows
