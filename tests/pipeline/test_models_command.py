"""`metricpipe models STORE`: what a first-hour user asks of the list (which model add-classes made,
from what, and how each model scored in the last run)."""

import json

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from metricpipe.cli import main
from tests.conftest import make_blobs

pytestmark = pytest.mark.integration  # a run on the session's cluster


def _invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def run_store(client, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("models_cmd")
    X, y = make_blobs(n=300, d=8)
    np.savez(tmp / "d.npz", X=X, y=y)
    cfg = {
        "store": str(tmp / "store"),
        "cluster": client.scheduler.address,
        "workers": 1,
        "dashboard": ":0",
        "data": {"path": str(tmp / "d.npz"), "chunk_mb": 0.002},
        "methods": [{"method": "pca", "dim": 4}, {"method": "ncmml", "dim": 4, "iters": 20, "select": False}],
        "evaluate": {"retrieval": {"k": [5]}, "classification": {"classifiers": ["knn1", "ncm"]}},
    }
    (tmp / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    res = _invoke("run", tmp / "cfg.yaml")
    assert res.exit_code == 0, res.output
    return tmp


def _lines(output):
    """{key: line} of the model rows."""
    return {ln.split()[0]: ln for ln in output.splitlines() if ln.split() and len(ln.split()[0]) == 16}


HEADLINES = (("map", None), ("map@r", None), ("top1_error", "knn1"), ("top1_error", "ncm"))


def test_models_shows_each_model_s_headline_metrics_of_the_last_run(run_store):
    res = _invoke("models", run_store / "store")
    assert res.exit_code == 0, res.output
    header = res.output.splitlines()[0]
    assert "normalize     mAP   MAP@R  knn1 err  ncm err  parameters" in header, header
    records = json.loads((run_store / "store/report/metrics.json").read_text())["records"]
    lines = _lines(res.output)
    scored = {r["model"] for r in records}
    assert len(scored) == 2 and scored <= set(lines)
    for key in scored:
        want = {(r["metric"], r["classifier"]): r["value"] for r in records if r["model"] == key}
        assert lines[key].split()[6:10] == [f"{want[h]:.4f}" for h in HEADLINES]
    unscored = set(lines) - scored  # the fit its refit replaced, say: no figures
    assert all(lines[k].split()[6:10] == ["-"] * 4 for k in unscored)


def test_models_marks_what_add_classes_made_with_its_origin_and_the_classes_added(run_store, tmp_path):
    import shutil

    store = tmp_path / "store"
    shutil.copytree(run_store / "store", store)
    origin = next(k for k, ln in _lines(_invoke("models", store).output).items() if " ncmml " in ln and " yes " in ln)
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "new.npz", X=rng.normal(size=(6, 8)).astype(np.float32), y=np.array([7, 7, 7, 9, 9, 9]))
    res = _invoke("add-classes", store, tmp_path / "new.npz", "--model", origin)
    assert res.exit_code == 0, res.output
    lines = _lines(_invoke("models", store).output)
    [made] = [k for k, ln in lines.items() if "add-classes" in ln]
    assert made != origin and lines[made].endswith(f"(add-classes: {origin} + 2 class(es): 7, 9)")
    assert lines[made].split()[6:10] == ["-"] * 4  # not scored by the run: no figures of its origin's
    assert "add-classes" not in lines[origin]
