"""The AccuracyCalculator metrics (map@r, r_precision, precision@1, mrr, nmi, ami): the streaming
top-k kernel against brute force, and the metrics against pytorch-metric-learning's definitions
re-derived in loops (tests/pml_reference.py) on tiny cases with ties."""

import numpy as np
import pytest
from sklearn.metrics import adjusted_mutual_info_score, normalized_mutual_info_score

from metricpipe.tasks import evaluation, knn, metrics
from tests.pml_reference import pml_accuracy, tied_case

NAMES = ("precision@1", "r_precision", "map@r", "mrr")


def _blocks(X, sizes):
    edges = np.minimum(np.cumsum([0, *sizes, len(X)]), len(X))
    return [(np.arange(a, b), X[a:b]) for a, b in zip(edges[:-1], edges[1:]) if b > a]


@pytest.mark.parametrize("seed", range(4))
def test_pooled_topk_equals_brute_force_with_ties_and_pool_cuts(monkeypatch, seed):
    monkeypatch.setattr(knn, "POOL_TILE", 16)  # tiles of 16 rows: the pool (2k + 16) is cut many times
    X, _ = tied_case(seed, n_ref=300, dim=2)
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 40))
    sizes = rng.integers(1, 90, 10)
    sizes[-1] = 300 - sizes[:-1].sum() if sizes[:-1].sum() < 300 else 0
    blocks = _blocks(X, sizes)
    d, i = knn.pooled_topk(X[:50], blocks, k, q_ids=np.arange(50), exclude_self=True)
    ref_d, ref_i = knn.brute_force_knn(X[:50], X, k, exclude_self=True)  # float64, ties by index
    np.testing.assert_array_equal(i, ref_i)
    np.testing.assert_allclose(d, ref_d, atol=1e-5)


def test_pooled_topk_merges_across_reference_ranges():
    X, _ = tied_case(7, n_ref=200, dim=3)
    whole = knn.pooled_topk(X[:30], _blocks(X, [50, 70]), 25)
    halves = knn.merge_topk(
        knn.pooled_topk(X[:30], [(np.arange(120), X[:120])], 25),
        knn.pooled_topk(X[:30], [(np.arange(120, 200), X[120:])], 25),
        25,
    )
    np.testing.assert_array_equal(whole[1], halves[1])


def _ours(Q, yq, X, y, self_in, sizes=None):
    R = evaluation.relevant_counts(yq, y, self_in)
    blocks = _blocks(X, sizes or [len(X)])
    per_query = evaluation.neighbour_accuracy(
        Q, lambda: iter(blocks), yq, y, R, evaluation.accuracy_k(R), np.arange(len(Q)), self_in
    )
    return evaluation.mean_accuracy(per_query)


@pytest.mark.parametrize("seed", range(6))
def test_accuracy_equals_pml_definitions_query_set_is_reference_set(seed):
    X, y = tied_case(seed, n_ref=int(np.random.default_rng(seed).integers(20, 80)))
    ours = _ours(X, y, X, y, True, sizes=[7, 5, 30, 100])
    ref = pml_accuracy(X, y)  # PML's default k (every reference)
    for name in NAMES:
        assert ours[name] == pytest.approx(ref[name], abs=1e-12), name


@pytest.mark.parametrize("seed", range(6))
def test_accuracy_equals_pml_definitions_with_separate_queries_and_lone_labels(seed):
    X, y, Q, yq = tied_case(seed, n_ref=50, n_query=30)
    yq[0] = 4  # at least one lone query (label 4 has no reference)
    ours = _ours(Q, yq, X, y, False)
    ref = pml_accuracy(Q, yq, X, y)
    for name in NAMES:
        assert ours[name] == pytest.approx(ref[name], abs=1e-12), name


def test_mrr_counts_a_first_relevant_reference_beyond_k():
    # the nearest same-label reference of rows 0 and 4 ranks after k = max bin count: PML's default k
    # (every reference) gives it 1/rank, as the extra passes do; PML's k="max_bin_count" gives 0
    X = np.array([[0.0], [1.0], [2.0], [3.0], [10.0]], np.float32)
    y = np.array([0, 1, 1, 1, 0])
    ours = _ours(X, y, X, y, True)
    assert ours["mrr"] == pytest.approx(pml_accuracy(X, y)["mrr"])
    assert ours["mrr"] > pml_accuracy(X, y, k="max_bin_count")["mrr"]


def test_stage_retrieval_kernel_gives_the_same_accuracy():
    X, y = tied_case(3, n_ref=70)
    R = evaluation.relevant_counts(y, y, True)
    idx = np.arange(len(X))
    out = evaluation.retrieval(X, idx, idx, X, y, (1,), False, "euclidean", 16, 9, accuracy_k=evaluation.accuracy_k(R))
    ours = evaluation.mean_accuracy({k: out[k] for k in NAMES})
    ref = pml_accuracy(X, y)
    for name in NAMES:
        assert ours[name] == pytest.approx(ref[name], abs=1e-12), name


def test_stage_retrieval_kernel_finds_a_first_relevant_reference_beyond_k():
    """The kernel looks for the first relevant place only for queries with none among their first
    accuracy_k: rows 0 and 4 here, whose MRR then equals PML's over every reference."""
    X = np.array([[0.0], [1.0], [2.0], [3.0], [10.0]], np.float32)
    y = np.array([0, 1, 1, 1, 0])
    idx = np.arange(len(X))
    k = evaluation.accuracy_k(evaluation.relevant_counts(y, y, True))
    out = evaluation.retrieval(X, idx, idx, X, y, (1,), False, "euclidean", 16, 2, accuracy_k=k)
    assert k == 2 and out["mrr"][0] == pytest.approx(1 / 4) and out["mrr"][4] == pytest.approx(1 / 4)
    assert evaluation.mean_accuracy({"mrr": out["mrr"]})["mrr"] == pytest.approx(pml_accuracy(X, y)["mrr"])


def test_knn_accuracy_lone_queries_are_nan_and_all_lone_is_nan():
    out = metrics.knn_accuracy(np.array([[False, False], [True, False]]), np.array([0, 1]))
    assert np.isnan(out["map@r"][0]) and out["map@r"][1] == 1.0
    assert np.isnan(evaluation.mean_accuracy(metrics.knn_accuracy(np.zeros((2, 1), bool), np.zeros(2)))["mrr"])


def test_nmi_ami_equal_scikit_learn_on_the_same_clustering():
    X, y = tied_case(1, n_ref=200, dim=3, classes=5)
    X = X + np.random.default_rng(0).normal(0, 0.1, X.shape)
    C = evaluation.kmeans_fit(X, 5, seed=0)
    clusters = evaluation.nearest_centroid(X, C)
    out = metrics.clustering_scores(y, clusters)
    assert out["nmi"] == normalized_mutual_info_score(y, clusters)
    assert out["ami"] == adjusted_mutual_info_score(y, clusters)
    np.testing.assert_array_equal(evaluation.kmeans_fit(X, 5, seed=0), C)  # seeded: deterministic
