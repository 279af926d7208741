import numpy as np
import pytest
from sklearn.decomposition import PCA

from metricpipe.tasks import moments
from metricpipe.tasks.moments import combine_all, combine_moments, finalize_statistics, partial_moments
from tests.conftest import make_blobs

# float64 features are reduced in float64 (rounding ~1e-12); float32 features through float32 slab
# products added in float64, so agreement is to float32's precision relative to the largest entry
TOL = {np.float64: 1e-9, np.float32: 1e-6}


def close(actual, desired, rtol):
    scale = np.abs(desired).max()
    np.testing.assert_allclose(actual, desired, rtol=0, atol=rtol * scale)


def _blocks(X, y, sizes):
    edges = np.cumsum([0] + sizes)
    return [partial_moments(X[a:b], y[a:b], 4) for a, b in zip(edges[:-1], edges[1:])]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_blockwise_covariance_equals_numpy(dtype):
    X, y = make_blobs(n=601, d=9)
    X = (X + 1000.0).astype(dtype)  # a large offset: raw-sum formulas would lose digits here
    stats = finalize_statistics(combine_all(_blocks(X, y, [100, 250, 1, 0, 250])))
    np.testing.assert_allclose(stats["mean"], X.astype(np.float64).mean(0), rtol=1e-12)
    close(stats["covariance"], np.cov(X.astype(np.float64), rowvar=False), TOL[dtype])


def test_float32_slabs_keep_precision_on_large_blocks(monkeypatch):
    """Rounding grows with the slab, not the block: a 40,000-row block with well separated classes
    (within-class scatter 1/2500 of the total) still gives Sw and the covariance to float32 precision."""
    monkeypatch.setattr(moments, "SCATTER_ROWS", 1000)
    X, y = make_blobs(n=40_000, d=16, classes=7, sep=50.0)
    s = finalize_statistics(partial_moments(X, y, 7))
    Xd = X.astype(np.float64)
    sw = sum((Xd[y == c] - Xd[y == c].mean(0)).T @ (Xd[y == c] - Xd[y == c].mean(0)) for c in range(7))
    close(s["within_scatter"], sw, 1e-6)
    close(s["covariance"], np.cov(Xd, rowvar=False), 1e-6)
    # the shortcut this avoids, a float32 Gram of the centred rows minus Sb, is off by ~1e-3 here
    Z = X - X.mean(0)
    assert np.abs((Z.T @ Z).astype(np.float64) - s["between_scatter"] - sw).max() > 1e-4 * np.abs(sw).max()


@pytest.mark.parametrize("second", [True, False])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_mean_squared_norm_streams_to_numpys(dtype, second):
    X, y = make_blobs(n=601, d=9)
    X = (3.0 * X + 7.0).astype(dtype)
    parts = [
        partial_moments(X[a:b], y[a:b], 4, second=second) for a, b in [(0, 100), (100, 350), (350, 350), (350, 601)]
    ]
    got = finalize_statistics(combine_all(parts))["mean_sq_norm"]
    np.testing.assert_allclose(got, (X.astype(np.float64) ** 2).sum(1).mean(), rtol=TOL[dtype])


def test_row_scale_is_the_rms_norm_and_one_for_l2_or_zero_rows():
    X, y = make_blobs(n=200, d=5)
    assert moments.row_scale(moments.statistics(X, y)) == pytest.approx(np.sqrt((X**2).sum(1).mean()), rel=1e-6)
    L2 = X / np.linalg.norm(X, axis=1, keepdims=True)
    assert moments.row_scale(moments.statistics(L2, y)) == pytest.approx(1.0, abs=1e-6)
    assert moments.row_scale(moments.statistics(np.zeros((4, 3)), np.array([0, 0, 1, 1]))) == 1.0


def test_combine_is_associative():
    X, y = make_blobs(n=300, d=5)
    a, b, c = _blocks(X, y, [90, 110, 100])
    left = combine_moments(combine_moments(a, b), c)
    right = combine_moments(a, combine_moments(b, c))
    np.testing.assert_allclose(left.m2, right.m2, rtol=1e-12)
    np.testing.assert_allclose(left.mean, right.mean, rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_class_statistics_and_scatter_decomposition(dtype):
    X, y = make_blobs(n=400, d=6)
    X = X.astype(dtype)
    s = finalize_statistics(combine_all(_blocks(X, y, [123, 277])))
    for c in range(4):
        np.testing.assert_allclose(s["class_means"][c], X[y == c].astype(np.float64).mean(0), rtol=1e-10)
    assert list(s["class_counts"]) == [int((y == c).sum()) for c in range(4)]
    Xd = X.astype(np.float64)
    sw = sum((Xd[y == c] - Xd[y == c].mean(0)).T @ (Xd[y == c] - Xd[y == c].mean(0)) for c in range(4))
    close(s["within_scatter"], sw, TOL[dtype])
    np.testing.assert_allclose(s["within_scatter"] + s["between_scatter"], s["covariance"] * (len(X) - 1), rtol=1e-9)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_pca_basis_matches_sklearn(dtype):
    X, y = make_blobs(n=500, d=8)
    s = finalize_statistics(partial_moments(X.astype(dtype), y, 4))
    ref = PCA(n_components=8).fit(X.astype(np.float64))
    close(s["pca_variances"], ref.explained_variance_, TOL[dtype])
    # components agree up to sign
    dots = np.abs(np.sum(s["pca_components"] * ref.components_, axis=1))
    np.testing.assert_allclose(dots, 1.0, atol=1e2 * TOL[dtype])


def test_finalize_needs_two_rows():
    with pytest.raises(ValueError, match="at least two rows"):
        finalize_statistics(partial_moments(np.ones((1, 3)), np.array([0]), 2))


def test_without_rows_gives_the_class_means_of_the_other_rows_and_keeps_the_rest():
    X, y = make_blobs(n=700, d=6, classes=4, seed=5)
    stats = moments.statistics(X, y)
    out = np.zeros(700, bool)
    out[np.random.default_rng(0).choice(700, 120, replace=False)] = True
    got = moments.without_rows(stats, X[out], y[out])
    close(got["class_means"], np.stack([X[~out & (y == c)].mean(0) for c in range(4)]), TOL[X.dtype.type])
    assert got["class_counts"].tolist() == np.bincount(y[~out], minlength=4).tolist()
    for k in ("mean", "covariance", "pca_components", "mean_sq_norm"):  # what reads no label: every row's
        assert got[k] is stats[k]
    with pytest.raises(ValueError, match="not a part of"):
        moments.without_rows(got, X[y == 0], y[y == 0])  # more rows of class 0 than it has left


@pytest.mark.parametrize("second", [True, False])
def test_moments_of_selected_rows_gathered_by_slabs_are_those_of_the_copy(second):
    """``rows`` gathers a slab at a time (no copy of the selection): the same bits as X[rows]."""
    rng = np.random.default_rng(0)
    X = (rng.standard_normal((2 * moments.SCATTER_ROWS + 777, 9)) + 5).astype(np.float32)
    y = rng.integers(0, 4, len(X))
    rows = np.flatnonzero(rng.random(len(X)) < 0.9)
    a = moments.partial_moments(X[rows], y[rows], 4, second=second)
    b = moments.partial_moments(X, y[rows], 4, second=second, rows=rows)
    assert a.n == b.n == len(rows) and a.sumsq == b.sumsq
    for f in ("mean", "class_counts", "class_sums") + (("m2",) if second else ()):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    with pytest.raises(IndexError):
        moments.partial_moments(X, y[:1], 4, rows=np.array([len(X)]))
