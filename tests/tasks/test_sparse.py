import warnings

import numpy as np
import pytest

from metricpipe.tasks import sparse
from metricpipe.tasks.errors import InputError
from tests.conftest import make_blobs, numerical_gradient


def _data(n=60, d=10, seed=0):
    X, y = make_blobs(n=n, d=d, classes=3, seed=seed, sep=0.5)
    X = X - X.mean(0)
    return (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float64), y


def test_golden_section_searches_a_bracket_far_below_one():
    # the step bracket is ||U|| / ||grad||: 1e-8 on raw digits pixels; the search must still narrow it
    assert sparse.golden_section(lambda x: (x - 3e-9) ** 2, 0.0, 1e-8, tol=1e-4, max_iter=40) == pytest.approx(
        3e-9, rel=1e-3
    )


def test_golden_section_finds_the_minimum_of_a_known_function():
    assert sparse.golden_section(lambda x: (x - 1.234) ** 2 + 3, 0.0, 5.0, tol=1e-9, max_iter=200) == pytest.approx(
        1.234, abs=1e-6
    )
    assert sparse.golden_section(lambda x: np.cosh(x + 0.5), -3.0, 2.0, tol=1e-9, max_iter=200) == pytest.approx(
        -0.5, abs=1e-5
    )


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
    _, history, n_iter = sparse.rank_projectors(X, y, U0, sparsity=0.0, queries=40, max_iter=20)
    first, last = history[0], history[-1]
    assert n_iter == 20 and [h["iter"] for h in history] == list(range(21))
    assert last["objective"] < 0.25 * first["objective"]
    assert last["train_map"] > first["train_map"] + 0.08


def test_sparse_training_keeps_the_constraint_and_is_seeded():
    X, y = _data(n=120, d=30)
    U0 = np.linalg.svd(X, full_matrices=False)[2][:4].T
    a, _, _ = sparse.rank_projectors(X, y, U0, sparsity=0.9, queries=30, max_iter=10)
    b, _, _ = sparse.rank_projectors(X, y, U0, sparsity=0.9, queries=30, max_iter=10)
    c, _, _ = sparse.rank_projectors(X, y, U0, sparsity=0.9, queries=30, max_iter=10, seed=1)
    assert ((a != 0).sum(0) == 3).all()
    np.testing.assert_allclose(np.linalg.norm(a, axis=0), 1.0, rtol=1e-5)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    with pytest.raises(InputError, match="'sparsity' parameter of sparse must be in \\[0, 1\\)"):
        sparse.rank_projectors(X, y, U0, sparsity=1.0)
    with pytest.raises(
        ValueError, match="The 'sparsity' parameter of SparseProjector must be a float in the range \\[0.0, 1.0\\)"
    ):
        sparse.SparseProjector(sparsity=1.0).fit(X, y)
    # a tau that rounds M of Eq. 19 to 0 keeps one non-zero, with a warning; one that rounds to 1, silently
    D = X.shape[1]
    with pytest.warns(
        UserWarning,
        match=f"leaves 0.4 non-zeros per column of the data's {D} features; 1 is kept \\(sparsity {1 - 1 / D:.6g}\\)",
    ):
        raised = sparse.SparseProjector(sparsity=1 - 0.4 / D, max_iter=2, validation=0).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kept = sparse.SparseProjector(sparsity=1 - 0.6 / D, max_iter=2, validation=0).fit(X, y)
    for est in (raised, kept):
        assert ((est.projectors_.toarray() != 0).sum(0) == 1).all()
    # the note follows the rounding of M: half a non-zero rounds to 0 (to even), one and a half to 2
    assert sparse.sparsity_note(64, 1 - 0.5 / 64) and sparse.nonzeros_per_column(64, 1 - 0.5 / 64) == 1
    assert sparse.sparsity_note(64, 1 - 1.5 / 64) is None and sparse.nonzeros_per_column(64, 1 - 1.5 / 64) == 2


def test_annealed_support_shrinks_geometrically_to_m_and_anneal_zero_is_algorithm_1():
    ms = [sparse.support_size(it, 1000, 10, 0.5, 100) for it in range(100)]
    assert ms[0] == 1000 and ms[50:] == [10] * 50
    assert all(a >= b for a, b in zip(ms, ms[1:]))
    assert ms[25] == 100  # geometric: halfway through the schedule, sqrt(D * M)
    assert sparse.support_size(0, 1000, 10, 0.0, 100) == 10
    X, y = _data(n=120, d=30)
    U0 = np.linalg.svd(X, full_matrices=False)[2][:4].T
    with pytest.raises(InputError, match="'anneal' parameter of sparse must be in \\[0, 1\\]"):
        sparse.rank_projectors(X, y, U0, anneal=1.5)
    with pytest.raises(
        ValueError, match="The 'anneal' parameter of SparseProjector must be a float in the range \\[0.0, 1.0\\]"
    ):
        sparse.SparseProjector(anneal=1.5).fit(X, y)


