import numpy as np
import pytest

from metricpipe.tasks import ncmml
from metricpipe.tasks.errors import InputError
from tests.conftest import make_blobs, numerical_gradient


def _case(n=40, D=6, d=3, C=4, k=1, seed=0):
    X, y = make_blobs(n=n, d=D, classes=C, seed=seed, sep=1.0)
    X = X.astype(np.float64)
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(d, D)) * 0.3
    cents = np.concatenate([X[y == c].mean(0) + rng.normal(0, 0.5, (k, D)) * (k > 1) for c in range(C)])
    owner = np.repeat(np.arange(C), k)
    return X, y, W, cents, owner


def _explicit_ncm_loglik(W, X, y, means):
    """Eqs. 5 and 9 written out per image and class."""
    total = 0.0
    for x, c in zip(X, y):
        d = np.array([np.sum((W @ (x - mu)) ** 2) for mu in means])
        total += -0.5 * d[c] - np.log(np.sum(np.exp(-0.5 * d)))
    return total / len(X)


def test_ncm_loglik_equals_the_equations_and_its_gradient_matches_finite_differences():
    X, y, W, means, owner = _case()
    L, G = ncmml.log_likelihood_and_gradient(W, X, y, means, owner, 4)
    assert L == pytest.approx(_explicit_ncm_loglik(W, X, y, means), rel=1e-10)
    num = numerical_gradient(lambda V: ncmml.log_likelihood_and_gradient(V, X, y, means, owner, 4, False)[0], W)
    np.testing.assert_allclose(G, num, rtol=1e-6, atol=1e-8)


def test_ncmc_gradient_matches_finite_differences_and_k1_equals_ncm():
    X, y, W, cents, owner = _case(k=3)
    _, G = ncmml.log_likelihood_and_gradient(W, X, y, cents, owner, 4)
    num = numerical_gradient(lambda V: ncmml.log_likelihood_and_gradient(V, X, y, cents, owner, 4, False)[0], W)
    np.testing.assert_allclose(G, num, rtol=1e-6, atol=1e-8)
    # Eq. 10's alpha written out for NCM against the mixture's alpha (Eq. 25) at k = 1
    X, y, W, means, owner = _case(k=1)
    Y, Mp = X @ W.T, means @ W.T
    P = ncmml.softmax(-0.5 * ((Y[:, None] - Mp[None]) ** 2).sum(-1))
    alpha = P - np.eye(4)[y]
    G10 = sum(alpha[i, c] * W @ np.outer(means[c] - X[i], means[c] - X[i]) for i in range(len(X)) for c in range(4))
    _, G = ncmml.log_likelihood_and_gradient(W, X, y, means, owner, 4)
    np.testing.assert_allclose(G, G10 / len(X), rtol=1e-10, atol=1e-12)


def test_dot_product_variant_gradient_matches_finite_differences():
    X, y, W, means, _ = _case()
    bias = np.array([0.1, -0.2, 0.05, 0.0])
    _, G, gb = ncmml.dot_log_likelihood_and_gradient(W, bias, X, y, means)
    f = lambda V: ncmml.dot_log_likelihood_and_gradient(V, bias, X, y, means, False)[0]  # noqa: E731
    np.testing.assert_allclose(G, numerical_gradient(f, W), rtol=1e-6, atol=1e-8)
    fb = lambda b: ncmml.dot_log_likelihood_and_gradient(W, b, X, y, means, False)[0]  # noqa: E731
    np.testing.assert_allclose(gb, numerical_gradient(fb, bias), rtol=1e-6, atol=1e-8)


def _random_triplet_case(m=30, D=5, d=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(m, D))
    W = rng.normal(size=(d, D)) * 0.4
    is_pos = np.arange(m) < 20
    return X, W, is_pos


