import pytest

from metricpipe.report import _kept_ks, render_html


def _doc(ks):
    recs = [{"method": m, "dim": d, "params": {}, "classifier": None, "metric": f"mprec@{k}", "value": 0.5}
            for m in ("pca", "nml") for d in (8, 16) for k in ks]
    run = {"dataset": {"source": "x", "n_samples": 1, "n_features": 1, "n_classes": 2, "splits": {}},
           "seconds": 1.0, "config": {}, "versions": {}}
    return {"records": recs, "run": run, "timings": []}


def test_many_k_show_a_few_columns_and_one_curve_over_k_per_dimension():
    ks = list(range(1, 51))
    assert _kept_ks(_doc(ks)["records"]) == {1, 5, 10, 20, 50}
    page = render_html(_doc(ks))
    assert ">mprec@10 &uarr;</th>" in page and ">mprec@11 " not in page
    main = page[page.index("<h2>Models</h2>"):page.index("<details>")]
    assert [k for k in ks if f">mprec@{k} " in main] == [1, 10, 50]      # the rest folded
    # one figure: a panel per main-table column against the dimension, then one mprec-vs-K panel per
    # dimension (8 and 16)
    assert page.count("<figure>") == 1
    assert _panels(page) == [f"mprec@{k} against code dimension" for k in (1, 10, 50)] + \
        ["mprec@K against K", "mprec@K against K"]
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
    return {"method": method, "dim": dim, "params": params, "classifier": classifier, "metric": metric,
            "value": value, "model": model or f"{method}{dim}"}


def _run_doc(records):
    return {**_doc([]), "records": records}


# (method, dim): mAP, knn1 top-1 error, ncm top-1 error, storage bytes
TABLE = {("pca", 16): (0.50, 0.20, 0.30, 4096), ("lda", 9): (0.55, 0.25, 0.22, 2304),
         ("ncmml", 16): (0.62, 0.18, 0.26, 4096), ("nml", 8): (0.58, 0.15, 0.40, 2048)}


def _table_records():
    recs = []
    for (m, d), (ap, knn1, ncm, size) in TABLE.items():
        recs += [_rec(m, d, "map", ap), _rec(m, d, "top1_error", knn1, "knn1"), _rec(m, d, "top1_error", ncm, "ncm"),
                 _rec(m, d, "top5_error", knn1 / 2, "knn1"), _rec(m, d, "storage_bytes", size)]
    return recs


def test_summary_names_the_best_learned_model_and_baseline_per_metric_with_the_signed_difference():
    from metricpipe.report import summarize
    from metricpipe.tasks.registry import BASELINES
    s = summarize(_table_records())
    by = {(e["metric"], e["classifier"]): e for e in s["headline"]}
    assert list(by) == [("map", None), ("top1_error", "knn1"), ("top1_error", "ncm")]
    for j, (mc, higher) in enumerate([(("map", None), True), (("top1_error", "knn1"), False),
                                      (("top1_error", "ncm"), False)]):
        pick = max if higher else min
        learned = pick((v[j], k) for k, v in TABLE.items() if k[0] not in BASELINES)
        base = pick((v[j], k) for k, v in TABLE.items() if k[0] in BASELINES)
        e = by[mc]
        assert (e["model"]["method"], e["model"]["dim"]) == learned[1]
        assert (e["baseline"]["method"], e["baseline"]["dim"]) == base[1]
        assert e["model"]["model"] == "%s%d" % learned[1]           # the key predict / export take
        assert e["difference"] == pytest.approx(learned[0] - base[0])
        assert e["higher_is_better"] is higher
    # mAP: ncmml 0.62 vs lda 0.55 -> +0.07 better; knn1: nml 0.15 vs pca 0.20 -> -0.05, lower error: better;
    # ncm: ncmml 0.26 vs lda 0.22 -> +0.04 error: worse
    assert [by[mc]["verdict"] for mc in by] == ["better", "better", "worse"]
    # winner: best of all models on most headline metrics: ncmml (mAP), nml (knn1), lda (ncm): a tie of
    # one each, broken by the first headline metric (mAP)
    assert (s["winner"]["method"], s["winner"]["wins"], s["winner"]["of"]) == ("ncmml", 1, 3)


