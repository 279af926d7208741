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
    m = run(
        {
            "store": str(tmp_path),
            "data": {"source": "digits", "split": {"test": 0.2, "seed": 0, "val": 0}},
            "methods": [{"method": "pca", "dim": 32}],
            "evaluate": EVAL,
        },
        client,
    )
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
    m = run(
        {
            "store": str(tmp_path / "s"),
            "data": {"path": str(tmp_path / "fm.npz"), "split": {"column": "split", "val": 0}, "chunk_mb": 5},
            "methods": [{"method": "pca", "dim": 32}],
            "evaluate": EVAL,
        },
        client,
    )
    tr, te = split == "train", split == "test"
    ref_map, ref_err = sklearn_pca_protocol(X[tr], y[tr], X[te], y[te], 32)
    assert abs(record(m["records"], "pca", 32, "map") - ref_map) < 0.005
    assert abs(record(m["records"], "pca", 32, "top1_error", "knn1") - ref_err) < 0.005


@pytest.mark.slow
def test_full_fashion_mnist_example_matches_sklearn(tmp_path):
    """The acceptance run: examples/fashion-mnist.yaml on all 70k images, timed, against scikit-learn."""
    import json
    import time
    from pathlib import Path

    from metricpipe.config import load_config
    from metricpipe.runner import run_pipeline

    cfg = load_config(Path(__file__).parents[2] / "examples/fashion-mnist.yaml")
    cfg = cfg.with_overrides(
        store=str(tmp_path),
        dashboard=":0",
        data=cfg.data.__class__(**{**cfg.data.__dict__, "root": str(fashion_root())}),
    )
    t0 = time.perf_counter()
    m = json.loads(Path(run_pipeline(cfg, log=print)).with_name("metrics.json").read_text())
    seconds = time.perf_counter() - t0
    X, y, split = _fashion_arrays()
    X /= np.linalg.norm(X, axis=1, keepdims=True)  # the example's l2 normalisation
    tr, te = split == "train", split == "test"
    ref_map, ref_err = sklearn_pca_protocol(X[tr], y[tr], X[te], y[te], 32)
    ours_map = record(m["records"], "pca", 32, "map")
    ours_err = record(m["records"], "pca", 32, "top1_error", "knn1")
    print(
        f"\nfashion-mnist run {seconds:.1f} s; PCA-32 mAP {ours_map:.4f} vs sklearn {ref_map:.4f}; "
        f"kNN-1 error {ours_err:.4f} vs sklearn {ref_err:.4f}"
    )
    assert abs(ours_map - ref_map) < 0.005 and abs(ours_err - ref_err) < 0.005


def test_digits_accuracy_metrics_match_the_pml_definitions(client, tmp_path):
    """map@r, r_precision, precision@1 and mrr of the evaluate stage (test queries the rest of test)
    equal the AccuracyCalculator's definitions on the same codes: identity codes are digits' integer
    pixels, so distances tie exactly and the order of tied rows matters."""
    from tests.pml_reference import pml_accuracy

    m = run(
        {
            "store": str(tmp_path),
            "data": {"source": "digits", "split": {"test": 0.2, "seed": 0, "val": 0}},
            "methods": [{"method": "identity"}],
            "evaluate": EVAL,
        },
        client,
    )
    X, y = load_digits(return_X_y=True)
    _, te = train_test_split(np.arange(len(y)), test_size=0.2, stratify=y, random_state=0)
    te = np.sort(te)
    ref = pml_accuracy(X[te].astype(np.float32), y[te])
    for name in ("map@r", "r_precision", "precision@1", "mrr"):
        assert record(m["records"], "identity", 64, name) == pytest.approx(ref[name], abs=1e-9), name
    assert 0.5 < record(m["records"], "identity", 64, "nmi") <= 1
    assert 0.5 < record(m["records"], "identity", 64, "ami") <= 1


# ---- val: auto borrows, so the user's train split is every baseline's and every database's -----------


