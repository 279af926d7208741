"""data.split.classes: the classes a run holds out get split codes of their own, so that no stage that
reads train (or val, or test) rows sees them: statistics, neighbours, the shuffled copy, every
learner, the borrowed validation rows."""
import numpy as np
import pytest

from metricpipe.config import parse_config
from metricpipe.folds import Fold, fold_split
from metricpipe.stages import prepare_data, run_neighbours, run_train
from metricpipe.storage import Store, load_arrays, load_estimator, open_array
from metricpipe.tasks.splits import TEST, TRAIN, UNSEEN_TEST, UNSEEN_TRAIN, VAL, hold_out
from tests.conftest import make_blobs, staged

pytestmark = pytest.mark.integration   # every test reads the stages run on the session's cluster

HELD = [1, 4]
SGD = {"dim": 4, "iters": 40, "batch": 100, "validate_every": 10, "validation": 100, "select": False}


def _raw(path, **split):
    return {"data": {"path": str(path), "chunk_mb": 0.005, "normalize": "l2", "split": split},
            "neighbours": {"k": 5},
            "methods": [{"method": "pca", "dim": 4}, {"method": "lda"}, {"method": "ncmml", **SGD},
                        {"method": "ncmml", **SGD, "objective": "dot", "lr": 1.0},
                        {"method": "ncmc", **SGD, "centroids": 2}, {"method": "knnml", **SGD, "batch": 60}],
            "evaluate": {"classification": {"classifiers": ["knn1"]}}}


@pytest.fixture(scope="module")
def trained(client, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("held")
    X, y = make_blobs(n=900, d=12, classes=6, sep=0.9, seed=3)
    np.savez(tmp / "d.npz", X=X, y=y)
    ctx, data, stats = staged(client, tmp / "s", _raw(tmp / "d.npz", classes=HELD))
    assert len(data.chunks) > 5
    graph = run_neighbours(ctx, data)
    models = run_train(ctx, data, stats, graph)
    return tmp, ctx, data, stats, graph, models


def test_held_out_rows_are_the_user_split_s_rows_recoded(trained):
    tmp, ctx, data, *_ = trained
    plain = prepare_data(parse_config(_raw(tmp / "d.npz")), Store(str(tmp / "other"))).info.split
    split, y = open_array(f"{data.url}/split")[:], open_array(f"{data.url}/label")[:]
    np.testing.assert_array_equal(split, hold_out(plain, y, HELD))   # the same stratified draw, then recoded
    held = np.isin(y, HELD)
    assert set(split[held]) == {UNSEEN_TRAIN, UNSEEN_TEST} and set(split[~held]) == {TRAIN, TEST}
    assert ((plain == TEST) == ((split == TEST) | (split == UNSEEN_TEST))).all()


def test_statistics_and_the_borrowed_validation_rows_see_the_seen_classes_only(trained):
    _, _, data, stats, _, _ = trained
    X = open_array(f"{data.url}/features")[:].astype(np.float64)
    split, y = open_array(f"{data.url}/split")[:], open_array(f"{data.url}/label")[:]
    s, _ = load_arrays(stats.url)
    train = split == TRAIN
    assert s["class_counts"].tolist() == np.bincount(y[train], minlength=6).tolist()
    assert s["class_counts"][HELD].tolist() == [0, 0] and int(s["n_samples"]) == train.sum()
    np.testing.assert_allclose(s["mean"], X[train].mean(0), atol=1e-6)
    np.testing.assert_allclose(s["covariance"], np.cov(X[train].T), atol=1e-6)
    borrowed = fold_split(data.url, Fold(0))
    assert (borrowed == VAL).any() and not np.isin(y[borrowed == VAL], HELD).any()
    assert (borrowed[np.isin(y, HELD)] == split[np.isin(y, HELD)]).all()


def test_the_neighbour_graph_and_the_learners_never_see_held_out_rows(trained):
    _, _, data, _, graph, models = trained
    split, y = open_array(f"{data.url}/split")[:], open_array(f"{data.url}/label")[:]
    nbr = open_array(f"{graph.url}/neighbours")[:]
    assert (split[nbr[nbr >= 0]] == TRAIN).all()
    tmp = trained[0]
    [copy] = [p.parent for p in (tmp / "s" / "shuffled").glob("*/row")]   # the SGD learners' shuffled rows
    assert sorted(open_array(str(copy / "row"))[:].tolist()) == np.flatnonzero(split == TRAIN).tolist()
    X = open_array(f"{data.url}/features")[:]
    for spec, unit, *_ in models:
        est = load_estimator(unit.url)
        if spec["method"] in ("ncmml", "ncmc"):   # a mean (centroids) of the seen classes only
            assert set(est.centroid_classes_.tolist()) == {0, 2, 3, 5}, spec
            assert not np.isin(est.predict(X), HELD).any()
        if spec["method"] == "lda":                # dim: the seen classes less one
            assert est.transform(X[:2]).shape[1] == 3