def test_winner_is_the_model_best_on_most_headline_metrics_even_a_baseline():
    from metricpipe.report import summarize
    recs = _table_records() + [_rec("pcaw", 16, "top1_error", 0.10, "knn1"), _rec("pcaw", 16, "top1_error", 0.05, "ncm"),
                               _rec("pcaw", 16, "map", 0.1)]
    s = summarize(recs)
    assert (s["winner"]["method"], s["winner"]["wins"], s["winner"]["baseline"]) == ("pcaw", 2, True)
    knn1 = s["headline"][1]
    assert knn1["baseline"]["method"] == "pcaw" and knn1["difference"] == pytest.approx(0.15 - 0.10)
    assert knn1["verdict"] == "worse"


def test_a_swept_parameter_is_named_at_its_default_too():
    """sparsity 0.9 is sparse's default: left out of a lone model's label, named when the run sweeps it."""
    from metricpipe.report import _swept, _table, summarize
    lone = summarize([_rec("sparse", 64, "map", 0.6, sparsity=0.9), _rec("pca", 64, "map", 0.5)])
    assert lone["winner"]["label"] == "sparse d=64"
    recs = [_rec("sparse", 64, "map", 0.6, model="a", sparsity=0.9), _rec("sparse", 64, "map", 0.55, model="b",
                                                                            sparsity=0.99),
            _rec("sparse", 64, "map", 0.58, model="c"), _rec("pca", 64, "map", 0.5), _rec("nml", 8, "map", 0.3, lr=0.1)]
    assert _swept(recs) == {("sparse", "sparsity")}   # the unset one counts as its default, 0.9
    views = [_rec("slne", 8, "map", 0.5, view="codes"), _rec("slne", 8, "map", 0.6, view="exact", score="inner"),
             _rec("slne", 8, "storage_bytes", 100)]
    assert _swept(views) == set()                      # views and scores are not parameters
    s = summarize(recs)
    assert s["winner"]["label"] == "sparse sparsity=0.9 d=64"
    from metricpipe.report import _rows
    page = _table(_rows(recs), [("map", None)], {})
    import re
    labels = re.findall(r"<tr><td class=l>([^<]*)</td>", page)
    assert sorted(labels) == ["nml lr=0.1", "sparse sparsity=0.9", "sparse sparsity=0.9", "sparse sparsity=0.99"]


def test_training_curve_titles_name_a_swept_parameter_like_the_tables():
    from metricpipe.report import _curve_panels, _swept
    recs = [_rec("sparse", 64, "map", 0.6, sparsity=0.9), _rec("sparse", 64, "map", 0.55, sparsity=0.99)]
    curve = {"model": {"method": "sparse", "sparsity": 0.9}, "history": [{"iter": i, "objective": 1.0 / (i + 1)}
                                                                       for i in range(3)]}
    assert _curve_panels(curve)[0]["title"] == "sparse"        # alone, the default is left out
    assert _curve_panels(curve, _swept(recs))[0]["title"] == "sparse sparsity=0.9"


def test_summary_ignores_other_views_and_ties_go_to_the_smaller_code():
    from metricpipe.report import summarize
    recs = [_rec("pca", 32, "map", 0.5), _rec("pca", 8, "map", 0.5), _rec("slne", 16, "map", 0.6, view="codes"),
            _rec("slne", 16, "map", 0.9, view="exact", score="inner")]
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
    assert only_learned["headline"][0]["baseline"] is None and only_learned["winner"]["method"] == "nml"


def test_winner_lines_end_with_the_winner_and_its_key():
    from metricpipe.report import summarize, winner_lines
    lines = winner_lines(summarize(_table_records()))
    assert lines[-1].startswith("Winner: ncmml d=16") and "ncmml16" in lines[-1]
    assert "0.6200 ncmml d=16 [ncmml16] vs baseline 0.5500 lda d=9: +0.0700 (better)" in lines[1]


# --- recall@K: shown only where informative ------------------------------------------------------------