def _knn_reference(Ztr, ytr, Zte, k):
    """Brute force in float64 with the documented rule: neighbours by (distance, train row), the most
    votes among the k nearest, a tie to the class whose nearest member is closer, then the lower code."""
    d = (Zte**2).sum(1)[:, None] + (Ztr**2).sum(1)[None] - 2 * Zte @ Ztr.T
    order = np.lexsort((np.broadcast_to(np.arange(len(Ztr)), d.shape), d), axis=1)[:, :k]
    out = []
    for row in ytr[order]:
        classes = list(dict.fromkeys(row))  # in order of their nearest member
        votes = [np.sum(row == c) for c in classes]
        out.append(max(zip(votes, [-i for i in range(len(classes))], classes))[2])
    return np.array(out)


def _users_split_matches_sklearn(client, tmp_path, X, y, split, scale):
    from sklearn.decomposition import PCA
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
    from sklearn.metrics import average_precision_score
    from sklearn.neighbors import KNeighborsClassifier, NearestCentroid

    np.savez(tmp_path / "d.npz", X=X, y=y, split=split)
    m = run(
        {
            "store": str(tmp_path / "s"),
            "data": {"path": str(tmp_path / "d.npz"), "split": {"column": "split"}},
            "methods": [
                {"method": "identity"},
                {"method": "pca", "dim": 32},
                {"method": "lda"},
                {"method": "ncmml", "dim": 8, "iters": 100, "validate_every": 50, "select": {"lr": [3.0, 30.0]}},
            ],
            "evaluate": {"retrieval": {"k": [10]}, "classification": {"classifiers": ["knn1", "knn10", "ncm"]}},
        },
        client,
    )
    assert m["selection"], "the run borrowed validation rows for its selection"
    tr, te = split == "train", split == "test"
    X64 = X.astype(np.float64) * scale
    lda = LinearDiscriminantAnalysis().fit(X64[tr], y[tr])
    codes = {
        ("identity", 64 if X.shape[1] == 64 else X.shape[1]): (X64[tr], X64[te]),
        ("pca", 32): tuple(PCA(32, svd_solver="full").fit(X64[tr]).transform(X64[s]) for s in (tr, te)),
        ("lda", len(np.unique(y)) - 1): (lda.transform(X64[tr]), lda.transform(X64[te])),
    }
    for (method, dim), (Ztr, Zte) in codes.items():
        knn1 = 1 - KNeighborsClassifier(1, algorithm="brute").fit(Ztr, y[tr]).score(Zte, y[te])
        ncm = 1 - NearestCentroid().fit(Ztr, y[tr]).score(Zte, y[te])
        knn10 = np.mean(_knn_reference(Ztr, y[tr], Zte, 10) != y[te])
        for name, ref in (("knn1", knn1), ("ncm", ncm), ("knn10", knn10)):
            assert record(m["records"], method, dim, "top1_error", name) == pytest.approx(ref, abs=1e-4), (method, name)
    Zte = X64[te]
    sq = (Zte**2).sum(1)
    aps = [
        average_precision_score(np.delete(y[te] == y[te][q], q), -np.delete(sq + sq[q] - 2 * Zte @ Zte[q], q))
        for q in range(len(Zte))
    ]
    assert record(m["records"], "identity", X.shape[1], "map") == pytest.approx(np.mean(aps), abs=1e-4)


def test_digits_with_val_auto_scores_every_baseline_as_scikit_learn_does_on_the_users_split(client, tmp_path):
    X, y = load_digits(return_X_y=True)
    split = np.where(np.arange(len(y)) % 5 == 0, "test", "train")
    _users_split_matches_sklearn(client, tmp_path, X.astype(np.float32), y, split, 1.0)


def test_fashion_subset_with_val_auto_scores_every_baseline_as_scikit_learn_does(client, tmp_path):
    X, y, split = _fashion_arrays()
    idx = np.r_[0:3000, 60000:61000]
    _users_split_matches_sklearn(client, tmp_path, X[idx], y[idx], split[idx], 1.0)
