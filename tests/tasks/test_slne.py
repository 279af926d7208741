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
    nbrs = {i: set(nb.indices[nb.indptr[i] : nb.indptr[i + 1]]) for i in range(4)}
    assert nbrs == {0: {1, 2, 3}, 1: {0, 2}, 2: {0, 1}, 3: {0}}  # Eq. 4: j in N_i or i in N_j
    assert list(nb.target[nb.indptr[0] : nb.indptr[1]]) == [True, False, False]


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
    i = next(
        i
        for i in range(len(X))
        if nb.target[nb.indptr[i] : nb.indptr[i + 1]].any() and not nb.target[nb.indptr[i] : nb.indptr[i + 1]].all()
    )
    dM, hinge = slne.triplet_update(M, X, nb, np.array([i]), np.array([0.3]), 5.0, "violating", rng)
    # brute force Eq. 7 and the hinge of Eq. 6 for sample i
    nbrs = nb.indices[nb.indptr[i] : nb.indptr[i + 1]]
    tgt = nb.target[nb.indptr[i] : nb.indptr[i + 1]]
    s = X[i] @ M @ X[nbrs].T
    j, l = nbrs[tgt][np.argmin(s[tgt])], nbrs[~tgt][np.argmax(s[~tgt])]

    def h(Mx):
        return max(5.0 - X[i] @ Mx @ X[j] + X[i] @ Mx @ X[l], 0.0)

    assert hinge[0] == pytest.approx(h(M), rel=1e-5)
    np.testing.assert_allclose(dM, -0.3 * numerical_gradient(h, M, 1e-4), atol=1e-4)


def test_training_lowers_the_objective_and_is_deterministic_per_seed():
    X, y, g = _problem(n=300, sep=0.8)
    before = slne.hinge_objective(X, y, g, np.eye(X.shape[1]), 0.02)
    a, hist = slne.learn_similarity(X, y, g, step=0.05, epochs=5, batch=8, seed=3)
    b, _ = slne.learn_similarity(X, y, g, step=0.05, epochs=5, batch=8, seed=3)
    c, _ = slne.learn_similarity(X, y, g, step=0.05, epochs=5, batch=8, seed=4)
    assert slne.hinge_objective(X, y, g, a, 0.02) < 0.8 * before
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert np.allclose(a, a.T)  # symmetric projection
    assert [h["epoch"] for h in hist] == [1, 2, 3, 4, 5] and hist[-1]["hinge"] < hist[0]["hinge"]
    u, _ = slne.learn_similarity(X, y, g, step=0.05, epochs=5, batch=8, sampling="uniform")
    assert slne.hinge_objective(X, y, g, u, 0.02) < before


def test_frobenius_normalisation():
    X, y, g = _problem()
    M, _ = slne.learn_similarity(X, y, g, step=0.5, epochs=2, normalize=2.0)
    assert np.linalg.norm(M) == pytest.approx(2.0, rel=1e-5)


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
    with pytest.raises(InputError, match="members x member_dim = 4 x 4 = 16 PCA directions, but only 12"):
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


@pytest.mark.parametrize("c", [1.0, 0.5])
def test_factor_of_the_start_keeps_the_leading_pca_directions(c):
    # M = c I (the start, kept when no epoch validates better) in PCA coordinates: with dim set, the codes
    # must be the first PCA coordinates (they were the last: ties reversed by a descending sort)
    L = slne.factor(c * np.eye(8, dtype=np.float32), rank=3)
    np.testing.assert_allclose(np.abs(L), np.sqrt(c) * np.eye(8)[:, :3], atol=1e-7)
    Z = np.random.default_rng(0).normal(size=(50, 20))
    est = slne.SLNE(dim=4, epochs=1, step=0.0).fit(Z, np.arange(50) % 3)  # step 0: M stays I
    C = est.transform(Z)
    ref = slne.preprocess(Z, est.mean_, est.basis_)[:, :4]
    np.testing.assert_allclose(np.abs(C), np.abs(ref), atol=1e-5)


