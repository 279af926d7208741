import numpy as np
import pytest

from metricpipe.tasks import slne
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.knn import brute_force_knn
from metricpipe.tasks.metrics import softvote_ranking
from tests.conftest import make_blobs, numerical_gradient


def _problem(n=120, d=6, k=8, seed=0, sep=1.2):
    X, y = make_blobs(n=n, d=d, classes=3, seed=seed, sep=sep)
    X = slne.preprocess(X, X.mean(0), np.eye(d, dtype=np.float32))
    _, g = brute_force_knn(X, X, k, exclude_self=True)
    return X, y, g


def test_neighbourhoods_include_reverse_neighbours_and_split_by_label():
    g = np.array([[1, -1], [2, -1], [0, -1], [0, -1]])  # 3 -> 0 only; 0 is not 3's... reverse gives 0 -> 3
    y = np.array([0, 0, 1, 1])
    nb = slne.neighbourhoods(g, y)
    nbrs = {i: set(nb.indices[nb.indptr[i]:nb.indptr[i + 1]]) for i in range(4)}
    assert nbrs == {0: {1, 2, 3}, 1: {0, 2}, 2: {0, 1}, 3: {0}}  # Eq. 4: j in N_i or i in N_j
    assert list(nb.target[nb.indptr[0]:nb.indptr[1]]) == [True, False, False]


def test_eq7_selection_is_the_most_violating_pair():
    rng = np.random.default_rng(1)
    for _ in range(100):
        seg = np.concatenate([[0], np.cumsum(rng.integers(0, 6, 5))])
        S = rng.normal(size=seg[-1])
        tgt = rng.random(seg[-1]) < 0.5
        jp, lp = slne.most_violating(S, tgt, seg)
        for s in range(5):
            pos = np.arange(seg[s], seg[s + 1])
            t, i = pos[tgt[pos]], pos[~tgt[pos]]
            assert jp[s] == (t[np.argmin(S[t])] if len(t) else -1)
            assert lp[s] == (i[np.argmax(S[i])] if len(i) else -1)


def test_single_update_is_minus_rho_times_the_hinge_subgradient():
    X, y, g = _problem()
    nb = slne.neighbourhoods(g, y)
    rng = np.random.default_rng(0)
    M = np.eye(X.shape[1]) + 0.1 * rng.normal(size=(X.shape[1],) * 2)
    i = next(i for i in range(len(X)) if nb.target[nb.indptr[i]:nb.indptr[i + 1]].any()
             and not nb.target[nb.indptr[i]:nb.indptr[i + 1]].all())
    dM, hinge = slne.triplet_update(M, X, nb, np.array([i]), np.array([0.3]), 5.0, "violating", rng)
    # brute force Eq. 7 and the hinge of Eq. 6 for sample i
    nbrs = nb.indices[nb.indptr[i]:nb.indptr[i + 1]]
    tgt = nb.target[nb.indptr[i]:nb.indptr[i + 1]]
    s = X[i] @ M @ X[nbrs].T
    j, l = nbrs[tgt][np.argmin(s[tgt])], nbrs[~tgt][np.argmax(s[~tgt])]

    def h(Mx):
        return max(5.0 - X[i] @ Mx @ X[j] + X[i] @ Mx @ X[l], 0.0)

    assert hinge[0] == pytest.approx(h(M), rel=1e-5)
    np.testing.assert_allclose(dM, -0.3 * numerical_gradient(h, M, 1e-4), atol=1e-4)


def test_training_lowers_the_objective_and_is_deterministic_per_seed():
    X, y, g = _problem(n=300, sep=0.8)
    before = slne.hinge_objective(X, y, g, np.eye(X.shape[1]), 0.02)
    a = slne.SLNE(step=0.05, epochs=5, batch=8, seed=3).fit(X, y, g)
    b = slne.SLNE(step=0.05, epochs=5, batch=8, seed=3).fit(X, y, g)
    c = slne.SLNE(step=0.05, epochs=5, batch=8, seed=4).fit(X, y, g)
    assert slne.hinge_objective(X, y, g, a.M_, 0.02) < 0.8 * before
    assert np.array_equal(a.M_, b.M_) and not np.array_equal(a.M_, c.M_)
    assert np.allclose(a.M_, a.M_.T)  # symmetric projection
    u = slne.SLNE(step=0.05, epochs=5, batch=8, sampling="uniform").fit(X, y, g)
    assert slne.hinge_objective(X, y, g, u.M_, 0.02) < before


def test_frobenius_normalisation():
    X, y, g = _problem()
    m = slne.SLNE(step=0.5, epochs=2, normalize=2.0).fit(X, y, g)
    assert np.linalg.norm(m.M_) == pytest.approx(2.0, rel=1e-5)


def test_ensemble_similarity_is_the_sum_of_members():
    rng = np.random.default_rng(0)
    p, d = 12, 4
    for kind in ("pca-blocks", "random"):
        Ps = slne.subspaces(p, 3, d, kind, seed=1)
        Ms = [rng.normal(size=(d, d)).astype(np.float32) for _ in Ps]
        A, B = rng.normal(size=(5, p)), rng.normal(size=(7, p))
        direct = sum((A @ P.T) @ M @ (B @ P.T).T for P, M in zip(Ps, Ms))
        np.testing.assert_allclose(A @ slne.ensemble_matrix(Ps, Ms) @ B.T, direct, rtol=1e-4, atol=1e-4)
    assert np.array_equal(slne.subspaces(p, 2, d, "random", 5)[1], slne.subspaces(p, 2, d, "random", 5)[1])
    with pytest.raises(InputError, match="members x dim = 4 x 4 = 16 PCA directions, but only 12"):
        slne.subspaces(p, 4, d, "pca-blocks", 0)


def test_factor_reproduces_psd_part():
    rng = np.random.default_rng(2)
    A = rng.normal(size=(6, 6))
    psd = A @ A.T
    L = slne.factor(psd)
    np.testing.assert_allclose(L @ L.T, psd, rtol=1e-4, atol=1e-4)
    v = np.linalg.eigh(psd)[1]
    indefinite = v @ np.diag([-3, -1, 1, 2, 4, 5.0]) @ v.T
    L = slne.factor(indefinite, rank=2)
    np.testing.assert_allclose(L @ L.T, v[:, -2:] @ np.diag([4, 5.0]) @ v[:, -2:].T, atol=1e-4)


def test_softvote_is_eq9_over_the_most_similar_neighbours():
    labels = np.array([[0, 1, 1, 2]])
    sims = np.array([[0.9, 0.5, 0.47, 0.95]])
    assert list(softvote_ranking(labels, sims, 3, 4)[0][:2]) == [1, 2]  # 0.95 (class 2) < 0.5 + 0.47 (class 1)
    assert softvote_ranking(labels, sims, 3, 1)[0][0] == 2
    assert softvote_ranking(labels, sims, 3, 2)[0][0] == 2  # 2: 0.95 vs 0: 0.9
