import numpy as np
import pytest

from metricpipe.tasks import slem
from metricpipe.tasks.errors import InputError


def _data(n=30, D=5, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, D)), rng.normal(size=(3, D))


@pytest.mark.parametrize("theta", [0.5, 1.0, 1 / 30])
def test_eq6_equals_the_ridge_solution_of_eqs_3_4_and_the_minimiser_of_eq1(theta):
    X, Y = _data()
    x0, lam = Y[0], 0.3
    A = slem.regularised_covariance(np.cov(X.T, bias=True), lam)
    w6, nu6 = slem.exemplar(x0, X.mean(0), A, theta)
    w3, nu3 = slem.exemplar_direct(x0, X, lam, theta)
    np.testing.assert_allclose(w6, w3, atol=1e-12)
    assert nu6 == pytest.approx(nu3, abs=1e-12)
    # Eq. 1 with the square loss, minimised as one least-squares problem over (omega, nu)
    n, D = X.shape
    Z = np.vstack(
        [np.sqrt(theta) * np.r_[x0, 1], np.c_[X, np.ones(n)] / np.sqrt(n), np.c_[np.sqrt(lam) * np.eye(D), np.zeros(D)]]
    )
    t = np.r_[np.sqrt(theta), -np.ones(n) / np.sqrt(n), np.zeros(D)]
    sol = np.linalg.lstsq(Z, t, rcond=None)[0]
    np.testing.assert_allclose(w6, sol[:D], atol=1e-10)
    assert nu6 == pytest.approx(sol[D], abs=1e-10)


def test_theta_changes_the_norm_not_the_direction_and_the_encoder_is_that_direction():
    X, Y = _data()
    lam = 0.1
    A = slem.regularised_covariance(np.cov(X.T, bias=True), lam)
    dirs = [slem.unit_rows(slem.exemplar(Y[0], X.mean(0), A, th)[0][None])[0] for th in (0.01, 1.0, 50.0)]
    norms = [np.linalg.norm(slem.exemplar(Y[0], X.mean(0), A, th)[0]) for th in (0.01, 1.0, 50.0)]
    np.testing.assert_allclose(dirs[0], dirs[1], atol=1e-12)
    np.testing.assert_allclose(dirs[0], dirs[2], atol=1e-12)
    assert len({round(v, 6) for v in norms}) == 3
    # the estimator reads lam for rows of unit RMS norm: its ridge is lam times the pool's mean squared norm
    s2 = (X * X).sum(1).mean()
    A = slem.regularised_covariance(np.cov(X.T, bias=True), lam * s2)
    direction = slem.unit_rows(slem.exemplar(Y[0], X.mean(0), A, 1.0)[0][None])[0]
    enc = slem.SLEM(lam=lam, negatives={"count": None}).fit(X)
    assert enc.ridge_ == pytest.approx(lam * s2, rel=1e-12)
    np.testing.assert_allclose(enc.cholesky_ @ enc.cholesky_.T, A, atol=1e-12)
    np.testing.assert_allclose(enc.transform(Y[:1])[0], direction, atol=1e-6)


@pytest.mark.parametrize(
    "make",
    [
        lambda: slem.SLEM(lam=0.1, negatives={"count": None}),
        lambda: slem.ESVM(lam=0.1, epochs=3, batch=8, negatives={"count": None}),
    ],
)
def test_lam_is_read_for_rows_of_unit_rms_norm_so_codes_do_not_change_with_the_features_scale(make):
    X, Y = _data(n=60, D=6)
    X, Y = X + 2.0, Y + 2.0  # off-centre, as raw pixels are
    s = np.sqrt((X * X).sum(1).mean())
    ref = make().fit(X / s).transform(Y / s)  # rows of unit RMS norm: lam as given
    for c in (1.0, 50.0):  # the same rows at other scales (raw pixels: ~60)
        np.testing.assert_allclose(make().fit(c * X / s).transform(c * Y / s), ref, atol=2e-6)
    if isinstance(make(), slem.SLEM):  # a fixed ridge of 0.1 at scale 50 is almost no ridge: other codes
        Xc, Yc = 50 * X / s, 50 * Y / s
        A = slem.regularised_covariance(np.cov(Xc.T, bias=True), 0.1)
        plain = slem.unit_rows(np.linalg.solve(A, (Yc - Xc.mean(0)).T).T)
        assert np.abs(plain - ref).max() > 1e-2