def test_softvote_is_eq9_over_the_most_similar_neighbours():
    labels = np.array([[0, 1, 1, 2]])
    sims = np.array([[0.9, 0.5, 0.47, 0.95]])
    assert list(softvote_ranking(labels, sims, 3, 4)[0][:2]) == [1, 2]  # 0.95 (class 2) < 0.5 + 0.47 (class 1)
    assert softvote_ranking(labels, sims, 3, 1)[0][0] == 2
    assert softvote_ranking(labels, sims, 3, 2)[0][0] == 2  # 2: 0.95 vs 0: 0.9


# ---- the estimators ------------------------------------------------------------------------------------


def _blobs(n=240, d=10, seed=0, sep=1.0):
    X, y = make_blobs(n=n, d=d, classes=3, seed=seed, sep=sep)
    return X + 2.0, y  # not centred: the estimator centres


def test_slne_fits_pca_space_exact_knn_graph_and_todays_linear_model_codes():
    from metricpipe.tasks.models import LinearModel

    X, y = _blobs()
    est = slne.SLNE(dim=4, input_dim=6, step=0.05, n_neighbors=7, random_state=2).fit(X, y)
    # the input space: the mean and the 6 leading principal directions of X (numpy reference)
    vals, vecs = np.linalg.eigh(np.cov(X.astype(np.float64).T))
    ref = vecs[:, ::-1][:, :6]
    ref *= np.sign(ref[np.argmax(np.abs(ref), axis=0), np.arange(6)])
    np.testing.assert_allclose(est.mean_, X.mean(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(est.basis_, ref, atol=1e-4)
    # the graph: brute-force 7-NN of X, self excluded; the solver: Algorithm 1 with the estimator's seed
    _, g = brute_force_knn(X, X, 7, exclude_self=True)
    np.testing.assert_array_equal(slne.knn_graph(X, 7), g)
    Z = slne.preprocess(X, est.mean_, est.basis_)
    M, hist = slne.learn_similarity(Z, y, g, step=0.05, seed=2)
    np.testing.assert_array_equal(est.M_, M)
    assert est.history_ == hist
    L = slne.factor(M, 4)
    model = LinearModel(W=L, pre_mean=est.mean_, pre_P=est.basis_, M=M, score="inner")
    np.testing.assert_array_equal(est.transform(X), model.transform(X))
    for a, b in zip(est.exact_views(X), model.exact_views(X)):
        np.testing.assert_array_equal(a, b)
    assert est.transform(X).shape == (len(X), 4) and est.code_metric == "inner"
    # a graph given to fit is used as is: the computed one gives the same model
    same = slne.SLNE(dim=4, input_dim=6, step=0.05, random_state=2).fit(X, y, neighbors=g)
    np.testing.assert_array_equal(same.M_, est.M_)


def test_slne_exact_views_give_the_bilinear_similarity_and_codes_its_psd_part():
    X, y = _blobs(sep=0.5)
    est = slne.SLNE(step=0.5, epochs=2, random_state=0).fit(X, y)
    q, b = est.exact_views(X[:20])
    Z = slne.preprocess(X[:20], est.mean_, est.basis_)
    np.testing.assert_allclose(q @ b.T, Z @ est.M_ @ Z.T, rtol=1e-4, atol=1e-5)  # Eq. 2
    vals, vecs = np.linalg.eigh(0.5 * (est.M_ + est.M_.T).astype(np.float64))
    psd = vecs @ np.diag(np.clip(vals, 0, None)) @ vecs.T
    C = est.transform(X[:20])
    np.testing.assert_allclose(C @ C.T, Z @ psd @ Z.T, rtol=1e-3, atol=1e-4)
    assert est.cost()["flops_per_image"] == 2 * (est.basis_.size + est.factor_.size)


def test_slne_refuses_bad_input_dim_graph_and_single_class():
    X, y = _blobs(d=5)
    with pytest.raises(InputError, match="'input_dim' parameter of slne must be <= 5"):
        slne.SLNE(input_dim=6).fit(X, y)
    with pytest.raises(InputError, match=r"neighbors must be an integer array of shape \(240, k\)"):
        slne.SLNE().fit(X, y, neighbors=np.zeros((10, 3), np.int64))
    with pytest.raises(InputError, match=r"row indices in \[0, 240\)"):
        slne.SLNE().fit(X, y, neighbors=np.full((240, 3), 240))
    with pytest.raises(InputError, match=r"neighbors lists no neighbour at all"):  # trained nothing, silently
        slne.SLNE().fit(X, y, neighbors=np.full((240, 3), -1))
    with pytest.raises(InputError, match="at least 2 classes .* got 1 class"):
        slne.SLNE().fit(X, np.zeros(len(X)))
    with pytest.raises(ValueError, match="The 'sampling' parameter of SLNE must be a str among"):
        slne.SLNE(sampling="best").fit(X, y)


def test_training_graph_keeps_anchors_and_their_neighbours_in_local_indices():
    anchors = np.array([2, 5, 9])
    nbrs = np.array([[5, 7, -1], [2, 11, 7], [3, -1, -1]])
    rows, graph = slne.training_graph(anchors, nbrs)
    np.testing.assert_array_equal(rows, [2, 3, 5, 7, 9, 11])
    anchor = np.isin(rows, anchors)
    np.testing.assert_array_equal(np.where(graph[anchor] >= 0, rows[graph[anchor]], -1), nbrs)
    assert np.all(graph[~anchor] == -1)  # neighbour-only rows have no list of their own
    # with every train row an anchor, the rows are the anchors and the graph is re-indexed
    rows, graph = slne.training_graph(np.array([1, 4, 6]), np.array([[4, 6], [1, 6], [4, 1]]))
    np.testing.assert_array_equal(rows, [1, 4, 6])
    np.testing.assert_array_equal(graph, [[1, 2], [0, 2], [1, 0]])


def test_slde_codes_concatenate_member_factors_split_over_members():
    X, y = _blobs(d=12)
    est = slne.SLDE(members=3, member_dim=4, dim=7, step=0.1, epochs=2, random_state=1).fit(X, y)
    Ps = est.projections(12)
    assert est.member_ranks(12) == [3, 2, 2]
    Z = slne.preprocess(X[:30], est.mean_, est.basis_)
    # codes: each member's factor of its share's rank, mapped back by P_n^T
    L = np.concatenate([Pn.T @ slne.factor(Mn, r) for Pn, Mn, r in zip(Ps, est.member_matrices_, [3, 2, 2])], 1)
    np.testing.assert_array_equal(est.factor_, L)
    positive = [int((np.linalg.eigvalsh(0.5 * (M + M.T)) > 0).sum()) for M in est.member_matrices_]
    # dim is the codes' width: zero columns where a member has fewer positive eigenvalues than its share
    assert est.transform(X).shape == (len(X), 7)
    padded = sum(max(r - k, 0) for r, k in zip([3, 2, 2], positive))
    assert padded > 0 and (np.abs(est.factor_).sum(0) == 0).sum() == padded
    # the exact views: the sum of the members' similarities (Eq. 8)
    q, b = est.exact_views(X[:30])
    direct = sum((Z @ Pn.T) @ Mn @ (Z @ Pn.T).T for Pn, Mn in zip(Ps, est.member_matrices_))
    np.testing.assert_allclose(q @ b.T, direct, rtol=1e-4, atol=1e-5)
    assert slne.SLDE(members=3, member_dim=4).fit(X, y).factor_.shape[1] <= 12  # None: all positive
    with pytest.raises(InputError, match=r"must be <= members x member_dim = 3 x 4 = 12"):
        slne.SLDE(members=3, member_dim=4, dim=13).fit(X, y)
    with pytest.raises(InputError, match="'dim' parameter of slde must be >= members"):
        slne.SLDE(members=3, member_dim=4, dim=2).fit(X, y)
    with pytest.raises(InputError, match=r"only 12 exist \(X has 12 feature\(s\)\)"):
        slne.SLDE(members=4, member_dim=4).fit(X, y)


def test_slde_default_members_have_at_least_16_pca_directions_where_the_input_allows():
    """8 members of 8 PCA directions on digits (p = 64) did not learn: each M_n shrank towards 0 and
    early stopping kept M_n = I. members None: 8, or as many blocks of 16 as p holds."""
    est = slne.SLDE()
    assert [(est.n_members(p), est.member_size(p)) for p in (784, 196, 64, 40, 10)] == [
        (8, 64),
        (8, 24),
        (4, 16),
        (2, 20),
        (1, 10),
    ]
    assert slne.SLDE(subspace="random").n_members(64) == 8 and slne.SLDE(members=8).member_size(64) == 8
    X, y = _blobs(d=40)
    fitted = slne.SLDE(epochs=1, random_state=0).fit(X, y)
    assert fitted.member_matrices_.shape == (2, 20, 20)


def test_slde_member_seeds_and_members_do_not_depend_on_the_worker_layout():
    X, y = _blobs(d=12)
    est = slne.SLDE(members=3, member_dim=4, subspace="random", epochs=2, random_state=5).fit(X, y)
    assert est.member_seed(2) == slne.SLDE(members=7, random_state=5).member_seed(2) != est.member_seed(1)
    mean, comps = slne.pca_statistics(X)
    g = slne.knn_graph(X, est.n_neighbors)
    # member 2 trained alone (as on its own worker) is the fitted member 2
    M2, meta = slne.fit_member(est.member_params(), est.member_rows(X, mean, comps, 2), y, g, est.member_seed(2))
    np.testing.assert_array_equal(M2, est.member_matrices_[2])
    assert meta["history"] == est.history_[2]["history"] and meta["samples_per_second"] > 0
    with pytest.raises(InputError, match="refine=True needs Z, y and neighbors"):
        slne.SLDE(members=3, member_dim=4, refine=True).assemble([(M2, meta)] * 3, mean, comps)
    with pytest.raises(InputError, match="expected 3 members"):
        slne.SLDE(members=3, member_dim=4).assemble([(M2, meta)] * 2, mean, comps)


def test_slde_refine_is_coordinate_descent_from_the_independent_members():
    X, y = _blobs(d=12, sep=0.6)
    plain = slne.SLDE(members=3, member_dim=4, step=0.05, epochs=2, random_state=0).fit(X, y)
    refined = slne.SLDE(members=3, member_dim=4, step=0.05, epochs=2, refine=True, random_state=0).fit(X, y)
    Z = slne.preprocess(X, plain.mean_, plain.basis_)
    Ps = plain.projections(12)
    Ms = slne.refine(Ps, list(plain.member_matrices_), Z, y, slne.knn_graph(X, 50), plain.member_params(), 0)
    np.testing.assert_array_equal(refined.member_matrices_, np.stack(Ms))
    np.testing.assert_array_equal(refined.M_, slne.ensemble_matrix(Ps, Ms))
    assert not np.array_equal(refined.M_, plain.M_)
    # the refined member n sees the others' similarity as a fixed offset on every edge
    nb = slne.neighbourhoods(slne.knn_graph(X, 50), y)
    others = sum(slne.edge_scores(Z @ P.T, M, nb) for P, M in zip(Ps[1:], plain.member_matrices_[1:]))
    M0, _ = slne.learn_similarity(
        Z @ Ps[0].T,
        y,
        slne.knn_graph(X, 50),
        step=0.05,
        epochs=2,
        seed=slne.member_seed(1, 0),
        offset=others,
        M0=plain.member_matrices_[0],
    )
    np.testing.assert_array_equal(M0, refined.member_matrices_[0])


def test_validated_training_keeps_the_epoch_with_the_lowest_validation_error():
    rng = np.random.default_rng(0)
    Z = rng.normal(size=(60, 5)).astype(np.float32)
    y = np.arange(60) % 3
    graph = slne.knn_graph(Z, 6)
    seen, errors = [], iter([0.5, 0.3, 0.4, 0.35])

    def validate(M):
        seen.append(M.copy())
        return next(errors)

    M, history = slne.learn_similarity(Z, y, graph, epochs=3, step=0.5, validate=validate)
    assert [h.get("val_error") for h in history] == [0.5, 0.3, 0.4, 0.35]
    assert np.array_equal(M, seen[1].astype(np.float32)) and not np.array_equal(M, seen[3].astype(np.float32))
    np.testing.assert_array_equal(seen[0], np.eye(5))  # the start is a candidate


def test_softvote_validator_is_eq9_by_brute_force():
    rng = np.random.default_rng(1)
    Z, Zv = rng.normal(size=(40, 4)), rng.normal(size=(15, 4))
    y, yv = rng.integers(0, 3, 40), rng.integers(0, 3, 15)
    nbr = np.argsort(((Zv[:, None] - Z[None]) ** 2).sum(-1), axis=1)[:, :10]
    M = rng.normal(size=(4, 4))
    votes = np.zeros((15, 3))
    for q in range(15):
        for j in nbr[q]:
            votes[q, y[j]] += Zv[q] @ M @ Z[j]
    want = np.mean(votes.argmax(1) != yv)
    assert slne.softvote_validator(Zv, yv, nbr, Z.astype(np.float32), y, k=10)(M) == pytest.approx(want)


def test_slne_fit_with_validation_rows_never_ends_worse_than_its_start():
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    est = slne.SLNE(step=5.0, random_state=0).fit(X[:800], y[:800], X_val=X[800:1100], y_val=y[800:1100])
    errs = [h["val_error"] for h in est.history_]
    assert est.best_epoch() == int(np.argmin(errs)) and errs[est.best_epoch()] <= errs[0]


def test_the_soft_vote_validator_lets_m_choose_the_voters_among_the_whole_neighbourhood():
    """Eq. 9 as the evaluate stage's softvoteK applies it: the k voters are the k members of the
    (Euclidean) neighbourhood most similar under M. Cut to its first k, the neighbourhood left M only
    the voters' weights: on digits every epoch and step scored the start's error."""
    from metricpipe.tasks.slne import softvote_validator

    Z = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]], np.float32)  # train rows: class 0, then two of class 1
    y = np.array([0, 1, 1])
    Zv, yv = np.array([[1.0, 0.1]], np.float32), np.array([1])
    nbr = np.array([[0, 1, 2]])  # Euclidean order: the class-0 row first
    score = softvote_validator(Zv, yv, nbr, Z, y, k=1)
    assert score(np.eye(2)) == 1.0  # z_v . z_0 = 1 > 0.1: class 0 votes, wrong
    assert score(np.diag([0.01, 1.0])) == 0.0  # under M the class-1 rows are the most similar
    assert softvote_validator(Zv, yv, nbr, Z, y, k=3)(np.eye(2)) == 1.0  # all three vote: 1 against 0.2, wrong


