"""The report's "Quality per byte" section from records alone: the best method at each size, repeats
averaged, the anchor and baselines drawn as baselines, and no retrieval to rank by."""

from metricpipe.report.quality import best_per_size, quality_html, quality_panel, quality_rows


def _recs(method, dim, size, map_, knn, model, params=None):
    base = {
        "method": method,
        "dim": dim,
        "params": params or {},
        "pq_bytes": size,
        "index": f"PQ{size}",
        "model": model,
    }
    return [
        {**base, "classifier": None, "metric": "map", "value": map_},
        {**base, "classifier": "knn1", "metric": "top1_error", "value": knn},
        {**base, "classifier": None, "metric": "bytes_per_vector", "value": size},
        {**base, "classifier": None, "metric": "qps", "value": 1000.0},
    ]


RECORDS = (
    _recs("pca", 64, 8, 0.40, 0.20, "a")
    + _recs("ncmml", 64, 8, 0.50, 0.25, "b")
    + _recs("ncmml", 64, 8, 0.30, 0.15, "c")  # a second repeat: the row is their mean
    + _recs("opq-pq", 784, 8, 0.45, 0.10, None)
    + _recs("pca", 64, 16, 0.60, 0.20, "a")
    + _recs("opq-pq", 784, 16, 0.55, 0.10, None)
)


def test_the_best_method_at_each_size_is_named_over_the_repeats_mean():
    rows = quality_rows(RECORDS)
    ncmml = next(r for r in rows if r["label"].startswith("ncmml") and r["pq_bytes"] == 8)
    assert ncmml["values"][("map", None)] == 0.4 and ncmml["models"] == ["b", "c"]
    assert [(b["pq_bytes"], b["label"], b["metric"]) for b in best_per_size(rows)] == [
        (8, "opq-pq (raw)", "mAP"),
        (16, "pca d=64", "mAP"),
    ]
    panel = quality_panel(rows)
    assert panel["log2_x"] and panel["baselines"] == {"opq-pq (raw)", "pca d=64"}
    assert sorted(panel["series"]["pca d=64"]) == [(8, 0.4), (16, 0.6)]
    page = quality_html({"records": RECORDS, "best": best_per_size(rows), "skipped": []})
    assert "Best at each size: 8 bytes: <b>opq-pq (raw)</b> (mAP 0.4500); 16 bytes: <b>pca d=64</b>" in page


def test_without_retrieval_the_sizes_are_ranked_by_knn_error():
    records = [r for r in RECORDS if r["metric"] != "map"]
    rows = quality_rows(records)
    assert [(b["label"], b["metric"]) for b in best_per_size(rows)] == [
        ("opq-pq (raw)", "kNN-1 error"),
        ("opq-pq (raw)", "kNN-1 error"),
    ]
    assert quality_panel(rows)["ylabel"] == "kNN-1 error"
    assert quality_html({"records": [], "best": []}) == ""
