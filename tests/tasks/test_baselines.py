import numpy as np
import pytest
from sklearn.decomposition import PCA as SkPCA
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

from metricpipe.tasks.baselines import LDA, PCA, PCAWhitening, RandomProjection
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.moments import finalize_statistics, partial_moments
from tests.conftest import make_blobs


@pytest.fixture(scope="module")
def data():
    X, y = make_blobs(n=800, d=10, classes=4, sep=1.5)
    return X, y, finalize_statistics(partial_moments(X, y, 4))


def test_pca_codes_are_centred_and_decorrelated_and_match_sklearn(data):
    X, y, s = data
    Z = PCA(3).fit(X).transform(X).astype(np.float64)
    np.testing.assert_allclose(Z.mean(0), 0, atol=1e-4)
    cov = np.cov(Z, rowvar=False)
    np.testing.assert_allclose(np.diag(cov), s["pca_variances"][:3], rtol=1e-4)
    assert np.abs(cov - np.diag(np.diag(cov))).max() < 1e-3 * cov.max()
    ref = SkPCA(3).fit_transform(X.astype(np.float64))
    np.testing.assert_allclose(np.abs(Z), np.abs(ref), atol=1e-4)  # up to each component's sign


def test_fit_in_memory_equals_fit_from_streamed_statistics(data):
    X, y, _ = data
    parts = [partial_moments(X[a : a + 97], y[a : a + 97], 4) for a in range(0, len(X), 97)]
    from metricpipe.tasks.moments import combine_all

    streamed = finalize_statistics(combine_all(parts))
    for est in (PCA(4), PCAWhitening(4), LDA(), RandomProjection(5, random_state=3)):
        a = est.fit(X, y).transform(X)
        b = type(est)(**est.get_params()).fit_statistics(streamed).transform(X)
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_pca_whitening_gives_unit_covariance(data):
    X, _, _ = data
    Z = PCAWhitening(4, eps=0).fit(X).transform(X).astype(np.float64)
    np.testing.assert_allclose(np.cov(Z, rowvar=False), np.eye(4), atol=1e-4)


def test_pca_whitening_refuses_a_zero_variance_component_without_eps():
    X = np.zeros((10, 3))
    X[:, 0] = np.arange(10)
    with pytest.raises(InputError, match="variance 0 and eps=0"):
        PCAWhitening(3, eps=0).fit(X)
    # constant rows: eps is a share of the top variance (0), so the advice to raise it could not help
    with pytest.raises(InputError, match=r"^PCAWhitening: the training rows are all the same \(every variance is 0\)"):
        PCAWhitening(3).fit(np.ones((10, 3)))


def test_lda_spans_the_same_subspace_as_sklearn(data):
    X, y, _ = data
    W = LDA().fit(X, y).components_.astype(np.float64)
    ref = LinearDiscriminantAnalysis(solver="eigen").fit(X, y).scalings_[:, :3]
    Qw, _ = np.linalg.qr(W)
    resid = ref - Qw @ (Qw.T @ ref)
    assert np.linalg.norm(resid) / np.linalg.norm(ref) < 1e-4


@pytest.mark.parametrize("constant", [0, 3])
def test_lda_codes_are_scikit_learn_s_up_to_sign_and_shift(data, constant):
    """The svd solver's whitening and truncation from the moments: the same codes, so kNN and NCM on
    them answer as on scikit-learn's (features that never vary, as image borders, are dropped alike)."""
    X, y, _ = data
    X = np.hstack([X, np.full((len(X), constant), 7.0)])
    Z = LDA().fit(X, y).transform(X).astype(np.float64)
    R = LinearDiscriminantAnalysis().fit(X, y).transform(X)
    Z, R = Z - Z.mean(0), R - R.mean(0)
    sign = np.sign((Z * R).sum(0))
    np.testing.assert_allclose(Z * sign, R, rtol=1e-4, atol=1e-4 * np.abs(R).max())


def test_lda_codes_have_unit_pooled_within_class_variance(data):
    X, y, _ = data
    Z = LDA().fit(X, y).transform(X).astype(np.float64)
    within = sum((Z[y == c] - Z[y == c].mean(0)).T @ (Z[y == c] - Z[y == c].mean(0)) for c in np.unique(y))
    np.testing.assert_allclose(within / len(Z), np.eye(Z.shape[1]), atol=1e-3)


def test_lda_dim_above_classes_minus_one_is_refused(data):
    X, y, _ = data
    with pytest.raises(InputError, match="'dim' parameter of LDA must be <= 3"):
        LDA(dim=5).fit(X, y)


def test_random_projection_is_seeded(data):
    X = data[0]
    a, b, c = (RandomProjection(5, random_state=q).fit(X).components_ for q in (0, 0, 1))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_lda_on_one_feature_or_constant_features_gives_finite_codes():
    """Issue 19 reported a raw LinAlgError here; the codes must be finite (the encode stage refuses others)."""
    rng = np.random.default_rng(0)
    y = np.arange(90) % 3
    X1 = rng.normal(size=(90, 1)) + y[:, None]
    Z = LDA().fit(X1, y).transform(X1)
    assert Z.shape == (90, 1) and np.isfinite(Z).all() and abs(np.corrcoef(Z[:, 0], y)[0, 1]) > 0.5
    Zc = LDA().fit(np.ones((90, 4)), y).transform(np.ones((5, 4)))
    assert np.isfinite(Zc).all() and np.ptp(Zc, axis=0).max() == 0  # nothing to separate: one code for all
