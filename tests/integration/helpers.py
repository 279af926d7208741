"""Reference computations with scikit-learn and helpers shared by the integration tests."""

import json
import os
from pathlib import Path

import numpy as np
from sklearn.decomposition import PCA
from sklearn.metrics import average_precision_score
from sklearn.neighbors import KNeighborsClassifier

from metricpipe.config import parse_config
from metricpipe.runner import run_pipeline


def sklearn_pca_protocol(Xtr, ytr, Xte, yte, dim):
    """PCA-dim retrieval mAP (test queries the rest of test) and kNN-1 top-1 error (train = database)."""
    pca = PCA(n_components=dim, svd_solver="full").fit(Xtr.astype(np.float64))
    Ztr, Zte = pca.transform(Xtr), pca.transform(Xte)
    sq = (Zte**2).sum(1)
    aps = []
    for a in range(0, len(Zte), 1000):
        d = sq[a : a + 1000, None] + sq[None, :] - 2 * Zte[a : a + 1000] @ Zte.T
        for i, row in enumerate(d):
            q = a + i
            keep = np.arange(len(Zte)) != q
            aps.append(average_precision_score(yte[keep] == yte[q], -row[keep]))
    err = 1.0 - KNeighborsClassifier(n_neighbors=1, algorithm="brute").fit(Ztr, ytr).score(Zte, yte)
    return float(np.mean(aps)), float(err)


def record(records, method, dim, metric, classifier=None):
    hits = [
        r["value"]
        for r in records
        if r["method"] == method and r["dim"] == dim and r["metric"] == metric and r["classifier"] == classifier
    ]
    assert len(hits) == 1, (method, dim, metric, classifier, hits)
    return hits[0]


def run(raw: dict, client=None, **kw) -> dict:
    path = run_pipeline(parse_config(raw), client=client, log=lambda m: None, **kw)
    return json.loads(Path(path).with_name("metrics.json").read_text())


def fashion_root() -> Path:
    """Fashion-MNIST for tests: $METRICPIPE_DATA, else the shared folder beside the checkout."""
    for p in (
        os.environ.get("METRICPIPE_DATA"),
        Path(__file__).parents[3] / "shared/data/fashion-mnist",
        "/usr/share/datasets/fashion-mnist",
    ):
        if p and Path(p, "train-images-idx3-ubyte.gz").exists():
            return Path(p)
    raise AssertionError("Fashion-MNIST not found: set METRICPIPE_DATA to a folder with its IDX files")


def run_results(url) -> tuple:
    """(metric records, {model spec: arrays}) of the last run in the store at ``url`` (a path or URL)."""
    from metricpipe.store import Store, load_arrays

    st = Store(str(url))
    models = {}
    for rel in st.read_json("runs/latest.json")["units"]["models"]:
        arrays, attrs = load_arrays(st.path(rel))
        models[json.dumps(attrs["spec"], sort_keys=True)] = arrays
    return portable_records(st.read_json("report/metrics.json")["records"]), models


def portable_records(records: list) -> list:
    """Records without the model key, which hashes the inputs' identity (a copy of the data at another
    path is other inputs), so that runs on copies of the data compare."""
    return [{k: v for k, v in r.items() if k != "model"} for r in records]


def assert_same_results(a, b) -> None:
    """Two runs' :func:`run_results` agree exactly: every metric and every model array."""
    assert a[0] == b[0]  # every metric, exactly
    assert a[1].keys() == b[1].keys()
    for spec, arrays in a[1].items():
        for name, value in arrays.items():
            np.testing.assert_array_equal(value, b[1][spec][name], err_msg=f"{spec} {name}")
