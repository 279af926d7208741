"""The synthetic generator's class structure is what its docstring claims (issue 21): raw features rank
the classes moderately, a projection learned from labels ranks them much better, and the nuisance
directions carry more variance than the class signal but no class information. Issue 48: how hard the
data is depends on the settings, not on the shape, and the rows at rank <= 32 are issue 21's."""

import numpy as np
import pytest
from sklearn.decomposition import PCA
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

from metricpipe.tasks.errors import InputError
from metricpipe.tasks.synthetic import UNIT, SyntheticSpec

N, D, C = 20_000, 128, 100


def _map(Z, y, queries, db):
    """Mean average precision of each query against the database rows other than itself."""
    Z = Z.astype(np.float64)
    aps = []
    for q in queries:
        rest = db[db != q]
        rel = (y[rest] == y[q])[np.argsort(((Z[rest] - Z[q]) ** 2).sum(1), kind="stable")]
        aps.append((np.cumsum(rel)[rel] / (np.flatnonzero(rel) + 1)).mean())
    return float(np.mean(aps))


@pytest.fixture(scope="module")
def data():
    spec = SyntheticSpec(N, D, C, seed=0)
    X, y = spec.rows(0, N), spec.labels()
    test = np.random.default_rng(0).random(N) < 0.2
    train, db = np.flatnonzero(~test), np.flatnonzero(test)
    return spec, X, y, train, db, np.random.default_rng(1).choice(db, 500, replace=False)


def test_raw_features_rank_moderately_and_a_learned_projection_much_better(data):
    spec, X, y, train, db, queries = data
    raw = _map(X, y, queries, db)
    assert 0.3 < raw < 0.5, raw  # issue 21: neither trivial nor hopeless
    lda = LinearDiscriminantAnalysis(n_components=32).fit(X[train], y[train])
    learned = _map(lda.transform(X), y, queries, db)
    assert learned > raw + 0.15, (raw, learned)
    # the signal subspace itself (what a learner can find) beats raw features too
    assert _map(X @ spec.signal_basis, y, queries, db) > raw + 0.15