def test_recall_is_left_out_when_near_zero_or_the_same_for_every_model():
    from metricpipe.report import RECALL_FLOOR, RECALL_SPREAD, recall_hidden
    recs = []
    for i, m in enumerate(("pca", "nml", "lda")):
        recs += [_rec(m, 8, "recall@1", RECALL_FLOOR / 2 + i * 1e-4),      # ~0 everywhere
                 _rec(m, 8, "recall@10", 0.4 + i * RECALL_SPREAD / 4),     # the same for every model
                 _rec(m, 8, "recall@50", 0.4 + i * 0.05)]                 # informative
    assert set(recall_hidden(recs)) == {1, 10}
    page = render_html(_run_doc(recs + [_rec(m, 8, "map", 0.5) for m in ("pca", "nml", "lda")]))
    assert ">recall@50 " in page and ">recall@1 " not in page and ">recall@10 " not in page
    assert "recall@K is shown for a K when" in page                  # the rule is stated
    # one model: only the floor applies
    assert recall_hidden([_rec("pca", 8, "recall@10", 0.4)]) == {}


# --- the page ---------------------------------------------------------------------------------------------

def test_page_summary_before_the_models_table_keys_shown_and_costs_in_their_own_table():
    import re
    page = render_html(_run_doc(_table_records()))
    summary, models, costs = page.index("<h2>Summary</h2>"), page.index("<h2>Models</h2>"), page.index("<h2>Costs</h2>")
    assert summary < models < costs
    assert "Winner: <b>ncmml d=16</b>" in page[summary:models]
    for m, d in TABLE:
        assert f"<code>{m}{d}</code>" in page[models:costs]          # every model's key in the main table
    tables = re.findall(r"<table.*?</table>", page[models:], re.S)
    main = tables[0]
    assert "model bytes" not in main and "4,096" not in main and "4096" not in main
    assert "top-5 error" not in main                                 # secondary: folded
    assert "top-5 error" in page[page.index("<details>"):page.index("</details>")]
    cost = page[costs:]
    assert "4,096" in cost and "2,304" in cost and "mAP" not in cost[:cost.index("</table>")]


def test_page_lists_models_extended_by_add_classes():
    doc = _run_doc(_table_records())
    doc["extended_models"] = [{"key": "ext0001", "extends": "ncmml16", "added": ["cat", "dog"], "images": 40,
                               "label": "ncmml d=16"}]
    page = render_html(doc)
    sect = page[page.index("<h2>Models extended by add-classes</h2>"):]
    assert "<code>ext0001</code>" in sect and "<code>ncmml16</code>" in sect and "cat, dog (2)" in sect
    # the run's model row points at its extension
    models = page[page.index("<h2>Models</h2>"):page.index("<h2>Models extended")]
    assert "+ classes: <code>ext0001</code>" in models


def test_a_tie_goes_to_the_baseline_and_a_models_cost_records_share_its_row():
    from metricpipe.report import summarize
    recs = [_rec("pca", 16, "top1_error", 0.1, "knn1"), _rec("ncmml", 16, "top1_error", 0.1, "knn1"),
            _rec("slne", 16, "top1_error", 0.2, "knn1", view="codes", score="inner"),
            _rec("slne", 16, "storage_bytes", 777)]                 # the evaluate stage writes costs without view
    s = summarize(recs)
    assert s["winner"]["method"] == "pca" and s["headline"][0]["verdict"] == "tie"
    page = render_html(_run_doc(recs))
    models = page[page.index("<h2>Models</h2>"):page.index("<h2>Costs</h2>")]
    assert models.count("<code>slne16</code>") == 1 and "score=inner" not in page


