"""data.split.classes: the classes a run holds out get split codes of their own, so that no stage that
reads train (or val, or test) rows sees them: statistics, neighbours, the shuffled copy, every
learner, the borrowed validation rows."""

import numpy as np
import pytest

from metricpipe.config import parse_config
from metricpipe.folds import Fold, fold_split
from metricpipe.stages import prepare_data, run_neighbours, run_train
from metricpipe.store import Store, load_arrays, load_estimator, open_array
from metricpipe.tasks.splits import TEST, TRAIN, UNSEEN_TEST, UNSEEN_TRAIN, VAL, hold_out
from tests.conftest import make_blobs, staged

pytestmark = pytest.mark.integration  # every test reads the stages run on the session's cluster

HELD = [1, 4]
SGD = {"dim": 4, "iters": 40, "batch": 100, "validate_every": 10, "validation": 100, "select": False}


def _raw(path, **split):
    return {
        "data": {"path": str(path), "chunk_mb": 0.005, "normalize": "l2", "split": split},
        "neighbours": {"k": 5},
        "methods": [
            {"method": "pca", "dim": 4},
            {"method": "lda"},
            {"method": "ncmml", **SGD},
            {"method": "ncmml", **SGD, "objective": "dot", "lr": 1.0},
            {"method": "ncmc", **SGD, "centroids": 2},
            {"method": "knnml", **SGD, "batch": 60},
        ],
        "evaluate": {"classification": {"classifiers": ["knn1", "ncm"]}},
    }


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
    np.testing.assert_array_equal(split, hold_out(plain, y, HELD))  # the same stratified draw, then recoded
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
    split = open_array(f"{data.url}/split")[:]
    nbr = open_array(f"{graph.url}/neighbours")[:]
    assert (split[nbr[nbr >= 0]] == TRAIN).all()
    tmp = trained[0]
    [copy] = [p.parent for p in (tmp / "s" / "shuffled").glob("*/row")]  # the SGD learners' shuffled rows
    assert sorted(open_array(str(copy / "row"))[:].tolist()) == np.flatnonzero(split == TRAIN).tolist()
    X = open_array(f"{data.url}/features")[:]
    for spec, unit, *_ in models:
        est = load_estimator(unit.url)
        if spec["method"] in ("ncmml", "ncmc"):  # a mean (centroids) of the seen classes only
            assert set(est.centroid_classes_.tolist()) == {0, 2, 3, 5}, spec
            assert not np.isin(est.predict(X), HELD).any()
        if spec["method"] == "lda":  # dim: the seen classes less one
            assert est.transform(X[:2]).shape[1] == 3


@pytest.fixture(scope="module")
def evaluated(trained):
    from metricpipe.stages import run_encode, run_evaluate

    _, ctx, data, _, graph, models = trained
    codes = run_encode(ctx, data, models)
    evals = run_evaluate(ctx, data, codes, graph)
    split, y = open_array(f"{data.url}/split")[:], open_array(f"{data.url}/label")[:]
    out = {}
    for (spec, cunit, _), (_, unit) in zip(codes, evals):
        key = spec["method"] + ("-dot" if spec.get("objective") == "dot" else "")
        out[key] = (spec, open_array(f"{cunit.url}/codes")[:].astype(np.float64), unit.read_json("records.json"))
    return data, split, y, out


def _value(records, classes, metric, classifier=None):
    [v] = [
        r["value"]
        for r in records
        if r.get("classes") == classes
        and r["metric"] == metric
        and r["classifier"] == classifier
        and "view" not in r["params"]
    ]
    return v


def _ncm_error(Z, y, train, test):
    classes = np.unique(y[train])  # only the classes with rows compete
    means = np.stack([Z[train][y[train] == c].mean(0) for c in classes])
    pred = classes[np.argmin(((Z[test][:, None] - means[None]) ** 2).sum(-1), axis=1)]
    return (pred != y[test]).mean()


