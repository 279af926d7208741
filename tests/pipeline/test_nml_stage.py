"""NML and linear ML through the pipeline: pairs from labels or from the user take one code path."""
import numpy as np
import pytest

from metricpipe.config import parse_config
from metricpipe.nml_train import check_pairs, sample_pairs
from metricpipe.stages import _load_model, run_encode, run_train
from metricpipe.storage import Store, open_array
from metricpipe.tasks import nml
from metricpipe.tasks.errors import InputError
from tests.conftest import make_blobs, staged


def _data(tmp_path):
    X, y = make_blobs(n=500, d=10, classes=4, sep=1.0, seed=2)
    X = np.abs(X)
    np.savez(tmp_path / "d.npz", X=X, y=y)
    return X, y


def test_sampled_pairs_are_balanced_train_pairs_with_correct_labels():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 5, 1000)
    split = (rng.random(1000) < 0.2).astype(np.int8)  # 1 = test
    i, j, y = sample_pairs(labels, split, 4000, seed=3)
    assert (split[i] == 0).all() and (split[j] == 0).all() and (i != j).all()
    assert np.array_equal(y == 1, labels[i] == labels[j])
    assert abs((y == 1).mean() - 0.5) < 0.01
    assert all(np.array_equal(a, b) for a, b in zip((i, j, y), sample_pairs(labels, split, 4000, seed=3)))


@pytest.mark.parametrize("i,j,y,match", [
    ([0, 1], [2, 3], [1], "equal, non-zero length"),
    ([0, 99], [2, 3], [1, -1], "index i=99 is out of range"),
    ([0, 1], [2, 5], [1, -1], "uses row 5, which is not in the train split"),
    ([0, 1], [2, 3], [1, 0], "must be \\+1 \\(similar\\) or -1"),
    ([0.0, 1.0], [2, 3], [1, -1], "'i' must hold integer row indices"),
])
def test_bad_user_pairs_are_refused(i, j, y, match):
    split = np.zeros(10, np.int8)
    split[5] = 1
    with pytest.raises(InputError, match=match):
        check_pairs(np.array(i), np.array(j), np.array(y), split, "pairs.npz")


def test_nml_and_linear_ml_train_encode_and_match_their_definitions(client, tmp_path):
    X, y = _data(tmp_path)
    ctx, data, stats = staged(client, tmp_path / "s", {
        "data": {"path": str(tmp_path / "d.npz"), "chunk_mb": 0.005},
        "methods": [{"method": "nml", "dim": 3, "pairs": 2000, "iters": 4000, "lr": 30.0, "optimizer": "sgd"},
                    {"method": "linear-ml", "dim": 3, "pairs": 2000, "iters": 4000}]})
    assert len(data.chunks) > 3
    models = run_train(ctx, data, stats, None)
    codes = run_encode(ctx, data, models)
    for (spec, unit), (_, cunit, dim) in zip(models, codes):
        meta = unit.meta()
        m = _load_model(unit.url)
        Z = open_array(f"{cunit.url}/codes")[:]
        hist = __import__("metricpipe.storage", fromlist=["load_arrays"]).load_arrays(unit.url)[1]["fit_meta"]
        assert 1900 < hist["pairs"] <= 2000 and hist["pair_source"] == "labels"
        split, lab = open_array(f"{data.url}/split")[:], open_array(f"{data.url}/label")[:]
        i, j, yy = sample_pairs(lab, split, 2000, 0)
        Xs = open_array(f"{data.url}/features")[:].astype(np.float64)
        if spec["method"] == "nml":  # the objective (Eq. 9) over the training pairs falls from the start
            X1 = X / X.sum(1, keepdims=True)
            L = open_array(f"{unit.url}/L")[:]
            L0 = np.random.default_rng([0, 19]).uniform(-0.5, 0.5, L.shape)
            f = lambda M: nml.nml_loss_and_gradient(M, X1[i], X1[j], yy.astype(float), 0.1, 0.02)[0]  # noqa: E731
        else:
            L, L0 = m.W.T.astype(np.float64), stats_pca(stats, 3)
            f = lambda M: nml.linear_loss_and_gradient(M, Xs[i], Xs[j], yy.astype(float), 1.0, 0.2)[0]  # noqa: E731
        assert f(L) < 0.9 * f(L0)
        if spec["method"] == "nml":  # Eq. 7 on l1-normalised rows
            np.testing.assert_allclose(Z, nml.chi2_kernel(X1, L.astype(np.float64)), rtol=1e-4, atol=1e-6)
        else:
            np.testing.assert_allclose(Z, X @ m.W, rtol=1e-4, atol=1e-5)
        assert meta["samples_per_second"] > 0 and dim == 3


