"""Issue #3's acceptance on full Fashion-MNIST (slow): SL-NE's soft vote beats Euclidean kNN's best
by at least a point on the same 50-neighbourhood, and SL-DE (8 x 64 PCA blocks) is within 1.5 points."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from metricpipe.config import load_config
from metricpipe.runner import run_pipeline
from tests.integration.helpers import fashion_root

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_slne_and_slde_on_fashion_mnist(tmp_path):
    cfg = load_config(Path(__file__).parents[2] / "examples/fashion-mnist-slde.yaml")
    cfg = cfg.with_overrides(store=str(tmp_path), dashboard=":0", data=replace(cfg.data, root=str(fashion_root())))
    records = json.loads(Path(run_pipeline(cfg, log=print)).with_name("metrics.json").read_text())["records"]

    def best(method, prefix):
        return min(
            r["value"]
            for r in records
            if r["method"] == method
            and r["metric"] == "top1_error"
            and (r["classifier"] or "").startswith(prefix)
            and r["params"].get("view", "codes") == "codes"
        )

    euclid, slne, slde = best("identity", "knn"), best("slne", "softvote"), best("slde", "softvote")
    print(f"\nEuclidean kNN best {euclid:.4f}; SL-NE soft vote {slne:.4f}; SL-DE soft vote {slde:.4f}")
    assert slne <= euclid - 0.01
    assert slde <= slne + 0.015
