"""NCMML, NCMC and k-NN ML as estimators: in-memory fit equals the stream entry point, predict and
predict_proba follow Eqs. 5, 22 and 27, parameters work in GridSearchCV, state round-trips."""

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from metricpipe.tasks import moments, ncmml, stream
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.ncmml import KNNML, NCMC, NCMML, ncm_scores
from tests.conftest import make_blobs


@pytest.fixture(scope="module")
def data():
    X, y = make_blobs(n=600, d=12, classes=5, sep=0.8, seed=4)
    return X / np.linalg.norm(X, axis=1, keepdims=True), y


SGD = {"dim": 4, "iters": 40, "batch": 50, "validate_every": 10, "validation": 100, "random_state": 3}


@pytest.mark.parametrize(
    "est",
    [
        NCMML(**SGD),
        NCMML(**SGD, objective="dot", lr=1.0),
        NCMC(**SGD, centroids=2),
        KNNML(**{**SGD, "batch": 30, "lr": 0.1}),
    ],
    ids=["ncmml", "dot", "ncmc", "knnml"],
)
def test_fit_equals_the_stream_entry_point_fed_by_the_same_pools(data, est):
    X, y = data
    a = clone(est).fit(X, y, block_rows=97)
    b = clone(est)
    seed = 3
    keys = stream.row_keys(X)
    val = stream.validation_split(y, est.validation, keys, seed)
    keep = np.ones(len(y), bool)
    keep[val] = False
    extra = {}
    Xt, yt = X[keep], y[keep]  # the class means and centroids leave validation out
    if isinstance(est, NCMC):
        sample = est.kmeans_sample(yt, keys[keep], seed)
        bl = stream.block_rows_for(X.shape[1])
        extra["centroids"] = b.kmeans(
            Xt[sample], yt[sample], lambda: iter([(Xt[s : s + bl], yt[s : s + bl]) for s in range(0, len(Xt), bl)]), 5
        )
    if isinstance(est, KNNML):
        ref = est.reference_rows(y, keep, keys, est.validation, seed)
        extra["reference"] = (X[ref], y[ref])
    stats = moments.without_rows(moments.statistics(X, y), X[val], y[val])
    b.fit_stream(stats, stream.pools(X, y, keep, 97, seed), X[val], y[val], **extra)
    np.testing.assert_array_equal(a.components_, b.components_)
    assert a.history_ == b.history_ and a.best_iter_ == b.best_iter_


@pytest.mark.parametrize("est", [NCMML(**SGD), NCMC(**SGD, centroids=2, kmeans_iters=100)], ids=["ncmml", "ncmc"])
def test_rows_held_out_for_validation_are_in_no_class_mean_or_centroid(est):
    """Validation rows carved from X score early stopping only: every centroid is the mean of the other
    rows it owns. (They were in the class means and NCMC's k-means: on digits NCMC's validation error
    was 0, its own rows pulling the centroids, and early stopping kept the start.)"""
    X, y = load_digits(return_X_y=True)
    X = (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32)
    rest = np.ones(len(y), bool)
    rest[stream.validation_split(y, est.validation, stream.row_keys(X), 3)] = False
    a = clone(est).fit(X, y)
    cents, owner = a.centroids_.astype(np.float64), a.centroid_classes_
    for c in range(10):
        Xc, mine = X[rest & (y == c)].astype(np.float64), np.flatnonzero(owner == c)
        near = np.argmin(((Xc[:, None] - cents[mine][None]) ** 2).sum(-1), axis=1)
        for k, m in enumerate(mine):
            np.testing.assert_allclose(cents[m], Xc[near == k].mean(0), rtol=1e-4, atol=1e-6)
    assert a.best_iter_ > 0 and a.val_error_ > 0


def test_new_classes_monitor_rows_are_not_in_their_class_means():
    X, y = load_digits(return_X_y=True)
    X = X.astype(np.float32)
    est = NCMML(**{**SGD, "classes": list(range(8))}).fit(X, y)
    keys = stream.row_keys(X)
    new = np.flatnonzero(y >= 8)
    held = stream.seeded_sample(new[stream.validation_split(y[new], est.validation, keys[new], 3)], est.validation, 3)
    rest = np.ones(len(y), bool)
    rest[held] = False
    assert est.val_error_new_classes_ is not None and len(held) > 0
    for c in (8, 9):  # computed on the rows the monitor does not score
        np.testing.assert_allclose(est.centroids_[c], X[rest & (y == c)].mean(axis=0), rtol=1e-5)


