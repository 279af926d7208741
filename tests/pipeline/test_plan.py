"""`metricpipe plan CONFIG` and the first lines of `metricpipe run`: every model and selection
candidate the run trains, with an estimate of its time, before any work."""

import json
import re

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from metricpipe.cli import main
from metricpipe.config import parse_config
from metricpipe.runner import run_pipeline
from metricpipe.tasks import registry
from metricpipe.tasks.baselines import PCA
from tests.conftest import make_blobs


def _config(tmp_path, methods, **extra) -> str:
    X, y = make_blobs(n=400, d=8)
    np.savez(tmp_path / "d.npz", X=X, y=y)
    raw = {
        "store": str(tmp_path / "store"),
        "workers": 2,
        "dashboard": ":0",
        "data": {"path": str(tmp_path / "d.npz"), "chunk_mb": 0.004},
        "methods": methods,
        "evaluate": {"retrieval": {"k": [5]}, "classification": {"classifiers": ["knn1"]}},
        **extra,
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(raw))
    return str(tmp_path / "cfg.yaml")


def _plan(*args):
    return CliRunner().invoke(main, ["plan", *map(str, args)], catch_exceptions=False)


def _fits(out: str) -> list[dict]:
    """The plan's table of fits: {entry, [repeat,] model, fit, rows, estimate} per row."""
    lines = [re.split(r"\s{2,}", line.strip()) for line in out.splitlines()]
    head = next(cells for cells in lines if cells[0] == "entry")
    return [dict(zip(head, cells)) for cells in lines if cells[0].startswith("methods[") and len(cells) == len(head)]


def test_the_plan_lists_every_candidate_and_refit_with_its_estimate_and_writes_nothing(tmp_path):
    cfg = _config(tmp_path, [{"method": "pca", "dim": 4}, {"method": "ncmml", "dim": 4, "iters": 40}])
    res = _plan(cfg, "--rate", "2")
    assert res.exit_code == 0, res.output
    fits = _fits(res.output)
    ncmml = [f for f in fits if f["model"].startswith("ncmml-4")]
    lrs = registry.make({"method": "ncmml"}).search_space["lr"]
    assert [f["fit"] for f in ncmml] == ["candidate"] * len(lrs) + ["refit"]  # each lr of the grid, then its refit
    assert [f["model"] for f in ncmml[:2]] == ["ncmml-4-iters40", "ncmml-4-iters40-lr3.0"]  # the train stage's names
    assert all(f["estimate"].startswith("at most ") for f in ncmml)  # early stopping decides the steps
    [pca] = [f for f in fits if f["model"] == "pca-4"]
    assert pca["fit"] == "model" and not pca["estimate"].startswith("at most")
    assert "2.0 G multiply-adds/s per task (given)" in res.output
    assert "methods[1] ncmml-4-iters40: 5 candidates (lr 30, 3, 10, 100, 300), then the chosen one" in res.output
    assert re.search(r"the run: at most about \d", res.output)
    assert not (tmp_path / "store").exists()  # nothing staged, no store made


def test_the_planned_fits_are_the_models_the_train_stage_makes(client, tmp_path):
    """One definition of which fits a run makes: the plan's, counted against the units committed (a
    grid of counts, so that no selection searches past its edge)."""
    methods = [
        {"method": "identity"},
        {"method": "pca", "dim": [2, 4]},
        {"method": "ncmml", "dim": 4, "iters": 30, "select": {"batch": [20, 40]}},
    ]
    cfg = _config(tmp_path, methods, repeats=2, cluster=client.scheduler.address)
    planned = _fits(_plan(cfg, "--rate", "1").output)
    run_pipeline(parse_config(yaml.safe_load(open(cfg)), where=cfg), client=client, log=lambda m: None)
    units = [json.loads(p.read_text()) for p in (tmp_path / "store" / "models").glob("*.committed.json")]
    made = sorted(registry.model_name(u["spec"]) for u in units if "refit_of" not in u)
    refits = [u for u in units if "refit_of" in u]
    assert made == sorted(f["model"] for f in planned if f["fit"] != "refit" and f["estimate"] != "trained once")
    assert len(refits) == sum(f["fit"] == "refit" for f in planned) == 2  # the chosen NCMML, per repeat


class Toy(PCA):
    """A plugin's learner that says nothing about its cost."""

    method = "toy"

    def fit_cost(self, *args, **kw):
        return None


def test_a_learner_that_states_no_cost_is_unknown_in_the_plan(tmp_path, monkeypatch):
    known = registry.methods()
    monkeypatch.setattr(registry, "methods", lambda: {**known, "toy": Toy})
    res = _plan(_config(tmp_path, [{"method": "pca", "dim": 4}, {"method": "toy", "dim": 2}]), "--rate", "1")
    assert res.exit_code == 0, res.output
    [toy] = [f for f in _fits(res.output) if f["model"].startswith("toy")]
    assert toy["estimate"] == "unknown"
    assert "and 1 fit(s) of unknown cost" in res.output


def test_a_bad_config_is_one_line_and_exit_2(tmp_path):
    res = _plan(_config(tmp_path, [{"method": "ncmml", "dim": 4, "lr": -1.0}]))
    assert res.exit_code == 2
    assert res.output.count("\n") == 1 and res.output.startswith("error: ") and "lr" in res.output
    assert not (tmp_path / "store").exists()


@pytest.mark.integration
def test_a_run_prints_its_plan_before_any_work_then_the_dashboard_link(client, tmp_path):
    cfg = _config(tmp_path, [{"method": "pca", "dim": 4}, {"method": "ncmml", "dim": 4, "iters": 20}])
    logs = []
    run_pipeline(parse_config(yaml.safe_load(open(cfg)), where=cfg), client=client, log=logs.append)
    first = next(i for i, m in enumerate(logs) if m.startswith("Plan: "))
    dashboard = next(i for i, m in enumerate(logs) if m.startswith("Dashboard: "))
    stage = logs.index("[1/7] stage ...") if "[1/7] stage ..." in logs else logs.index("[1/6] stage ...")
    assert first < dashboard < stage
    assert any(m.startswith("  methods[1] ncmml-4-iters20: 5 candidates") for m in logs[first:dashboard])
