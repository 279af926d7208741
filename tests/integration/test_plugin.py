"""A learner of another package, registered by its entry point, runs through the whole pipeline:
configured by name, its parameter selected on the validation rows, refitted, encoded, evaluated and
in the report, with no change to metricpipe."""

import json
import textwrap

import pytest
from distributed import Client, LocalCluster

from metricpipe.config import parse_config
from metricpipe.runner import run_pipeline
from metricpipe.tasks import registry

pytestmark = pytest.mark.integration

TOY = textwrap.dedent('''
    """A toy learner as a third-party package would write it: the leading principal directions,
    scaled by a searched parameter (only their number matters to a ranking: dim)."""
    import numpy as np

    from metricpipe.tasks import moments
    from metricpipe.tasks.base import DIM_OR_NONE, POSITIVE, Learner


    class Toy(Learner):
        method = "toy"
        feeds = "statistics"                       # the statistics stage's moments
        search_space = {"dim": [2, 12]}            # chosen on the validation rows
        selection_metric = "map"
        fitted_attributes = ("components_", "offset_")
        _parameter_constraints = {"dim": DIM_OR_NONE, "scale": POSITIVE}

        def __init__(self, dim=None, scale=1.0):
            self.dim = dim
            self.scale = scale

        def fit(self, X, y=None):
            X = self._check_X(X, reset=True)
            return self.fit_statistics(moments.statistics(X))

        def fit_statistics(self, stats):
            self._validate_params()
            self.n_features_in_ = len(stats["mean"])
            W = stats["pca_components"][: self.dim or 2].T * self.scale
            self.components_ = np.asarray(W, np.float32)
            self.offset_ = (-np.asarray(stats["mean"]) @ W).astype(np.float32)
            return self

        def _transform(self, X):
            return np.asarray(X, np.float64) @ self.components_ + self.offset_

        @property
        def _n_features_out(self):
            return self.components_.shape[1]
''')


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