def test_training_curves_are_one_figure_with_a_row_per_model():
    import base64
    import re
    curves = [{"model": {"method": "nml", "dim": 8}, "history": [{"iter": i, "objective": 10.0 / (i + 1),
                                                                   "val_error": 0.3 - 0.01 * i} for i in range(5)]},
              {"model": {"method": "slne", "input_dim": 24}, "history": [{"epoch": e, "hinge": 1.0 - e / 10}
                                                                          for e in range(3)]}]
    page = render_html(_doc([1, 10]), curves)
    training = page[page.index("<h2>Training curves</h2>"):]
    assert training.count("<figure>") == 1
    assert _panels(training) == ["objective against iter", "val_error against iter", "hinge against epoch"]
    png = base64.b64decode(re.search(r'base64,([^"]+)"', training).group(1))
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width > height * 1.2   # two models' rows of two panels (the second row's right one left blank)


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
    curves = [{"model": {"method": "ncmml"}, "history": [{"iter": i, "val_error": 0.3 - 0.01 * i, "batch": -0.2 + i / 100}
                                                         for i in range(3)]},
              {"model": {"method": "slne"}, "history": [{"epoch": 0, "val_error": 0.2},
                                                        {"epoch": 1, "val_error": 0.19, "violations": 9, "hinge": 0.1}]}]
    page = render_html(_doc([1, 10]), curves)
    for key in ("val_error", "batch", "violations", "hinge"):
        assert f"<b>{key}</b>: {escape(CURVES[key])}" in page
    assert "<b>objective</b>" not in page                   # only the quantities drawn
    assert "baselines dashed; models with equal values draw over each other" in page


def test_a_learned_model_a_hair_above_a_baseline_is_a_tie_for_the_winner_too():
    """mAP 0.2011 against 0.2011 (2.2e-8 apart) read '+0.0000 (tie)', yet the metric counted for the
    learned model in 'Winner: ... best on 2 of 3' (a new-user trial): the winner now counts ties as
    the verdict does, and a tie goes to the baseline."""
    from metricpipe.report import summarize
    recs = [_rec("ncmml", 32, "map", 0.20110002), _rec("pca", 32, "map", 0.2011),
            _rec("ncmml", 32, "top1_error", 0.30, "knn1"), _rec("pca", 32, "top1_error", 0.31, "knn1")]
    s = summarize(recs)
    assert [e["verdict"] for e in s["headline"]] == ["tie", "better"]
    assert s["headline"][0]["model"]["value"] == 0.20110002     # each side still shows its own best value
    assert (s["winner"]["method"], s["winner"]["wins"]) == ("pca", 1)   # one metric each: the first is pca's
    recs[0] = _rec("ncmml", 32, "map", 0.2013)  # a difference the report shows does count
    assert summarize(recs)["winner"] == {**summarize(recs)["winner"], "method": "ncmml", "wins": 2}


def test_the_shown_precision_ties_only_the_winner_s_count_not_the_headline_or_the_tables():
    """A review of the tie rule: applied to every best pick, a smaller code within 0.5e-4 of a larger
    one's better value took the headline (better -> tie) and the table's bold cell."""
    from metricpipe.report import summarize
    recs = [_rec("ncmml", 32, "map", 0.20009), _rec("ncmml", 16, "map", 0.200045), _rec("pca", 32, "map", 0.2)]
    [e] = [e for e in summarize(recs)["headline"] if e["metric"] == "map"]
    assert (e["model"]["value"], e["model"]["dim"], e["verdict"]) == (0.20009, 32, "better")
    w = summarize(recs)["winner"]      # PCA 0.9e-4 below: not tied; the two NCMML within 0.5e-4 tie,
    assert (w["method"], w["dim"]) == ("ncmml", 32)       # but NCMML-16 ties PCA (0.45e-4): the larger wins
    recs[0] = _rec("ncmml", 32, "map", 0.20012)          # NCMML-16 0.55e-4 above PCA: it beats it too
    w = summarize(recs)["winner"]
    assert (w["method"], w["dim"]) == ("ncmml", 32)       # 0.75e-4 below the top: not tied with it
    recs = [_rec("ncmml", 32, "map", 0.20009), _rec("ncmml", 16, "map", 0.200055), _rec("pca", 32, "map", 0.2)]
    w = summarize(recs)["winner"]
    assert (w["method"], w["dim"]) == ("ncmml", 16)       # tied with the top, clear of PCA: the smaller code
    recs = [_rec("ncmml", 16, "map", 0.20004), _rec("pca", 32, "map", 0.2)]   # shown as 0.2000 both
    s = summarize(recs)
    assert s["headline"][0]["verdict"] == "tie" and s["winner"]["method"] == "pca"   # the baseline, not the smaller code
