"""How a learner's codes are compared, exposed as metric-learn users expect (get_metric, pair_distance,
pair_score) and as scikit-learn's neighbour estimators take it (knn_params): the same neighbours as
metricpipe's own kNN, for Euclidean, inner-product and kernel SLEM codes."""

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.datasets import load_digits
from sklearn.neighbors import KNeighborsClassifier, NearestNeighbors

from metricpipe.tasks import evaluation
from metricpipe.tasks.errors import InputError
from tests.tasks.test_estimator_checks import CHECKED


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    X = X / 16.0 + np.random.default_rng(0).uniform(0, 1e-3, X.shape)  # no exact ties; >= 0 (NML)
    return X[:400], y[:400], X[400:500], y[400:500]


@pytest.fixture(scope="module", params=CHECKED, ids=lambda e: f"{type(e).__name__}-{CHECKED.index(e)}")
def fitted(request, digits):
    X, y, _, _ = digits
    return clone(request.param).fit(X, y)


def test_get_metric_and_pair_distance_are_the_codes_distance(fitted, digits):
    X, _, Q, _ = digits
    Z, ZQ = fitted.transform(X[:20]).astype(np.float64), fitted.transform(Q[:20]).astype(np.float64)
    pairs = np.stack([X[:20], Q[:20]], axis=1)
    d = fitted.pair_distance(pairs)
    if fitted.code_metric == "euclidean":
        want = np.linalg.norm(Z - ZQ, axis=1)
    elif fitted.code_metric == "inner":
        want = -(Z * ZQ).sum(1)
    else:  # kernel SLEM: minus its Eq. 16 score, as the evaluation ranks by
        want = np.diag(evaluation.scores(Z, ZQ, fitted.code_metric))
    np.testing.assert_allclose(d, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fitted.pair_score(pairs), -d)
    metric = fitted.get_metric()
    assert metric(X[3], Q[3]) == pytest.approx(d[3], rel=1e-5, abs=1e-6)
    assert fitted.code_distance(Z[3], ZQ[3]) == pytest.approx(d[3], rel=1e-5, abs=1e-6)
    with pytest.raises(InputError, match=r"pair_distance: pairs of shape \(20, 64\); give \(n_pairs, 2, n_features\)"):
        fitted.pair_distance(X[:20])


def test_scikit_learn_s_neighbours_over_the_codes_are_metricpipe_s(fitted, digits):
    X, y, Q, _ = digits
    Z, ZQ = fitted.transform(X), fitted.transform(Q)
    score = fitted.code_metric or "euclidean"
    ours = evaluation.knn_neighbours(ZQ, [(np.arange(len(Z)), Z)], 5, score)[1]
    theirs = NearestNeighbors(n_neighbors=5, **fitted.knn_params()).fit(Z).kneighbors(ZQ, return_distance=False)
    np.testing.assert_array_equal(theirs, ours)
    knn = KNeighborsClassifier(n_neighbors=1, **fitted.knn_params()).fit(Z, y)
    np.testing.assert_array_equal(knn.predict(ZQ), y[ours[:, 0]])


def test_the_euclidean_metric_on_inner_product_codes_finds_other_neighbours(digits):
    """Why knn_params matters: SL-NE's codes under KNeighborsClassifier's default metric."""
    from metricpipe.tasks.slne import SLNE

    X, y, Q, _ = digits
    est = SLNE(epochs=1, n_neighbors=5).fit(X, y)
    Z, ZQ = est.transform(X), est.transform(Q)
    ours = evaluation.knn_neighbours(ZQ, [(np.arange(len(Z)), Z)], 5, "inner")[1]
    default = NearestNeighbors(n_neighbors=5).fit(Z).kneighbors(ZQ, return_distance=False)
    assert est.knn_params()["algorithm"] == "brute" and (default != ours).any()