def test_singular_covariance_without_lambda_is_a_one_line_error():
    X = np.c_[np.random.default_rng(0).normal(size=(10, 3)), np.zeros(10)]  # a feature with no variance
    with pytest.raises(InputError, match="raise lam"):
        slem.factor(slem.regularised_covariance(np.cov(X.T, bias=True), 0.0))
    with pytest.raises(InputError, match="SLEM: .* raise lam"):
        slem.SLEM(lam=0.0).fit(X)


@pytest.mark.parametrize("kind,gamma", [("gaussian", 0.3), ("poly", 0.5)])
def test_lemma1_factor_reproduces_the_augmented_kernel_matrix(kind, gamma):
    X, Y = _data()
    K = slem.kernel(X, X, kind, gamma)
    B, eps = slem.complete_cholesky(K)
    assert eps < 1e-6
    m = slem.KernelSLEM(0.1, kind, gamma, "full", "cholesky").fit(X)
    v, u = m.lemma1(Y[:1])
    Bp = np.zeros((len(X) + 1, len(X) + 1))
    Bp[0, 0], Bp[0, 1:], Bp[1:, 1:] = u[0], v[0], B
    Kp = slem.kernel(np.vstack([Y[:1], X]), np.vstack([Y[:1], X]), kind, gamma)
    np.testing.assert_allclose(Bp @ Bp.T, Kp, atol=1e-8)  # Eqs. 11-13


@pytest.mark.parametrize("kind,gamma", [("gaussian", 0.3), ("poly", 0.5)])
def test_eq16_equals_the_inner_product_of_the_explicit_classifiers(kind, gamma):
    X, Y = _data()
    lam = 0.3
    m = slem.KernelSLEM(lam, kind, gamma, "full", "cholesky").fit(X)
    C = m.transform(Y[:2]).astype(np.float64)
    n = len(X)
    Kfull = slem.kernel(np.vstack([Y[:2], X]), np.vstack([Y[:2], X]), kind, gamma)
    B, _ = slem.complete_cholesky(slem.kernel(X, X, kind, gamma))
    P = np.linalg.pinv(B.T)
    alphas = []
    for a in range(2):  # Eq. 15 with beta = [u / lambda; beta_hat]
        v, u = m.lemma1(Y[a : a + 1])
        beta0, bh = u[0] / lam, C[a, :n]
        al = np.zeros(n + 2)
        al[a], al[2:] = beta0 / u[0], P @ bh - P @ v[0] * beta0 / u[0]
        alphas.append(al)
    h, g = alphas
    cosine = h @ Kfull @ g / np.sqrt((h @ Kfull @ h) * (g @ Kfull @ g))
    assert slem.similarity(C[:1], C[1:], m.code_metric)[0, 0] == pytest.approx(cosine, abs=1e-5)


@pytest.mark.parametrize("kind", ["gaussian", "poly"])
def test_icd_at_full_rank_equals_complete_cholesky(kind):
    X, Y = _data(n=15)  # the poly kernel's feature space has 5 + 15 dimensions: K (15 x 15) has full rank
    K = slem.kernel(X, X, kind, 0.4)
    B, piv = slem.incomplete_cholesky(np.diag(K), lambda j: K[:, j], len(X))
    assert sorted(piv) == list(range(len(X)))  # every column pivoted once
    np.testing.assert_allclose(B @ B.T, K, atol=1e-8)
    ccd = slem.KernelSLEM(0.2, kind, 0.4, "full", "cholesky").fit(X)
    icd = slem.KernelSLEM(0.2, kind, 0.4, "full", "icd").fit(X)
    assert icd.factor_info_ == {"pivots": len(X)}
    Sc = slem.similarity(ccd.transform(Y), ccd.transform(Y), ccd.code_metric)
    Si = slem.similarity(icd.transform(Y), icd.transform(Y), icd.code_metric)
    np.testing.assert_allclose(Si, Sc, atol=1e-5)