@pytest.mark.parametrize(
    "est",
    [
        NCMML(**SGD),
        NCMML(**SGD, objective="dot", lr=1.0),
        NCMC(**SGD, centroids=2),
        KNNML(**{**SGD, "batch": 30, "lr": 0.1}),
    ],
    ids=["ncmml", "dot", "ncmc", "knnml"],
)
def test_lr_means_the_same_whatever_the_rows_scale(data, est):
    """Rows 16 times larger (raw pixels against l2 rows) train the same model in their own units:
    W / 16, the same validation errors, the same kept step. Unscaled, lr = 30 on rows of norm 16 is a
    step 256 times larger."""
    X, y = data
    seed, c = 3, 16.0
    keys = stream.row_keys(X)
    val = stream.validation_split(y, est.validation, keys, seed)
    keep = np.ones(len(y), bool)
    keep[val] = False
    fits = []
    for f in (1.0, c):
        Xf, extra = X * f, {}
        if isinstance(est, NCMC):
            sample = est.kmeans_sample(y, keys, seed)
            cents, owner = est.kmeans(X[sample], y[sample], lambda: iter([(X, y)]), 5)
            extra["centroids"] = (cents * f, owner)
        if isinstance(est, KNNML):
            ref = est.reference_rows(y, keep, keys, est.validation, seed)
            extra["reference"] = (Xf[ref], y[ref])
        fits.append(
            clone(est).fit_stream(
                moments.statistics(Xf, y), stream.pools(Xf, y, keep, 97, seed, keys), Xf[val], y[val], **extra
            )
        )
    one, big = fits
    # the same path: every validation's error and every logged batch value (log-likelihood or
    # violating triplets), along a path where W moved (the errors change)
    assert len({h["val_error"] for h in one.history_}) > 2
    assert [h["val_error"] for h in big.history_] == [h["val_error"] for h in one.history_]
    assert [h["batch"] for h in big.history_[1:]] == pytest.approx([h["batch"] for h in one.history_[1:]], rel=1e-6)
    np.testing.assert_allclose(
        big.components_ * c, one.components_, rtol=1e-4, atol=1e-5 * np.abs(one.components_).max()
    )
    assert big.best_iter_ == one.best_iter_
    if getattr(one, "class_bias_", None) is not None:
        np.testing.assert_allclose(big.class_bias_, one.class_bias_, rtol=1e-4, atol=1e-5)
    if not isinstance(est, KNNML):
        np.testing.assert_array_equal(big.predict(X[val] * c), one.predict(X[val]))


def test_early_stopping_keeps_the_best_validated_w(data):
    X, y = data
    est = NCMML(**{**SGD, "lr": 300.0}).fit(X, y)  # a step that overshoots: later W are worse
    errors = [h["val_error"] for h in est.history_]
    assert est.val_error_ == min(errors) and est.best_iter_ == est.history_[int(np.argmin(errors))]["iter"]


def test_predict_proba_is_eq5_softmax_and_predict_its_argmax(data):
    X, y = data
    est = NCMML(**SGD).fit(X, y)
    W = est.components_.astype(np.float64)
    P = est.predict_proba(X[:20])
    s = ncm_scores(X[:20] @ W, est.centroids_.astype(np.float64) @ W)  # -||Wx - W mu_c||^2 / 2
    ref = np.exp(s - s.max(1, keepdims=True))
    np.testing.assert_allclose(P, ref / ref.sum(1, keepdims=True), rtol=1e-10)
    np.testing.assert_array_equal(est.predict(X[:20]), est.classes_[P.argmax(1)])
    rest = np.ones(len(y), bool)  # the class means of the rows validation does not score
    rest[stream.validation_split(y, est.validation, stream.row_keys(X), 3)] = False
    np.testing.assert_allclose(est.centroids_, np.stack([X[rest & (y == c)].mean(0) for c in range(5)]), rtol=1e-5)


def test_labels_of_any_type_come_back_as_given(data):
    X, y = data
    names = np.array(["cat", "dog", "eel", "fox", "gnu"])[y]
    est = NCMC(**SGD, centroids=2).fit(X, names)
    assert set(est.predict(X[:50])) <= set(names) and est.score(X, names) > 0.5


