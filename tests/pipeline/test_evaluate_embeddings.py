"""``metricpipe.evaluate_embeddings``: the evaluate stage's metrics of codes in memory (NumPy, no Dask),
equal to a run's records on the same codes; bad input refused in one line."""

import numpy as np
import pytest

import metricpipe
from metricpipe.tasks.errors import InputError
from tests.conftest import make_blobs, staged


def _values(records):
    return {(r["metric"], r["classifier"]): r["value"] for r in records}


@pytest.mark.integration
@pytest.mark.parametrize("method", [{"method": "identity"}, {"method": "pca", "dim": 3}])
def test_equals_the_evaluate_stage_s_records_on_the_same_codes(client, tmp_path, method):
    from metricpipe.stages import run_encode, run_evaluate, run_train
    from metricpipe.stages.common import TEST, TRAIN
    from metricpipe.store import open_array

    X, y = make_blobs(n=700, d=6, classes=5, sep=1.0, seed=4)  # classes overlap: errors are not 0
    np.savez(tmp_path / "d.npz", X=X, y=np.array(["ant", "bee", "cat", "dog", "eel"])[y])  # string labels
    ev = {"retrieval": {"k": [1, 5, 50]}, "classification": {"classifiers": ["knn1", "knn5", "ncm"]}}
    raw = {"data": {"path": str(tmp_path / "d.npz"), "chunk_mb": 0.003}, "methods": [method], "evaluate": ev}
    ctx, data, stats = staged(client, tmp_path / "s", raw)
    codes = run_encode(ctx, data, run_train(ctx, data, stats, None))
    [(_, unit)] = run_evaluate(ctx, data, codes)
    stage = _values(
        r for r in unit.read_json("records.json") if r["metric"] not in ("flops_per_image", "nnz", "storage_bytes")
    )
    Z = open_array(f"{codes[0][1].url}/codes")[:]
    split, labels = open_array(f"{data.url}/split")[:], np.asarray(data.classes)[data.labels]
    got = metricpipe.evaluate_embeddings(
        Z[split == TEST], labels[split == TEST], Z[split == TRAIN], labels[split == TRAIN],
        k=(1, 5, 50), classifiers=("knn1", "knn5", "ncm"), seed=ctx.config.seed,
    )  # fmt: skip
    assert len(stage) == 19 and set(_values(got)) == set(stage)
    for key, value in stage.items():
        assert _values(got)[key] == pytest.approx(value, abs=1e-12), key


def test_retrieval_alone_and_the_records_form():
    X, y = make_blobs(n=120, d=4, classes=3, seed=1)
    recs = metricpipe.evaluate_embeddings(X, y, k=(1, 10))
    assert {r["classifier"] for r in recs} == {None}
    assert [r["metric"] for r in recs][:5] == ["map", "mprec@1", "recall@1", "mprec@10", "recall@10"]
    assert all(r["method"] == "embeddings" and r["dim"] == 4 and r["params"] == {} for r in recs)
    assert _values(recs)[("map", None)] > 0.9  # well separated blobs
    assert metricpipe.evaluate_embeddings(X, y, k=(1,), metric="inner")[0]["params"] == {"score": "inner"}
    assert "evaluate_embeddings" in metricpipe.__all__


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((np.ones((5, 2)), np.zeros(4)), {}, r"y: labels of shape \(4,\) for 5 rows"),
        ((np.ones(5), np.zeros(5)), {}, r"X: got an array of shape \(5,\)"),
        (
            (np.array([[0.0, np.nan], [1, 1], [2, 2]]), np.zeros(3)),
            {},
            r"X: 1 row\(s\) hold NaN or inf \(first: row 0\)",
        ),
        (
            (np.ones((5, 2)), np.zeros(5)),
            {"classifiers": ("knn1",)},
            r"need the train rows .* give X_train and y_train",
        ),
        ((np.ones((5, 2)), np.zeros(5), np.ones((5, 3)), np.zeros(5)), {}, r"X_train: 3 dimensions, X 2"),
        (
            (np.ones((5, 2)), np.zeros(5), np.ones((5, 2)), np.zeros(5)),
            {"classifiers": ("softvote5",)},
            r"'softvote5' is not",
        ),
        ((np.ones((5, 2)), np.zeros(5), np.ones((5, 2))), {}, r"X_train and y_train: give both"),
        ((np.ones((5, 2)), np.zeros(5)), {"metric": "cosine"}, r"metric: got 'cosine'; use 'euclidean' or 'inner'"),
    ],
)
def test_bad_input_is_refused_in_one_line(args, kwargs, match):
    with pytest.raises(InputError, match=match):
        metricpipe.evaluate_embeddings(*args, **kwargs)