def test_low_rank_factors_approximate_k_and_keep_lemma1_valid():
    X, Y = _data(n=60, D=4)
    K = slem.kernel(X, X, "gaussian", 0.5)
    err = {}
    for method in ("kpca", "icd"):
        m = slem.KernelSLEM(0.1, "gaussian", 0.5, 10, method).fit(X)
        assert m.rank_ == 10
        v, u = m.lemma1(Y)
        assert np.all(np.isfinite(u)) and np.all((v * v).sum(1) <= 1.0 + 1e-9)  # ||v||^2 <= k_00 = 1
        B, _ = slem.decompose(X, "gaussian", 0.5, method, 10)
        err[method] = np.linalg.norm(K - B @ B.T)
    svals = np.linalg.eigvalsh(K)[::-1]
    assert err["kpca"] == pytest.approx(np.sqrt((svals[10:] ** 2).sum()), rel=1e-6)  # Eckart-Young
    assert err["kpca"] <= err["icd"] + 1e-12


def test_esvm_separates_each_exemplar_from_the_negatives():
    rng = np.random.default_rng(1)
    Xneg = rng.normal(size=(200, 6))
    X0 = rng.normal(size=(5, 6)) + 4.0  # far from the negatives
    W = slem.esvm(X0, Xneg, lam=1e-3, theta=1.0, epochs=20, batch=16, rng=np.random.default_rng(0))
    np.testing.assert_allclose(np.linalg.norm(W, axis=1), 1.0)
    own = (W * X0).sum(1)  # each classifier's score on its exemplar
    assert np.all(own > (W @ Xneg.T).max(axis=1))  # above every negative's
    # the same seed gives the same codes; the estimator wraps the same solver with the draw [seed, 23]
    enc = slem.ESVM(1e-3, 1.0, 20, 16, {"count": None}, random_state=0).fit(Xneg)
    np.testing.assert_array_equal(enc.transform(X0), enc.transform(X0))
    s = np.sqrt((Xneg * Xneg).sum(1).mean())  # lam for rows of unit RMS norm: the rows over s
    ref = slem.esvm(X0 / s, Xneg / s, 1e-3, 1.0, 20, 16, np.random.default_rng([0, 23]))
    np.testing.assert_allclose(enc.transform(X0), ref, atol=1e-7)
    assert not np.allclose(slem.ESVM(1e-3, 1.0, 20, 16, {"count": None}, random_state=1).fit(Xneg).transform(X0), ref)


@pytest.mark.parametrize("decomposition, rank", [("cholesky", "full"), ("kpca", 8), ("icd", 8)])
@pytest.mark.parametrize("scale", [1.0, 40.0])
def test_kernel_slem_with_the_linear_kernel_is_linear_slem_at_the_same_lam(decomposition, rank, scale):
    # poly with gamma 0 is the linear kernel: Eq. 16's cosine must be linear SLEM's cosine for the same lam
    X = scale * np.random.default_rng(0).normal(size=(60, 8)) + scale
    Q = scale * np.random.default_rng(1).normal(size=(5, 8))
    lin = slem.SLEM(lam=0.3).fit(X)
    ker = slem.KernelSLEM(lam=0.3, kernel="poly", gamma=0.0, decomposition=decomposition, rank=rank).fit(X)
    expect = lin.transform(Q) @ lin.transform(X).T
    got = slem.similarity(ker.transform(Q), ker.transform(X), ker.code_metric)
    np.testing.assert_allclose(got, expect, atol=1e-5)  # u = sqrt(k00 - ||v||^2) cancels
