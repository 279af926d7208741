"""IVF neighbours: searching every list is exact search; fewer lists trade recall, which is measured
against exact search and recorded with the graph."""

import numpy as np
import pytest

from metricpipe import checks, ivf
from metricpipe.stages import run_neighbours
from metricpipe.store import open_array
from tests.conftest import make_blobs, staged


def _graph(client, tmp_path, name, neighbours):
    X, y = make_blobs(n=3000, d=16, classes=6, seed=2, sep=2.0)
    np.savez(tmp_path / "d.npz", X=X, y=y)
    ctx, data, stats = staged(
        client,
        tmp_path / name,
        {
            "data": {"path": str(tmp_path / "d.npz"), "chunk_mb": 0.05, "split": {"test": 0.2, "seed": 0}},
            "neighbours": neighbours,
        },
    )
    unit = run_neighbours(ctx, data)
    _graph.stats = stats
    return unit, open_array(f"{unit.url}/neighbours")[:], open_array(f"{unit.url}/distances")[:], data


def _overlap(a, b):
    return np.mean([len(np.intersect1d(x, z)) / len(x) for x, z in zip(a, b)])


@pytest.mark.integration
def test_ivf_probing_every_list_is_exact_and_fewer_lists_report_their_recall(client, tmp_path):
    exact_unit, exact, exact_d, data = _graph(client, tmp_path, "exact", {"k": 10, "method": "exact"})
    assert exact_unit.meta()["method"] == "exact"
    full_unit, full, full_d, _ = _graph(client, tmp_path, "full", {"k": 10, "method": "ivf", "nlist": 16, "nprobe": 16})
    meta = full_unit.meta()
    assert meta["method"] == "ivf" and meta["index"] == "IVF16,Flat" and meta["recall"] == pytest.approx(1.0)
    # the same lists, up to the order of near-ties (faiss and the GEMM round differently)
    diff = np.flatnonzero((full != exact).any(1))
    assert len(diff) <= 3
    np.testing.assert_allclose(full_d, exact_d, rtol=1e-4, atol=1e-4)
    for r in diff:
        assert len(np.intersect1d(full[r], exact[r])) >= 9
    one_unit, one, _, _ = _graph(client, tmp_path, "one", {"k": 10, "method": "ivf", "nlist": 16, "nprobe": 1})
    rec = one_unit.meta()["recall"]
    train = np.flatnonzero(data.split == 0)
    overall = _overlap(exact[train], one[train])
    assert 0.2 < rec < 1.0 and abs(rec - overall) < 0.1  # the sampled recall tracks the whole graph's
    assert np.all((one[train] != train[:, None]))  # a row is never its own neighbour


@pytest.mark.integration
def test_pq_index_when_flat_codes_would_not_fit_and_reranking_restores_exact_distances(client, tmp_path, monkeypatch):
    monkeypatch.setattr(ivf, "IVF_FLAT_BYTES", 0)
    assert ivf.factory_string(2400, 16, 16) == "IVF16,PQ4"
    _, exact, exact_d, data = _graph(client, tmp_path, "exact", {"k": 10, "method": "exact"})
    unit, _, _, _ = _graph(client, tmp_path, "pq", {"k": 10, "method": "ivf", "nlist": 16, "nprobe": 16, "rerank": 1})
    meta = unit.meta()
    assert meta["index"] == "IVF16,PQ4" and meta["rerank"] == 1 and 0.2 < meta["recall"] < 0.9
    # re-ranking 8 x k candidates, in several groups (each one pass over the blocks)
    monkeypatch.setattr(ivf, "RERANK_PAIRS", 300 * 80)
    unit, graph, dist, _ = _graph(
        client, tmp_path, "rr", {"k": 10, "method": "ivf", "nlist": 16, "nprobe": 16, "rerank": 8}
    )
    train = np.flatnonzero(data.split == 0)
    assert unit.meta()["recall"] > meta["recall"] + 0.2 and unit.meta()["recall"] > 0.9
    X = open_array(f"{data.url}/features")[:]
    ref = ((X[train][:, None, :] - X[graph[train]]) ** 2).sum(-1)  # the stored distances are exact ones
    np.testing.assert_allclose(dist[train], ref, rtol=1e-4, atol=1e-5)
    assert np.all(np.diff(dist[train], axis=1) >= 0)  # and sorted
    assert _overlap(exact[train], graph[train]) > 0.9
    # the filled index does not outlive the stage in the workers' memory
    assert set(client.run(lambda: ivf._load.cache_info().currsize).values()) == {0}


