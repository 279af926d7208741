import numpy as np
import pytest
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

from metricpipe.tasks import baselines
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.moments import finalize_statistics, partial_moments
from metricpipe.tasks.registry import expand_method
from tests.conftest import make_blobs


@pytest.fixture(scope="module")
def data():
    X, y = make_blobs(n=800, d=10, classes=4, sep=1.5)
    return X, y, finalize_statistics(partial_moments(X, y, 4))


def test_pca_codes_are_centred_and_decorrelated(data):
    X, _, s = data
    Z = baselines.fit_pca(s, 3).transform(X).astype(np.float64)
    np.testing.assert_allclose(Z.mean(0), 0, atol=1e-4)
    cov = np.cov(Z, rowvar=False)
    np.testing.assert_allclose(np.diag(cov), s["pca_variances"][:3], rtol=1e-4)
    assert np.abs(cov - np.diag(np.diag(cov))).max() < 1e-3 * cov.max()


def test_pca_whitening_gives_unit_covariance(data):
    X, _, s = data
    Z = baselines.fit_pcaw(s, 4, eps=0).transform(X).astype(np.float64)
    np.testing.assert_allclose(np.cov(Z, rowvar=False), np.eye(4), atol=1e-4)


def test_lda_spans_the_same_subspace_as_sklearn(data):
    X, y, s = data
    W = baselines.fit_lda(s, reg=0.0).W.astype(np.float64)
    ref = LinearDiscriminantAnalysis(solver="eigen").fit(X, y).scalings_[:, :3]
    # projection of ref's columns onto span(W) loses nothing
    Qw, _ = np.linalg.qr(W)
    resid = ref - Qw @ (Qw.T @ ref)
    assert np.linalg.norm(resid) / np.linalg.norm(ref) < 1e-4


def test_lda_dim_above_classes_minus_one_is_refused(data):
    with pytest.raises(InputError, match="'dim' parameter of lda must be <= 3"):
        baselines.fit_lda(data[2], dim=5)


def test_random_projection_is_seeded(data):
    s = data[2]
    a, b, c = (baselines.fit_random(s, 5, seed=q).W for q in (0, 0, 1))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_registry_expands_sweeps_and_rejects_unknown_parameters():
    assert [m["dim"] for m in expand_method({"method": "pca", "dim": [8, 16]})] == [8, 16]
    with pytest.raises(InputError, match="unknown parameter 'dimm' for method pca; did you mean 'dim'"):
        expand_method({"method": "pca", "dimm": 8})
    with pytest.raises(InputError, match="did you mean 'pca'"):
        expand_method({"method": "pcca"})
    with pytest.raises(InputError, match="'dim' parameter of pca must be >= 1"):
        expand_method({"method": "pca", "dim": 0})
