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
    assert "<th>mprec@10</th>" in page and "<th>mprec@11</th>" not in page
    # 5 per-K plots against the dimension, then one mprec-vs-K plot per dimension (8 and 16)
    assert page.count("<figure>") == 5 + 2


def test_few_k_keep_every_column_and_no_curve_over_k():
    page = render_html(_doc([1, 10, 100]))
    assert all(f"<th>mprec@{k}</th>" in page for k in (1, 10, 100))
    assert page.count("<figure>") == 3
