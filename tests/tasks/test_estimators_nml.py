"""NML and LinearML as scikit-learn estimators: the common checks, the entry points the pipeline
calls (the same code path as fit), user pairs, parameter search, and batches that mix classes on
data stored sorted by class."""

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from metricpipe.tasks import evaluation, moments, nml, stream
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.nml import NML, LinearML
from metricpipe.tasks.normalize import normalize_rows
from tests.conftest import make_blobs

SMALL = {"dim": 2, "pairs": 200, "iters": 200, "batch": 32}


# scikit-learn's estimator checks for NML and LinearML: tests/tasks/test_estimator_checks.py


def _data(n=400, d=12, classes=5, seed=0):
    X, y = make_blobs(n=n, d=d, classes=classes, seed=seed, sep=1.5)
    return np.abs(X), y


def _reference_sgd(est, L0, X, batches):
    """Algorithm 1 in mini-batches, by hand: one PairSGD step per batch of (rows i, rows j, y)."""
    sgd = nml.PairSGD(L0, est._kind, est._searched("lr"), est.bias, est.margin, est.learn_bias, est.optimizer)
    for i, j, s in batches:
        sgd.step(X[i], X[j], s)
    return sgd


@pytest.mark.parametrize("cls", [NML, LinearML])
def test_fit_is_fit_stream_fed_by_the_in_memory_pools(cls):
    X, y = _data()
    est = cls(dim=3, pairs=300, iters=700, batch=16, validation=0, random_state=3)
    a = clone(est).fit(X, y, block_rows=90)
    stats = moments.statistics(X)
    init, scale = (None, 1.0) if cls is NML else (stats["pca_components"], moments.row_scale(stats))
    b = clone(est).fit_stream(stream.pools(X, y, None, 90, 3), len(X), X.shape[1], init, row_scale=scale)
    assert np.array_equal(a.L_, b.L_) and a.history_ == b.history_ and a.bias_ == b.bias_
    assert a.pairs_seen_ == 700 and a.n_pairs_ == 700 and a.pair_source_ == "labels"
    its = [h["iter"] for h in a.history_]
    assert its[-1] == 700 and np.all(np.diff(its) > 0) and 40 <= len(its) <= 60
    assert np.array_equal(a.classes_, np.arange(5))
    c = clone(est).set_params(random_state=4).fit(X, y, block_rows=90)
    assert not np.allclose(a.L_, c.L_)  # the seed matters


def test_fit_from_labels_is_the_reference_loop_on_one_pool():
    """One pool (block_rows >= n): the pairs of sample_pairs drawn once with the [seed, 17] stream,
    then batches of 16 in order; iters = 250 cuts the last batch to 10 pairs."""
    X, y = _data(n=120)
    est = NML(dim=3, pairs=250, iters=250, batch=16, optimizer="sgd", lr=50.0, validation=0, random_state=1)
    est.fit(X, y, block_rows=1000)
    pi = stream.layout(stream.row_keys(X), 1)
    [(_, pos)] = stream.epoch_order(len(X), 1000, 0, 1)
    rows = pi[pos]
    i, j, s = nml.sample_pairs(y[rows], 250, np.random.default_rng([1, 17]))
    Xp = normalize_rows(X[rows], "l1")
    L0 = np.random.default_rng([1, 19]).uniform(-0.5, 0.5, (3, X.shape[1]))
    ref = _reference_sgd(est, L0, Xp, [(i[a : a + 16], j[a : a + 16], s[a : a + 16]) for a in range(0, 250, 16)])
    assert ref.steps == est.n_steps_ == 16
    np.testing.assert_array_equal(est.L_, ref.L.astype(np.float32))


def test_each_pass_draws_pairs_pairs_shared_out_by_pool_size():
    X, y = _data(n=400)
    est = LinearML(dim=2, pairs=1000, iters=2000)
    est._validate_params()
    got = list(est._label_pair_pools(stream.pools(X, y, None, 150, 0), len(X), np.random.default_rng(0)))
    sizes = [len(Xp) for Xp, *_ in got]
    counts = [len(s) for *_, s in got]
    assert sum(counts) == 2000 and sum(counts[:3]) == 1000  # 3 pools (150, 150, 100 rows) a pass
    for m, c in zip(sizes, counts):
        assert abs(c - 1000 * m / 400) <= 1