def test_state_round_trip_gives_the_same_codes_and_classes(data):
    X, y = data
    for est in (NCMML(**SGD, objective="dot", lr=1.0).fit(X, y), KNNML(**SGD).fit(X, y)):
        again = type(est).from_state(est.get_params(), est.fitted_state())
        np.testing.assert_array_equal(again.transform(X), est.transform(X))
        if hasattr(est, "predict"):
            np.testing.assert_array_equal(again.predict(X), est.predict(X))


def test_the_same_rows_stored_in_another_order_learn_the_same_model(data):
    X, y = data
    order = np.argsort(y, kind="stable")
    shuffled = np.random.default_rng(0).permutation(len(y))  # another order within each class too
    for est in (NCMML(**SGD), KNNML(**{**SGD, "batch": 30}), NCMC(**SGD, centroids=3)):
        other = shuffled if isinstance(est, NCMC) else order
        a, b = clone(est).fit(X, y), clone(est).fit(X[other], y[other])
        # the same pools and validation rows; only the statistics' summation order (the PCA start and
        # the Lloyd passes' sums) differs. NCMC's k-means++ seeded in the stored order before
        np.testing.assert_allclose(a.components_, b.components_, rtol=1e-5, atol=1e-6)
        if isinstance(est, NCMC):
            np.testing.assert_allclose(a.centroids_, b.centroids_, rtol=1e-5, atol=1e-6)


def test_row_keys_follow_content_and_layouts_follow_seeds(data):
    X, _ = data
    keys = stream.row_keys(X)
    perm = np.random.default_rng(0).permutation(len(X))
    np.testing.assert_array_equal(stream.row_keys(X[perm]), keys[perm])
    assert len(np.unique(keys)) == len(X)
    pi0, pi1 = stream.layout(keys, 0), stream.layout(keys, 1)
    assert sorted(pi0) == list(range(len(X))) and not np.array_equal(pi0, pi1)
    np.testing.assert_array_equal(perm[stream.layout(keys[perm], 0)], pi0)  # the same rows, in the same order


def test_pools_of_class_sorted_rows_mix_the_classes():
    X, y = load_digits(return_X_y=True)
    order = np.argsort(y, kind="stable")
    Xs, ys = X[order], y[order]
    first = next(stream.pools(Xs, ys, None, 200, 0))[1]
    assert len(np.unique(first)) == 10  # a stored block of 200 sorted rows holds 2 classes
    assert len(np.unique(ys[:200])) <= 2


def test_grid_search_over_a_pipeline_with_ncmml():
    X, y = load_digits(return_X_y=True)
    X, y = X[:900], y[:900]
    search = GridSearchCV(
        make_pipeline(StandardScaler(), NCMML(dim=16, iters=100, batch=200, random_state=0)),
        {"ncmml__lr": [0.1, 30.0]},
        cv=3,
    ).fit(X, y)
    scores = search.cv_results_["mean_test_score"]
    assert np.all(np.isfinite(scores))  # standardised pixels (RMS norm 8): the default rate holds
    assert search.best_params_["ncmml__lr"] == [0.1, 30.0][int(np.argmax(scores))]
    assert search.best_score_ > 0.8


def test_knnml_without_a_class_of_two_rows_in_any_pool_is_an_error_not_a_hang():
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(100, 8)), np.repeat(np.arange(25), 4)  # pools of one row: never two of a class
    with pytest.raises(Exception, match="pools in a row held no class with two training rows"):
        KNNML(dim=4, iters=20, validate_every=10, validation=10, batch=10).fit(X, y, block_rows=1)


def test_validation_leaves_every_class_a_training_row():
    y = np.repeat(np.arange(30), 2)
    keys = stream.row_keys(np.arange(60, dtype=np.float32)[:, None])
    val = stream.validation_split(y, 5000, keys, 0)
    assert np.bincount(y[val], minlength=30).max() <= 1 and len(val) <= 30
    rest = np.setdiff1d(np.arange(60), val)
    assert set(y[rest]) == set(range(30))


