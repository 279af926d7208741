import numpy as np
import pytest

from metricpipe.tasks import knn


@pytest.mark.parametrize("tiles", [(1024, 8192), (64, 50)])
def test_exact_on_integer_data_including_ties(monkeypatch, tiles):
    # Integer-valued float32 data: GEMM distances are exact, so ties are real and must be broken
    # by index exactly as the brute-force (distance, index) order does. Small tiles exercise the
    # pruned merge (entries at or below the running k-th distance only), ties included.
    monkeypatch.setattr(knn, "QUERY_TILE", tiles[0])
    monkeypatch.setattr(knn, "DB_TILE", tiles[1])
    rng = np.random.default_rng(1)
    X = rng.integers(0, 3, (700, 6)).astype(np.float32)
    d, i = knn.block_topk(X, X, 15, q_ids=np.arange(700), x_ids=np.arange(700), exclude_self=True)
    bd, bi = knn.brute_force_knn(X, X, 15, exclude_self=True)
    np.testing.assert_array_equal(i, bi)
    np.testing.assert_array_equal(d, bd)
    # the same, carrying the running lists from one database block to the next
    run = knn.empty_topk(700, 15)
    for a, b in [(0, 240), (240, 241), (241, 700)]:
        run = knn.block_topk(X, X[a:b], 15, q_ids=np.arange(700), x_ids=np.arange(a, b), exclude_self=True, init=run)
    np.testing.assert_array_equal(run[1], bi)
    np.testing.assert_array_equal(run[0], bd)


@pytest.mark.parametrize("tiles", [(1024, 8192), (37, 101)])
def test_blocks_and_tiles_do_not_change_the_answer(monkeypatch, tiles):
    monkeypatch.setattr(knn, "QUERY_TILE", tiles[0])
    monkeypatch.setattr(knn, "DB_TILE", tiles[1])
    rng = np.random.default_rng(2)
    Q = rng.normal(size=(150, 20)).astype(np.float32)
    X = rng.normal(size=(1000, 20)).astype(np.float32)
    bd, bi = knn.brute_force_knn(Q, X, 10)
    # database split in uneven blocks, merged in two different orders
    parts = [knn.block_topk(Q, X[a:b], 10, db_offset=a) for a, b in [(0, 333), (333, 334), (334, 1000)]]
    m1 = knn.merge_topk(knn.merge_topk(parts[0], parts[1], 10), parts[2], 10)
    m2 = knn.merge_topk(parts[0], knn.merge_topk(parts[2], parts[1], 10), 10)
    for d, i in (m1, m2):
        np.testing.assert_array_equal(i, bi)  # continuous data: no ties
        np.testing.assert_allclose(d, bd, rtol=1e-4, atol=1e-4)


def test_fewer_candidates_than_k_are_padded():
    Q = np.zeros((2, 3), np.float32)
    X = np.ones((3, 3), np.float32)
    d, i = knn.block_topk(Q, X, 5)
    assert list(i[0]) == [0, 1, 2, -1, -1]
    assert np.isinf(d[0, 3:]).all()


def test_self_is_excluded_only_for_same_ids():
    X = np.arange(10, dtype=np.float32)[:, None]
    _, i = knn.block_topk(X[:3], X, 1, q_ids=np.arange(3), x_ids=np.arange(10), exclude_self=True)
    assert list(i[:, 0]) == [1, 0, 1]