def test_batches_mix_classes_when_the_rows_are_sorted_by_class():
    """Digits sorted by label: a stored row-block of 180 rows holds 2 classes (the old per-block
    grouping's batches), a pool holds them all, and so does the first batch of 64 pairs."""
    X, y = load_digits(return_X_y=True)
    order = np.argsort(y, kind="stable")
    X, y = X[order], y[order]
    assert len(np.unique(y[:180])) <= 2
    X0, y0 = next(stream.pools(X, y, None, 180, 0))
    assert len(np.unique(y0)) >= 8
    est = NML(dim=2, pairs=5000, iters=5000, batch=64)
    est._validate_params()
    Xp, i, j, s = next(est._label_pair_pools(stream.pools(X, y, None, 180, 0), len(X), np.random.default_rng(0)))
    classes = np.unique(np.r_[y0[i[:64]], y0[j[:64]]])
    assert len(classes) >= 8
    assert 20 <= (s[:64] > 0).sum() <= 44  # about half similar
    assert np.array_equal(y0[i] == y0[j], s > 0)


def test_user_pairs_follow_the_layout_groups_of_the_pipeline():
    """fit_pairs with row indices visits the pairs group by group (blocks of the layout) in the order
    of pair_groups, and each pair's rows are the right rows of X."""
    X, y = _data(n=300)
    rng = np.random.default_rng(5)
    P = rng.integers(0, 300, (800, 2))
    s = np.where(y[P[:, 0]] == y[P[:, 1]], 1, -1)
    est = LinearML(dim=3, iters=1000, batch=32, random_state=2)
    est.fit_pairs(P, s, X=X, block_rows=70)
    pi = stream.layout(stream.row_keys(X), 2)
    pos = np.empty(300, np.int64)
    pos[pi] = np.arange(300)
    batches, seen = [], 0
    for blocks, sel in nml.pair_groups(pos[P[:, 0]], pos[P[:, 1]], 300, 70, 2):
        assert set(pos[P[sel]].ravel() // 70) <= set(blocks) and len(blocks) <= 2
        for a in range(0, len(sel), 32):
            b = sel[a : a + 32][: 1000 - seen]
            batches.append((P[b, 0], P[b, 1], s[b].astype(np.float32)))
            seen += len(b)
            if seen == 1000:
                break
        if seen == 1000:
            break
    # LinearML reads lr for rows of unit RMS norm: the reference runs on the rows over that norm
    stats = moments.statistics(X)
    s = moments.row_scale(stats)
    assert abs(s - 1) > 0.5  # the scaling is tried, not a no-op
    ref = _reference_sgd(est, stats["pca_components"][:3], (X / s).astype(np.float32), batches)
    np.testing.assert_allclose(est.L_, ref.L / s, rtol=1e-4, atol=1e-6)
    assert est.pair_source_ == "user" and est.n_pairs_ == 800 and est.pairs_seen_ == 1000
    assert not hasattr(est, "classes_")


def test_pairs_as_metric_learn_takes_them():
    """(n_pairs, 2, n_features) pairs: the rows 2k, 2k + 1 of pairs.reshape(-1, D), paired."""
    X, y = _data(n=200)
    rng = np.random.default_rng(0)
    P = rng.integers(0, 200, (300, 2))
    s = np.where(y[P[:, 0]] == y[P[:, 1]], 1, -1)
    est = NML(dim=3, iters=3000, lr=0.01)
    a = clone(est).fit_pairs(X[P], s)
    b = clone(est).fit_pairs(np.arange(600).reshape(300, 2), s, X=X[P].reshape(600, -1))
    assert np.array_equal(a.L_, b.L_) and a.n_features_in_ == 12
    # it learns: the hinge of Eq. 9 over the pairs falls well below the start's
    X1 = normalize_rows(X, "l1")
    L0 = np.random.default_rng([0, 19]).uniform(-0.5, 0.5, (3, 12))
    f = lambda L: nml.nml_loss_and_gradient(L, X1[P[:, 0]], X1[P[:, 1]], s.astype(float), 0.1, 0.02)[0]  # noqa: E731
    assert f(a.L_.astype(np.float64)) < 0.6 * f(L0)


@pytest.mark.parametrize(
    "pairs,y,X,match",
    [
        (np.zeros((4, 3)), [1, -1, 1, -1], None, r"shape \(n_pairs, 2, n_features\)"),
        (np.zeros((4, 3), int), [1, -1, 1, -1], np.ones((5, 2)), r"\(n_pairs, 2\) array of row indices"),
        (np.array([[0, 1], [2, 9]]), [1, -1], np.ones((5, 2)), "pair index j=9 is out of range 0..4"),
        (np.array([[0, 1], [2, 3]]), [1, 0], np.ones((5, 2)), r"must be \+1 \(similar\) or -1"),
        (np.array([[0, 1], [2, 3]]), [1], np.ones((5, 2)), "equal, non-zero length"),
    ],
)
def test_bad_pairs_are_refused(pairs, y, X, match):
    with pytest.raises(InputError, match=match):
        LinearML(dim=1).fit_pairs(pairs, y, X=X)


def test_codes_are_eq_7_and_the_linear_map():
    X, y = _data(n=150)
    m = NML(dim=4, pairs=500, iters=500, lr=0.01).fit(X, y)
    X1 = X / X.sum(1, keepdims=True)
    np.testing.assert_allclose(m.transform(X), nml.chi2_kernel(X1, m.L_.astype(np.float64)), rtol=1e-4, atol=1e-6)
    assert m.transform(X).dtype == np.float32 and m.get_feature_names_out().tolist()[0] == "nml0"
    assert m.cost() == {"nnz": 48, "storage_bytes": 192, "flops_per_image": 192}
    lin = LinearML(dim=4, pairs=500, iters=500, lr=0.01).fit(X, y)
    np.testing.assert_allclose(lin.transform(X), X @ lin.L_.T.astype(np.float64), rtol=1e-5, atol=1e-5)
    assert lin.cost()["flops_per_image"] == 96


@pytest.mark.parametrize("cls", [NML, LinearML])
def test_from_state_round_trip_gives_the_same_codes(cls):
    X, y = _data(n=150)
    m = cls(dim=3, pairs=300, iters=300, lr=0.01, random_state=7).fit(X, y)
    back = cls.from_state(m.get_params(), m.fitted_state())
    assert np.array_equal(back.transform(X), m.transform(X))
    assert set(m.fitted_state()) >= {"L_", "bias_", "history_", "pairs_seen_", "n_pairs_", "pair_source_"}


def test_learn_bias_moves_b_and_threads_do_not_change_a_bit():
    X, y = _data(n=200)
    one = NML(dim=5, pairs=400, iters=400, learn_bias=True, lr=0.01).fit(X, y)
    two = NML(dim=5, pairs=400, iters=400, learn_bias=True, lr=0.01, threads=3).fit(X, y)
    assert one.bias_ != 0.1 and np.array_equal(one.L_, two.L_) and one.bias_ == two.bias_


def test_input_errors():
    X, y = _data(n=100)
    with pytest.raises(InputError, match="^NML.fit: X: Negative values in data: NML.s chi2 kernel needs non-negative"):
        NML(**SMALL).fit(X - 1.0, y)
    with pytest.raises(InputError, match="Negative values in data"):
        NML(**SMALL).fit(X, y).transform(-X)
    with pytest.raises(InputError, match=r"The 'dim' parameter of LinearML must be <= 12.*n_features = 12"):
        LinearML(dim=13).fit(X, y)
    with pytest.raises(ValueError, match="The 'optimizer' parameter of NML must be a str among"):
        NML(optimizer="rmsprop").fit(X, y)
    with pytest.raises(InputError, match="LinearML starts from the PCA basis"):
        LinearML(**SMALL).fit_stream(stream.pools(X, y, None, 50, 0), len(X), X.shape[1])


def test_grid_search_on_digits_with_a_1nn_score():
    X, y = load_digits(return_X_y=True)
    X, y = X[:600], y[:600]

    def knn1(est, X, y):
        """Leave-one-out 1-NN accuracy on the codes of the held-out fold."""
        Z = est.transform(X).astype(np.float64)
        d = ((Z[:, None, :] - Z[None, :, :]) ** 2).sum(-1)
        np.fill_diagonal(d, np.inf)
        return float((y[d.argmin(1)] == y).mean())

    pipe = make_pipeline(StandardScaler(), LinearML(dim=8, pairs=20000, iters=20000, validation=0))
    gs = GridSearchCV(pipe, {"linearml__lr": [100.0, 1.0]}, cv=3, scoring=knn1).fit(X, y)
    assert gs.best_params_ == {"linearml__lr": 1.0}  # lr 100 diverges (a fold's score is NaN)
    assert np.isnan(gs.cv_results_["mean_test_score"][0])
    assert gs.best_score_ > 0.9 and gs.best_estimator_.transform(X).shape == (600, 8)


@pytest.mark.parametrize("optimizer,learn_bias", [("sgd", False), ("adam", False), ("sgd", True)])
def test_linear_ml_lr_means_the_same_whatever_the_rows_scale(optimizer, learn_bias):
    """Rows 16 times larger train the same L in their own units (L / 16) along the same path: the
    same hinge at every logged step and the same validation mAPs."""
    X, y = _data(n=400)
    keys = stream.row_keys(X)
    est = LinearML(
        dim=3,
        pairs=600,
        iters=1500,
        batch=16,
        optimizer=optimizer,
        learn_bias=learn_bias,
        validation=100,
        random_state=2,
    )
    held = stream.validation_split(y, 100, keys, 2)
    keep = np.ones(len(X), bool)
    keep[held] = False
    fits = []
    for f in (1.0, 16.0):
        stats = moments.statistics(X * f)
        fits.append(
            clone(est).fit_stream(
                stream.pools(X * f, y, keep, 90, 2, keys),
                int(keep.sum()),
                X.shape[1],
                stats["pca_components"],
                X[held] * f,
                y[held],
                row_scale=moments.row_scale(stats),
            )
        )
    one, big = fits
    hinge = [h["hinge"] for h in one.history_ if "hinge" in h]
    assert len(set(np.round(hinge, 6))) > 3  # L moved
    for key in ("hinge", "val_map"):
        assert [h[key] for h in big.history_ if key in h] == pytest.approx(
            [h[key] for h in one.history_ if key in h], rel=1e-5
        )
    assert [h["iter"] for h in big.history_] == [h["iter"] for h in one.history_]
    np.testing.assert_allclose(big.L_ * 16, one.L_, rtol=1e-4, atol=1e-5 * np.abs(one.L_).max())
    assert big.bias_ == pytest.approx(one.bias_, rel=1e-5) and (one.bias_ != 1.0) == learn_bias


def test_a_diverging_step_is_an_error_not_a_nan_model():
    X, y = _data(n=200)
    with pytest.raises(
        InputError, match=r"LinearML diverged after \d+ steps \(L is not finite in float32\); lower 'lr'"
    ):
        LinearML(dim=3, pairs=2000, iters=20000, lr=1e6, random_state=0).fit(X, y)


@pytest.mark.parametrize("cls", [NML, LinearML])
def test_early_stopping_keeps_the_l_with_the_best_validation_map(cls):
    X, y = _data(n=600)
    Xv, yv = _data(n=200)
    est = cls(dim=3, pairs=3000, iters=20000, batch=16, random_state=0).fit(X, y, X_val=Xv, y_val=yv)
    checks = [h for h in est.history_ if "val_map" in h]
    best = max(checks, key=lambda h: h["val_map"])
    assert est.val_map_ == best["val_map"] and est.best_iter_ == best["iter"]
    assert est.val_map_ == pytest.approx(evaluation.validation_map(est.transform(Xv), yv), abs=1e-6)
    assert checks[0]["iter"] == 0  # the start is a candidate
    if est.pairs_seen_ < 20000:  # stopped early: PATIENCE checks in a row without a better mAP
        assert len(checks) - 1 - checks.index(best) == nml.PATIENCE
    off = clone(est).set_params(validation=0).fit(X, y)
    assert off.best_iter_ is None and off.pairs_seen_ == 20000


@pytest.mark.parametrize("cls", [NML, LinearML])
def test_a_refit_of_a_model_kept_at_its_start_takes_no_step(cls):
    """Early stopping that kept the start (best_iter_ 0) refits with iters 0: the fit drew no pair,
    then refused its 'two passes gave no pair' (a 5-repeat digits run stopped on it). No pair is
    needed: the model is its start, L0 from every training row."""
    X, y = _data()
    est = cls(dim=3, pairs=300, iters=700, batch=16, random_state=0)
    est.fit(X, y, X_val=X[:50], y_val=y[:50])
    est.best_iter_ = 0
    refit = clone(est).set_params(**est.refit_params()).fit(X, y)
    assert refit.pairs_seen_ == refit.n_pairs_ == refit.n_steps_ == 0 and refit.best_iter_ is None
    assert np.isfinite(refit.transform(X)).all()