def test_added_classes_and_the_trained_ones_all_take_their_implied_bias_in_the_dot_form(data):
    X, y = data
    est = NCMML(**SGD, objective="dot", lr=1.0).fit(X[y < 4], y[y < 4])
    learned = est.class_bias_.copy()
    new = X[y == 4].mean(0, keepdims=True)
    est.add_centroids(new, [7])  # a label, not a code: it gets code 4
    assert est.classes_.tolist() == [0, 1, 2, 3, 7]
    P = est.centroids_.astype(np.float64) @ est.components_.astype(np.float64)
    np.testing.assert_allclose(est.class_bias_, -0.5 * (P**2).sum(1), rtol=1e-5)
    assert not np.allclose(learned, est.class_bias_[:4], rtol=1e-3)  # the learned ones are replaced
    # the dot form with implied biases is the Euclidean NCM rule on the projected means
    Z = X @ est.components_.astype(np.float64)
    np.testing.assert_array_equal(est.predict(X), est.classes_[np.argmin(((Z[:, None] - P[None]) ** 2).sum(-1), 1)])
    assert (est.predict(X[y == 4]) == 7).mean() > 0.5


def test_dot_form_trained_on_some_classes_predicts_the_others_by_the_implied_bias(data):
    X, y = data
    est = NCMML(**SGD, objective="dot", lr=1.0, classes=[0, 1, 2]).fit(X, y)
    P = est.centroids_.astype(np.float64) @ est.components_.astype(np.float64)
    np.testing.assert_allclose(est.class_bias_, -0.5 * (P**2).sum(1), rtol=1e-5)
    assert (est.predict(X[y >= 3]) == y[y >= 3]).mean() > 0.5  # was 0: the left-out classes never won
    assert est.val_error_new_classes_ is not None


def test_add_centroids_keeps_the_fitted_labels_and_refuses_bad_classes(data):
    X, y = data
    names = np.array(["cat", "dog", "eel", "fox", "gnu"])[y]
    est = NCMML(**SGD).fit(X[y < 4], names[y < 4])
    est.add_centroids(X[y == 4].mean(0, keepdims=True), ["gnu"])
    assert est.classes_.tolist() == ["cat", "dog", "eel", "fox", "gnu"]
    assert est.predict(X[:5]).dtype.kind == "U" and est.score(X, names) > 0.5  # was codes: 'mix of label types'
    with pytest.raises(InputError, match="'gnu' is already one of the model's classes"):
        est.add_centroids(X[:1], ["gnu"])
    with pytest.raises(InputError, match="kind of the model's classes"):
        est.add_centroids(X[:1], [5])
    with pytest.raises(InputError, match="one label per centroid"):
        est.add_centroids(X[:2], ["hen"])
    with pytest.raises(InputError, match=r"centroids must be \(m, 12\)"):
        est.add_centroids(X[:1, :5], ["hen"])
    assert est.classes_.tolist() == ["cat", "dog", "eel", "fox", "gnu"]  # refused calls change nothing


@pytest.mark.parametrize("cls", [NCMML, NCMC, KNNML])
def test_fit_errors_name_the_problem_not_a_symptom(data, cls):
    X, y = data
    y1 = y.copy()
    y1[0] = 9  # a class of one sample: it cannot give a validation row and a training row
    with pytest.raises(
        InputError,
        match=r"class 9 has 1 sample\(s\); give every class at least 2, as the pipeline's stratified split requires",
    ):
        cls(**SGD).fit(X, y1)
    with pytest.raises(InputError, match="X_val needs y_val"):
        cls(**SGD).fit(X, y, X_val=X[:10])
    with pytest.raises(InputError, match=r"y_val must hold one label per row of X_val \(10\); got shape \(3,\)"):
        cls(**SGD).fit(X, y, X_val=X[:10], y_val=y[:3])


def test_dot_form_on_a_class_subset_stops_early_on_the_rule_it_returns():
    """Its validation error is the returned model's rule (implied biases, among the trained classes),
    not the learned biases' (which it does not return)."""
    X, y = make_blobs(n=900, d=12, classes=5, sep=0.35, seed=7)
    Xv, yv = X[y < 3][::3], y[y < 3][::3]
    est = NCMML(**{**SGD, "iters": 60, "validation": len(Xv)}, objective="dot", lr=3.0, classes=[0, 1, 2]).fit(
        X, y, X_val=Xv, y_val=yv
    )
    W = est.components_.astype(np.float64)
    P = est.centroids_[:3].astype(np.float64) @ W
    pred = np.argmax(Xv @ W @ P.T - 0.5 * (P**2).sum(1), axis=1)
    assert est.val_error_ == pytest.approx(float((pred != yv).mean()), abs=1e-12)


