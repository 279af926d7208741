import numpy as np
import pytest
from sklearn.decomposition import PCA

from tasks.moments import combine_all, combine_moments, finalize_statistics, partial_moments
from tests.conftest import make_blobs


def _blocks(X, y, sizes):
    edges = np.cumsum([0] + sizes)
    return [partial_moments(X[a:b], y[a:b], 4) for a, b in zip(edges[:-1], edges[1:])]


def test_blockwise_covariance_equals_numpy():
    X, y = make_blobs(n=601, d=9)
    X = X + 1000.0  # a large offset: raw-sum formulas would lose digits here
    stats = finalize_statistics(combine_all(_blocks(X, y, [100, 250, 1, 0, 250])))
    np.testing.assert_allclose(stats["mean"], X.astype(np.float64).mean(0), rtol=1e-12)
    np.testing.assert_allclose(stats["covariance"], np.cov(X.astype(np.float64), rowvar=False), rtol=1e-9, atol=1e-9)


def test_combine_is_associative():
    X, y = make_blobs(n=300, d=5)
    a, b, c = _blocks(X, y, [90, 110, 100])
    left = combine_moments(combine_moments(a, b), c)
    right = combine_moments(a, combine_moments(b, c))
    np.testing.assert_allclose(left.m2, right.m2, rtol=1e-12)
    np.testing.assert_allclose(left.mean, right.mean, rtol=1e-12)


def test_class_statistics_and_scatter_decomposition():
    X, y = make_blobs(n=400, d=6)
    s = finalize_statistics(combine_all(_blocks(X, y, [123, 277])))
    for c in range(4):
        np.testing.assert_allclose(s["class_means"][c], X[y == c].astype(np.float64).mean(0), rtol=1e-10)
    assert list(s["class_counts"]) == [int((y == c).sum()) for c in range(4)]
    Xd = X.astype(np.float64)
    sw = sum((Xd[y == c] - Xd[y == c].mean(0)).T @ (Xd[y == c] - Xd[y == c].mean(0)) for c in range(4))
    np.testing.assert_allclose(s["within_scatter"], sw, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(s["within_scatter"] + s["between_scatter"], s["covariance"] * (len(X) - 1), rtol=1e-9)


def test_pca_basis_matches_sklearn():
    X, y = make_blobs(n=500, d=8)
    s = finalize_statistics(partial_moments(X, y, 4))
    ref = PCA(n_components=8).fit(X.astype(np.float64))
    np.testing.assert_allclose(s["pca_variances"], ref.explained_variance_, rtol=1e-8)
    # components agree up to sign
    dots = np.abs(np.sum(s["pca_components"] * ref.components_, axis=1))
    np.testing.assert_allclose(dots, 1.0, atol=1e-8)


def test_finalize_needs_two_rows():
    with pytest.raises(ValueError, match="at least two rows"):
        finalize_statistics(partial_moments(np.ones((1, 3)), np.array([0]), 2))