@pytest.mark.parametrize("margin", [1.0, 0.05])
@pytest.mark.parametrize("mode,k", [("all", None), ("dynamic", 3)])
def test_sorting_gradient_equals_the_explicit_triplet_loop(mode, k, margin):
    X, W, is_pos = _random_triplet_case()
    n_pos = int(is_pos.sum())
    Y = X @ W.T
    targets = ncmml.choose_targets(Y, n_pos, k, mode)
    negatives = np.broadcast_to(~is_pos, targets.shape)
    cp, cn = ncmml.triplet_counts(ncmml.sqdist(Y[:n_pos], Y), targets, negatives, margin)
    G = ncmml.triplet_gradient(W, X, np.arange(n_pos), cp, cn)
    loss, G_loop = ncmml.triplet_loss_loop(W, X, np.arange(n_pos), targets, negatives, margin)
    assert loss > 0 and cp.sum() > 0 and cp.sum() == cn.sum()
    np.testing.assert_allclose(G, G_loop, rtol=1e-9, atol=1e-9)


def test_triplet_counts_on_ties_count_only_positive_losses():
    # d(q,p) + 1 == d(q,n) exactly: zero loss, not counted; d(q,n) just below: counted
    dq = np.array([[0.0, 1.0, 2.0, 1.5]])
    targets = np.array([[False, True, False, False]])
    negatives = np.array([[False, False, True, True]])
    cp, cn = ncmml.triplet_counts(dq, targets, negatives)
    assert cp.tolist() == [[0, 1, 0, 0]] and cn.tolist() == [[0, 0, 0, 1]]


def test_dynamic_targets_are_the_closest_positives_under_w():
    X, W, is_pos = _random_triplet_case()
    Y = X @ W.T
    t = ncmml.choose_targets(Y, 20, 2, "dynamic")
    for q in range(20):
        d = ((Y[:20] - Y[q]) ** 2).sum(1)
        d[q] = np.inf
        assert set(np.flatnonzero(t[q])) == set(np.argsort(d)[:2])


def test_streaming_lloyd_equals_in_memory_lloyd_and_kmeanspp_refuses_too_few_rows():
    X, y = make_blobs(n=300, d=4, classes=3, seed=2)
    X = X.astype(np.float64)
    rng = np.random.default_rng(0)
    cents = np.concatenate([ncmml.kmeans_plus_plus(X[y == c], 2, rng) for c in range(3)])
    owner = np.repeat(np.arange(3), 2)
    parts = [ncmml.lloyd_partial(X[a : a + 70], y[a : a + 70], cents, owner) for a in range(0, 300, 70)]
    new = ncmml.lloyd_update(cents, sum(p[0] for p in parts), sum(p[1] for p in parts))
    for c in range(3):  # reference: one Lloyd step on the class's rows in memory
        Xc, mine = X[y == c], np.flatnonzero(owner == c)
        j = np.argmin(((Xc[:, None] - cents[mine][None]) ** 2).sum(-1), axis=1)
        for a in range(2):
            np.testing.assert_allclose(new[mine[a]], Xc[j == a].mean(0), rtol=1e-12)
    with pytest.raises(InputError, match="centroids"):
        ncmml.kmeans_plus_plus(X[:3], 5, rng)


def test_l2_targets_are_the_nearest_same_class_rows():
    X, y = make_blobs(n=120, d=5, classes=3, seed=4)
    t = ncmml.l2_targets(X, y, 4)
    for i in range(len(X)):
        same = np.flatnonzero((y == y[i]) & (np.arange(len(X)) != i))
        d = ((X[same] - X[i]) ** 2).sum(1)
        assert set(t[i]) == set(same[np.argsort(d, kind="stable")[:4]])


def test_fixed_batch_holds_queries_with_their_targets_and_its_gradient_equals_the_loop():
    X, y = make_blobs(n=200, d=6, classes=4, seed=5)
    X = X.astype(np.float64)
    t = ncmml.l2_targets(X, y, 3)
    rows, is_pos, (queries, mask) = ncmml.sample_fixed_batch(y, t, 60, 2 / 3, np.random.default_rng(0))
    n_pos = int(is_pos.sum())
    assert n_pos <= 40 and len(rows) == 60 and len(set(rows.tolist())) == 60
    assert len(np.unique(y[rows[:n_pos]])) == 1 and not np.isin(y[rows[n_pos:]], y[rows[0]]).any()
    for qi, q in enumerate(queries):  # each query's targets are its l2 targets, all in the batch
        assert set(rows[mask[qi]]) == set(t[rows[q]])
    W = np.random.default_rng(1).normal(size=(3, 6)) * 0.3
    G, _ = ncmml.knnml_step(W, X[rows], is_pos, 3, "fixed", (queries, mask))
    negatives = np.broadcast_to(~is_pos, mask.shape)
    _, G_loop = ncmml.triplet_loss_loop(W, X[rows], queries, mask, negatives)
    np.testing.assert_allclose(G, G_loop / len(queries), rtol=1e-9, atol=1e-9)