def test_every_model_is_scored_on_the_held_out_classes_beside_the_seen_ones(evaluated):
    data, split, y, out = evaluated
    for key in ("pca", "ncmml"):
        _, Z, recs = out[key]
        assert {r.get("classes") for r in recs if r["metric"] != "nnz"} >= {"seen", "unseen"}
        seen = _ncm_error(Z, y, split == TRAIN, split == TEST)  # no zero mean for the held-out classes
        assert _value(recs, "seen", "top1_error", "ncm") == pytest.approx(seen, abs=1e-9)
        unseen = _ncm_error(Z, y, split == UNSEEN_TRAIN, split == UNSEEN_TEST)  # their means, from their train rows
        assert _value(recs, "unseen", "top1_error", "ncm") == pytest.approx(unseen, abs=1e-9)
        tr, te = np.flatnonzero(split == UNSEEN_TRAIN), np.flatnonzero(split == UNSEEN_TEST)
        nearest = tr[np.argmin(((Z[te][:, None] - Z[tr][None]) ** 2).sum(-1), axis=1)]  # kNN over their train rows
        assert _value(recs, "unseen", "top1_error", "knn1") == pytest.approx((y[nearest] != y[te]).mean(), abs=1e-9)
        from sklearn.metrics import average_precision_score  # retrieval among their test rows

        ap = []
        for i in te:
            others = te[te != i]
            ap.append(average_precision_score(y[others] == y[i], -((Z[others] - Z[i]) ** 2).sum(1)))
        assert _value(recs, "unseen", "map") == pytest.approx(np.mean(ap), abs=1e-6)
    # the dot form meets the held-out classes with their implied biases: Euclidean NCM on their means
    _, Z, recs = out["ncmml-dot"]
    unseen = _ncm_error(Z, y, split == UNSEEN_TRAIN, split == UNSEEN_TEST)
    assert _value(recs, "unseen", "top1_error", "ncm") == pytest.approx(unseen, abs=1e-9)


def test_an_ncmc_model_meets_the_held_out_classes_with_k_means_of_their_train_rows(evaluated, trained):
    from metricpipe.tasks.base import seed_of
    from metricpipe.tasks.ncmml import mixture_class_scores

    data, split, y, out = evaluated
    spec, Z, recs = out["ncmc"]
    [unit] = [u for s, u, *_ in trained[-1] if s["method"] == "ncmc"]
    est = load_estimator(unit.url)
    X = open_array(f"{data.url}/features")[:].astype(np.float64)
    keys = open_array(f"{data.url}/row_key")[:]
    rows = np.flatnonzero(split == UNSEEN_TRAIN)
    sample = rows[
        est.kmeans_sample(y[rows], keys[rows], seed_of(est.random_state), est.kmeans_per_class(6, 12), est.centroids)
    ]
    cents, owner = est.kmeans(
        X[sample], y[sample], lambda: iter([(X[rows], y[rows])]), 6, np.bincount(y[rows], minlength=6)
    )
    assert sorted(set(owner.tolist())) == HELD and np.bincount(owner).max() == 2
    te = split == UNSEEN_TEST
    scores = mixture_class_scores(Z[te], est.transform(cents).astype(np.float64), owner, 6)
    assert _value(recs, "unseen", "top1_error", "ncmc") == pytest.approx((scores.argmax(1) != y[te]).mean(), abs=1e-9)
    assert _value(recs, "seen", "top1_error", "ncmc") is not None  # its own classifier, on the seen classes too


def test_the_report_shows_the_held_out_classes_apart_and_decides_on_the_seen_ones(client, tmp_path):
    import json

    import yaml
    from click.testing import CliRunner

    from metricpipe.cli import main

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "store": str(tmp_path / "store"),
                "cluster": client.scheduler.address,
                "data": {"source": "digits", "split": {"classes": [0, 7]}},
                "methods": [{"method": "pca", "dim": 8}, {"method": "identity"}],
                "evaluate": {"classification": {"classifiers": ["knn1", "ncm"]}},
            }
        )
    )
    res = CliRunner().invoke(main, ["run", str(cfg)])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "store" / "report" / "metrics.json").read_text())
    manifest = json.loads((tmp_path / "store" / "runs" / "latest.json").read_text())
    assert manifest["dataset"]["unseen_classes"] == [0, 7] and "unseen_test" in manifest["dataset"]["splits"]
    assert {r.get("classes") for r in doc["records"]} <= {"seen", None}  # the summary's and tables' records
    held = doc["held_out_classes"]
    assert held["classes"] == [0, 7] and [c["label"] for c in held["columns"]][:2] == ["mAP", "MAP@R"]
    [pca] = [r for r in held["rows"] if r["method"] == "pca"]
    col = [(c["metric"], c["classifier"]) for c in held["columns"]].index(("top1_error", "ncm"))
    recs = [r for r in doc["records"] + held["records"] if r["method"] == "pca"]
    assert pca["values"][col] == [
        _value(recs, "seen", "top1_error", "ncm"),
        _value(recs, "unseen", "top1_error", "ncm"),
    ]
    page = (tmp_path / "store" / "report" / "index.html").read_text()
    assert "<h2>Held-out classes</h2>" in page and "holds out 0, 7" in page