def test_nuisance_directions_have_high_variance_and_no_class_signal(data):
    spec, X, y, train, db, queries = data
    A, B = spec.signal_basis, spec.nuisance_basis
    assert B.shape == (D, D // 16) and np.abs(A.T @ B).max() < 1e-5
    var_signal, var_nuisance = (X @ A).var(0), (X @ B).var(0)
    assert var_nuisance.min() > var_signal.mean(), (var_nuisance, var_signal.mean())

    # class means differ along A, not along B: between-class variance over total variance
    def between_share(P):
        means = np.stack([P[y == c].mean(0) for c in range(C)])
        return means.var(0).sum() / P.var(0).sum()

    assert between_share(X @ B) < 0.02 < 0.3 < between_share(X @ A)
    # PCA's leading directions are drawn to the nuisance: most of B lies in the top-16 PCA subspace
    V = PCA(16).fit(X[train]).components_
    assert np.linalg.norm(V @ B) ** 2 / B.shape[1] > 0.5


def test_nuisance_knob_controls_raw_difficulty(data):
    _, X, y, _, db, queries = data
    clean = SyntheticSpec(N, D, C, seed=0, nuisance=0.0)
    assert clean.nuisance_basis.shape == (D, 0)
    assert _map(clean.rows(0, N), y, queries, db) > _map(X, y, queries, db) + 0.1


def test_special_case_is_the_generator_before_issue_21():
    n, d, c, seed = 3000, 16, 5, 3
    s = SyntheticSpec(n, d, c, seed=seed, rank=5, separation=3.0, nuisance=0.0, modes=1, width=0.0)
    rng = np.random.default_rng([seed, 0])
    A, _ = np.linalg.qr(rng.standard_normal((d, 5)))
    means = (3.0 * rng.standard_normal((c, 5)) @ A.T).astype(np.float32)
    scales = (1.0 / np.sqrt(1.0 + np.arange(d) / 8.0)).astype(np.float32)
    y = np.random.default_rng([seed, 1]).integers(0, c, n).astype(np.int32)
    old = np.vstack(
        [
            means[y[a : a + UNIT]]
            + np.random.default_rng([seed, 2, a // UNIT]).standard_normal((min(UNIT, n - a), d), dtype=np.float32)
            * scales
            for a in range(0, n, UNIT)
        ]
    )
    np.testing.assert_array_equal(s.labels(), y)
    np.testing.assert_array_equal(s.rows(0, n), old)


def _ncm_error(spec, X, y):
    """Top-1 error of the nearest of the spec's own class means (the mean of each class's mode centres)."""
    M = spec.means.mean(1).astype(np.float64)
    return float(np.mean(((M * M).sum(1)[None] - 2 * X.astype(np.float64) @ M.T).argmin(1) != y))


def test_difficulty_is_a_property_of_the_settings_not_of_the_shape():
    # issue 48: at rank 256 (1,024 features, 256 classes) the old generator's classes were trivially
    # separable (raw mAP 0.997, NCM error 0.000, against 0.376 and 0.208 at 128 x 100 below)
    n, everyone = 6000, np.arange(6000)
    maps, errors = [], []
    for d, c in ((128, 100), (1024, 256)):
        spec = SyntheticSpec(n, d, c, seed=0)
        maps.append(_map(spec.rows(0, n), spec.labels(), everyone[:200], everyone))
        blurred = SyntheticSpec(n, d, c, seed=0, width=1.5)
        errors.append(_ncm_error(blurred, blurred.rows(0, n), blurred.labels()))
    assert all(0.2 < m < 0.6 for m in maps), maps
    assert all(0.15 < e < 0.3 for e in errors) and abs(errors[0] - errors[1]) < 0.05, errors


def _issue_21(n, d, c, seed=0, separation=1.0, nuisance=1.7, modes=3, spread=0.7):
    """Issue 21's mode centres and bases, as that generator drew them."""
    r = min(min(max(2, c), max(1, d // 4)), d)
    rng = np.random.default_rng([seed, 0])
    A, _ = np.linalg.qr(rng.standard_normal((d, r)))
    z = rng.standard_normal((c, r))
    extra = np.random.default_rng([seed, 4])
    z = z[:, None, :] + spread * extra.standard_normal((c, modes, r))
    G = extra.standard_normal((d, min(d - r, max(1, d // 16))))
    B, _ = np.linalg.qr(G - A @ (A.T @ G))
    means = (separation * z.reshape(c, -1, r) @ A.T).astype(np.float32)
    return means, A.astype(np.float32), B.astype(np.float32)


@pytest.mark.parametrize("shape", [(128, 100), (128, 10), (64, 40)])
def test_rows_at_rank_32_or_below_are_issue_21s(shape):
    # the defaults' published figures (128 features, 100 classes) stay: the class scale is exactly 1 there
    d, c = shape
    spec = SyntheticSpec(3000, d, c, seed=5, separation=0.8)
    means, A, B = _issue_21(3000, d, c, seed=5, separation=0.8)
    np.testing.assert_array_equal(spec.means, means)
    np.testing.assert_array_equal(spec.signal_basis, A)
    np.testing.assert_array_equal(spec.nuisance_basis, B)


def test_overlap_moves_that_share_of_the_nuisance_into_the_signal_and_blurs_the_class_means():
    n, d, c = 10_000, 128, 100
    errors = {}
    for overlap in (0.0, 0.5, 1.0):
        spec = SyntheticSpec(n, d, c, seed=0, nuisance=2.0, overlap=overlap)
        A, B = spec.signal_basis, spec.nuisance_basis
        np.testing.assert_allclose(((A.T @ B) ** 2).sum(0), overlap, atol=1e-5)
        np.testing.assert_allclose(np.linalg.norm(B, axis=0), 1.0, atol=1e-5)
        X, y = spec.rows(0, n), spec.labels()
        errors[overlap] = _ncm_error(spec, X, y)
    assert errors[0.0] < errors[0.5] < errors[1.0], errors
    # what a learned metric undoes: LDA's class means classify far better than the raw ones
    train = np.arange(n) < 8000
    Z = LinearDiscriminantAnalysis(n_components=32).fit(X[train], y[train]).transform(X)
    means = np.stack([Z[train & (y == k)].mean(0) for k in range(c)])
    learned = np.mean(((Z[~train, None] - means[None]) ** 2).sum(-1).argmin(1) != y[~train])
    assert learned < errors[1.0] / 2, (learned, errors)
    with pytest.raises(InputError, match=r"The 'overlap' parameter of SyntheticSpec must be a float in \[0, 1\]"):
        SyntheticSpec(10, 4, 2, overlap=1.5)