def test_dot_form_trained_on_some_classes_keeps_one_bias_per_trained_class():
    X, y = make_blobs(n=300, d=6, classes=4, seed=0, sep=0.3)
    X = X.astype(np.float64)
    means = np.stack([X[y == c].mean(0) for c in range(4)])
    sub = np.array([0, 2])
    sgd = ncmml.MetricSGD(np.eye(3, 6), "dot", 0.1, means[sub], sub, 4)
    m = np.isin(y, sub)
    L0 = ncmml.dot_log_likelihood_and_gradient(sgd.W, sgd.bias, X[m], (y[m] == 2).astype(int), means[sub], False)[0]
    for _ in range(30):
        sgd.step(X[m], y[m])
    assert sgd.bias.shape == (2,)
    L1 = ncmml.dot_log_likelihood_and_gradient(sgd.W, sgd.bias, X[m], (y[m] == 2).astype(int), means[sub], False)[0]
    assert L1 > L0  # the likelihood of the trained classes rises
    assert set(np.unique(sgd.classify(X))) <= {0, 2}


def test_ncmc_kmeans_seeding_sample_is_bounded_in_bytes():
    from metricpipe.tasks.ncmml import KMEANS_BYTES, KMEANS_SAMPLE, NCMC

    est = NCMC(centroids=10)
    per = est.kmeans_per_class(1000, 4096)
    assert 10 <= per < KMEANS_SAMPLE and per * 1000 * 4096 * 4 <= KMEANS_BYTES  # 1,000 classes x 4,096 dims
    assert est.kmeans_per_class(10, 784) == KMEANS_SAMPLE  # small data: unchanged
    assert NCMC(centroids=30).kmeans_per_class(10_000, 100_000) == 30  # never below k


