import numpy as np
import pytest

from metricpipe.tasks import nml
from metricpipe.tasks.errors import InputError
from tests.conftest import numerical_gradient


def _pairs(n=12, D=7, d=3, seed=0, zero_col=True):
    rng = np.random.default_rng(seed)
    X = rng.random((2 * n, D)) * (rng.random((2 * n, D)) > 0.3)
    if zero_col:
        X[:, 2] = 0.0  # an all-zero column
    X[0] = 0.0  # an all-zero image
    X /= np.maximum(X.sum(1, keepdims=True), 1e-12)
    L = rng.uniform(-0.5, 0.5, (d, D))
    L[1, 4] = 0.0  # l_c = 0 meets x_c = 0 somewhere
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    return X[:n], X[n:], y, L


def test_chi2_embedding_equals_the_kernel_of_eq_11_and_is_finite_on_zeros():
    Xi, Xj, _, L = _pairs()
    X = np.concatenate([Xi, Xj])
    K = nml.chi2_embed(L, X)
    assert np.all(np.isfinite(K)) and np.allclose(K[0], 0.0)  # x = 0 embeds at the origin
    np.testing.assert_allclose(K, nml.chi2_kernel(X, L), rtol=1e-5, atol=1e-7)
    # Eq. 11 by hand for one entry
    l, x = L[2], X[3]
    by_hand = sum(2 * a * b / (abs(a) + abs(b)) for a, b in zip(l, x) if abs(a) + abs(b) > 0)
    assert K[3, 2] == pytest.approx(by_hand, rel=1e-5)


@pytest.mark.parametrize("margin,bias", [(0.02, 0.1), (0.5, 0.3)])
def test_nml_subgradient_matches_finite_differences(margin, bias):
    Xi, Xj, y, L = _pairs()
    loss, G, _ = nml.nml_loss_and_gradient(L, Xi, Xj, y, bias, margin)
    assert loss > 0 and np.all(np.isfinite(G))
    f = lambda M: nml.nml_loss_and_gradient(M, Xi, Xj, y, bias, margin)[0]  # noqa: E731
    np.testing.assert_allclose(G, numerical_gradient(f, L, h=1e-7), rtol=2e-3, atol=1e-6)