def stats_pca(stats, d):
    from metricpipe.storage import load_arrays
    return load_arrays(stats.url)[0]["pca_components"][:d]


def test_negative_features_are_a_one_line_error_for_nml(client, tmp_path):
    X, y = make_blobs(n=200, d=6, classes=2, seed=1)
    np.savez(tmp_path / "neg.npz", X=X, y=y)
    ctx, data, stats = staged(client, tmp_path / "s", {"data": {"path": str(tmp_path / "neg.npz")},
                                                       "methods": [{"method": "nml", "dim": 2, "pairs": 100,
                                                                    "iters": 100}]})
    with pytest.raises(InputError, match="needs non-negative features"):
        run_train(ctx, data, stats, None)


def test_user_pairs_and_label_pairs_take_the_same_code_path(client, tmp_path):
    """The same pairs given by the user give the same model as when sampled from the labels."""
    X, y = _data(tmp_path)
    spec = {"method": "nml", "dim": 2, "pairs": 1000, "iters": 1500, "lr": 0.01}  # the default optimizer, Adam
    out = {}
    for name, extra in (("labels", {}), ("user", {"pairs": str(tmp_path / "pairs.npz")})):
        ctx, data, stats = staged(client, tmp_path / name, {
            "data": {"path": str(tmp_path / "d.npz"), "chunk_mb": 0.005, **extra}, "methods": [spec]})
        if name == "labels":  # the user hands in exactly the pairs the labels would give
            i, j, yy = sample_pairs(open_array(f"{data.url}/label")[:], open_array(f"{data.url}/split")[:], 1000, 0)
            np.savez(tmp_path / "pairs.npz", i=i, j=j, y=yy)
        [(_, unit)] = run_train(ctx, data, stats, None)
        out[name] = (open_array(f"{unit.url}/L")[:], unit.meta())
    assert np.array_equal(out["labels"][0], out["user"][0])


def test_bad_pairs_file_is_refused_at_staging(tmp_path):
    from metricpipe.stages import prepare_data
    _data(tmp_path)
    np.savez(tmp_path / "p.npz", i=np.array([0, 1]), j=np.array([2, 10_000]), y=np.array([1, -1]))
    cfg = parse_config({"data": {"path": str(tmp_path / "d.npz"), "pairs": str(tmp_path / "p.npz")}})
    with pytest.raises(InputError, match=r"p.npz \(data.pairs\): pair index j=10000 is out of range"):
        prepare_data(cfg, Store(str(tmp_path / "s")))


def test_pairs_file_that_is_not_an_npz_is_a_one_line_error(tmp_path):
    from metricpipe.stages import prepare_data
    _data(tmp_path)
    np.save(tmp_path / "p.npy", np.zeros(3))
    cfg = parse_config({"data": {"path": str(tmp_path / "d.npz"), "pairs": str(tmp_path / "p.npy")}})
    with pytest.raises(InputError, match=r"p.npy: data.pairs must be an .npz file with arrays i, j, y"):
        prepare_data(cfg, Store(str(tmp_path / "s")))


def test_nml_encoder_refuses_negative_features():
    with pytest.raises(InputError, match="needs non-negative features"):
        nml.ChiEmbedding(np.ones((2, 3))).transform(np.array([[0.1, -0.2, 0.3]]))