def test_held_out_is_the_stratified_subset_wherever_every_class_has_a_share_and_capped_where_not():
    """Data whose every class's share rounds to a row or more hold out exactly the rows they did (so
    runs on such data keep their splits); few-shot classes no longer push the total past ``size``."""
    from metricpipe.tasks import stream

    rng = np.random.default_rng(3)
    for _ in range(200):
        n, C = int(rng.integers(50, 3000)), int(rng.integers(2, 15))
        y = rng.integers(0, C, n)
        r = stream.rank(stream.row_keys(rng.normal(size=(n, 3)).astype(np.float32)), 0, stream.VALIDATION)
        size = int(rng.integers(1, n // 5 + 1))
        got = stream.held_out(y, size, r, leave=1)
        counts = np.bincount(y, minlength=C)
        if (size * counts[counts > 0] / n >= 1).all():
            assert np.array_equal(got, stream.stratified_subset(y, size, r, leave=1))
        assert len(got) <= max(size, int(np.rint(size * counts / n).clip(0, None).sum()))
        assert (np.bincount(y[got], minlength=C) <= np.maximum(counts - 1, 0)).all()  # one row each stays
    y = np.repeat(np.arange(50), 4)  # 4 images per class, a tenth held out
    r = stream.rank(stream.row_keys(rng.normal(size=(200, 3)).astype(np.float32)), 0, stream.VALIDATION)
    got = stream.held_out(y, 20, r, leave=2)
    assert len(got) == 20 and np.bincount(y[got]).max() == 1  # was 50: one of every class
    for k in (2, 3, 4):  # a fifth held out, not one row a class
        y = np.repeat(np.arange(200), k)
        keys = stream.row_keys(rng.normal(size=(200 * k, 3)).astype(np.float32))
        assert len(stream.validation_split(y, 5000, keys, 0)) == 40 * k


def test_few_shot_classes_hold_out_at_most_a_fifth_and_every_class_still_competes():
    """One validation row of every class held out half of a data set of two images per class (class
    means of one image, 0.71 test accuracy where a separate validation set gave 0.89). Now at most
    a fifth is held out; a class without validation rows still competes as an answer, and given
    validation rows may miss classes too."""
    from metricpipe.tasks import stream

    rng = np.random.default_rng(0)
    centres = rng.normal(size=(200, 64))
    y = np.repeat(np.arange(200), 2)
    X = (centres[y] + rng.normal(size=(400, 64))).astype(np.float32)
    held = stream.validation_split(y, 5000, stream.row_keys(X), 0)
    assert len(held) == 80 and np.bincount(y[held]).max() == 1
    est = ncmml.NCMML(dim=32, lr=3.0, iters=200, validate_every=50).fit(X, y)
    assert est.classes_.tolist() == list(range(200))
    # the means of the 120 classes without validation rows hold both their images
    kept = np.setdiff1d(np.arange(200), y[held])
    Xt = (centres[np.repeat(kept, 3)] + rng.normal(size=(3 * len(kept), 64))).astype(np.float32)
    assert est.score(Xt, np.repeat(kept, 3)) > 0.5
    X2, y2 = make_blobs(n=300, d=6, classes=3, sep=2.0, seed=1)
    ncmml.NCMML(dim=2, iters=20, validate_every=10).fit(
        X2[:240], y2[:240], X_val=X2[240:][y2[240:] != 2], y_val=y2[240:][y2[240:] != 2]
    )


def test_all_targets_step_is_scaled_to_k_targets_per_query():
    """Every positive as a target summed n_pos - 1 terms per query, not k: at the default lr SGD
    diverged on digits. The step is the triplet gradient times k / (n_pos - 1), per query."""
    X, W, is_pos = _random_triplet_case()
    n_pos, k = int(is_pos.sum()), 3
    targets = ncmml.choose_targets(X @ W.T, n_pos, None, "all")
    _, G_loop = ncmml.triplet_loss_loop(W, X, np.arange(n_pos), targets, np.broadcast_to(~is_pos, targets.shape))
    G, _ = ncmml.knnml_step(W, X, is_pos, k, "all")
    np.testing.assert_allclose(G, G_loop * k / (n_pos - 1) / n_pos, rtol=1e-9, atol=1e-12)
    from sklearn.datasets import load_digits

    Xd, y = load_digits(return_X_y=True)
    # the scaled step still diverges on digits at lr 0.1 (W grows ~3x a step; it used to keep the start,
    # best_iter_ 0, with later iterates beyond float32): a one-line divergence, and a smaller lr trains
    with pytest.raises(InputError, match=r"diverged after \d+ steps \(W is not finite in float32\); lower 'lr'"):
        ncmml.KNNML(dim=16, iters=300, targets="all", lr=0.1, random_state=0).fit(Xd[:1300], y[:1300])
    est = ncmml.KNNML(dim=16, iters=300, targets="all", lr=0.001, random_state=0).fit(Xd[:1300], y[:1300])
    assert np.isfinite(est.components_).all() and est.best_iter_ > 0


def test_knnml_margin_m_is_the_run_from_w0_over_sqrt_m_with_margin_1():
    """The hinge is scale-covariant: W -> c W multiplies distances by c^2, so a margin m from W0 is
    margin 1 from W0 / sqrt(m), step for step (a margin that ignored its value would fail this)."""
    X, W0, is_pos = _random_triplet_case(m=40, D=6, d=4, seed=3)
    y = is_pos.astype(np.int64)
    runs = {}
    for name, W, margin in (("m", W0, 0.04), ("scaled", W0 / 0.2, 1.0), ("one", W0, 1.0)):
        sgd = ncmml.MetricSGD(W, "knn", 0.05, n_classes=2, targets="dynamic", k=3, margin=margin)
        for _ in range(5):
            sgd.step(X, y, is_pos)
        runs[name] = sgd.W
    np.testing.assert_allclose(runs["m"], runs["scaled"] * 0.2, rtol=1e-9, atol=1e-12)
    assert not np.allclose(runs["m"], runs["one"])