def test_kernel_gradient_of_eq_12_matches_finite_differences():
    rng = np.random.default_rng(3)
    x = rng.random(6)
    x[1] = 0.0
    l = rng.uniform(-0.5, 0.5, 6)
    _, R, cols = nml.chi2_embed(l[None], x[None], gradient=True)
    grad = np.zeros(6)
    grad[cols] = 2.0 * R[0, 0]
    num = numerical_gradient(lambda v: nml.chi2_kernel(x[None], v[None])[0, 0], l)
    np.testing.assert_allclose(grad, num, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(grad, 2 * x * np.abs(x) / (np.abs(x) + np.abs(l)) ** 2, rtol=1e-5)


def test_linear_gradient_matches_finite_differences():
    Xi, Xj, y, L = _pairs(zero_col=False)
    _, G, gb = nml.linear_loss_and_gradient(L, Xi * 5, Xj * 5, y, 1.0, 0.2)
    f = lambda M: nml.linear_loss_and_gradient(M, Xi * 5, Xj * 5, y, 1.0, 0.2)[0]  # noqa: E731
    np.testing.assert_allclose(G, numerical_gradient(f, L), rtol=1e-5, atol=1e-8)


def test_negative_features_are_refused():
    with pytest.raises(InputError, match="non-negative features .* first at row 1, column 0"):
        nml.check_nonnegative(np.array([[0.1, 0.2], [-0.3, 0.0]]), "x.npz")


def test_reused_work_buffer_gives_the_fresh_result_on_gathered_and_dense_columns():
    rng = np.random.default_rng(5)
    L = rng.uniform(-0.5, 0.5, (4, 30))
    work = np.empty(4 * 9 * 30, np.float32)
    sparse = rng.random((9, 30)) * (rng.random((9, 30)) > 0.5)
    sparse[:, :10] = 0.0  # the union of non-zero columns is 2/3 of D: gathered
    dense = rng.random((5, 30))  # all columns: no gather
    for X in (sparse, dense, sparse[:3]):
        K, R, cols = nml.chi2_embed(L, X, gradient=True, work=work)
        np.testing.assert_allclose(K, nml.chi2_kernel(X, L), rtol=1e-5, atol=1e-7)
        full = np.zeros((4, len(X), 30), np.float32)
        full[:, :, cols] = R
        Xa, La = X[None], np.abs(L)[:, None, :]
        expect = np.divide(Xa * Xa, (La + Xa) ** 2, out=np.zeros_like(La + Xa), where=La + Xa > 0)
        np.testing.assert_allclose(full, expect, rtol=1e-5, atol=1e-9)
    assert len(nml.chi2_embed(L, sparse, True, work)[2]) < 30 == len(nml.chi2_embed(L, dense, True, work)[2])


def test_sgd_step_is_algorithm_1s_update_and_adam_lowers_the_hinge():
    Xi, Xj, y, L = _pairs(n=40, D=12, d=3, seed=4)
    _, G, _ = nml.nml_loss_and_gradient(L, Xi, Xj, y, 0.1, 0.02)
    sgd = nml.PairSGD(L, "nml", 50.0, 0.1, 0.02)
    sgd.step(Xi, Xj, y)
    np.testing.assert_allclose(sgd.L, L - 50.0 * G, rtol=1e-6, atol=1e-9)
    adam = nml.PairSGD(L, "nml", 0.01, 0.1, 0.02, optimizer="adam")
    first = nml.nml_loss_and_gradient(L, Xi, Xj, y, 0.1, 0.02)[0]
    for _ in range(200):
        adam.step(Xi, Xj, y)
    after = nml.nml_loss_and_gradient(adam.L, Xi, Xj, y, 0.1, 0.02)[0]
    assert after < 0.5 * first
    # Adam's first step moves every entry with a non-zero gradient by lr (the bias-corrected ratio is +-1)
    one = nml.PairSGD(L, "nml", 0.01, 0.1, 0.02, optimizer="adam")
    one.step(Xi, Xj, y)
    moved = np.abs(one.L - L)[G != 0]
    np.testing.assert_allclose(moved, 0.01, rtol=1e-6)
    with pytest.raises(ValueError, match="optimizer"):
        nml.PairSGD(L, "nml", 0.01, 0.1, 0.02, optimizer="rmsprop")


def test_threads_split_the_rows_of_L_without_changing_a_bit():
    Xi, Xj, y, L = _pairs(n=40, D=30, d=7, seed=6)
    one = nml.PairSGD(L, "nml", 0.01, 0.1, 0.02, optimizer="adam")
    two = nml.PairSGD(L, "nml", 0.01, 0.1, 0.02, optimizer="adam", threads=3)
    for s in range(5):
        assert one.step(Xi, Xj, y) == two.step(Xi, Xj, y)
    assert np.array_equal(one.L, two.L)
    np.testing.assert_array_equal(nml.chi2_embed(L, Xi), nml.chi2_embed(L, Xi, pool=two.pool))


def test_pool_pairs_are_balanced_distinct_and_correctly_labelled():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 5, 1000)
    i, j, s = nml.sample_pairs(y, 4001, np.random.default_rng(3))
    assert len(s) == 4001 and (i != j).all() and (s == 1).sum() == 2000
    assert np.array_equal(s == 1, y[i] == y[j])
    assert 0.4 < (s[:200] == 1).mean() < 0.6  # shuffled: both kinds throughout
    again = nml.sample_pairs(y, 4001, np.random.default_rng(3))
    relabelled = nml.sample_pairs(10 * y + 7, 4001, np.random.default_rng(3))  # codes' order only matters
    assert all(np.array_equal(a, b) and np.array_equal(a, c) for a, b, c in zip((i, j, s), again, relabelled))
    # similar partners are uniform over the other rows of the class; dissimilar ones over other classes
    sim = s == 1
    assert np.all(np.bincount(j[sim][y[i[sim]] == 0], minlength=1000)[y != 0] == 0)
    counts = np.bincount(y[j[~sim]], minlength=5) / np.bincount(y[i[~sim]], minlength=5).sum()
    assert counts.min() > 0.15


def test_pool_pairs_fall_back_when_a_kind_is_impossible():
    one_class = nml.sample_pairs(np.zeros(5, int), 10, np.random.default_rng(0))
    assert (one_class[2] == 1).all() and (one_class[0] != one_class[1]).all()
    singletons = nml.sample_pairs(np.arange(6), 10, np.random.default_rng(0))
    assert (singletons[2] == -1).all() and len(singletons[2]) == 10
    assert len(nml.sample_pairs(np.array([3]), 10, np.random.default_rng(0))[2]) == 0


def test_pair_groups_visit_every_pair_once_per_epoch_by_block_pairs():
    rng = np.random.default_rng(1)
    pi, pj = rng.integers(0, 100, 500), rng.integers(0, 100, 500)
    gen = nml.pair_groups(pi, pj, 100, 30, seed=4)
    n_groups = len({(min(a, b), max(a, b)) for a, b in zip(pi // 30, pj // 30)})
    epochs = [[next(gen) for _ in range(n_groups)] for _ in range(2)]
    for groups in epochs:
        assert np.array_equal(np.sort(np.concatenate([sel for _, sel in groups])), np.arange(500))
        for blocks, sel in groups:
            assert len(blocks) <= 2 and set(pi[sel] // 30) | set(pj[sel] // 30) == set(blocks)
    assert [b for b, _ in epochs[0]] != [b for b, _ in epochs[1]]  # a new seeded order every epoch