def test_a_model_that_float32_cannot_hold_is_a_divergence_not_a_committed_model():
    # a step too large for these rows: W grows past float32's range while still finite in float64; the
    # model is stored and its codes computed in float32, so it used to be kept with inf weights
    rng = np.random.default_rng(0)
    X = (rng.normal(size=(36, 5)) + np.repeat(np.eye(3, 5), 12, 0) * 2).astype(np.float32)
    y = np.repeat(np.arange(3), 12)
    with pytest.raises(InputError, match=r"diverged after \d+ steps \(W is not finite in float32\); lower 'lr'"):
        NCMML(dim=2, iters=50, lr=300).fit(X, y)
    assert np.isfinite(NCMML(dim=2, iters=50, lr=3).fit(X, y).components_).all()


def test_knnml_margin_reaches_the_training_and_the_stored_parameters(data):
    """margin is searched by selection: a margin the fit ignored would select among equal models."""
    X, y = data
    a = KNNML(**{**SGD, "batch": 30, "lr": 0.1}, margin=1.0).fit(X, y)
    b = KNNML(**{**SGD, "batch": 30, "lr": 0.1}, margin=0.01).fit(X, y)
    assert a.history_ != b.history_  # the trajectories differ (either may keep its start W)
    again = KNNML.from_state(b.get_params(), b.fitted_state())
    assert again.get_params()["margin"] == 0.01
    np.testing.assert_array_equal(again.transform(X[:20]), b.transform(X[:20]))


def test_knnml_defaults_move_off_the_pca_start_on_real_data():
    """At Eq. 35's margin 1 (the default until 0.3.11) nearly every triplet of rows of unit RMS norm
    violates, the first step grows W about 13-fold and early stopping kept the PCA start: KNNML()
    learned nothing on digits (best_iter_ 0 on three splits). The default margin now learns."""
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    est = KNNML(iters=200, random_state=0).fit(X, y)
    assert est.margin == KNNML.search_space["margin"][0]  # select: false is the default model
    assert est.best_iter_ > 0 and est.val_error_ < est.history_[0]["val_error"], est.history_


def test_an_unset_lr_backs_off_from_the_best_w_and_a_set_one_diverges():
    """KNNML() diverged on 120 classes of 10 rows at its default lr 0.1 (and at 0.01), NCMML() on HOG
    at 30 after 812 steps: a fit that raised where a smaller rate trains. Left unset, the rate now
    drops tenfold on each divergence (at most 3 times) and SGD goes on from the best W validated so
    far; a rate the user sets is still theirs, its divergence an error."""
    from sklearn.datasets import make_classification

    X, y = make_classification(1200, 100, n_informative=40, n_classes=120, n_clusters_per_class=1, random_state=0)
    with pytest.raises(InputError, match=r"diverged after \d+ steps .*lower 'lr' \(now 0.1\)"):
        KNNML(lr=0.1, random_state=0).fit(X, y)
    est = KNNML(random_state=0).fit(X, y)
    drops = [h for h in est.history_ if "lr" in h]
    assert [h["lr"] for h in drops] == [0.01, 0.001][: len(drops)] and drops and est.lr_ == drops[-1]["lr"]
    assert np.isfinite(est.components_).all() and est.best_iter_ > drops[-1]["iter"]  # it learned after
    assert est.val_error_ < est.history_[0]["val_error"]


def test_back_off_resumes_from_the_best_validated_w_at_a_tenth_of_the_rate():
    rng = np.random.default_rng(0)
    sgd = ncmml.MetricSGD(rng.normal(size=(2, 4)), "ncm", 30.0, rng.normal(size=(3, 4)), np.arange(3), 3, scale=2.0)
    best = sgd.W.copy()
    sgd.record(0.5, None)
    sgd.W += 7.0
    sgd.record(0.6, None)  # worse: the best stays the first
    step = sgd.step_W
    sgd.back_off()
    np.testing.assert_array_equal(sgd.W, best)
    assert sgd.lr == 3.0 and sgd.step_W == pytest.approx(step / 10) and sgd.history[-1] == {"iter": 0, "lr": 3.0}


