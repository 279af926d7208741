"""Encoded databases (tasks.pq): metrics through a faiss PQ index equal the brute-force metrics of the
vectors its codes decode to, and a vector's bytes are what the index stores."""

import numpy as np
import pytest

from metricpipe.tasks import evaluation, pq
from metricpipe.tasks.errors import InputError
from tests.conftest import make_blobs


def _case(d: int, M: int, metric: str, rotate: bool = False):
    X, y = make_blobs(n=700, d=d, classes=5, seed=3)
    if metric == "ip":
        X = X / np.linalg.norm(X, axis=1, keepdims=True) * np.linspace(0.5, 2.0, len(X))[:, None]  # not unit norm
    trained = pq.train(X[:500], M, metric, rotate, seed=0)
    return X.astype(np.float32), y, trained, pq.encode(trained, X)


CASES = {
    "l2, d a multiple of M": (16, 4, "l2", False),
    "inner product": (16, 8, "ip", False),
    "l2, d padded to a multiple of M": (12, 8, "l2", False),
    "inner product, padded": (6, 8, "ip", False),
    "l2, OPQ onto a multiple of M": (18, 4, "l2", True),
    "l2, OPQ onto 4 dimensions a byte": (40, 4, "l2", True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_index_metrics_equal_brute_force_metrics_of_the_decoded_vectors(case):
    d, M, metric, rotate = CASES[case]
    X, y, trained, codes = _case(d, M, metric, rotate)
    test, train = np.arange(500, 700), np.arange(500)
    decoded = pq.decode(trained, codes)  # sa_decode(sa_encode(x))
    score = "inner" if metric == "ip" else "euclidean"
    ks, acc_k = (1, 10), evaluation.accuracy_k(evaluation.relevant_counts(y[test], y[test], True))
    through = pq.retrieval(pq.filled(trained, codes[test], test), X[test], test, test, y, ks, acc_k, group=64)
    brute = evaluation.retrieval(
        X[test], test, test, np.ascontiguousarray(decoded[test]), y, ks, False, score, 64, 64, acc_k
    )
    for name in ("ap", "prec", "recall", "map@r", "precision@1", "mrr"):
        np.testing.assert_allclose(through[name], brute[name], rtol=1e-9, err_msg=name)
    errors, seconds = pq.knn_errors(pq.filled(trained, codes[train], train), X[test], y[test], y, [1, 5], 5)
    exact = evaluation.knn_errors(X[test], y[test], [(train, decoded[train])], y, [1, 5], score, 5)
    for k in ("knn1", "knn5"):
        np.testing.assert_array_equal(errors[k][0], exact[k][0])
        np.testing.assert_array_equal(errors[k][1], exact[k][1])
    assert seconds > 0


@pytest.mark.parametrize("d, M", [(16, 4), (12, 8), (6, 8)])
def test_a_vector_takes_the_index_s_code_size_in_bytes(d, M):
    X, _, trained, codes = _case(d, M, "l2")
    assert pq.code_size(trained) == M == codes.shape[1] and codes.dtype == np.uint8
    ids = np.arange(len(X))
    small, large = (len(pq.serialized(pq.filled(trained, codes[:n], ids[:n]))) for n in (100, 150))
    assert large - small == 50 * (M + 8)  # each vector's code and its 8-byte id, nothing else


def test_filled_index_returns_the_rows_it_was_given_as_ids():
    X, _, trained, codes = _case(16, 4, "l2")
    rows = np.arange(3, 700, 7)
    _, ids = pq.search(pq.filled(trained, codes[rows], rows), X[rows[:20]], 1)
    assert set(ids[:, 0]) <= set(rows) and (ids[:, 0] == rows[:20]).mean() > 0.9


def test_a_quantiser_needs_a_centroid_s_worth_of_rows():
    with pytest.raises(InputError, match=r"trains 256 centroids per sub-quantiser and got 100 rows"):
        pq.train(np.ones((100, 8), np.float32), 4)


def test_factory_pads_or_rotates_so_that_every_size_works():
    assert pq.factory(64, 8) == "PQ8"
    assert pq.factory(64, 24) == "Pad72,PQ24"
    assert pq.factory(16, 32) == "Pad32,PQ32"
    assert pq.factory(784, 32, rotate=True) == "OPQ32_128,PQ32"  # faiss's guideline: 4 dimensions a byte
    assert pq.factory(100, 32, rotate=True) == "OPQ32_96,PQ32"  # at most d
    assert pq.factory(16, 32, rotate=True) == "OPQ32_32,PQ32"
    assert pq.factory(784, 32, rotate=True, rotate_dim=768) == "OPQ32_768,PQ32"


def test_an_opq_rotation_onto_a_dimension_m_does_not_divide_is_refused():
    with pytest.raises(InputError, match=r"onto 100 dimensions for 32 bytes; give a positive multiple of 32"):
        pq.factory(784, 32, rotate=True, rotate_dim=100)


def test_the_anchor_s_training_is_priced_by_the_dimension_it_rotates_onto():
    # at 4,096-d the rotation onto all of d is dominated by its d x d SVDs; onto 4M it is not
    full, rule = pq.train_cost(7812, 4096, 8, True, 4096), pq.train_cost(7812, 4096, 8, True)
    assert full > 50 * rule
    assert pq.train_cost(7812, 4096, 8, True, 32) == rule
    assert pq.train_cost(7812, 4096, 8) < rule  # the rotation costs on top of the PQ's k-means