def test_auto_is_exact_below_the_stated_size_and_nlist_follows_sqrt_n():
    from metricpipe.ivf import EXACT_MAX_TRAIN

    assert EXACT_MAX_TRAIN == 200_000
    assert ivf.nlist_for(5_000_000) == 4096 and ivf.nlist_for(1000) == 25
    # a sampled graph's few queries: fewer lists (7 sqrt(Q)), never more than the all-rows rule's
    assert ivf.nlist_for(4_500_000, 21_000) == 1024 and ivf.nlist_for(4_500_000, 4_500_000) == 4096
    assert ivf.nlist_for(10_000, 5_000) == ivf.nlist_for(10_000)


def test_the_memory_rule_and_the_stage_size_a_sampled_graph_s_index_alike(tmp_path):
    """The start-up check counts the k-means sample of the index the stage will build: with
    neighbours.queries, its lists follow the queries in both."""
    from types import SimpleNamespace

    from metricpipe.config import parse_config
    from metricpipe.stages import neighbours as nbs

    raw = {
        "data": {"source": "digits"},
        "methods": [{"method": "pca", "dim": 8}],
        "neighbours": {"k": 10, "method": "ivf", "queries": 20000},
    }
    cfg = parse_config(raw)
    n_train = 4_500_000
    stage = nbs._nlist(SimpleNamespace(config=cfg), n_train)
    assert stage == 1024
    rows = ivf.sample_rows(n_train, stage)
    info = SimpleNamespace(
        n_samples=5_000_000,
        n_features=256,
        classes=list(range(100)),
        chunk_rows=62_500,
        split=np.r_[np.zeros(n_train, np.int8), np.ones(500_000, np.int8)],
    )
    needs = {what: b for what, b, _ in checks.largest_tasks(info, cfg, 2e9)}
    assert f"the IVF index's k-means sample ({rows:,} rows)" in needs, needs
    # its 20,500 queries are held by each scan task over the streamed rows: no index
    scan = "the neighbours stage's IVF search of 20,500 queries over the streamed rows"
    assert scan in needs and not any("IVF index (" in w for w in needs), needs
    assert needs[scan] == ivf.stream_bytes(20_500, 256, 10, 1024, 62_500 * 256 * 4.0, 16) < 0.6 * 2e9
    # an all-rows graph's index is IVF-PQ at this size
    cfg = parse_config({**raw, "neighbours": {"k": 10, "method": "ivf"}})
    needs = [what for what, *_ in checks.largest_tasks(info, cfg, 2e9)]
    assert any(w.startswith("the neighbours stage's IVF index (IVF4096_HNSW32,PQ") for w in needs), needs


