"""repeats: N on digits, end to end: every learned model trained with N seeds, baselines without seed
once, and a report of means, spreads and paired verdicts."""

import json
from pathlib import Path

import pytest

from metricpipe.config import parse_config
from metricpipe.report import read_summary, winner_lines
from metricpipe.runner import run_pipeline
from metricpipe.store import Store

pytestmark = pytest.mark.integration


def test_five_repeats_on_digits_report_mean_spread_and_a_paired_verdict(client, tmp_path):
    raw = {
        "store": str(tmp_path / "s"),
        "repeats": 5,
        "data": {"source": "digits", "split": {"test": 0.2, "seed": 0}},
        "methods": [
            {"method": "identity"},
            {"method": "pca", "dim": 16},
            {"method": "ncmml", "dim": 16, "iters": 100, "validate_every": 50, "select": False},
        ],
        "evaluate": {"retrieval": {"k": [1, 10]}, "classification": {"classifiers": ["knn1", "knn5", "ncm"]}},
    }
    closing = []
    path = run_pipeline(parse_config(raw), client=client, log=lambda m: None, result=closing.append)
    doc = json.loads(Path(path).with_name("metrics.json").read_text())
    manifest = Store(str(tmp_path / "s")).read_json("runs/latest.json")
    assert manifest["repeats"] == 5 and manifest["test_items"] == {"retrieval": 360, "classification": 360}
    # records carry the [entry, repeat] pairs their model serves: a baseline once for all five
    serves = {r["model"]: r["serves"] for r in doc["records"]}
    by_method = {}
    for r in doc["records"]:
        by_method.setdefault(r["method"], set()).add(r["model"])
    assert len(by_method["pca"]) == 1 and serves[next(iter(by_method["pca"]))] == [[1, r] for r in range(5)]
    assert len(by_method["ncmml"]) == 5 and sorted(s for k in by_method["ncmml"] for s in serves[k]) == [
        [2, r] for r in range(5)
    ]
    # per row, every repeat's value, their mean and sample standard deviation
    table = doc["repeats"]
    assert table["count"] == 5 and [r["method"] for r in table["rows"]] == ["identity", "pca", "ncmml"]
    ncmml = table["rows"][2]
    [m] = [m for m in ncmml["metrics"] if m["metric"] == "map"]
    assert len(m["values"]) == 5 and len(set(m["values"])) > 1 and m["sd"] > 0
    assert m["mean"] == pytest.approx(sum(m["values"]) / 5)
    assert all(mm["sd"] is None for mm in table["rows"][1]["metrics"])  # pca: computed once
    # the verdict: per family, a paired 95% t interval over the five repeats
    s = read_summary(Store(str(tmp_path / "s")))
    assert s["repeats"] == 5 and [f["family"] for f in s["families"]] == ["retrieval", "knn", "ncm"]
    for f in s["families"]:
        lo, hi = f["interval"]
        assert lo <= f["difference"] <= hi and f["verdict"] in ("better", "worse", "tie")
        assert f["verdict"] != "tie" or lo <= 0 <= hi or abs(f["difference"]) < 1 / 360
    assert [o["objective"] for o in s["objectives"]] == ["retrieval", "classification"]
    assert closing[-2:] == winner_lines(s)[-2:] and closing[-2].startswith("Winner (retrieval): ")
    page = Path(path).read_text()
    assert "&plusmn;" in page and "95% paired t interval" in page and "over its 5 repeats" in page
