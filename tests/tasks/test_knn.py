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


def _ivf_reference(Q, q_ids, X, C, nprobe, k, metric="l2"):
    """Brute force over the rows whose nearest centroid (float64, ties to the lower list) is one of
    the query's nprobe nearest, ordered by (distance, id), the query itself left out; "ip": nearest
    by largest inner product and distance -q.x."""
    Q64, X64, C64 = (np.asarray(a, np.float64) for a in (Q, X, C))

    def score(A, B):
        return ((A[:, None] - B[None]) ** 2).sum(-1) if metric == "l2" else -(A @ B.T)

    own = np.argmin(score(X64, C64), 1)
    dq = score(Q64, C64)
    probes = np.lexsort((np.broadcast_to(np.arange(len(C)), dq.shape), dq), axis=-1)[:, :nprobe]
    dist, idx = np.full((len(Q), k), np.inf), np.full((len(Q), k), -1)
    for r in range(len(Q)):
        cand = np.flatnonzero(np.isin(own, probes[r]) & (np.arange(len(X)) != q_ids[r]))
        d = score(Q64[r : r + 1], X64[cand])[0]
        o = np.lexsort((cand, d))[:k]
        dist[r, : len(o)], idx[r, : len(o)] = d[o], cand[o]
    return dist, idx, probes


@pytest.mark.parametrize("metric", ["l2", "ip"])
@pytest.mark.parametrize("splits", [[(0, 900)], [(0, 300), (300, 301), (301, 900)], [(600, 900), (0, 10), (10, 600)]])
def test_ivf_over_streamed_blocks_is_brute_force_over_the_probed_lists_ties_included(splits, metric, monkeypatch):
    # integer-valued rows and centroids: GEMM distances are exact, so rows and queries tie with
    # others (and with centroids) and the (distance, id) order and the lower-list rule are checked
    rng = np.random.default_rng(3)
    X = rng.integers(0, 4, (900, 5)).astype(np.float32)
    C = rng.integers(0, 4, (12, 5)).astype(np.float32)
    q_ids = np.sort(rng.choice(900, 120, replace=False))
    Q, k, nprobe = X[q_ids], 15, 3
    monkeypatch.setattr(knn, "LIST_QUERY_TILE", 7)  # lists compared in tiles (a crowded list)
    monkeypatch.setattr(knn, "LIST_ROW_TILE", 11)
    want_d, want_i, probes = _ivf_reference(Q, q_ids, X, C, nprobe, k, metric)
    np.testing.assert_array_equal(knn.nearest_lists(Q, C, nprobe, metric), probes)
    lists = knn.queries_of_lists(knn.nearest_lists(Q, C, nprobe, metric), len(C))
    parts = [knn.ivf_block_topk(Q, q_ids, lists, X[a:b], np.arange(a, b), C, k, metric=metric) for a, b in splits]
    run = parts[0]
    for p in parts[1:]:  # blocks searched apart and merged in any order: the same lists
        run = knn.merge_topk(run, p, k)
    dist, idx = knn.ivf_distances(run, Q, metric)
    np.testing.assert_array_equal(idx, want_i)
    np.testing.assert_array_equal(dist, want_d.astype(np.float32))
    assert (idx >= 0).all() and not np.any(idx == q_ids[:, None])
    # carried from block to block (init) instead of merged: the same
    run = None
    for a, b in splits:
        run = knn.ivf_block_topk(Q, q_ids, lists, X[a:b], np.arange(a, b), C, k, init=run, metric=metric)
    np.testing.assert_array_equal(run[1], want_i)


def test_ivf_over_streamed_blocks_finds_what_faiss_ivf_flat_finds_with_the_same_centroids():
    import faiss

    rng = np.random.default_rng(4)
    X = rng.normal(size=(4000, 24)).astype(np.float32)
    C = X[rng.choice(4000, 32, replace=False)] + 0.1
    q_ids = np.sort(rng.choice(4000, 300, replace=False))
    Q, k, nprobe = X[q_ids], 10, 4
    quantizer = faiss.IndexFlatL2(24)
    quantizer.add(C)
    index = faiss.IndexIVFFlat(quantizer, 24, 32)
    index.is_trained = True
    index.add(X)
    index.nprobe = nprobe
    fd, fi = index.search(Q, k + 1)
    fi = np.array([[j for j in row if j != q][:k] for row, q in zip(fi, q_ids)])
    lists = knn.queries_of_lists(knn.nearest_lists(Q, C, nprobe), 32)
    run = None
    for a in range(0, 4000, 700):
        run = knn.ivf_block_topk(Q, q_ids, lists, X[a : a + 700], np.arange(a, min(4000, a + 700)), C, k, init=run)
    dist, idx = knn.ivf_distances(run, Q)
    same = np.mean([len(np.intersect1d(a, b)) / k for a, b in zip(idx, fi)])
    assert same > 0.995, same  # (near-ties may round apart: faiss scans, the kernel uses a GEMM)
    np.testing.assert_allclose(dist, ((X[idx] - Q[:, None]) ** 2).sum(-1), rtol=1e-4, atol=1e-4)
