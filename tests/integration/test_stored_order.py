"""Issue 17's acceptance: the same rows stored shuffled or sorted by class (the usual layout of
feature dumps) train the same SGD learners. The train stage feeds them pools of a shuffled copy of
the training rows, so batches mix classes whatever the source's order; before, batches came from
the row-block in hand and sorted input gave batches of one or two classes.

A Fashion-MNIST subset (8,000 images pooled to 14 x 14, cut into more than 5 row-blocks), with one
split column so that both orders hold the same train, validation and test rows."""

import numpy as np
import pytest

from tests.integration.helpers import fashion_root, run

# slow (about 90 s: two runs of four SGD learners on 8,000 images): the default run covers the same
# behaviour on small data: the shuffled copy's layout follows the rows' contents, not their stored order
# (tests/tasks/test_estimators_ncmml.py::test_row_keys_follow_content_and_layouts_follow_seeds), pools
# of class-sorted rows mix the classes (test_pools_of_class_sorted_rows_mix_the_classes, and
# test_estimators_nml.py::test_batches_mix_classes_when_the_rows_are_sorted_by_class), NCMML and k-NN ML
# learn the same model from either order (test_the_same_rows_stored_in_another_order_learn_the_same_model),
# and the pipeline feeds the learners exactly those pools (tests/pipeline/test_ncmml_stage.py and
# test_nml_stage.py: the pipeline learns what fit learns in memory).
pytestmark = [pytest.mark.integration, pytest.mark.slow]

METHODS = [
    {"method": "ncmml", "dim": 32, "iters": 400, "batch": 500, "validate_every": 50},
    {"method": "knnml", "dim": 32, "iters": 300, "validate_every": 50, "validation": 1000},
    {"method": "linear-ml", "dim": 16, "pairs": 50000, "iters": 200000, "lr": 3.0},
    {"method": "nml", "dim": 16, "pairs": 50000, "iters": 200000},
]


def _fashion(n_train=6000, n_val=1000, n_test=1000, seed=0):
    from metricpipe.config import parse_config
    from metricpipe.sources import open_source

    src = open_source(parse_config({"data": {"source": "fashion-mnist", "root": str(fashion_root())}}).data)
    rng = np.random.default_rng(seed)
    pick = np.concatenate(
        [
            rng.choice(np.flatnonzero(src.split == "train"), n_train + n_val, replace=False),
            rng.choice(np.flatnonzero(src.split == "test"), n_test, replace=False),
        ]
    )
    pick.sort()
    X = src.reader.read(0, src.reader.shape[0])[pick].reshape(-1, 28, 28).astype(np.float32)
    X = X.reshape(-1, 14, 2, 14, 2).mean(axis=(2, 4)).reshape(len(pick), 196)  # 2 x 2 mean pooling
    split = np.where(src.split[pick] == "test", "test", "train").astype("<U5")
    split[rng.choice(np.flatnonzero(split == "train"), n_val, replace=False)] = "val"
    return X, np.asarray(src.labels)[pick], split


def _values(records):
    out = {}
    for r in records:
        key = (r["method"], r["metric"], r["classifier"])
        if key in {
            ("ncmml", "top1_error", "ncm"),
            ("knnml", "top1_error", "knn1"),
            ("linear-ml", "map", None),
            ("nml", "map", None),
        }:
            out[key] = r["value"]
    return out


def test_stored_sorted_or_shuffled_the_sgd_learners_score_within_half_a_point(client, tmp_path):
    from metricpipe.store import chunk_rows_for

    X, y, split = _fashion()
    assert len(y) / chunk_rows_for(X.shape[1], 1.0) > 5  # more than five row-blocks
    orders = {"shuffled": np.random.default_rng(1).permutation(len(y)), "sorted": np.argsort(y, kind="stable")}
    got = {}
    for name, order in orders.items():
        np.savez(tmp_path / f"{name}.npz", X=X[order], y=y[order], split=split[order])
        raw = {
            "store": str(tmp_path / f"store-{name}"),
            "seed": 0,
            "data": {
                "path": str(tmp_path / f"{name}.npz"),
                "split": {"column": "split"},
                "normalize": "l2",
                "chunk_mb": 1.0,
            },
            "methods": METHODS,
            "evaluate": {"retrieval": {"k": [10]}, "classification": {"classifiers": ["knn1", "ncm"]}},
        }
        got[name] = _values(run(raw, client)["records"])
    assert len(got["sorted"]) == 4
    print({k: (got["shuffled"][k], got["sorted"][k]) for k in got["sorted"]})
    for key, value in got["sorted"].items():
        assert abs(value - got["shuffled"][key]) <= 0.005, (key, got["shuffled"][key], value)
