"""A learner of another package, registered by its entry point, runs through the whole pipeline:
configured by name, its parameter selected on the validation rows, refitted, encoded, evaluated and
in the report, with no change to metricpipe."""

import json
from pathlib import Path

import pytest
from distributed import Client, LocalCluster

from metricpipe.config import parse_config
from metricpipe.runner import run_pipeline
from metricpipe.tasks import registry

pytestmark = pytest.mark.integration


def _documented_learner() -> str:
    """The learner the docs' "Writing a learner" shows (docs/contributing.md, its first python block):
    the test runs it."""
    text = (Path(__file__).parents[2] / "docs" / "contributing.md").read_text()
    section = text[text.index("## Writing a learner") :]
    return section[section.index("```python\n") + 10 : section.index("```\n", section.index("```python\n") + 10)]


TOY = _documented_learner()


@pytest.fixture
def toy_installed(tmp_path, monkeypatch):
    """The toy package installed the way pip would leave it: its module and a dist-info whose
    entry_points.txt registers it in the group metricpipe.learners."""
    site = tmp_path / "site"
    (site / "toy_plugin-0.1.dist-info").mkdir(parents=True)
    (site / "toy_learner.py").write_text(TOY)
    (site / "toy_plugin-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: toy-plugin\nVersion: 0.1\n"
    )
    (site / "toy_plugin-0.1.dist-info" / "entry_points.txt").write_text(
        "[metricpipe.learners]\ntoy = toy_learner:Toy\n"
    )
    monkeypatch.syspath_prepend(str(site))
    registry.methods.cache_clear()
    yield
    registry.methods.cache_clear()


def test_a_registered_learner_runs_through_the_pipeline_and_is_in_the_report(toy_installed, tmp_path):
    assert "toy" in registry.methods()
    raw = {
        "store": str(tmp_path / "s"),
        "data": {"source": "digits"},
        "dashboard": False,
        "methods": [{"method": "pca", "dim": 12}, {"method": "toy"}],
        "evaluate": {"retrieval": {"k": [10]}, "classification": {"classifiers": ["knn1"]}},
    }
    # workers in this process: they import the toy module from the same sys.path
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as lc,
        Client(lc) as client,
    ):
        path = run_pipeline(parse_config(raw), client=client, log=lambda m: None)
    doc = json.loads(open(path.replace("index.html", "metrics.json")).read())
    [sel] = doc["selection"]
    assert sel["method"] == "toy" and [c["params"]["dim"] for c in sel["candidates"]] == [2, 12]
    assert {r["method"] for r in doc["records"]} == {"pca", "toy"}
    chosen = sel["candidates"][sel["chosen"]]["params"]["dim"]
    toy_map = [r["value"] for r in doc["records"] if r["method"] == "toy" and r["metric"] == "map"]
    pca_map = [r["value"] for r in doc["records"] if r["method"] == "pca" and r["metric"] == "map"]
    assert chosen == 12 and toy_map == pytest.approx(pca_map, abs=1e-6)  # PCA-12, refitted on every train row
    assert "toy" in open(path).read()