@pytest.mark.parametrize("used", [20, 198])
def test_sparse_encode_equals_dense_whether_few_or_most_input_dimensions_are_used(used):
    import scipy.sparse

    from metricpipe.tasks.models import LinearModel

    rng = np.random.default_rng(0)
    U = np.zeros((200, 6), np.float32)
    for c in range(6):  # supports together cover exactly the first `used` input dimensions
        rows = np.arange(c, used, 6)
        U[rows, c] = rng.normal(size=len(rows))
    X = rng.normal(size=(50, 200)).astype(np.float32)
    model = LinearModel(scipy.sparse.csc_array(U), b=np.ones(6, np.float32))
    np.testing.assert_allclose(model.transform(X), X @ U + 1, rtol=1e-5, atol=1e-5)


def _random_sparse(rng, D, R, density, empty=()):
    U = rng.normal(size=(D, R)).astype(np.float32) * (rng.random((D, R)) < density)
    U[:, list(empty)] = 0
    return U


@pytest.mark.parametrize(
    "n, D, R, density, empty",
    [
        (1, 300, 5, 0.05, ()),
        (70, 300, 17, 0.05, (0, 3, 16)),  # empty columns, a partial last block of rows
        (257, 1000, 64, 0.01, (5,)),  # one partial tile of groups, 8 blocks of rows and 1 row
        (33, 50, 8, 0.0, ()),  # all zero
        (0, 40, 4, 0.1, ()),  # no rows
    ],
)
def test_sparse_kernel_equals_the_dense_product(n, D, R, density, empty):
    import scipy.sparse

    from metricpipe.tasks.spmm import SparseRows

    rng = np.random.default_rng(n + D)
    U = _random_sparse(rng, D, R, density, empty)
    X = rng.normal(size=(n, D)).astype(np.float32)
    out = SparseRows(scipy.sparse.csc_array(U)).matmul(X)
    assert out.dtype == np.float32 and out.shape == (n, R)
    ref = X.astype(np.float64) @ U.astype(np.float64)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(ref).max(initial=0)))
    assert not out[:, list(empty)].any()


def test_sparse_kernel_gives_the_same_bits_whatever_the_row_blocks():
    """A row's codes do not depend on its neighbours: the encode stage and `metricpipe encode`
    slice rows differently and must store the same codes."""
    import scipy.sparse

    from metricpipe.tasks.spmm import SparseRows

    rng = np.random.default_rng(3)
    U = _random_sparse(rng, 700, 40, 0.03)
    U[rng.random(U.shape) < 0.001] = np.float32(
        1e-30
    )  # tiny terms: any arithmetic that depended on the block would show
    X = rng.normal(size=(131, 700)).astype(np.float32)
    k = SparseRows(scipy.sparse.csc_array(U))
    whole = k.matmul(X)
    pieces = np.concatenate([k.matmul(X[a:b]) for a, b in [(0, 1), (1, 40), (40, 77), (77, 131)]])
    np.testing.assert_array_equal(whole, pieces)
    np.testing.assert_array_equal(whole[5:6], k.matmul(np.asfortranarray(X[5:6].astype(np.float64))))


def test_sparse_kernel_sums_each_column_in_increasing_input_dimension():
    import scipy.sparse

    from metricpipe.tasks.spmm import SparseRows

    # in float32, (1 + 1e8) - 1e8 is 0 while (-1e8 + 1e8) + 1 is 1: the order is the documented one
    W = np.zeros((3, 1), np.float32)
    W[:, 0] = [1, 1e8, -1e8]
    X = np.ones((2, 3), np.float32)
    in_order = (np.float32(1) + np.float32(1e8)) - np.float32(1e8)
    assert in_order == 0 and SparseRows(scipy.sparse.csc_array(W)).matmul(X)[0, 0] == in_order