def test_factor_pads_to_the_rank_asked_for_with_zero_columns():
    """dim is the codes' width: SLNE(dim=60) gave 54 columns when M had 54 positive eigenvalues."""
    M = np.diag([2.0, 1.0, -1.0, 0.5])
    L = slne.factor(M, 4)
    assert L.shape == (4, 4) and not L[:, 3].any() and np.allclose(L[:, :3] @ L[:, :3].T, np.diag([2, 1, 0, 0.5]))
    assert slne.factor(M).shape == (4, 3) and slne.factor(M, 2).shape == (4, 2)


def test_slne_dim_beyond_the_pca_directions_kept_is_refused():
    """With randomized PCA (D above max_dense_dim) the input space has k < D directions: dim > k gave
    codes of k real columns and dim - k zero ones."""
    X, y = _blobs(d=12)
    mean, comps = slne.pca_statistics(X)
    est = slne.SLNE(dim=8, epochs=1)
    Z = est.input_rows(X, mean, comps[:5])
    with pytest.raises(InputError, match=r"'dim' parameter of SLNE must be <= 5, the input space's dimension"):
        est.fit_space(Z, y, slne.knn_graph(Z, 5), mean, comps[:5])


def test_members_map_gives_each_member_map_s_rows_exactly():
    """The pipeline reads and preprocesses an SL-DE's training rows once for every member
    (``members_map``): each member must see the very rows its own ``member_map`` gives."""
    from metricpipe.tasks.moments import pca_statistics
    from metricpipe.tasks.slne import SLDE

    rng = np.random.default_rng(3)
    X = rng.normal(size=(300, 40)).astype(np.float32)
    mean, components = pca_statistics(X)
    for params in (
        {"members": 3, "member_dim": 8},
        {"members": 2, "member_dim": 5, "subspace": "random", "input_dim": 20},
    ):
        est = SLDE(**params, random_state=4)
        parts = est.members_map(mean, components)(X[17:230])
        assert len(parts) == params["members"]
        for n, part in enumerate(parts):
            np.testing.assert_array_equal(part, est.member_map(mean, components, n)(X[17:230]))
