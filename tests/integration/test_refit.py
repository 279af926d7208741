"""Validation rows are borrowed, not taken: what the user called train is all of it for every final
model, and the chosen candidate is refitted on it."""

import numpy as np
import pytest
from sklearn.datasets import load_digits

from metricpipe.folds import Fold, fold_split
from metricpipe.store import Store, load_estimator
from metricpipe.tasks.splits import VAL
from tests.integration.helpers import run

pytestmark = pytest.mark.integration

NCMML = {"method": "ncmml", "dim": 16, "iters": 300, "validate_every": 50, "select": {"lr": [3.0, 30.0]}}


def _digits_with_a_split_column(tmp_path):
    X, y = load_digits(return_X_y=True)
    split = np.where(np.arange(len(y)) % 5 == 0, "test", "train")
    np.savez(tmp_path / "d.npz", X=X.astype(np.float32), y=y, split=split)
    return X.astype(np.float32), y, split


def _config(tmp_path, store, entry):
    return {
        "store": str(tmp_path / store),
        "data": {"path": str(tmp_path / "d.npz"), "split": {"column": "split"}},
        "methods": [{"method": "identity"}, entry],
        "evaluate": {"retrieval": False, "classification": {"classifiers": ["ncm"]}},
    }


def _models(store):
    st = Store(store)
    manifest = st.read_json("runs/latest.json")
    return (
        st,
        manifest,
        {
            st.unit(*rel.split("/")).meta()["spec"]["method"]: st.unit(*rel.split("/"))
            for rel in manifest["units"]["models"]
        },
    )


def test_the_chosen_candidate_is_refitted_on_every_train_row(client, tmp_path):
    X, y, split = _digits_with_a_split_column(tmp_path)
    run(_config(tmp_path, "s", NCMML), client)
    st, manifest, models = _models(str(tmp_path / "s"))
    final = models["ncmml"]
    chosen = st.unit("models", final.meta()["refit_of"])
    sel = st.unit(*manifest["units"]["selection"][0].split("/")).meta()
    assert sel["model"] == chosen.key  # the refit is of the selection's choice
    assert final.meta()["spec"]["early_stopping"] is False  # with the steps the choice kept
    assert final.meta()["spec"]["iters"] == chosen.meta()["best_iter"]
    train = split == "train"
    borrowed = fold_split(st.unit(*manifest["units"]["data"].split("/")).url, Fold(0)) == VAL
    assert borrowed.sum() > 100 and (train[borrowed]).all()  # borrowed from the user's train rows
    means = np.stack([X[train & (y == c)].mean(0) for c in range(10)])
    cand_means = np.stack([X[train & ~borrowed & (y == c)].mean(0) for c in range(10)])
    np.testing.assert_allclose(load_estimator(final.url).centroids_, means, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(load_estimator(chosen.url).centroids_, cand_means, rtol=1e-5, atol=1e-4)
    # the fits a refit replaced are the run's (gc keeps them): every candidate that trained
    assert manifest["units"]["validated"] == sorted(
        f"models/{c['model']}" for c in sel["candidates"] if c["score"] is not None
    )


def test_refit_false_keeps_the_chosen_candidate(client, tmp_path):
    _digits_with_a_split_column(tmp_path)
    run(_config(tmp_path, "s", {**NCMML, "select": {**NCMML["select"], "refit": False}}), client)
    st, manifest, models = _models(str(tmp_path / "s"))
    sel = st.unit(*manifest["units"]["selection"][0].split("/")).meta()
    assert models["ncmml"].key == sel["model"] and "refit_of" not in models["ncmml"].meta()


def test_a_model_that_stops_early_without_a_grid_is_refitted_too(client, tmp_path):
    X, y, split = _digits_with_a_split_column(tmp_path)
    run(_config(tmp_path, "s", {**NCMML, "lr": 3.0, "select": False}), client)
    st, manifest, models = _models(str(tmp_path / "s"))
    final = models["ncmml"]
    first = st.unit("models", final.meta()["refit_of"])
    assert manifest["units"]["validated"] == [first.rel] and not manifest["units"]["selection"]
    means = np.stack([X[(split == "train") & (y == c)].mean(0) for c in range(10)])
    np.testing.assert_allclose(load_estimator(final.url).centroids_, means, rtol=1e-5, atol=1e-4)


def test_export_of_the_train_split_holds_every_train_row(client, tmp_path):
    import faiss
    from click.testing import CliRunner

    from metricpipe.cli import main

    _, _, split = _digits_with_a_split_column(tmp_path)
    run(_config(tmp_path, "s", NCMML), client)
    _, _, models = _models(str(tmp_path / "s"))
    out = tmp_path / "train.faiss"
    r = CliRunner().invoke(
        main, ["export", str(tmp_path / "s"), "--model", models["ncmml"].key, "--faiss", str(out), "--split", "train"]
    )
    assert r.exit_code == 0, r.output
    assert faiss.read_index(str(out)).ntotal == int((split == "train").sum())


SPARSE = {"method": "sparse", "dim": 8, "sparsity": 0.5, "queries": 20, "max_iter": 20, "validation": 200}


@pytest.mark.parametrize("train_size", [300, 5000])
def test_a_learner_whose_subset_is_capped_keeps_its_validated_fit(client, tmp_path, train_size):
    """Sparse projectors draw train_size rows: when that caps the subset a refit would see no more rows,
    so the chosen candidate is the final model; else it is refitted with the kept iteration."""
    _digits_with_a_split_column(tmp_path)
    entry = {**SPARSE, "train_size": train_size, "select": {"anneal": [0.5, 0.0]}}
    run(_config(tmp_path, "s", entry), client)
    st, manifest, models = _models(str(tmp_path / "s"))
    sel = st.unit(*manifest["units"]["selection"][0].split("/")).meta()
    final = models["sparse"]
    if train_size == 300:
        assert final.key == sel["model"] and "refit_of" not in final.meta()
        assert final.rel not in manifest["units"]["validated"]
    else:
        assert final.meta()["refit_of"] == sel["model"]
        chosen = st.unit("models", sel["model"])
        assert final.meta()["spec"]["stop_iter"] == chosen.meta()["best_iter"]
        assert f"models/{sel['model']}" in manifest["units"]["validated"]