@pytest.mark.integration
def test_sampled_queries_keep_the_full_graphs_rows_and_slne_trains_on_them_and_their_neighbours(client, tmp_path):
    from metricpipe.stages.train.neighbours import _inputs

    _, full, _, data = _graph(client, tmp_path, "all", {"k": 10, "method": "exact"})
    unit, part, _, _ = _graph(client, tmp_path, "part", {"k": 10, "method": "exact", "queries": 300})
    q = open_array(f"{unit.url}/query_rows")[:]
    train = np.flatnonzero(data.split == 0)
    assert np.all(np.isin(q, train)) and abs(len(q) - 300) <= 6 and unit.meta()["queries"] == len(q)
    for c in np.unique(data.labels[train]):  # every class keeps its share of the train split
        share = np.mean(data.labels[train] == c)
        assert abs(np.sum(data.labels[q] == c) - 300 * share) <= 1
    np.testing.assert_array_equal(part[q], full[q])  # a sampled row's list is the exact one
    assert np.all(np.delete(part, q, axis=0) == -1)  # nothing else was searched

    from metricpipe.store import load_arrays
    from metricpipe.tasks.slne import SLNE

    stats, _ = load_arrays(_graph.stats.url)
    mean, P = SLNE().input_space(stats["mean"], stats["pca_components"])
    Z, y, graph = _inputs(
        data.url, unit.url, data.chunks, SLNE().input_map(stats["mean"], stats["pca_components"]), data.split
    )
    rows = np.union1d(q, full[q])  # the sampled rows and their neighbours
    X = open_array(f"{data.url}/features")[:]
    ref = (X[rows] - mean) @ P
    np.testing.assert_allclose(Z, ref / np.linalg.norm(ref, axis=1, keepdims=True), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(y, data.labels[rows])
    anchor = np.isin(rows, q)
    np.testing.assert_array_equal(rows[graph[anchor]], full[q])  # local indices point at the same rows
    assert np.all(graph[~anchor] == -1)


@pytest.mark.integration
def test_hnsw_quantizer_from_many_lists_finds_every_probed_list(client, tmp_path, monkeypatch):
    monkeypatch.setattr(ivf, "HNSW_MIN_WORK", 16 * 16)
    assert ivf.factory_string(2400, 16, 16) == "IVF16_HNSW32,Flat" and ivf.factory_string(2400, 16, 8) == "IVF8,Flat"
    _, exact, exact_d, data = _graph(client, tmp_path, "exact", {"k": 10, "method": "exact"})
    unit, graph, dist, _ = _graph(client, tmp_path, "hnsw", {"k": 10, "method": "ivf", "nlist": 16, "nprobe": 16})
    assert unit.meta()["index"] == "IVF16_HNSW32,Flat"
    # probing all 16 lists through the graph walk (efSearch 4 x nprobe) is exact search
    assert unit.meta()["recall"] == pytest.approx(1.0)
    train = np.flatnonzero(data.split == 0)
    np.testing.assert_allclose(dist[train], exact_d[train], rtol=1e-4, atol=1e-4)
    one, _, _, _ = _graph(client, tmp_path, "hnsw1", {"k": 10, "method": "ivf", "nlist": 16, "nprobe": 1})
    assert 0.2 < one.meta()["recall"] < 1.0


@pytest.mark.integration
def test_a_sampled_graph_is_searched_over_the_streamed_rows_as_ivf_flat_and_keeps_no_index(client, tmp_path):
    _, full, full_d, data = _graph(client, tmp_path, "all", {"k": 10, "method": "exact"})
    unit, part, part_d, _ = _graph(
        client, tmp_path, "every", {"k": 10, "method": "ivf", "queries": 300, "nlist": 16, "nprobe": 16}
    )
    meta = unit.meta()
    assert meta["streamed"] and meta["index"] == "IVF16,Flat" and meta["recall"] == pytest.approx(1.0)
    q = open_array(f"{unit.url}/query_rows")[:]
    # every list probed: exact search, up to the order of near-ties (the GEMMs' shapes differ)
    diff = np.flatnonzero((part[q] != full[q]).any(1))
    assert len(diff) <= 3 and all(len(np.intersect1d(part[r], full[r])) >= 9 for r in q[diff])
    np.testing.assert_allclose(part_d[q], full_d[q], rtol=1e-5, atol=1e-5)
    assert np.all(np.delete(part, q, axis=0) == -1)
    assert not [p for p in (tmp_path / "every").rglob("ivf_*")]  # no index stored
    one, graph, _, _ = _graph(
        client, tmp_path, "one", {"k": 10, "method": "ivf", "queries": 300, "nlist": 16, "nprobe": 1}
    )
    rec = one.meta()["recall"]
    assert 0.2 < rec < 1.0 and abs(rec - _overlap(full[q], graph[q])) < 0.1  # the check tracks the graph's
    assert np.all(graph[q] != q[:, None]) and np.all(graph[q] >= 0)


def test_queries_are_streamed_only_when_every_task_can_hold_them():
    block = 62_500 * 256 * 4.0
    need = ivf.stream_bytes(20_500, 256, 20, 1024, block, 16)
    assert ivf.streamed(20_000, 256, 20, 1024, block, need, 16)  # exactly fits the share
    assert not ivf.streamed(20_000, 256, 20, 1024, block, need - 1, 16)  # a byte short: a faiss index
    assert not ivf.streamed(20_000, 256, 20, 1024, block, need, 64)  # more probed lists to hold
    assert not ivf.streamed(None, 256, 20, 1024, block, None, 16)  # an all-rows graph
    many = int(ivf.STREAM_QUERY_BYTES // (257 * 4)) + 1  # past 256 MB of queries
    assert ivf.streamed(many - 1, 256, 20, 1024, block, None, 16) and not ivf.streamed(
        many, 256, 20, 1024, block, None, 16
    )


@pytest.mark.integration
def test_the_streamed_search_gives_the_same_graph_on_one_worker_as_on_two(client, tmp_path):
    from distributed import Client, LocalCluster

    nb = {"k": 10, "method": "ivf", "queries": 400, "nlist": 16, "nprobe": 2}
    two, g2, d2, _ = _graph(client, tmp_path, "two", nb)
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as lc,
        Client(lc) as one_client,
    ):
        one, g1, d1, _ = _graph(one_client, tmp_path, "one", nb)
    assert two.meta()["streamed"] and one.meta()["streamed"]
    np.testing.assert_array_equal(g1, g2)  # bit for bit: fixed blocks, tiles and merge tree
    np.testing.assert_array_equal(d1, d2)
    assert two.meta()["recall"] == one.meta()["recall"] < 1.0
