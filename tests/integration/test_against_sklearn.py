"""Whole runs compared with scikit-learn computations of the same protocol."""
import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from metricpipe.config import parse_config
from metricpipe.sources import open_source
from tests.integration.helpers import fashion_root, record, run, sklearn_pca_protocol

pytestmark = pytest.mark.integration

EVAL = {"retrieval": {"k": [1, 10]}, "classification": {"classifiers": ["knn1"]}}


def test_digits_pca_matches_sklearn(client, tmp_path):
    m = run({"store": str(tmp_path), "data": {"source": "digits", "split": {"test": 0.2, "seed": 0, "val": 0}},
             "methods": [{"method": "pca", "dim": 32}], "evaluate": EVAL}, client)
    X, y = load_digits(return_X_y=True)
    tr, te = train_test_split(np.arange(len(y)), test_size=0.2, stratify=y, random_state=0)
    ref_map, ref_err = sklearn_pca_protocol(X[tr], y[tr], X[te], y[te], 32)
    assert abs(record(m["records"], "pca", 32, "map") - ref_map) < 0.005
    assert abs(record(m["records"], "pca", 32, "top1_error", "knn1") - ref_err) < 0.005


def _fashion_arrays():
    src = open_source(parse_config({"data": {"source": "fashion-mnist", "root": str(fashion_root())}}).data)
    return src.reader.read(0, src.reader.shape[0]).astype(np.float32), src.labels, src.split


def test_fashion_mnist_subset_pca_matches_sklearn(client, tmp_path):
    """Real data through the npz path with a split column: 6,000 train / 1,500 test images."""
    X, y, split = _fashion_arrays()
    idx = np.r_[0:6000, 60000:61500]
    X, y, split = X[idx] / 255.0, y[idx], split[idx]
    np.savez(tmp_path / "fm.npz", X=X, y=y, split=split)
    m = run({"store": str(tmp_path / "s"), "data": {"path": str(tmp_path / "fm.npz"), "split": {"column": "split", "val": 0},
                                                  "chunk_mb": 5},
             "methods": [{"method": "pca", "dim": 32}], "evaluate": EVAL}, client)
    tr, te = split == "train", split == "test"
    ref_map, ref_err = sklearn_pca_protocol(X[tr], y[tr], X[te], y[te], 32)
    assert abs(record(m["records"], "pca", 32, "map") - ref_map) < 0.005
    assert abs(record(m["records"], "pca", 32, "top1_error", "knn1") - ref_err) < 0.005


@pytest.mark.slow
def test_full_fashion_mnist_example_matches_sklearn(tmp_path):
    """The acceptance run: examples/fashion-mnist.yaml on all 70k images, timed, against scikit-learn."""
    import time

    from metricpipe.config import load_config
    from metricpipe.runner import run_pipeline
    from pathlib import Path
    import json

    cfg = load_config(Path(__file__).parents[2] / "examples/fashion-mnist.yaml")
    cfg = cfg.with_overrides(store=str(tmp_path), dashboard=":0",
                             data=cfg.data.__class__(**{**cfg.data.__dict__, "root": str(fashion_root())}))
    t0 = time.perf_counter()
    m = json.loads(Path(run_pipeline(cfg, log=print)).with_name("metrics.json").read_text())
    seconds = time.perf_counter() - t0
    X, y, split = _fashion_arrays()
    X /= np.linalg.norm(X, axis=1, keepdims=True)  # the example's l2 normalisation
    tr, te = split == "train", split == "test"
    ref_map, ref_err = sklearn_pca_protocol(X[tr], y[tr], X[te], y[te], 32)
    ours_map = record(m["records"], "pca", 32, "map")
    ours_err = record(m["records"], "pca", 32, "top1_error", "knn1")
    print(f"\nfashion-mnist run {seconds:.1f} s; PCA-32 mAP {ours_map:.4f} vs sklearn {ref_map:.4f}; "
          f"kNN-1 error {ours_err:.4f} vs sklearn {ref_err:.4f}")
    assert abs(ours_map - ref_map) < 0.005 and abs(ours_err - ref_err) < 0.005


def test_digits_accuracy_metrics_match_the_pml_definitions(client, tmp_path):
    """map@r, r_precision, precision@1 and mrr of the evaluate stage (test queries the rest of test)
    equal the AccuracyCalculator's definitions on the same codes: identity codes are digits' integer
    pixels, so distances tie exactly and the order of tied rows matters."""
    from tests.pml_reference import pml_accuracy

    m = run({"store": str(tmp_path), "data": {"source": "digits", "split": {"test": 0.2, "seed": 0, "val": 0}},
             "methods": [{"method": "identity"}], "evaluate": EVAL}, client)
    X, y = load_digits(return_X_y=True)
    _, te = train_test_split(np.arange(len(y)), test_size=0.2, stratify=y, random_state=0)
    te = np.sort(te)
    ref = pml_accuracy(X[te].astype(np.float32), y[te])
    for name in ("map@r", "r_precision", "precision@1", "mrr"):
        assert record(m["records"], "identity", 64, name) == pytest.approx(ref[name], abs=1e-9), name
    assert 0.5 < record(m["records"], "identity", 64, "nmi") <= 1
    assert 0.5 < record(m["records"], "identity", 64, "ami") <= 1
