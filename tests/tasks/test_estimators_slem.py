"""SLEM, kernel SLEM and ESVM as scikit-learn estimators: the common checks, the pipeline's entry
points against in-memory fit, and the stored-state round trip."""

import numpy as np
import pytest
from sklearn.base import clone

from metricpipe.tasks import moments, slem
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.slem import ESVM, SLEM, KernelSLEM

# scikit-learn's estimator checks for these classes: tests/tasks/test_estimator_checks.py


def _pool(n=80, D=6, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, D)) + rng.normal(size=D), rng.normal(size=(7, D))


def test_linear_fit_samples_count_rows_and_equals_the_moments_entry_points():
    X, Y = _pool()
    neg = {"count": 50, "seed": 3}
    est = SLEM(lam=0.2, negatives=neg).fit(X)
    rows = np.sort(np.random.default_rng([3, 29]).choice(len(X), 50, replace=False))  # the pipeline's draw
    P = X[rows]
    assert est.n_negatives_ == 50
    # the paper's A^-1 (x - mu) normalised on the sampled pool (numpy reference)
    A = np.cov(P.T, bias=True) + 0.2 * (P * P).sum(1).mean() * np.eye(X.shape[1])  # lam for rows of unit RMS norm
    ref = slem.unit_rows(np.linalg.solve(A, (Y - P.mean(0)).T).T)
    np.testing.assert_allclose(est.transform(Y), ref, atol=1e-6)
    # the pipeline's two entry points: streamed blocks, and the statistics stage's unbiased moments
    streamed = clone(est).fit_blocks([P[:13], P[13:14], P[14:]])
    stats = moments.finalize_statistics(
        moments.combine_all(
            [
                moments.partial_moments(P[a : a + 16], np.zeros(len(P[a : a + 16]), np.int64), 1)
                for a in range(0, 50, 16)
            ]
        )
    )
    from_stats = clone(est).fit_moments(stats["mean"], stats["covariance"], int(stats["n_samples"]), ddof=1)
    for other in (streamed, from_stats):
        np.testing.assert_allclose(other.cholesky_, est.cholesky_, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(other.transform(Y), est.transform(Y), atol=1e-6)


@pytest.mark.parametrize(
    "make",
    [
        lambda: KernelSLEM(lam=0.3, gamma=0.2, negatives={"count": 40, "seed": 1}),
        lambda: KernelSLEM(kernel="poly", gamma=0.3, rank=6, decomposition="icd", negatives={"count": 40, "seed": 1}),
        lambda: ESVM(lam=0.01, epochs=3, negatives={"count": 40, "seed": 1}, random_state=5),
    ],
)
def test_pool_learners_fit_equals_fit_pool_on_the_same_pool(make):
    X, Y = _pool()
    est = make().fit(X)
    rows = np.sort(np.random.default_rng([1, 29]).choice(len(X), 40, replace=False))
    if getattr(est, "decomposition", None) == "icd":  # ICD keeps its r pivots of the pool only
        assert len(est.pool_) == est.rank_ == 6 and all((X[rows] == p).all(1).any() for p in est.pool_)
    else:
        np.testing.assert_array_equal(est.pool_, X[rows])
    other = make().fit_pool(X[rows])
    np.testing.assert_array_equal(other.transform(Y), est.transform(Y))
    assert other.code_metric == est.code_metric


@pytest.mark.parametrize(
    "make",
    [
        lambda: SLEM(lam=0.05),
        lambda: KernelSLEM(kernel="poly", gamma=0.3, rank=6, decomposition="kpca"),
        lambda: KernelSLEM(gamma=0.2, rank=6, decomposition="icd"),
        lambda: ESVM(epochs=2, random_state=np.random.RandomState(4)),
    ],
)
def test_from_state_round_trip_transforms_identically(make):
    X, Y = _pool()
    est = make().fit(X)
    state = est.fitted_state()
    for k, v in state.items():  # arrays or JSON-able values only: the pipeline stores nothing else
        assert isinstance(v, (np.ndarray, int, float, str, dict, list)), k
    params = est.get_params()
    again = type(est).from_state(params, state)
    np.testing.assert_array_equal(again.transform(Y), est.transform(Y))
    assert again.code_metric == est.code_metric and again.cost() == est.cost()
    assert again.get_feature_names_out().tolist() == est.get_feature_names_out().tolist()


def test_a_kernel_slem_stored_before_the_relative_ridge_loads_with_its_lam_as_the_ridge():
    """Before 0.3.8 the ridge was lam itself (no ridge_ in the stored state): such a model must score
    as it was fitted, and a new poly model's ridge is lam times the pool's mean k(x, x)."""
    X, _ = _pool()
    est = KernelSLEM(kernel="poly", gamma=0.5, lam=0.3, rank=6, decomposition="kpca").fit(X)
    assert est.ridge_ == pytest.approx(0.3 * np.mean(slem.kernel_diag(X, "poly", est.gamma_)))
    state = {k: v for k, v in est.fitted_state().items() if k != "ridge_"}
    old = KernelSLEM.from_state(est.get_params(), state)
    assert old.ridge_ == 0.3 and old.code_metric.split(":")[3] == "0.3" != est.code_metric.split(":")[3]


def test_kernel_slem_score_string_parses_and_drives_similarity():
    X, Y = _pool()
    est = KernelSLEM(lam=np.float64(0.3), gamma=np.float32(0.25), rank=5, decomposition="kpca").fit(X)
    assert est.code_metric == "slem:gaussian:0.25:0.3:5"
    assert slem.parse_score(est.code_metric) == ("gaussian", 0.25, 0.3, 5)
    C = est.transform(Y)
    S = slem.similarity(C, C, est.code_metric)
    np.testing.assert_allclose(np.diag(S), 1.0, atol=1e-5)  # a cosine: each image's own classifier


def test_bad_negatives_and_small_pools_are_one_line_errors():
    X, _ = _pool(n=10)
    for neg, msg in (
        ({"split": "test"}, "never test"),
        ({"count": 1}, "integer >= 2"),
        ({"size": 5}, "keys among split, count, seed"),
        ({"seed": -1}, "seed must be an integer >= 0"),
    ):
        for est in (SLEM(negatives=neg), KernelSLEM(negatives=neg), ESVM(negatives=neg)):
            with pytest.raises(InputError, match=msg):
                est.fit(X)
    with pytest.raises(ValueError, match="1 sample"):
        KernelSLEM().fit_pool(X[:1])
    with pytest.raises(InputError, match="at least 2 negative images; got 1 sample"):
        SLEM().fit_blocks([X[:1]])
    with pytest.raises(InputError, match=r"SLEM.fit_moments: mean \(D,\) and covariance \(D, D\) expected"):
        SLEM().fit_moments(np.zeros(3), np.eye(4), 10)
    with pytest.raises(
        InputError,
        match="decomposition cholesky is full rank, but rank is 4; use decomposition kpca "
        "or icd for a low rank, or rank full",
    ):
        KernelSLEM(rank=4).fit(X)
    with pytest.raises(InputError, match="but rank is 50"):  # refused as a parameter, whatever the pool's size
        KernelSLEM(rank=50).fit(X)
    from sklearn.utils._param_validation import InvalidParameterError

    with pytest.raises(InvalidParameterError, match="The 'kernel' parameter of SLEM must be a str among"):
        SLEM(kernel="sigmoid").fit(X)
    with pytest.raises(InvalidParameterError, match="The 'lam' parameter of KernelSLEM must be a float in the range"):
        KernelSLEM(lam=0.0).fit(X)


def test_icd_encodes_against_its_pivots_as_the_nystrom_extension_over_the_whole_pool():
    """v = P k(pool, x) with P zero outside the pivot columns (the full-pool form) equals the r x r
    form the model keeps; encoding costs r kernel evaluations, not n."""
    from scipy import linalg as sla

    from metricpipe.tasks.slem import incomplete_cholesky, kernel, kernel_diag

    X, Y = _pool()
    pool = X[:60].astype(np.float64)
    est = KernelSLEM(kernel="gaussian", gamma=0.2, rank=8, decomposition="icd").fit_pool(pool)
    B, piv = incomplete_cholesky(
        kernel_diag(pool, "gaussian", 0.2), lambda j: kernel(pool, pool[j : j + 1], "gaussian", 0.2)[:, 0], 8
    )
    P_full = np.zeros((8, len(pool)))
    P_full[:, piv] = sla.solve_triangular(B[piv], np.eye(8), lower=True)
    v_full = (P_full @ kernel(pool, Y.astype(np.float64), "gaussian", 0.2)).T
    v, _ = est.lemma1(Y)
    np.testing.assert_allclose(v, v_full, rtol=1e-10, atol=1e-12)
    assert est.cost()["flops_per_image"] == 2 * 8 * X.shape[1] + 2 * 8 * 8 + 2 * 8 * 8


def test_kernel_slem_gamma_scale_makes_the_gaussian_score_unit_free():
    """gamma: scale = 1 / mean squared distance of the pool: scaling every feature by 100 (raw pixel
    units against l2-normalised ones) leaves Eq. 16's scores unchanged; a fixed gamma does not."""
    from metricpipe.tasks.slem import similarity

    X, Y = _pool()
    scores = {}
    for s in (1.0, 100.0):
        for gamma in ("scale", 1.0):
            est = KernelSLEM(lam=0.3, gamma=gamma).fit_pool(s * X[:50])
            C = est.transform(s * Y)
            scores[s, gamma] = similarity(C, C, est.code_metric)
    np.testing.assert_allclose(scores[1.0, "scale"], scores[100.0, "scale"], rtol=1e-6, atol=1e-9)
    assert not np.allclose(scores[1.0, 1.0], scores[100.0, 1.0], atol=1e-3)
    est = KernelSLEM(gamma="scale").fit_pool(X[:50])
    d2 = ((X[:50, None, :] - X[None, :50, :]) ** 2).sum(-1)
    assert est.gamma_ == pytest.approx(1.0 / (d2.sum() / 50**2), rel=1e-9)  # 1 / mean ||a - b||^2
