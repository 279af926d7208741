"""partial_fit of the SGD learners (issue 46, item 3): one pool's steps per call, the SGD state carried
over, so that a loop of partial_fit over the pools of ``tasks.stream.pools`` learns fit's model bit for
bit (fit without early stopping, as many steps as the loop took), and dask-ml's Incremental drives it."""

import itertools
import pickle

import dask.array as da
import numpy as np
import pytest
from dask_ml.wrappers import Incremental
from sklearn.base import clone
from sklearn.datasets import load_digits

from metricpipe.tasks import moments, stream
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.ncmml import KNNML, NCMC, NCMML
from metricpipe.tasks.nml import NML, LinearML
from metricpipe.tasks.rows import ArrayRows

SEED, BLOCK, POOLS = 3, 150, 7
CLASSES = np.arange(10)
LEARNERS = [
    NCMML(dim=8, batch=40, lr=3.0, early_stopping=False, random_state=SEED),
    NCMML(dim=8, batch=40, objective="dot", early_stopping=False, random_state=SEED),
    NCMC(dim=8, batch=40, centroids=3, early_stopping=False, random_state=SEED),
    KNNML(dim=8, batch=30, targets="fixed", early_stopping=False, random_state=SEED),
    KNNML(dim=8, batch=30, early_stopping=False, random_state=SEED),
    NML(dim=4, pairs=400, batch=16, validation=0, threads=2, random_state=SEED),
    LinearML(dim=4, pairs=400, batch=16, validation=0, optimizer="adam", learn_bias=True, random_state=SEED),
]


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    return X[:900], y[:900]


def _init(est, X, y) -> dict:
    """What partial_fit's first call reads: the training rows' statistics as fit computes them (with
    the class codes for the metric learners; NCMC: and its k-means)."""
    init = moments.statistics(X, y if isinstance(est, (NCMML, NCMC, KNNML)) else None)
    if isinstance(est, NCMC):
        init["centroids"] = est.class_centroids(ArrayRows(X, y), np.ones(len(X), bool), len(CLASSES))
    return init


def _loop(est, X, y, init, pools=POOLS):
    for Xp, yp in itertools.islice(stream.pools(X, y, None, BLOCK, SEED), pools):
        est.partial_fit(Xp, yp, classes=CLASSES, init=init)
    return est


def _steps(est) -> int:
    """What ``iters`` counts: SGD steps (NCMML, NCMC, k-NN ML) or pairs (NML, linear ML)."""
    return est.pairs_seen_ if hasattr(est, "pairs_seen_") else est.best_iter_


def _weights(est) -> np.ndarray:
    return est.L_ if hasattr(est, "L_") else est.components_


def _model(est) -> dict:
    names = (
        "components_",
        "centroids_",
        "centroid_classes_",
        "class_bias_",
        "L_",
        "bias_",
        "history_",
        "lr_",
        "pairs_seen_",
        "n_steps_",
        "n_pairs_",
        "best_iter_",
        "classes_",
        "n_features_in_",
    )
    return {k: getattr(est, k) for k in names if hasattr(est, k)}


def _assert_same(a, b):
    ma, mb = _model(a), _model(b)
    assert ma.keys() == mb.keys()
    for k, v in ma.items():
        if isinstance(v, np.ndarray):
            np.testing.assert_array_equal(v, mb[k], err_msg=k)
        else:
            assert v == mb[k], k


@pytest.mark.parametrize(
    "est", LEARNERS, ids=lambda e: f"{type(e).__name__}-{getattr(e, 'objective', '')}{getattr(e, 'targets', '')}"
)
def test_a_partial_fit_loop_over_the_pools_learns_fit_s_model_bit_for_bit(digits, est):
    X, y = digits
    init = _init(est, X, y)
    steps = _steps(_loop(clone(est).set_params(iters=10**6), X, y, init))  # the steps of POOLS pools
    assert steps > 0
    est = clone(est).set_params(iters=steps)
    looped = _loop(clone(est), X, y, init)
    fitted = clone(est).fit(X, y, block_rows=BLOCK)
    _assert_same(fitted, looped)
    assert not np.array_equal(_weights(looped), _weights(clone(est).set_params(iters=0).fit(X, y)))  # W moved
    if isinstance(est, (NCMML, NCMC, KNNML)):  # fit_stream (fit_rows ends there) is the same path
        side = {"centroids": init["centroids"]} if isinstance(est, NCMC) else {}
        _assert_same(clone(est).fit_stream(init, stream.pools(X, y, None, BLOCK, SEED), **side), looped)


def test_the_partial_fit_state_is_kept_between_calls_and_fit_drops_it(digits):
    X, y = digits
    est = NCMML(dim=8, batch=40, early_stopping=False, random_state=SEED)
    one = clone(est).partial_fit(X[:300], y[:300], classes=CLASSES)
    W1 = one.components_.copy()
    one.partial_fit(X[300:600], y[300:600])
    assert one.best_iter_ == 16 and not np.array_equal(one.components_, W1)  # 8 steps a call, from W1 on
    two = clone(est).partial_fit(X[:300], y[:300], classes=CLASSES).partial_fit(X[300:600], y[300:600])
    np.testing.assert_array_equal(one.components_, two.components_)
    one.fit(X, y)
    again = one.partial_fit(X[:300], y[:300], classes=CLASSES)  # after fit: a new start
    np.testing.assert_array_equal(again.components_, W1)


