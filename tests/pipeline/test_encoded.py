"""Encoded databases (encode.pq) through a whole run on digits: the records, the report's "Quality per
byte" section and `export --faiss --pq` exist and agree; a model whose codes are not a vector space's
is left out with a note."""

import json
import re

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from metricpipe.cli import main
from metricpipe.config import SPLIT_NAMES
from metricpipe.store import open_array
from metricpipe.tasks import evaluation, pq

SIZES = (4, 8)


@pytest.fixture(scope="module")
def run(client, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("encoded")
    cfg = {
        "store": str(tmp / "store"),
        "cluster": client.scheduler.address,
        "data": {"source": "digits"},
        "methods": [
            {"method": "pca", "dim": 12},  # l2, d not a multiple of 8: padded
            {"method": "sparse", "dim": 16, "max_iter": 3},  # inner product
            {"method": "slem", "kernel": "gaussian", "gamma": 0.05, "lam": 0.1, "negatives": {"count": 200}},
        ],
        "encode": {"pq": list(SIZES)},
        "evaluate": {"retrieval": {"k": [5]}, "classification": {"classifiers": ["knn1"]}},
    }
    (tmp / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    res = CliRunner().invoke(main, ["run", str(tmp / "cfg.yaml")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    store = tmp / "store"
    return store, json.loads((store / "runs/latest.json").read_text()), res.output


def _records(store):
    return json.loads((store / "report/metrics.json").read_text())["quality_per_byte"]


def test_every_encoded_database_has_its_records_with_pq_bytes(run):
    store, manifest, output = run
    section = _records(store)
    by = {}
    for r in section["records"]:
        by.setdefault((r["method"], r["pq_bytes"]), {})[(r["metric"], r["classifier"])] = r["value"]
    assert sorted(by) == sorted((m, s) for m in ("pca", "sparse", pq.ANCHOR) for s in SIZES)
    for (method, size), values in by.items():
        assert values[("bytes_per_vector", None)] == size  # the index's sa_code_size
        assert 0 < values[("map", None)] <= 1 and 0 < values[("map@r", None)] <= 1
        assert 0 <= values[("top1_error", "knn1")] < 0.5 and values[("qps", None)] > 0
    # the float codes' records stay as they were: none carries pq_bytes
    plain = json.loads((store / "report/metrics.json").read_text())["records"]
    assert plain and not any("pq_bytes" in r for r in plain)
    assert len(manifest["units"]["pq"]) == len(manifest["units"]["pq_evaluation"]) == 3 * len(SIZES)
    # kernel SLEM compares codes by Eq. 16: no vector index, said in the log, the manifest and the report
    assert [s["model"].split("-")[0] for s in manifest["pq_skipped"]] == ["slem"]
    assert "no product quantiser of slem" in output


def test_the_report_names_the_best_method_at_each_size_and_plots_quality_per_byte(run):
    store, _, _ = run
    section = _records(store)
    assert [b["pq_bytes"] for b in section["best"]] == list(SIZES)
    page = (store / "report/index.html").read_text()
    part = page[page.index("<h2>Quality per byte</h2>") :]
    part = part[: part.index("<h2>", 10)]
    for b in section["best"]:
        assert f"{b['pq_bytes']} bytes: <b>{b['label']}</b> (mAP {b['value']:.4f})" in part
        best = max(
            (r for r in section["records"] if r["pq_bytes"] == b["pq_bytes"] and r["metric"] == "map"),
            key=lambda r: r["value"],
        )
        assert b["value"] == best["value"]
    assert "opq-pq (raw)" in part and '<img alt="mAP through the encoded database' in part
    assert "No encoded database of slem" in part


def test_export_writes_the_index_the_evaluation_searched(run, tmp_path):
    import faiss

    store, manifest, _ = run
    section = _records(store)
    for rel in manifest["units"]["pq"]:
        meta = json.loads((store / f"{rel}.committed.json").read_text())
        if meta["model"] is None or meta["spec"]["method"] != "sparse" or meta["pq_bytes"] != 8:
            continue
        out = tmp_path / "pq8.faiss"
        res = CliRunner().invoke(
            main, ["export", str(store), "--model", meta["model"], "--faiss", str(out), "--pq", "8"]
        )
        assert res.exit_code == 0, res.output
        index = faiss.read_index(str(out))
        data = store / manifest["units"]["data"]
        split, labels = open_array(str(data / "split"))[:], open_array(str(data / "label"))[:]
        test = np.flatnonzero(split == SPLIT_NAMES.index("test"))
        assert index.ntotal == len(test) and index.metric_type == faiss.METRIC_INNER_PRODUCT
        assert pq.code_size(np.frombuffer(faiss.serialize_index(faiss.downcast_index(index).index), np.uint8)) == 8
        codes = open_array(str(store / "codes" / _codes_key(store, manifest, meta["model"]) / "codes"))[:]
        acc_k = evaluation.accuracy_k(evaluation.relevant_counts(labels[test], labels[test], True))
        found = pq.retrieval(index, codes[test], test, test, labels, (5,), acc_k)
        want = {
            r["metric"]: r["value"] for r in section["records"] if r["model"] == meta["model"] and r["pq_bytes"] == 8
        }
        assert np.nanmean(found["ap"]) == pytest.approx(want["map"], abs=1e-12)
        assert np.nanmean(found["map@r"]) == pytest.approx(want["map@r"], abs=1e-12)
        break
    else:
        raise AssertionError("no sparse pq8 unit")


def _codes_key(store, manifest, model: str) -> str:
    for rel in manifest["units"]["codes"]:
        if json.loads((store / f"{rel}.committed.json").read_text())["model"] == model:
            return rel.split("/")[1]
    raise AssertionError(model)


def test_export_refuses_a_size_the_run_did_not_make_in_one_line(run, tmp_path):
    store, manifest, _ = run
    models = {
        json.loads((store / f"{rel}.committed.json").read_text())["spec"]["method"]: rel.split("/")[1]
        for rel in manifest["units"]["models"]
    }
    for model, size, match in (
        (
            models["pca"],
            16,
            r"--pq 16: model \w+ has no encoded database of 16 bytes per vector; the run's encode.pq made 4, 8: give one of them$",
        ),
        (
            models["slem"],
            8,
            r"--pq 8: model \w+ has no encoded database of 8 bytes per vector: the last run made none for it",
        ),
    ):
        res = CliRunner().invoke(
            main, ["export", str(store), "--model", model, "--faiss", str(tmp_path / "x.faiss"), "--pq", str(size)]
        )
        lines = res.output.strip().splitlines()
        assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), res.output
        assert re.search(match, lines[0]), lines[0]
        assert not (tmp_path / "x.faiss").exists()
