"""Stored models load as fitted estimators that reproduce the stored codes from raw features."""
import numpy as np
import pytest
from click.testing import CliRunner

import metricpipe
from metricpipe.cli import main
from metricpipe.stages import run_encode, run_train
from metricpipe.storage import open_array
from metricpipe.tasks.errors import InputError
from tests.conftest import make_blobs, staged

METHODS = [{"method": "identity"}, {"method": "pca", "dim": 4}, {"method": "lda"},  # fixed: no selection
           {"method": "ncmml", "dim": 4, "iters": 30, "batch": 50, "validate_every": 10, "validation": 50, "select": False},
           {"method": "slne", "dim": 3, "input_dim": 6, "epochs": 1, "select": False},
           {"method": "sparse", "dim": 3, "sparsity": 0.5, "train_size": 100, "max_iter": 3, "queries": 10,
            "select": False},
           {"method": "nml", "dim": 3, "pairs": 500, "iters": 1000, "select": False},
           {"method": "slem", "lam": 0.1, "negatives": {"count": 100}}]


@pytest.fixture(scope="module")
def stored(client, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("models")
    X, y = make_blobs(n=500, d=10, classes=4, sep=1.0, seed=2)
    X = np.abs(X) * 3.0                     # raw features, non-negative (NML), far from unit norm
    np.savez(tmp / "d.npz", X=X, y=y)
    raw = {"data": {"path": str(tmp / "d.npz"), "chunk_mb": 0.002, "normalize": "l2"}, "methods": METHODS,
           "neighbours": {"k": 5}}
    ctx, data, stats = staged(client, tmp / "s", raw)
    from metricpipe.stages import run_neighbours
    graph = run_neighbours(ctx, data)
    models = run_train(ctx, data, stats, graph)
    codes = run_encode(ctx, data, models)
    return ctx, data, X, models, codes


def test_load_model_reproduces_the_stored_codes_from_raw_features(stored):
    ctx, data, X, models, codes = stored
    assert len(data.chunks) > 5
    for (spec, unit), (_, cunit, dim) in zip(models, codes):
        est = metricpipe.load_model(ctx.store.url, unit.key)
        assert est.steps[0][0] == "normalize" and type(est[-1]).method == spec["method"]
        stored_codes = open_array(f"{cunit.url}/codes")[:]
        mine = np.concatenate([est.transform(X[a:b]) for a, b in data.chunks])   # the encode stage's blocks
        np.testing.assert_array_equal(mine, stored_codes, err_msg=spec["method"])
        assert mine.shape[1] == dim


def test_load_model_by_key_prefix_and_its_errors(stored):
    ctx, _, X, models, _ = stored
    key = models[1][1].key
    assert metricpipe.load_model(ctx.store.url, key[:6])[-1].get_params()["dim"] == 4
    with pytest.raises(InputError, match="no committed model 'zzz'"):
        metricpipe.load_model(ctx.store.url, "zzz")
    with pytest.raises(InputError, match="matches 8 models"):
        metricpipe.load_model(ctx.store.url, "")


def test_models_command_lists_every_model_with_its_method_and_parameters(stored):
    ctx, _, _, models, _ = stored
    res = CliRunner().invoke(main, ["models", ctx.store.url])
    assert res.exit_code == 0, res.output
    header, *lines = res.output.strip().splitlines()
    assert header.split()[:3] == ["key", "method", "codes"] and len(lines) == len(models)
    for spec, unit in models:
        [line] = [ln for ln in lines if ln.startswith(unit.key)]
        assert f" {spec['method']} " in line
    assert any("input_dim=6" in ln and " slne " in ln for ln in lines)


def test_a_loaded_classifier_predicts_the_data_s_own_labels(client, tmp_path):
    """Class names of any type (here strings) come back from predict, not the stored class codes."""
    X, y = make_blobs(n=300, d=6, classes=3, sep=3.0, seed=1)
    names = np.array(["ant", "bee", "cat"])[y]
    np.savez(tmp_path / "d.npz", X=X, y=names)
    ctx, data, stats = staged(client, tmp_path / "s", {
        "data": {"path": str(tmp_path / "d.npz"), "chunk_mb": 0.002},
        "methods": [{"method": "ncmml", "dim": 3, "iters": 20, "batch": 50, "validate_every": 10, "validation": 30,
                     "lr": 0.1}]})
    [(_, unit)] = run_train(ctx, data, stats, None)
    est = metricpipe.load_model(ctx.store.url, unit.key)
    assert list(est.classes_) == ["ant", "bee", "cat"]
    assert set(est.predict(X)) <= {"ant", "bee", "cat"} and est.score(X, names) > 0.9


def test_a_model_stored_before_estimators_is_a_one_line_error(tmp_path):
    from metricpipe.storage import load_estimator, save_arrays
    save_arrays(str(tmp_path / "old"), {"W": np.eye(3, dtype=np.float32)}, {"spec": {"method": "pca"}, "dim": 3})
    with pytest.raises(InputError, match="stored by metricpipe before 0.2.*rerun its config"):
        load_estimator(str(tmp_path / "old"))
