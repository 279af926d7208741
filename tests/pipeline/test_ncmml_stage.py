"""NCMML / NCMC / k-NN metric learning through the pipeline, on small data cut into many row-blocks."""

import numpy as np
import pytest

from metricpipe.stages import run_encode, run_evaluate, run_train
from metricpipe.store import load_estimator, open_array
from metricpipe.tasks.ncmml import PATIENCE
from tests.conftest import make_blobs, staged

pytestmark = pytest.mark.integration  # every test reads the stages run on the session's cluster


@pytest.fixture(scope="module")
def trained(client, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ncm")
    X, y = make_blobs(n=900, d=12, classes=5, sep=0.9, seed=3)
    np.savez(tmp / "d.npz", X=X, y=y)
    common = {"dim": 4, "iters": 60, "batch": 100, "validate_every": 10, "validation": 100, "select": False}
    ctx, data, stats = staged(
        client,
        tmp / "s",
        {
            "data": {"path": str(tmp / "d.npz"), "chunk_mb": 0.005, "normalize": "l2", "split": {"val": 0}},
            "methods": [
                {"method": "identity"},
                {"method": "ncmml", **common},
                {"method": "ncmml", **common, "objective": "dot", "lr": 1.0},
                {"method": "ncmml", **common, "classes": [0, 1, 2]},
                {"method": "ncmml", **common, "classes": [0, 1, 2], "objective": "dot", "lr": 1.0},
                {"method": "ncmc", **common, "centroids": 2, "kmeans_iters": 100},
                {"method": "ncmc", **common, "centroids": 1},
                {"method": "knnml", **{**common, "batch": 60}, "targets": ["dynamic", "fixed"]},
            ],
            # ncmc unlisted: an NCMC model is scored with its own classifier all the same (issue 45 item 6)
            "evaluate": {"retrieval": False, "classification": {"classifiers": ["knn1", "ncm"]}},
        },
    )
    assert len(data.chunks) > 5
    models = run_train(ctx, data, stats, None)
    codes = run_encode(ctx, data, models)
    evals = run_evaluate(ctx, data, codes)
    return ctx, data, models, codes, evals


def _records(evals, method, **params):
    for spec, unit in evals:
        if spec["method"] == method and all(spec.get(k) == v for k, v in params.items()):
            return unit.read_json("records.json")
    raise AssertionError((method, params))


def test_early_stopping_keeps_the_w_with_the_lowest_validation_error(trained):
    _, _, models, _, _ = trained
    for spec, unit, _ in models:
        if spec["method"] in ("ncmml", "ncmc", "knnml"):
            est = load_estimator(unit.url)
            errors = [h["val_error"] for h in est.history_]
            best = int(np.argmin(errors))
            # the start, then every 10 of 60 steps, or fewer: PATIENCE checks without a lower error stop SGD
            patience = max(5, int(PATIENCE * 60 / 10))
            assert len(errors) == 7 or len(errors) - 1 - best == patience, errors
            assert est.val_error_ == errors[best] and est.best_iter_ == est.history_[best]["iter"]
            assert unit.meta()["val_error"] == errors[best]


def test_ncmc_centroids_are_a_lloyd_fixed_point_per_class(trained):
    _, data, models, _, _ = trained
    [unit] = [u for s, u, _ in models if s["method"] == "ncmc" and s["centroids"] == 2]
    est = load_estimator(unit.url)
    X = open_array(f"{data.url}/features")[:].astype(np.float64)
    y = open_array(f"{data.url}/label")[:]
    train = open_array(f"{data.url}/split")[:] == 0
    from metricpipe.tasks import stream  # the rows validation scores are in no centroid

    pos = np.flatnonzero(train)
    train[pos[stream.validation_split(y[pos], est.validation, stream.row_keys(X[pos].astype(np.float32)), 0)]] = False
    cents, owner = est.centroids_, est.centroid_classes_
    assert np.bincount(owner).tolist() == [2] * 5
    for c in range(5):  # streamed over the blocks, yet each centroid is the mean of the rows it owns
        Xc, mine = X[train & (y == c)], np.flatnonzero(owner == c)
        j = np.argmin(((Xc[:, None] - cents[mine][None]) ** 2).sum(-1), axis=1)
        for a in range(2):
            np.testing.assert_allclose(cents[mine[a]], Xc[j == a].mean(0), rtol=1e-4, atol=1e-6)


def test_ncm_classifiers_use_the_learned_metric_and_new_classes_are_scored_apart(trained):
    ctx, data, models, codes, evals = trained
    test = np.flatnonzero(open_array(f"{data.url}/split")[:] == 1)
    y = open_array(f"{data.url}/label")[:]
    train = np.flatnonzero(open_array(f"{data.url}/split")[:] == 0)
    [(spec, cunit, _)] = [
        c for c in codes if c[0]["method"] == "ncmml" and c[0].get("classes") and c[0]["objective"] == "euclidean"
    ]
    Z = open_array(f"{cunit.url}/codes")[:].astype(np.float64)
    means = np.stack([Z[train][y[train] == c].mean(0) for c in range(5)])  # every class, from train codes
    pred = np.argmin(((Z[test][:, None] - means[None]) ** 2).sum(-1), axis=1)
    wrong = pred != y[test]
    recs = _records(evals, "ncmml", classes=[0, 1, 2], objective="euclidean")
    got = {r["metric"]: r["value"] for r in recs if r["classifier"] == "ncm"}
    new = ~np.isin(y[test], [0, 1, 2])
    assert got["top1_error"] == pytest.approx(wrong.mean(), abs=1e-9)
    assert got["top1_error_new_classes"] == pytest.approx(wrong[new].mean(), abs=1e-9)
    # ncmc is reported for the model that has several centroids per class (its own classifier, which
    # the config does not list), and only for it
    assert any(r["classifier"] == "ncmc" for r in _records(evals, "ncmc", centroids=2))
    assert not any(r["classifier"] == "ncmc" for r in _records(evals, "ncmml", objective="euclidean"))
    # the control (trained on every class) is scored on the same new-class images
    [(_, ctrl, _)] = [
        c for c in codes if c[0]["method"] == "ncmml" and c[0]["objective"] == "euclidean" and not c[0].get("classes")
    ]
    Zc = open_array(f"{ctrl.url}/codes")[:].astype(np.float64)
    mc = np.stack([Zc[train][y[train] == c].mean(0) for c in range(5)])
    wrong_c = np.argmin(((Zc[test][:, None] - mc[None]) ** 2).sum(-1), axis=1) != y[test]
    got_c = {
        r["metric"]: r["value"]
        for r in _records(evals, "ncmml", objective="euclidean", classes=None)
        if r["classifier"] == "ncm"
    }
    assert got_c["top1_error_new_classes"] == pytest.approx(wrong_c[new].mean(), abs=1e-9)


def test_dot_form_stores_class_biases_and_classifies_with_them(trained):
    ctx, data, models, codes, evals = trained
    [unit] = [u for s, u, _ in models if s.get("objective") == "dot" and not s["classes"]]
    bias = load_estimator(unit.url).class_bias_
    assert bias.shape == (5,) and np.all(np.isfinite(bias))
    [(spec, cunit, _)] = [c for c in codes if c[0].get("objective") == "dot" and not c[0]["classes"]]
    Z = open_array(f"{cunit.url}/codes")[:].astype(np.float64)
    split, y = open_array(f"{data.url}/split")[:], open_array(f"{data.url}/label")[:]
    means = np.stack([Z[split == 0][y[split == 0] == c].mean(0) for c in range(5)])
    pred = np.argmax(Z[split == 1] @ means.T + bias, axis=1)
    got = [
        r["value"]
        for r in _records(evals, "ncmml", objective="dot", classes=None)
        if r["classifier"] == "ncm" and r["metric"] == "top1_error"
    ]
    assert got == [pytest.approx((pred != y[split == 1]).mean(), abs=1e-9)]


def test_learned_metrics_are_linear_encoders_without_offset(trained):
    _, data, models, _, _ = trained
    X = open_array(f"{data.url}/features")[:50]
    for spec, unit, _ in models:
        if spec["method"] in ("ncmml", "ncmc", "knnml"):
            m = load_estimator(unit.url)
            assert m.components_.shape == (12, 4) and not hasattr(m, "offset_")
            np.testing.assert_allclose(m.transform(X), X @ m.components_, rtol=1e-5)


def test_add_classes_extends_a_copy_and_predicts_like_ncm_with_numpy_means(trained, tmp_path):
    from metricpipe.commands.classes import add_classes, predict
    from metricpipe.tasks.normalize import normalize_rows

    ctx, data, models, _, _ = trained
    [(spec, unit)] = [
        (s, u) for s, u, _ in models if s["method"] == "ncmml" and s.get("classes") and s["objective"] == "euclidean"
    ]
    before = {p: p.read_bytes() for p in __import__("pathlib").Path(unit.url).rglob("*") if p.is_file()}
    rng = np.random.default_rng(5)
    Xn = rng.normal(0, 1, (300, 12)).astype(np.float32) + np.repeat(np.eye(12)[[0, 5]] * 4, 150, axis=0)
    yn = np.repeat(np.array([10, 11]), 150)  # classes 10 and 11, integers as the model's
    np.savez(tmp_path / "new.npz", X=Xn, y=yn)
    [info] = add_classes(ctx.store.url, str(tmp_path / "new.npz"), model=unit.key, log=lambda m: None)
    assert info["added"] == [10, 11] and info["images"] == 300
    assert {p: p.read_bytes() for p in before} == before  # the trained model is untouched
    ext = ctx.store.unit("models", info["model"].split("/")[-1])
    est, names_all = load_estimator(ext.url), ext.meta()["class_names"]
    assert names_all[-2:] == [10, 11] and ext.done()
    Z = normalize_rows(Xn, "l2").astype(np.float64)
    np.testing.assert_allclose(est.centroids_[-2:], [Z[:150].mean(0), Z[150:].mean(0)], rtol=1e-5)
    # prediction = nearest projected mean among the trained classes' means and the two new ones
    probe = np.concatenate([Xn[:20], open_array(f"{data.url}/features")[:20]])
    np.savez(tmp_path / "probe.npz", X=probe, y=np.zeros(40, int))
    names, _, _ = predict(ctx.store.url, ext.key, str(tmp_path / "probe.npz"))
    W = load_estimator(unit.url).components_
    P = normalize_rows(probe, "l2") @ W
    M = est.centroids_ @ W
    expect = np.array(names_all)[est.centroid_classes_[np.argmin(((P[:, None] - M[None]) ** 2).sum(-1), 1)]]
    assert (names == expect).all() and (names[:20] == 10).mean() > 0.5  # chance: 1 in 7
    # the report labels the copy as the run labels its model: objective is swept, so named at its default
    from metricpipe.report import extended_models

    run = [{"key": u.key, "spec": u.meta()["spec"]} for _, u, _ in models]
    [e] = [e for e in extended_models(ctx.store, run) if e["key"] == ext.key]
    assert e["extends"] == unit.key and "objective=euclidean" in e["label"] and "dim=" not in e["label"]


def test_add_classes_refuses_bad_new_data(trained, tmp_path):
    from metricpipe.commands.classes import add_classes
    from metricpipe.tasks.errors import InputError

    ctx, _, models, _, _ = trained
    [unit] = [u for s, u, _ in models if s["method"] == "ncmml" and s.get("classes") and s["objective"] == "euclidean"]
    np.savez(tmp_path / "wrong_dim.npz", X=np.ones((10, 7), np.float32), y=np.zeros(10, int))
    with pytest.raises(InputError, match="features have 7 dimensions but model .* takes 12"):
        add_classes(ctx.store.url, str(tmp_path / "wrong_dim.npz"), model=unit.key, log=lambda m: None)
    np.savez(tmp_path / "old.npz", X=np.ones((10, 12), np.float32), y=np.zeros(10, int))
    with pytest.raises(InputError, match=r"class\(es\) \[0\] are already in model"):
        add_classes(ctx.store.url, str(tmp_path / "old.npz"), model=unit.key, log=lambda m: None)


def test_add_classes_again_reuses_its_models_and_leaves_the_store_as_it_was(trained, tmp_path):
    """The same command twice: the default targets are the models runs trained (not the copies the
    first call made, which hold the new classes already), and their copies are reused, not rewritten."""
    import shutil

    from metricpipe.commands.classes import add_classes
    from metricpipe.tasks.errors import InputError

    ctx, _, models, codes, _ = trained
    store = tmp_path / "store"
    shutil.copytree(ctx.store.url, store)
    # one NCM model without codes stands in for a selection candidate that was not kept: not a target
    [dropped] = [c.key for (s, _, _), (_, c, _) in zip(models, codes) if s["method"] == "ncmc"][:1]
    (store / f"codes/{dropped}.committed.json").unlink()
    rng = np.random.default_rng(6)
    np.savez(tmp_path / "new.npz", X=rng.normal(0, 1, (40, 12)).astype(np.float32), y=np.repeat([21, 22], 20))
    logs = []
    first = add_classes(str(store), str(tmp_path / "new.npz"), log=logs.append)
    assert len(first) == sum(s["method"] in ("ncmml", "ncmc") for s, _, _ in models) - 1
    files = {p: p.stat().st_mtime_ns for p in store.rglob("*") if p.is_file()}
    second = add_classes(str(store), str(tmp_path / "new.npz"), log=logs.append)
    assert second == first and all("reusing" in m for m in logs[len(first) :])
    assert {p: p.stat().st_mtime_ns for p in store.rglob("*") if p.is_file()} == files  # nothing rewritten
    pca = next(u for s, u, _ in models if s["method"] not in ("ncmml", "ncmc"))
    with pytest.raises(InputError, match=rf"model {pca.key} is a \w+ model, not NCMML or NCMC"):
        add_classes(str(store), str(tmp_path / "new.npz"), model=pca.key[:6], log=logs.append)


def test_add_classes_refuses_for_any_target_before_writing_for_one(trained, tmp_path):
    """A new class that one target cannot take (NCMC's several centroids per class and a hierarchy's
    zero-shot prior): NCMML's copy could be made, NCMC's cannot; the refusal comes before either is
    written."""
    import shutil

    import yaml

    from metricpipe.commands.classes import add_classes
    from metricpipe.tasks.errors import InputError

    ctx, _, models, _, _ = trained
    store = tmp_path / "store"
    shutil.copytree(ctx.store.url, store)
    before = sorted(p.name for p in (store / "models").iterdir())
    np.savez(tmp_path / "few.npz", X=np.ones((3, 12), np.float32), y=np.array([30, 30, 30]))
    (tmp_path / "h.yaml").write_text(yaml.safe_dump({30: "things", **{c: "things" for c in range(10)}}))
    with pytest.raises(InputError, match=r"--hierarchy: model \w+ keeps \d+ centroids per class"):
        add_classes(str(store), str(tmp_path / "few.npz"), hierarchy=str(tmp_path / "h.yaml"), log=lambda m: None)
    assert sorted(p.name for p in (store / "models").iterdir()) == before


def test_add_classes_gives_a_class_with_fewer_images_than_ncmc_s_centroids_one_on_each(trained, tmp_path):
    """It refused them ("give at least k images of each"); NCMC's fit takes such classes now, so
    extending a model takes them too."""
    import shutil

    from metricpipe.commands.classes import add_classes
    from metricpipe.store import load_estimator

    ctx, _, models, _, _ = trained
    store = tmp_path / "store"
    shutil.copytree(ctx.store.url, store)
    x = np.random.default_rng(1).normal(size=12).astype(np.float32)
    np.savez(tmp_path / "few.npz", X=x[None], y=np.array([30]))  # one image, k = 2 centroids
    out = add_classes(str(store), str(tmp_path / "few.npz"), log=lambda m: None)
    ncmc = [load_estimator(str(store / o["model"])) for o in out]
    ncmc = [e for e in ncmc if np.bincount(e.centroid_classes_).max() > 1]
    assert ncmc, out
    for est in ncmc:
        mine = est.centroids_[est.centroid_classes_ == est.centroid_classes_.max()]
        assert len(mine) == 1  # on the image (as the run normalised it: l2 here, a direction)
        np.testing.assert_allclose(mine[0] / np.linalg.norm(mine[0]), x / np.linalg.norm(x), rtol=1e-5)


def test_zero_shot_prior_is_the_mean_of_ancestor_means_and_map_mixes_it(trained, tmp_path):
    from metricpipe.commands.classes import add_classes, zero_shot_prior
    from metricpipe.tasks.errors import InputError

    means = {"cat": np.array([1.0, 0]), "dog": np.array([3.0, 0]), "car": np.array([0, 10.0])}
    parents = {"cat": "mammal", "dog": "mammal", "lynx": "mammal", "mammal": "animal", "car": "thing"}
    # Eq. 33: ancestors of lynx are mammal (cat, dog) and animal (cat, dog): both average to (2, 0)
    np.testing.assert_allclose(zero_shot_prior("lynx", parents, means), [2.0, 0])
    ctx, data, models, _, _ = trained
    [unit] = [u for s, u, _ in models if s["method"] == "ncmml" and s.get("classes") and s["objective"] == "euclidean"]
    (tmp_path / "h.yaml").write_text("'0': a\n'1': a\n'2': b\n40: a\n41: b\n")
    Xn = np.abs(np.random.default_rng(1).normal(size=(4, 12))).astype(np.float32)
    np.savez(tmp_path / "n.npz", X=Xn, y=np.array([40] * 4))
    [info] = add_classes(
        ctx.store.url,
        str(tmp_path / "n.npz"),
        model=unit.key,
        hierarchy=str(tmp_path / "h.yaml"),
        prior_weight=2.0,
        zero_shot=("41",),
        log=lambda m: None,
    )
    ext_unit = ctx.store.unit("models", info["model"].split("/")[-1])
    ext, base = load_estimator(ext_unit.url), load_estimator(unit.url)
    c = {int(k): v for k, v in zip(base.centroid_classes_, base.centroids_)}
    from metricpipe.tasks.normalize import normalize_rows

    mu_s = normalize_rows(Xn, "l2").mean(0)
    mu_z = (c[0] + c[1]) / 2
    np.testing.assert_allclose(ext.centroids_[-2], (4 * mu_s + 2 * mu_z) / 6, rtol=1e-5)  # Eq. 34
    np.testing.assert_allclose(ext.centroids_[-1], c[2], rtol=1e-6)  # 41: the prior alone
    assert ext_unit.meta()["class_names"][-2:] == [40, 41]
    # classes written as YAML floats (13.0: ...) name the integer classes: they named no class
    (tmp_path / "f.yaml").write_text("0.0: a\n1.0: a\n2.0: b\n40.0: a\n41.0: b\n")
    [again] = add_classes(
        ctx.store.url,
        str(tmp_path / "n.npz"),
        model=unit.key,
        hierarchy=str(tmp_path / "f.yaml"),
        prior_weight=2.0,
        zero_shot=("41",),
        log=lambda m: None,
    )
    ext_f = load_estimator(ctx.store.unit("models", again["model"].split("/")[-1]).url)
    np.testing.assert_allclose(ext_f.centroids_, ext.centroids_, rtol=1e-6)
    np.savez(tmp_path / "t.npz", X=Xn, y=np.array(["forty"] * 4))  # text beside integer classes: refused
    with pytest.raises(InputError, match=r"t.npz: class\(es\) \['forty'\] are not integers like model \w+'s classes"):
        add_classes(ctx.store.url, str(tmp_path / "t.npz"), model=unit.key, log=lambda m: None)
    with pytest.raises(InputError, match=r"class\(es\) \['ghost'\] are not integers"):  # a zero-shot name too
        add_classes(
            ctx.store.url,
            str(tmp_path / "n.npz"),
            model=unit.key,
            hierarchy=str(tmp_path / "h.yaml"),
            zero_shot=("ghost",),
            log=lambda m: None,
        )
    # a zero-shot class with images would be added twice (classes_ [... 40, 40]): refused, as is a repeat
    for zero, words in (
        (("40",), r"--zero-shot: class\(es\) \[40\] have images in \S*n.npz"),
        (("41", "41"), r"--zero-shot: class\(es\) \[41\] given more than once"),
    ):
        with pytest.raises(InputError, match=words):
            add_classes(
                ctx.store.url,
                str(tmp_path / "n.npz"),
                model=unit.key,
                hierarchy=str(tmp_path / "h.yaml"),
                zero_shot=zero,
                log=lambda m: None,
            )


def test_ncmc_with_one_centroid_per_class_trains_the_ncmml_metric(trained):
    _, _, models, _, _ = trained
    [ncmc1] = [u for s, u, _ in models if s["method"] == "ncmc" and s["centroids"] == 1]
    [ncm] = [u for s, u, _ in models if s["method"] == "ncmml" and s["objective"] == "euclidean" and not s["classes"]]
    a, b = load_estimator(ncmc1.url), load_estimator(ncm.url)
    np.testing.assert_allclose(a.centroids_, b.centroids_, rtol=1e-5, atol=1e-6)  # k-means, k = 1: the means
    np.testing.assert_allclose(a.components_, b.components_, rtol=1e-4, atol=1e-6)


def test_dot_form_on_a_class_subset_gives_every_class_its_implied_bias_so_new_classes_can_win(trained):
    """Learned biases start at 0 and implied ones are -||W mu||^2 / 2: mixed, the classes left out of
    training lost every comparison (top-1 error 1.0 on them). With classes left out, every class takes
    the implied bias (Section 3.4), which is the Euclidean NCM rule on the projected means."""
    _, data, models, codes, evals = trained
    [unit] = [u for s, u, _ in models if s.get("objective") == "dot" and s["classes"]]
    est = load_estimator(unit.url)
    P = est.centroids_.astype(np.float64) @ est.components_.astype(np.float64)
    np.testing.assert_allclose(est.class_bias_, -0.5 * (P**2).sum(1), rtol=1e-5)
    assert est.val_error_new_classes_ is not None  # the new classes are watched in the dot form too
    [(_, cunit, _)] = [c for c in codes if c[0].get("objective") == "dot" and c[0]["classes"]]
    Z = open_array(f"{cunit.url}/codes")[:].astype(np.float64)
    split, y = open_array(f"{data.url}/split")[:], open_array(f"{data.url}/label")[:]
    means = np.stack([Z[split == 0][y[split == 0] == c].mean(0) for c in range(5)])
    test = split == 1
    wrong = np.argmin(((Z[test][:, None] - means[None]) ** 2).sum(-1), axis=1) != y[test]
    new = ~np.isin(y[test], [0, 1, 2])
    recs = {
        r["metric"]: r["value"]
        for r in _records(evals, "ncmml", objective="dot", classes=[0, 1, 2])
        if r["classifier"] == "ncm"
    }
    assert recs["top1_error_new_classes"] == pytest.approx(wrong[new].mean(), abs=1.5 / new.sum())
    assert recs["top1_error"] == pytest.approx(wrong.mean(), abs=1.5 / test.sum())
    assert recs["top1_error_new_classes"] < 0.5


def test_predict_needs_no_labels_and_refuses_bad_ones_and_ambiguous_models(trained, tmp_path):
    from metricpipe.commands.classes import add_classes, predict
    from metricpipe.tasks.errors import InputError

    ctx, data, models, _, _ = trained
    X = open_array(f"{data.url}/features")[:30]
    np.savez(tmp_path / "unlabelled.npz", X=X)
    [unit] = [u for s, u, _ in models if s["method"] == "ncmml" and not s["classes"] and s["objective"] == "euclidean"]
    names, error, _ = predict(ctx.store.url, unit.key, str(tmp_path / "unlabelled.npz"))
    assert len(names) == 30 and error is None
    np.savez(tmp_path / "short.npz", X=X, y=np.zeros((2, 15), int))
    with pytest.raises(InputError, match=r"labels of shape \(2, 15\) for 30 rows"):
        predict(ctx.store.url, unit.key, str(tmp_path / "short.npz"), labels="y")
    np.savez(tmp_path / "short2.npz", X=X, y=np.zeros(7, int))
    with pytest.raises(InputError, match=r"\(--labels y\): labels of shape \(7,\) for 30 rows; give a 1-D array"):
        predict(ctx.store.url, unit.key, str(tmp_path / "short2.npz"), labels="y")
    with pytest.raises(InputError, match=r"\(DATA's y\): labels of shape \(7,\) for 30 rows"):
        predict(ctx.store.url, unit.key, str(tmp_path / "short2.npz"))  # its y, unnamed: checked all the same
    np.savez(tmp_path / "text.npz", X=X, y=np.array(["cat"] * 30))
    names, error, unknown = predict(ctx.store.url, unit.key, str(tmp_path / "text.npz"))
    assert len(names) == 30 and error is None and unknown == 30  # no error rate against other labels ...
    from click.testing import CliRunner

    from metricpipe.cli import main

    res = CliRunner().invoke(main, ["predict", ctx.store.url, str(tmp_path / "text.npz"), "--model", unit.key])
    assert res.exit_code == 0 and "30 rows classified; no top-1 error: none of DATA's y is a class" in res.output
    with pytest.raises(InputError, match=r"none of the labels is a class of model"):  # ... refused when named
        predict(ctx.store.url, unit.key, str(tmp_path / "text.npz"), labels="y")
    with pytest.raises(InputError, match=r"model .. matches \d+ models \(.*\); give more of the key"):
        predict(ctx.store.url, "", str(tmp_path / "unlabelled.npz"))
    [ncmc] = [u for s, u, _ in models if s["method"] == "ncmc" and s["centroids"] == 2]
    (tmp_path / "h.yaml").write_text("'0': a\n50: a\n")
    np.savez(tmp_path / "n.npz", X=np.abs(X[:4]), y=np.array([50] * 4))
    with pytest.raises(InputError, match="keeps 2 centroids per class; the zero-shot prior"):
        add_classes(
            ctx.store.url,
            str(tmp_path / "n.npz"),
            model=ncmc.key,
            hierarchy=str(tmp_path / "h.yaml"),
            prior_weight=1.0,
            log=lambda m: None,
        )


@pytest.mark.parametrize(
    "method, params",
    [
        ("ncmml", {"objective": "euclidean", "classes": None}),
        ("ncmc", {"centroids": 2}),
        ("knnml", {"targets": "fixed"}),
    ],
)
def test_the_pipeline_learns_what_fit_learns_in_memory(trained, method, params):
    """Fed the same statistics, the estimator learns the same W in memory (from ``tasks.stream.pools``
    over the train rows) as the pipeline (from the shuffled copy): bit for bit. ``fit(X, y)`` computes
    its own statistics, whose summation order differs from the pipeline's block-by-block moments by
    ~1e-7; NCM/NCMC's W stays within 1e-3, while k-NN ML's sorted triplets can pick other targets
    after a few steps, so its fit is compared by validation error (the documented tolerance)."""
    from metricpipe.store import load_arrays
    from metricpipe.tasks import moments, registry, stream

    _, data, models, _, _ = trained
    [(spec, unit)] = [
        (s, u) for s, u, _ in models if s["method"] == method and all(s.get(k) == v for k, v in params.items())
    ]
    X = open_array(f"{data.url}/features")[:]
    train = data.split == 0
    Xt, yt = X[train], data.labels[train]
    stored = load_estimator(unit.url)
    seed = spec["random_state"] or 0
    est = registry.make(spec)
    keys = stream.row_keys(Xt)
    val = stream.validation_split(yt, est.validation, keys, seed)
    keep = np.ones(len(yt), bool)
    keep[val] = False
    extra = {}
    fit = np.flatnonzero(train)[keep]  # the validation rows are in no mean, centroid or PCA start
    if method == "ncmc":
        sample = est.kmeans_sample(yt[keep], keys[keep], seed)
        blocks = [
            (X[a:b][mask].astype(np.float64), data.labels[a:b][mask])
            for a, b in data.chunks
            for mask in [np.isin(np.arange(a, b), fit)]
        ]
        extra["centroids"] = est.kmeans(Xt[keep][sample], yt[keep][sample], lambda: iter(blocks), 5)  # as the driver
    if method == "knnml":
        ref = est.reference_rows(yt, keep, keys, est.validation, seed)
        extra["reference"] = (Xt[ref], yt[ref])
    stats = moments.without_rows(load_arrays(_stats_url(trained))[0], Xt[val], yt[val])
    est.fit_stream(stats, stream.pools(Xt, yt, keep, data.chunk_rows, seed), Xt[val], yt[val], **extra)
    np.testing.assert_array_equal(est.components_, stored.components_)
    assert est.history_ == stored.history_

    mem = registry.make(spec).fit(Xt, yt, block_rows=data.chunk_rows)
    if method == "knnml":
        assert abs(mem.val_error_ - stored.val_error_) <= 0.05
    else:
        np.testing.assert_allclose(mem.components_, stored.components_, rtol=1e-3, atol=1e-4)


def _stats_url(trained):
    [unit] = trained[0].store.units("statistics")  # the store's only statistics unit
    return unit.url


def test_a_model_trained_on_some_classes_records_the_others_validation_error(trained):
    """Section 5.4's protocol: W is chosen on the trained classes; the other classes' NCM error over
    all class means is recorded at every validation and at the kept W (never used to choose it)."""
    _, data, models, _, _ = trained
    [(spec, unit)] = [
        (s, u)
        for s, u, _ in models
        if s["method"] == "ncmml" and s.get("classes") == [0, 1, 2] and s["objective"] == "euclidean"
    ]
    est = load_estimator(unit.url)
    hist = est.history_
    assert all("val_error_new_classes" in h for h in hist)
    kept = next(h for h in hist if h["iter"] == est.best_iter_)
    assert est.val_error_new_classes_ == kept["val_error_new_classes"] == unit.meta()["val_error_new_classes"]
    assert est.best_iter_new_classes_ == min(hist, key=lambda h: h["val_error_new_classes"])["iter"]
    assert est.best_iter_ == min(hist, key=lambda h: h["val_error"])["iter"]
    # the recorded figure is the kept W's NCM error, over all class means, on the other classes'
    # share of the train split that the driver holds out for it (this fixture has no val split)
    from metricpipe.tasks import stream

    X = open_array(f"{data.url}/features")[:].astype(np.float64)
    train = np.flatnonzero(data.split == 0)
    keys = open_array(f"{data.url}/row_key")[:][train]
    pos = np.flatnonzero(~np.isin(data.labels[train], [0, 1, 2]))
    rows = train[pos[stream.validation_split(data.labels[train][pos], est.validation, keys[pos], 0)]]
    W = est.components_.astype(np.float64)
    means = est.centroids_.astype(np.float64) @ W
    pred = (((X[rows] @ W)[:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    assert np.mean(pred != data.labels[rows]) == pytest.approx(est.val_error_new_classes_, abs=1e-12)
    # neither those rows nor the validation rows carved from the trained classes are in any class mean
    mine = np.flatnonzero(np.isin(data.labels[train], [0, 1, 2]))
    val = train[mine[stream.validation_split(data.labels[train][mine], est.validation, keys[mine], 0)]]
    rest = data.split == 0
    rest[np.concatenate([rows, val])] = False
    for c in range(5):
        np.testing.assert_allclose(est.centroids_[c], X[rest & (data.labels == c)].mean(0), rtol=1e-5, atol=1e-7)


def test_labels_are_compared_by_value_and_predict_returns_the_models_kind(trained, tmp_path):
    """Float labels 3.0 are class 3 (issue 19): predict's error, its output dtype, add-classes' clash."""
    from metricpipe.commands.classes import add_classes, predict
    from metricpipe.tasks.errors import InputError

    ctx, data, models, _, _ = trained
    [unit] = [u for s, u, _ in models if s["method"] == "ncmml" and not s["classes"] and s["objective"] == "euclidean"]
    test = np.flatnonzero(data.split == 1)[:200]
    X, y = open_array(f"{data.url}/features")[:][test], data.labels[test]
    names = np.array(unit.meta()["class_names"])
    np.savez(tmp_path / "int.npz", X=X, y=names[y])
    np.savez(tmp_path / "float.npz", X=X, y=names[y].astype(np.float64))
    pred, err_int, _ = predict(ctx.store.url, unit.key, str(tmp_path / "int.npz"), labels="y")
    _, err_float, _ = predict(ctx.store.url, unit.key, str(tmp_path / "float.npz"), labels="y")
    assert pred.dtype == np.int64 and err_float == err_int == pytest.approx(np.mean(pred != names[y]))
    assert err_int < 0.5
    np.savez(tmp_path / "text.npz", X=X, y=names[y].astype(str))
    with pytest.raises(InputError, match=r"none of the labels is a class of model .* \(e.g. '\d+'"):
        predict(ctx.store.url, unit.key, str(tmp_path / "text.npz"), labels="y")
    np.savez(tmp_path / "half.npz", X=X, y=np.full(len(X), 2.5))
    with pytest.raises(InputError, match=r"non-integral float64 value\(s\), first 2.5 at row 0"):
        predict(ctx.store.url, unit.key, str(tmp_path / "half.npz"), labels="y")
    [sub] = [u for s, u, _ in models if s["method"] == "ncmml" and s.get("classes") and s["objective"] == "euclidean"]
    taken = float(sub.meta()["class_names"][0])
    np.savez(tmp_path / "again.npz", X=X[:10], y=np.full(10, taken))  # 3.0 against class 3: a clash
    with pytest.raises(InputError, match=rf"class\(es\) \[{int(taken)}\] are already in model"):
        add_classes(ctx.store.url, str(tmp_path / "again.npz"), model=sub.key, log=lambda m: None)


def test_a_hierarchy_with_a_cycle_is_refused_naming_the_loop(trained, tmp_path):
    from metricpipe.commands.classes import add_classes
    from metricpipe.tasks.errors import InputError

    ctx, _, models, _, _ = trained
    [unit] = [u for s, u, _ in models if s["method"] == "ncmml" and s.get("classes") and s["objective"] == "euclidean"]
    (tmp_path / "h.yaml").write_text("'0': a\nnew: a\na: b\nb: a\n")
    np.savez(tmp_path / "n.npz", X=np.ones((4, 12), np.float32), y=np.array(["new"] * 4))
    with pytest.raises(InputError, match=r"h.yaml: the hierarchy has a cycle \(a -> b -> a\); class 'a' is its own"):
        add_classes(
            ctx.store.url,
            str(tmp_path / "n.npz"),
            model=unit.key,
            hierarchy=str(tmp_path / "h.yaml"),
            prior_weight=1.0,
            log=lambda m: None,
        )


@pytest.mark.integration
def test_candidates_share_one_shuffled_copy_even_without_resume(client, tmp_path):
    """Without resume every unit is recomputed once, but a unit this run made is not made again: the
    NCMML candidates of a grid read one shuffled copy (rewriting it for each would pull it from under
    the readers of the first)."""
    from metricpipe.config import parse_config
    from metricpipe.context import StageContext
    from metricpipe.stages import run_stage, run_statistics
    from metricpipe.store import Store

    raw = {
        "data": {"source": "digits", "chunk_mb": 0.05},
        "methods": [{"method": "ncmml", "dim": 4, "iters": 20, "lr": [0.1, 1.0, 10.0]}],
    }
    for attempt in range(2):  # the second run (resume off) recomputes everything, the copy once
        lines = []
        ctx = StageContext(client, Store(str(tmp_path)), parse_config(raw), resume=False, log=lines.append)
        data = run_stage(ctx)
        models = run_train(ctx, data, run_statistics(ctx, data), None)
        assert len(models) == 3 and sum("shuffled" in ln for ln in lines) == 1, lines


def _assert_fit_stream_learns_the_stored_model(ctx, data, spec, unit):
    """The stored model is what ``fit_stream`` learns in memory from the pools of every training row
    (block_rows = the run's); returns those rows and labels."""
    from metricpipe.store import load_arrays
    from metricpipe.tasks import moments, registry, stream

    train = data.split == 0
    Xt, yt = open_array(f"{data.url}/features")[:][train], data.labels[train]
    est = registry.make(spec)
    val = stream.validation_split(yt, est.validation, stream.row_keys(Xt), 0)
    keep = np.ones(len(yt), bool)
    keep[val] = False
    stats = moments.without_rows(load_arrays(_stats_url((ctx,)))[0], Xt[val], yt[val])  # validation in no mean
    est.fit_stream(stats, stream.pools(Xt, yt, keep, data.chunk_rows, 0), Xt[val], yt[val])
    np.testing.assert_array_equal(est.components_, load_estimator(unit.url).components_)
    return Xt, yt


def test_sgd_that_reads_a_few_pools_gets_a_copy_of_those_blocks_only_and_learns_what_fit_stream_learns(
    client, tmp_path
):
    """NCMML's iters x batch (+ validation) rows are a few of the copy's blocks: only the blocks that
    epoch 0 visits first are written, and the model is the one ``fit_stream`` learns in memory from
    every row's pools, bit for bit (so nothing it read was missing). A learner that reads past them
    is stopped, not fed unwritten rows."""
    from metricpipe.stages.train import shuffle

    X, y = make_blobs(n=3000, d=12, classes=5, sep=0.9, seed=4)
    np.savez(tmp_path / "d.npz", X=X, y=y)
    spec = {
        "method": "ncmml",
        "dim": 4,
        "iters": 6,
        "batch": 50,
        "validate_every": 2,
        "validation": 100,
        "select": False,
    }
    ctx, data, stats = staged(
        client,
        tmp_path / "s",
        {
            "data": {"path": str(tmp_path / "d.npz"), "chunk_mb": 0.005, "normalize": "l2", "split": {"val": 0}},
            "methods": [spec],
        },
    )
    lines = []
    ctx.log = lines.append
    [(spec, unit, _)] = run_train(ctx, data, stats, None)
    train = data.split == 0
    n, br = int(train.sum()), data.chunk_rows
    [copy] = ctx.store.units("shuffled")
    written = copy.meta()["blocks"]
    n_blocks = -(-n // br)
    assert 6 * 50 + 100 <= written * br and written < n_blocks / 3, (written, n_blocks)
    assert any(f"({written} of {n_blocks} blocks, what SGD reads)" in ln for ln in lines), lines
    # the stored model is what fit_stream learns from the pools of every training row
    _assert_fit_stream_learns_the_stored_model(ctx, data, spec, unit)
    # reading on past the written blocks is an error naming the copy
    with pytest.raises(RuntimeError, match=f"holds {written} blocks and SGD asked for block"):
        for _ in shuffle.stream_pools(copy.url, br, 0):
            pass


def test_a_copy_smaller_than_a_block_is_one_chunk_read_once_and_trains_what_fit_stream_learns(
    client, tmp_path, monkeypatch
):
    """Zarr stores an edge chunk whole: the copy of 480 rows in a 64 MB block was one 64 MB chunk,
    decoded at every pool read (38 ms, 2,000 reads a model on digits). Its chunk is its rows now,
    and the model is still the one the in-memory pools of one block give."""
    from metricpipe.tasks import stream

    X, y = make_blobs(n=600, d=12, classes=5, sep=0.9, seed=4)
    np.savez(tmp_path / "d.npz", X=X, y=y)
    spec = {
        "method": "ncmml",
        "dim": 4,
        "iters": 30,
        "batch": 50,
        "validate_every": 10,
        "validation": 100,
        "select": False,
    }
    ctx, data, stats = staged(
        client, tmp_path / "s", {"data": {"path": str(tmp_path / "d.npz"), "split": {"val": 0}}, "methods": [spec]}
    )
    [(spec, unit, _)] = run_train(ctx, data, stats, None)
    train = data.split == 0
    n, br = int(train.sum()), data.chunk_rows
    assert br > 100 * n
    [copy] = ctx.store.units("shuffled")
    assert open_array(f"{copy.url}/features").chunks == (n, 12)
    Xt, yt = _assert_fit_stream_learns_the_stored_model(ctx, data, spec, unit)
    # and the one block is read once, not once a pool: the pools are the in-memory ones all the same
    from metricpipe.stages.train import shuffle

    reads = []
    monkeypatch.setattr(shuffle, "read_pool", lambda *a, _f=shuffle.read_pool: reads.append(a) or _f(*a))
    got = shuffle.stream_pools(copy.url, br, 0)
    for (Xa, ya), (Xb, yb), _ in zip(got, stream.pools(Xt, yt, None, br, 0), range(5)):
        np.testing.assert_array_equal(Xa, Xb)
        np.testing.assert_array_equal(ya, yb)
    assert len(reads) == 1


def test_a_validation_share_rounded_up_over_many_classes_still_fits_the_partial_copy(client, tmp_path):
    """1,000 classes and validation: 10 hold out ~1,000 rows (at least one of every class), not 10:
    the copy's blocks still hold every pool row SGD reads (found in review: the run stopped with
    "holds 5 of 10 blocks and SGD asked for block 1")."""
    X, y = make_blobs(n=12000, d=12, classes=1000, seed=5)
    np.savez(tmp_path / "d.npz", X=X, y=y)
    spec = {
        "method": "ncmml",
        "dim": 4,
        "iters": 87,
        "batch": 50,
        "validation": 10,
        "validate_every": 1000,
        "select": False,
    }
    ctx, data, stats = staged(
        client,
        tmp_path / "s",
        {"data": {"path": str(tmp_path / "d.npz"), "chunk_mb": 0.05, "split": {"val": 0}}, "methods": [spec]},
    )
    [(spec, unit, _)] = run_train(ctx, data, stats, None)
    [copy] = ctx.store.units("shuffled")
    n = int((data.split == 0).sum())
    assert copy.meta()["blocks"] < -(-n // data.chunk_rows)  # still a partial copy
    assert load_estimator(unit.url).best_iter_ is not None


def _flip_last_bytes(unit_dir):
    from pathlib import Path

    chunk = sorted(p for p in Path(unit_dir).rglob("*") if p.is_file() and p.name != "zarr.json")[0]
    data = chunk.read_bytes()
    chunk.write_bytes(data[:-2] + bytes(b ^ 0xFF for b in data[-2:]))
    return chunk, data


def test_add_classes_refuses_a_damaged_model_and_recomputes_a_damaged_copy(trained, tmp_path):
    """A damaged model would be extended with its damage and committed whole (checksums of the copy);
    a damaged copy add-classes made is recomputed by the same command, which is what its message says."""
    import shutil

    from metricpipe.commands.classes import add_classes, predict
    from metricpipe.tasks.errors import InputError

    ctx, _, models, _, _ = trained
    store = tmp_path / "store"
    shutil.copytree(ctx.store.url, store)
    [unit] = [u for s, u, _ in models if s["method"] == "ncmml" and s.get("classes") and s["objective"] == "euclidean"]
    rng = np.random.default_rng(7)
    np.savez(tmp_path / "new.npz", X=rng.normal(0, 1, (40, 12)).astype(np.float32), y=np.repeat([31, 32], 20))
    chunk, intact = _flip_last_bytes(store / "models" / unit.key)
    before = sorted(p.name for p in (store / "models").iterdir())
    with pytest.raises(
        InputError,
        match=rf"model {unit.key} is damaged: models/{unit.key}/\S+: checksum differs .*; "
        r"rerun the run that made it with --repair",
    ):
        add_classes(str(store), str(tmp_path / "new.npz"), model=unit.key, log=lambda m: None)
    assert sorted(p.name for p in (store / "models").iterdir()) == before  # no copy was made
    chunk.write_bytes(intact)
    [info] = add_classes(str(store), str(tmp_path / "new.npz"), model=unit.key, log=lambda m: None)
    copy = info["model"].split("/")[-1]
    chunk, intact = _flip_last_bytes(store / "models" / copy)
    np.savez(tmp_path / "probe.npz", X=np.ones((3, 12), np.float32), y=np.array([31, 32, 31]))
    with pytest.raises(
        InputError,
        match=rf"model {copy} is damaged: .*; delete models/{copy} and rerun the "
        r"metricpipe add-classes that made it",
    ):
        predict(str(store), copy, str(tmp_path / "probe.npz"))
    logs = []
    [again] = add_classes(str(store), str(tmp_path / "new.npz"), model=unit.key, log=logs.append)
    assert {**again, "seconds": 0} == {**info, "seconds": 0}
    assert not any("reusing" in m for m in logs) and chunk.read_bytes() == intact  # made again, same bits


def test_classes_name_the_data_s_labels_through_the_pipeline(client, tmp_path):
    """NCMML's classes are labels as the data holds them (they were positions: with labels 10..14,
    classes [11, 13] was refused and [1, 3] trained labels 11 and 13). Labels 0..4, 10..14 and text
    c0..c4 with the same classes named each way train the same W and report the same new-class error."""
    X, y = make_blobs(n=600, d=8, classes=5, sep=0.9, seed=7)
    common = {"dim": 3, "iters": 40, "batch": 100, "validate_every": 10, "validation": 100, "select": False}
    out = []
    for name, labels, classes in (
        ("int", y, [3, 1]),
        ("shifted", y + 10, [11, 13]),
        ("text", np.array([f"c{v}" for v in y]), ["c1", "c3"]),
    ):
        np.savez(tmp_path / f"{name}.npz", X=X, y=labels)
        ctx, data, stats = staged(
            client,
            tmp_path / name,
            {
                "data": {"path": str(tmp_path / f"{name}.npz"), "chunk_mb": 0.005, "split": {"val": 0}},
                "methods": [{"method": "ncmml", **common, "classes": classes}],
                "evaluate": {"retrieval": False, "classification": {"classifiers": ["ncm"]}},
            },
        )
        models = run_train(ctx, data, stats, None)
        evals = run_evaluate(ctx, data, run_encode(ctx, data, models))
        recs = evals[0][1].read_json("records.json")
        new = [r["value"] for r in recs if r["metric"] == "top1_error_new_classes"]
        out.append((load_estimator(models[0][1].url).components_, new))
    assert out[0][1] and all(o[1] == out[0][1] for o in out), [o[1] for o in out]
    for W, _ in out[1:]:
        np.testing.assert_array_equal(W, out[0][0])


def test_a_model_is_scored_with_its_own_classifier_whatever_the_config_lists():
    from metricpipe.config import parse_config
    from metricpipe.stages.evaluate import served_classifiers

    ev = parse_config(
        {"data": {"source": "digits"}, "evaluate": {"classification": {"classifiers": ["knn1"]}}}
    ).evaluate
    assert served_classifiers(ev, {"method": "ncmml"}) == ("knn1", "ncm")
    assert served_classifiers(ev, {"method": "ncmc"}) == ("knn1", "ncmc")
    assert served_classifiers(ev, {"method": "pca"}) == ("knn1",)
    ev = parse_config({"data": {"source": "digits"}}).evaluate  # the defaults list ncm already: once
    assert served_classifiers(ev, {"method": "ncmml"}) == ("knn1", "knn10", "ncm")