@pytest.mark.parametrize(
    "n, D, R, tiles",
    [
        (45, 3100, 12, 3),  # three tiles of used groups, a last group of 12 dimensions, a partial block of rows
        (64, 1024, 3, 1),  # one tile (some groups unused), whole blocks of rows
        (7, 33, 5, 1),  # three groups, the last of one dimension; fewer rows than a block
    ],
)
def test_sparse_kernel_matches_the_documented_float32_sum_bit_for_bit(n, D, R, tiles):
    """Each code is float32 ((0 + w1 x1) + w2 x2) + ... over its column's non-zeros in increasing
    input dimension, rounded at every step: computed here in numpy, one term at a time."""
    import scipy.sparse

    from metricpipe.tasks.spmm import SparseRows

    rng = np.random.default_rng(D)
    U = _random_sparse(rng, D, R, 0.02)
    U[rng.integers(0, D, 3), rng.integers(0, R, 3)] = rng.normal(size=3) * 1e7  # large terms: order shows
    U[D - 1, 0] = 0.5  # the last group, short when D % 16 != 0, is read
    X = rng.normal(size=(n, D)).astype(np.float32)
    ref = np.zeros((n, R), np.float32)
    for j in range(R):
        for d in np.flatnonzero(U[:, j]):
            ref[:, j] = ref[:, j] + U[d, j] * X[:, d]  # float32 * float32, then float32 +
    k = SparseRows(scipy.sparse.csc_array(U))
    assert len(k.tptr) == tiles and k.groups[-1] == (D - 1) // 16 * 16  # the cases are what they say
    np.testing.assert_array_equal(k.matmul(X), ref)


def test_sparse_kernel_adds_repeated_entries_of_w_as_the_stored_model_does():
    """A W with an entry stored three times: merged one by one in float32, as toarray() and a
    model saved and loaded again merge it (scipy's coo merge rounds 1 + 2**-24 + 2**-24 to 1 + 2**-23)."""
    import scipy.sparse

    from metricpipe.tasks.spmm import SparseRows

    v = np.array([1, 2.0**-24, 2.0**-24], np.float32)
    W = scipy.sparse.coo_array((v, ([0, 0, 0], [0, 0, 0])), shape=(1, 1))
    X = np.ones((1, 1), np.float32)
    expected = (v[0] + v[1]) + v[2]
    assert expected == W.toarray()[0, 0] == np.float32(1)
    assert SparseRows(W).matmul(X)[0, 0] == expected
    assert SparseRows(W.tocsr()).matmul(X)[0, 0] == expected


def test_the_kernel_refuses_arrays_it_would_misread():
    """The intrinsics address rows as contiguous float32: a strided or float64 array does not
    compile (SparseRows.matmul makes its input so; this guards a direct call)."""
    import numba

    from metricpipe.tasks import spmm

    k = spmm.SparseRows(np.eye(40, 3, dtype=np.float32))
    out = np.empty((32, 3), np.float32)
    for X in (np.ones((32, 80), np.float32)[:, ::2], np.ones((32, 40), np.float64)):
        with pytest.raises(numba.core.errors.TypingError):
            spmm._sparse_rows_matmul(X, k.groups, k.tptr, k.dloc, k.vals, out)


def test_linear_model_uses_the_kernel_for_sparse_w_and_blas_for_denser():
    import scipy.sparse

    from metricpipe.tasks.models import LinearModel

    rng = np.random.default_rng(1)
    X = rng.normal(size=(20, 100)).astype(np.float32)
    for density in (0.02, 0.9):
        U = _random_sparse(rng, 100, 10, density)
        model = LinearModel(scipy.sparse.csc_array(U))
        kernel = getattr(model._matmul, "__self__", None)
        assert (type(kernel).__name__ == "SparseRows") == (density < LinearModel.SPARSE_BELOW)
        np.testing.assert_allclose(model.transform(X), X @ U, rtol=1e-4, atol=1e-4)


# ---- the estimator and its training subset -----------------------------------------------------------


def _reference_subset(labels, keys, size, seed):
    """The order-free stratified draw, written out: each class's share of ``size`` rounded (at least one),
    its rows first in the order of their content keys mixed with the seed (``stream.rank``)."""
    from metricpipe.tasks import stream

    order = stream.rank(keys, seed, stream.SUBSET)
    picked = []
    for c in np.unique(labels):
        rows = np.flatnonzero(labels == c)
        take = max(1, int(np.rint(size * len(rows) / len(labels))))
        picked.append(rows[np.argsort(order[rows], kind="stable")[:take]])
    return np.sort(np.concatenate(picked))


