import numpy as np
import pytest

from metricpipe.tasks import sparse
from metricpipe.tasks.errors import InputError
from tests.conftest import make_blobs, numerical_gradient


def _data(n=60, d=10, seed=0):
    X, y = make_blobs(n=n, d=d, classes=3, seed=seed, sep=0.5)
    X = X - X.mean(0)
    return (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float64), y


def test_golden_section_finds_the_minimum_of_a_known_function():
    assert sparse.golden_section(lambda x: (x - 1.234) ** 2 + 3, 0.0, 5.0, tol=1e-9, max_iter=200) == \
        pytest.approx(1.234, abs=1e-6)
    assert sparse.golden_section(lambda x: np.cosh(x + 0.5), -3.0, 2.0, tol=1e-9, max_iter=200) == \
        pytest.approx(-0.5, abs=1e-5)


def test_l0_projection_keeps_exactly_m_largest_per_column():
    rng = np.random.default_rng(0)
    U = rng.normal(size=(50, 7))
    P = sparse.project_l0(U, 5)
    assert ((P != 0).sum(0) == 5).all()
    for c in range(7):
        kept = np.flatnonzero(P[:, c])
        assert np.abs(U[kept, c]).min() >= np.abs(np.delete(U[:, c], kept)).max()
        np.testing.assert_array_equal(P[kept, c], U[kept, c])
    assert sparse.nonzeros_per_column(16384, 0.99) == 164  # Eq. 19: tau = (D - M) / D


def test_gradient_matches_finite_differences_of_the_objective():
    X, y = _data()
    gt = sparse.GroundTruth(np.arange(len(X)), y)
    rng = np.random.default_rng(1)
    U = rng.normal(size=(X.shape[1], 3)) * 0.5
    qs = np.array([0, 5, 17, 33])
    _, neg = gt.masks(qs)
    piv = sparse.pivots((X[qs] @ U) @ (X @ U).T, neg)
    f0, G, _ = sparse.objective_and_gradient(U, X, gt, qs, piv, 1e-3)
    num = numerical_gradient(lambda V: sparse.objective_and_gradient(V, X, gt, qs, piv, 1e-3)[0], U)
    assert f0 > 0
    np.testing.assert_allclose(G, num, rtol=1e-4, atol=1e-6)


def test_pivot_is_the_highest_scored_negative():
    S = np.array([[0.9, 0.2, 0.7, 0.1]])
    neg = np.array([[False, True, True, True]])
    assert sparse.pivots(S, neg)[0] == 2


def test_dense_training_lowers_the_objective_and_raises_train_map():
    """The paper's Fig. 2 on a small case: the objective falls and train mAP rises."""
    X, y = make_blobs(n=200, d=40, classes=5, sep=0.6)
    X = X - X.mean(0)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    U0 = np.linalg.svd(X, full_matrices=False)[2][:8].T
    m = sparse.SparseProjector(sparsity=0.0, queries=40, max_iter=20).fit(X, y, U0)
    first, last = m.history[0], m.history[-1]
    assert last["objective"] < 0.25 * first["objective"]
    assert last["train_map"] > first["train_map"] + 0.08


def test_sparse_training_keeps_the_constraint_and_is_seeded():
    X, y = _data(n=120, d=30)
    U0 = np.linalg.svd(X, full_matrices=False)[2][:4].T
    a = sparse.SparseProjector(sparsity=0.9, queries=30, max_iter=10).fit(X, y, U0)
    b = sparse.SparseProjector(sparsity=0.9, queries=30, max_iter=10).fit(X, y, U0)
    assert ((a.U_ != 0).sum(0) == 3).all()
    np.testing.assert_allclose(np.linalg.norm(a.U_, axis=0), 1.0, rtol=1e-5)
    assert np.array_equal(a.U_, b.U_)
    with pytest.raises(InputError, match="'sparsity' parameter of sparse must be in \\[0, 1\\)"):
        sparse.SparseProjector(sparsity=1.0).fit(X, y, U0)


def test_annealed_support_shrinks_geometrically_to_m_and_anneal_zero_is_algorithm_1():
    p = sparse.SparseProjector(sparsity=0.99, max_iter=100, anneal=0.5)
    ms = [p._support(it, 1000, 10) for it in range(100)]
    assert ms[0] == 1000 and ms[50:] == [10] * 50
    assert all(a >= b for a, b in zip(ms, ms[1:]))
    assert ms[25] == 100  # geometric: halfway through the schedule, sqrt(D * M)
    assert sparse.SparseProjector(sparsity=0.99, max_iter=100, anneal=0.0)._support(0, 1000, 10) == 10
    X, y = _data(n=120, d=30)
    U0 = np.linalg.svd(X, full_matrices=False)[2][:4].T
    with pytest.raises(InputError, match="'anneal' parameter of sparse must be in \\[0, 1\\]"):
        sparse.SparseProjector(anneal=1.5).fit(X, y, U0)


@pytest.mark.parametrize("used", [20, 198])
def test_sparse_encode_equals_dense_whether_it_gathers_used_dimensions_or_not(used):
    import scipy.sparse
    from metricpipe.tasks.models import LinearModel
    rng = np.random.default_rng(0)
    U = np.zeros((200, 6), np.float32)
    for c in range(6):  # supports together cover exactly the first `used` input dimensions
        rows = np.arange(c, used, 6)
        U[rows, c] = rng.normal(size=len(rows))
    X = rng.normal(size=(50, 200)).astype(np.float32)
    model = LinearModel(scipy.sparse.csc_array(U), b=np.ones(6, np.float32))
    rows, _ = model._W_compute
    assert (rows is not None) == (used <= LinearModel.GATHER_BELOW * 200)
    np.testing.assert_allclose(model.transform(X), X @ U + 1, rtol=1e-5, atol=1e-5)