@pytest.mark.parametrize(
    "est", [KNNML(dim=4, batch=30), NML(dim=4, pairs=300, batch=16, threads=2)], ids=lambda e: type(e).__name__
)
def test_a_partially_fitted_learner_pickles_and_goes_on_from_where_it_was(digits, est):
    """dask's distributed scheduler moves the estimator between partial_fit calls as a pickle."""
    X, y = digits
    one = clone(est).partial_fit(X[:300], y[:300], classes=CLASSES)
    two = pickle.loads(pickle.dumps(one))
    for e in (one, two):
        e.partial_fit(X[300:600], y[300:600])
    _assert_same(one, two)


def test_without_init_the_start_is_the_first_call_s_statistics(digits):
    X, y = digits
    for est in (NCMML(dim=8, batch=40, random_state=SEED), LinearML(dim=4, pairs=200, batch=16, random_state=SEED)):
        a = clone(est).partial_fit(X[:300], y[:300], classes=CLASSES)
        b = clone(est).partial_fit(X[:300], y[:300], classes=CLASSES, init=_init(est, X[:300], y[:300]))
        _assert_same(a, b)
        c = clone(est).partial_fit(X[:300], y[:300], classes=CLASSES, init=moments.statistics(X, y))
        assert not np.array_equal(_weights(a), _weights(c))


def test_labels_of_any_type_are_given_by_classes_and_come_back_as_given(digits):
    X, y = digits
    names = np.array([f"digit {d}" for d in CLASSES])
    est = NCMML(dim=8, batch=40, random_state=SEED)
    by_name = clone(est).partial_fit(X[:300], names[y[:300]], classes=names[::-1])
    by_code = clone(est).partial_fit(X[:300], y[:300], classes=CLASSES)
    np.testing.assert_array_equal(by_name.components_, by_code.components_)
    assert list(by_name.classes_) == sorted(names) and set(by_name.predict(X[:50])) <= set(names)


@pytest.mark.parametrize(
    "est", [NCMML(dim=4, batch=16), NML(dim=4, pairs=100, batch=16)], ids=lambda e: type(e).__name__
)
def test_partial_fit_errors_name_the_problem(digits, est):
    X, y = digits
    first = clone(est).partial_fit(X[:200], y[:200], classes=CLASSES)
    with pytest.raises(InputError, match=r"partial_fit: y holds the label 10, which is not in classes"):
        first.partial_fit(X[200:300], np.r_[y[200:299], 10])
    with pytest.raises(InputError, match=r"partial_fit: classes differs from the first call's"):
        first.partial_fit(X[200:300], y[200:300], classes=np.arange(11))
    with pytest.raises(ValueError, match=r"X has 63 features, but \w+ is expecting 64 features"):
        first.partial_fit(X[200:300, 1:], y[200:300])
    with pytest.raises(InputError, match=r"partial_fit: y holds the label 9, which is not in classes"):
        clone(est).partial_fit(X[:200], y[:200], classes=np.arange(9))
    with pytest.raises(InputError, match=r"partial_fit: init must be a dict"):
        clone(est).partial_fit(X[:200], y[:200], classes=CLASSES, init=[1, 2])


def test_metric_learner_init_is_checked_against_the_rows_and_classes(digits):
    X, y = digits
    est = NCMML(dim=4, batch=16, random_state=SEED)
    stats = moments.statistics(X, y)
    with pytest.raises(InputError, match=r"init lacks class_means, class_counts; give the statistics"):
        est.partial_fit(
            X[:200], y[:200], classes=CLASSES, init={k: stats[k] for k in ("mean", "pca_components", "mean_sq_norm")}
        )
    with pytest.raises(
        InputError,
        match=r"init describes 64 features and 10 classes; the rows have 64 features "
        r"and classes holds 11 labels",
    ):
        clone(est).partial_fit(X[:200], y[:200], classes=np.arange(11), init=stats)


def test_dask_ml_incremental_drives_ncmml_over_a_dask_array_of_digits():
    """dask-ml's Incremental calls partial_fit on each block in turn (passing classes and init every
    time): the model is the partial_fit loop's over the same blocks, and classifies held-out digits."""
    X, y = load_digits(return_X_y=True)
    Xtr, ytr, Xte, yte = X[:1400], y[:1400], X[1400:], y[1400:]
    init = moments.statistics(Xtr, ytr)
    est = NCMML(dim=16, batch=100, early_stopping=False, random_state=0)
    inc = Incremental(clone(est), scoring=None, shuffle_blocks=False)
    inc.fit(da.from_array(Xtr, chunks=(200, -1)), da.from_array(ytr, chunks=200), classes=CLASSES, init=init)
    loop = clone(est)
    for a in range(0, len(Xtr), 200):
        loop.partial_fit(Xtr[a : a + 200], ytr[a : a + 200], classes=CLASSES, init=init)
    np.testing.assert_array_equal(inc.estimator_.components_, loop.components_)
    assert inc.estimator_.best_iter_ == 14  # 7 blocks of 200 rows, 2 batches of 100 each
    assert inc.score(da.from_array(Xte, chunks=200), yte) > 0.85