def test_ncmc_gives_a_class_with_fewer_images_than_centroids_one_centroid_on_each():
    """NCMC() refused any class with fewer than 10 training images ("lower 'centroids'"), so its
    defaults failed 17 of scikit-learn's estimator checks and every few-shot data set."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(70, 6))
    y = np.array([0] * 40 + [1] * 24 + [2] * 6)
    Xv, yv = rng.normal(size=(9, 6)), np.array([0, 1, 2] * 3)
    est = NCMC(dim=3, centroids=10, iters=30, validate_every=10, random_state=0).fit(X, y, X_val=Xv, y_val=yv)
    assert np.bincount(est.centroid_classes_).tolist() == [10, 10, 6]
    small = est.centroids_[est.centroid_classes_ == 2].astype(np.float64)
    np.testing.assert_allclose(np.sort(small, axis=0), np.sort(X[y == 2], axis=0), rtol=1e-6)  # its 6 images


def test_classes_names_labels_as_y_holds_them_not_positions():
    """With labels 3..9, NCMML(classes=[5, 6]) trained labels 8 and 9 (positions 5 and 6 in classes_),
    silently; string labels could not be named at all."""
    X, y = make_blobs(n=700, d=8, classes=7, sep=1.0, seed=2)
    est = NCMML(**SGD, classes=[5, 6])
    np.testing.assert_array_equal(est.trained_classes(np.arange(3, 10)), [2, 3])
    fitted = est.fit(X, y + 3)
    assert fitted.trained_classes(fitted.classes_).tolist() == [2, 3]
    same = NCMML(**SGD, classes=[2, 3]).fit(X, y)  # the same classes by their 0-based labels
    np.testing.assert_array_equal(fitted.components_, same.components_)
    names = np.array(list("abcdefg"))[y]
    np.testing.assert_array_equal(NCMML(**SGD, classes=["c", "d"]).fit(X, names).components_, same.components_)
    with pytest.raises(
        InputError,
        match=r"'classes' parameter of NCMML lists \[12\], which is not among the class "
        r"labels \(3, 4, 5, 6, 7, \.\.\.\)",
    ):
        NCMML(**SGD, classes=[5, 12]).fit(X, y + 3)
    # numbers by value (a review: float labels could be named only as the text "2.0")
    for given in ([2.0, 3.0], [np.int64(2), "3"]):
        np.testing.assert_array_equal(NCMML(**SGD, classes=given).fit(X, y.astype(float)).components_, same.components_)


def test_text_labels_are_named_as_text_and_numbers_by_value_only_where_the_labels_are_numbers():
    """A review: every text that float() reads was a number, so with text labels "01" and "1" one
    overwrote the other ("01" trained class "1"), "1_0" named "10", and the label "nan" could not be named."""
    X, y = make_blobs(n=700, d=8, classes=7, sep=1.0, seed=2)
    names = np.array(["01", "1", "2", "3", "nan", "1_0", "10"])[y]
    est = NCMML(**SGD, classes=["01", "2"])
    assert est.trained_classes(np.unique(names)).tolist() == [0, 4]  # sorted: 01, 1, 10, 1_0, 2, 3, nan
    assert est.fit(X, names).trained_classes(est.classes_).tolist() == [0, 4]
    assert NCMML(**SGD, classes=["nan", "1_0", 10]).trained_classes(np.unique(names)).tolist() == [2, 3, 6]
    with pytest.raises(InputError, match=r"lists \['001'\], which is not among"):
        NCMML(**SGD, classes=["001"]).trained_classes(np.unique(names))
    # numeric labels: text naming a number by value, but not Python's "1_0" or "nan"
    assert NCMML(**SGD, classes=["01", " 3 ", "1e1"]).trained_classes(np.array([1, 3, 10])).tolist() == [0, 1, 2]
    for text in ("1_0", "nan"):
        with pytest.raises(InputError, match="not among the class labels"):
            NCMML(**SGD, classes=[text]).trained_classes(np.array([1, 3, 10]))
    # a review: YAML reads an unquoted 2.0 as a number, which named the text label "2", not "2.0"
    assert NCMML(**SGD, classes=[2.0, 2.5]).trained_classes(np.array(["1.5", "2.0", "2.5"])).tolist() == [1, 2]
    assert NCMML(**SGD, classes=[2.0]).trained_classes(np.array(["1", "2", "3"])).tolist() == [1]
    # and a float beyond 2^53 holds no exact integer: it named a neighbouring label
    big = np.array([2**53, 2**53 + 1])
    assert NCMML(**SGD, classes=["9007199254740993"]).trained_classes(big).tolist() == [1]
    for given in ("9007199254740993.0", 9007199254740993.0):
        with pytest.raises(InputError, match="beyond 2\\^53 written as a float, which names no label exactly"):
            NCMML(**SGD, classes=[given]).trained_classes(big)


def test_ncmc_counts_a_class_s_training_images_not_its_share_of_the_k_means_sample(monkeypatch):
    """A review: the k-means sample holds each class's share, so a class of 12 images beside one of
    5,988 had 8 rows in it and got 8 centroids of 10 (before the one-per-image rule: refused)."""
    rng = np.random.default_rng(0)
    y = np.array([0] * 12 + [1] * 5988)
    X = rng.normal(size=(len(y), 4)) + y[:, None]
    keys = stream.row_keys(X)
    pos = NCMC.kmeans_sample(y, keys, 0, per_class=40)
    assert np.bincount(y[pos]).tolist()[0] < 10  # the class's share alone
    pos = NCMC.kmeans_sample(y, keys, 0, per_class=40, at_least=10)
    assert np.bincount(y[pos])[0] == 10 and set(pos) >= set(NCMC.kmeans_sample(y, keys, 0, per_class=40))
    Xv, yv = X[::500], y[::500]
    monkeypatch.setattr(NCMC, "kmeans_per_class", lambda self, n_classes, n_features: 40)  # as small a sample
    est = NCMC(dim=2, centroids=10, iters=20, validate_every=10, random_state=0).fit(X, y, X_val=Xv, y_val=yv)
    assert np.bincount(est.centroid_classes_).tolist() == [10, 10]


@pytest.mark.parametrize(
    "est",
    [
        NCMML(**SGD),
        NCMML(**SGD, objective="dot", lr=1.0),
        NCMC(**SGD, centroids=2),
        KNNML(**{**SGD, "batch": 30, "lr": 0.1}),
    ],
    ids=["ncmml", "dot", "ncmc", "knnml"],
)
def test_a_class_without_training_rows_neither_trains_nor_gets_a_mean(data, est):
    """A run's held-out class (data.split.classes) has no train row: the statistics count 0 rows of
    it. The model is the one fitted without that class existing at all (no zero mean at the origin
    in the softmax, no k-means of no rows), and it has no centroid to predict it with."""
    X, y = data
    seen = y != 4
    Xs, ys = X[seen], y[seen]
    keys = stream.row_keys(Xs)
    val = stream.validation_split(ys, est.validation, keys, 3)
    keep = np.ones(len(ys), bool)
    keep[val] = False

    def fit(n_classes):
        b = clone(est)
        extra = {}
        if isinstance(est, NCMC):
            sample = b.kmeans_sample(ys[keep], keys[keep], 3)
            extra["centroids"] = b.kmeans(
                Xs[keep][sample],
                ys[keep][sample],
                lambda: iter([(Xs[keep], ys[keep])]),
                n_classes,
                np.bincount(ys[keep], minlength=n_classes),
            )
        if isinstance(est, KNNML):
            ref = est.reference_rows(ys, keep, keys, est.validation, 3)
            extra["reference"] = (Xs[ref], ys[ref])
        stats = moments.finalize_statistics(moments.partial_moments(Xs[keep], ys[keep], n_classes))
        return b.fit_stream(stats, stream.pools(Xs, ys, keep, 97, 3), Xs[val], ys[val], **extra)

    held, alone = fit(5), fit(4)  # class 4 counted with 0 rows / not a class at all
    np.testing.assert_array_equal(held.components_, alone.components_)
    assert held.history_ == alone.history_
    if not isinstance(est, KNNML):
        assert set(held.centroid_classes_) == {0, 1, 2, 3}
        np.testing.assert_array_equal(held.centroids_, alone.centroids_)
        assert not (held.predict(X) == 4).any()
        if getattr(est, "objective", None) == "dot":
            np.testing.assert_array_equal(held.class_bias_[:4], alone.class_bias_)