def test_the_sample_keeps_every_class_share_is_seeded_and_follows_the_rows_content():
    from metricpipe.tasks import stream

    rng = np.random.default_rng(3)
    labels = rng.integers(0, 5, 1000)
    keys = rng.integers(0, 2**63, 1000, dtype=np.uint64)
    rows = stream.sample(labels, 120, keys, 7)
    assert np.all(np.diff(rows) > 0)
    for c in range(5):
        assert abs(np.sum(labels[rows] == c) - 120 * np.mean(labels == c)) <= 1
    np.testing.assert_array_equal(rows, stream.sample(labels, 120, keys, 7))
    assert not np.array_equal(rows, stream.sample(labels, 120, keys, 8))
    order = rng.permutation(1000)  # the same rows stored in another order: the same rows drawn
    np.testing.assert_array_equal(np.sort(order[stream.sample(labels[order], 120, keys[order], 7)]), rows)
    np.testing.assert_array_equal(stream.sample(labels, 5000, keys, 7), np.arange(1000))
    assert len(stream.sample(np.array([0] * 50 + [1]), 10, None, 0)) == 11  # every class keeps one row


def test_projector_is_algorithm_1_on_the_stratified_subset_from_the_pca_of_all_rows():
    import scipy.sparse

    from metricpipe.tasks.models import LinearModel

    X, y = make_blobs(n=300, d=20, classes=4, sep=0.5)
    X = X + 1.0
    est = sparse.SparseProjector(
        dim=5, sparsity=0.8, queries=20, train_size=120, max_iter=12, validation=0, random_state=4
    ).fit(X, y)
    mean = X.astype(np.float64).mean(0)
    vals, vecs = np.linalg.eigh(np.cov(X.astype(np.float64).T))
    U0 = vecs[:, ::-1][:, :5]
    U0 *= np.sign(U0[np.argmax(np.abs(U0), axis=0), np.arange(5)])  # numpy reference PCA
    from metricpipe.tasks import stream

    rows = _reference_subset(y, stream.row_keys(X), 120, 4)
    U, history, n_iter = sparse.rank_projectors(
        X[rows] - mean, y[rows], U0, sparsity=0.8, queries=20, max_iter=12, seed=4
    )
    assert isinstance(est.projectors_, scipy.sparse.csc_array) and est.n_iter_ == n_iter == 12
    np.testing.assert_allclose(est.projectors_.toarray(), U, atol=1e-4)
    assert ((est.projectors_.toarray() != 0).sum(0) <= sparse.nonzeros_per_column(20, 0.8)).all()
    assert [h["iter"] for h in est.history_] == [h["iter"] for h in history]
    model = LinearModel(scipy.sparse.csc_array(est.projectors_), (-mean.astype(np.float32) @ U).astype(np.float32))
    np.testing.assert_allclose(est.transform(X), model.transform(X), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(est.transform(X), (X - mean) @ U, rtol=1e-4, atol=1e-4)
    assert est.cost() == model.cost(20) and est.cost()["nnz"] == est.projectors_.nnz
    dense = sparse.SparseProjector(dim=5, sparsity=0.0, max_iter=2).fit(X, y)
    assert isinstance(dense.projectors_, np.ndarray) and dense.transform(X).shape == (300, 5)


def test_fit_subset_takes_relevance_keys_other_than_the_labels():
    X, y = make_blobs(n=200, d=10, classes=4, sep=0.5)
    groups = y // 2  # e.g. the data's groups: two relevance keys
    mean, comps = X.astype(np.float64).mean(0), np.linalg.svd(X - X.mean(0), full_matrices=False)[2]
    est = sparse.SparseProjector(dim=3, sparsity=0.5, queries=10, max_iter=5).fit_subset(X, groups, mean, comps)
    U, _, _ = sparse.rank_projectors(X - mean, groups, comps[:3].T, sparsity=0.5, queries=10, max_iter=5)
    np.testing.assert_allclose(est.projectors_.toarray(), U)
    assert est.n_features_in_ == 10 and list(est.classes_) == [0, 1]


def test_stopping_before_the_annealing_ends_still_meets_the_sparsity():
    X, y = make_blobs(n=90, d=12, classes=3, sep=5.0)  # separable: the objective is 0 at once
    est = sparse.SparseProjector(dim=4, sparsity=0.75, queries=20, max_iter=50, pivot="initial", validation=0).fit(X, y)
    assert est.n_iter_ == 1 and est.history_[-1]["iter"] == 0
    assert ((est.projectors_.toarray() != 0).sum(0) <= 3).all()


def test_projector_refuses_too_many_projectors_and_a_single_key():
    X, y = make_blobs(n=60, d=6, classes=3)
    with pytest.raises(InputError, match=r"'dim' parameter of sparse must be <= 6, .*\(X has 6 feature\(s\)\)"):
        sparse.SparseProjector(dim=7).fit(X, y)
    with pytest.raises(InputError, match=r"at least 2 relevance keys \(positives and negatives\); got 1 class"):
        sparse.SparseProjector(dim=2).fit(X, np.zeros(len(X)))


def test_pivots_come_from_the_original_signatures_by_default(monkeypatch):
    """Section IV-1: each query's pivot is its negative scored highest by the original signatures."""
    from metricpipe.tasks.sparse import ranking

    X, y = make_blobs(n=60, d=8, classes=3, sep=1.0)
    Xc = X - X.mean(0)
    U0 = np.linalg.svd(Xc, full_matrices=False)[2][:2].T
    seen = {}
    real = sparse.pivots

    def spy(S0, neg):
        seen["S0"] = S0
        return real(S0, neg)

    monkeypatch.setattr(ranking, "pivots", spy)
    sparse.rank_projectors(Xc, y, U0, sparsity=0.0, queries=10, max_iter=2)
    np.testing.assert_allclose(seen["S0"], Xc @ Xc.T, rtol=1e-5, atol=1e-6)
    sparse.rank_projectors(Xc, y, U0, sparsity=0.0, queries=10, max_iter=2, pivot="initial")
    np.testing.assert_allclose(seen["S0"], (Xc @ U0) @ (Xc @ U0).T, rtol=1e-5, atol=1e-6)


def _split_digits():
    """900 of scikit-learn's digits (l2-normalised, centred on the first 600): 600 train, 300 validation
    rows; dense training first loses validation mAP, then beats the PCA start around step 24."""
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    X = X / np.linalg.norm(X, axis=1, keepdims=True)
    p = np.random.default_rng(0).permutation(len(X))[:900]
    X, y = X[p], y[p]
    X = X - X[:600].mean(0)
    return X[:600], y[:600], X[600:], y[600:]


@pytest.mark.parametrize("sparsity", [0.0, 0.5])
def test_early_stopping_keeps_the_state_with_the_best_validation_map(sparsity):
    from metricpipe.tasks.evaluation import validation_map

    X, y, Xv, yv = _split_digits()
    U0 = np.linalg.svd(X, full_matrices=False)[2][:8].T
    kw = dict(sparsity=sparsity, anneal=0.0, queries=40, seed=2)
    U, hist, n_iter, (best_iter, best_map) = sparse.rank_projectors(
        X, y, U0, max_iter=30, validation=(Xv, yv), patience=1000, **kw
    )
    checked = [h for h in hist if "val_map" in h]
    assert len(checked) == len(hist) and n_iter == 30  # anneal 0: every state has its final support
    assert best_map == max(h["val_map"] for h in checked)
    assert best_iter == next(h["iter"] for h in checked if h["val_map"] == best_map)
    assert validation_map(Xv @ U, yv, "inner") == pytest.approx(best_map, abs=1e-6)
    start = validation_map(
        Xv @ sparse.unit_columns(sparse.project_l0(U0, sparse.nonzeros_per_column(64, sparsity))), yv, "inner"
    )
    assert checked[0]["iter"] == 0 and checked[0]["val_map"] == pytest.approx(start, abs=1e-6)  # the start counts
    assert best_map >= start and checked[-1]["val_map"] < best_map  # the last state is not the one kept
    # the kept state is the one Algorithm 1 reaches after best_iter steps (the start: its projection)
    ref = (
        sparse.rank_projectors(X, y, U0, max_iter=best_iter, **kw)[0]
        if best_iter
        else sparse.unit_columns(sparse.project_l0(U0, sparse.nonzeros_per_column(64, sparsity)))
    )
    np.testing.assert_allclose(U, ref, atol=1e-6)


def test_early_stopping_stops_after_patience_checks_without_a_better_map():
    X, y, Xv, yv = _split_digits()
    U0 = np.linalg.svd(X, full_matrices=False)[2][:8].T
    U, hist, n_iter, (best_iter, _) = sparse.rank_projectors(
        X, y, U0, sparsity=0.0, queries=40, max_iter=200, validation=(Xv, yv), patience=3, seed=2
    )
    after = [h["iter"] for h in hist if h["iter"] > best_iter]
    assert n_iter < 200 and after == [best_iter + 1, best_iter + 2, best_iter + 3]


def test_annealed_states_are_validated_only_once_the_support_is_final():
    X, y, Xv, yv = _split_digits()
    U0 = np.linalg.svd(X, full_matrices=False)[2][:8].T
    _, hist, _, (best_iter, _) = sparse.rank_projectors(
        X, y, U0, sparsity=0.8, anneal=0.5, queries=40, max_iter=20, validation=(Xv, yv), patience=1000
    )
    steps = 10  # anneal * max_iter: the step taken at iteration 10 projects onto M first; states after it count
    assert [h["iter"] for h in hist if "val_map" in h] == list(range(steps + 1, 21))
    assert best_iter >= steps
