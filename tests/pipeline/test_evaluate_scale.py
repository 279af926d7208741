"""Evaluation at scale: kNN from the stored graph, from an IVF index of the codes, on sampled queries;
the memory rule's plan; rows read chunk by chunk."""

import re
from types import SimpleNamespace

import numpy as np
import pytest

from metricpipe import ivf, stages
from metricpipe.checks import check_memory
from metricpipe.checks import largest_tasks as needs
from metricpipe.config import parse_config
from metricpipe.context import StageContext
from metricpipe.store import Store, open_array, read_rows
from metricpipe.tasks import stream
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.knn import brute_force_knn
from metricpipe.tasks.models import LinearModel
from tests.conftest import make_blobs


def _evaluate(client, path, store, raw):
    cfg = parse_config({"data": {"path": str(path), "chunk_mb": 0.0083, "split": {"test": 0.3}}, **raw})
    ctx = StageContext(client, Store(str(store)), cfg, log=lambda m: None)
    data = stages.run_stage(ctx)
    stats = stages.run_statistics(ctx, data)
    graph = stages.run_neighbours(ctx, data) if cfg.neighbours else None
    models = stages.run_train(ctx, data, stats, graph)
    codes = stages.run_encode(ctx, data, models)
    recs = [r for _, unit in stages.run_evaluate(ctx, data, codes, graph) for r in unit.read_json("records.json")]
    return recs, data


def _get(recs, method, dim, metric, classifier):
    [v] = [
        r for r in recs if (r["method"], r["dim"], r["metric"], r["classifier"]) == (method, dim, metric, classifier)
    ]
    return v


@pytest.fixture
def integer_npz(tmp_path):
    rng = np.random.default_rng(5)
    X = rng.integers(0, 4, (1000, 7)).astype(np.float32)  # integer-valued: exact distances, real ties
    y = (X[:, 0] + X[:, 1] > 3).astype(int) * 2 + (np.arange(1000) % 2)
    np.savez(tmp_path / "d.npz", X=X, y=y)
    return tmp_path / "d.npz", X, y


@pytest.mark.integration
def test_the_retrieval_sample_is_announced_only_when_there_is_retrieval(client, tmp_path, integer_npz, monkeypatch):
    """evaluate.retrieval: false still logged 'retrieval by a seeded sample of 10,000 ...'."""
    import gc

    from metricpipe.tasks import scoring

    monkeypatch.setattr(scoring, "RETRIEVAL_QUERIES", 50)  # of the 300 test rows
    said = {}
    for retrieval in (False, {"k": [1]}):
        cfg = parse_config(
            {
                "data": {"path": str(integer_npz[0]), "split": {"test": 0.3}},
                "methods": [{"method": "identity"}],
                "evaluate": {"retrieval": retrieval, "classification": {"classifiers": ["knn1"]}},
            }
        )
        logs = []
        ctx = StageContext(client, Store(str(tmp_path / "s")), cfg, log=logs.append)
        data = stages.run_stage(ctx)
        models = stages.run_train(ctx, data, stages.run_statistics(ctx, data), None)
        stages.run_evaluate(ctx, data, stages.run_encode(ctx, data, models))
        said[bool(retrieval)] = [m for m in logs if "retrieval by a seeded sample" in m]
        del ctx, data, models
        gc.collect()  # the labels' scatter has one key in both runs: released now, not during the next one's
    assert said == {
        False: [],
        True: [
            "  evaluate: retrieval by a seeded sample of 50 of the 300 test rows (set "
            "evaluate.retrieval.queries to change it)"
        ],
    }


@pytest.mark.integration  # stages on the session cluster
def test_knn_from_the_stored_graph_equals_exact_search_ties_included(client, tmp_path, integer_npz):
    path = integer_npz[0]
    methods = [{"method": "identity"}, {"method": "pca", "dim": 3}]
    ev = {"retrieval": False, "classification": {"classifiers": ["knn1", "knn5"]}}
    with_graph, _ = _evaluate(
        client, path, tmp_path / "a", {"neighbours": {"k": 6}, "methods": methods, "evaluate": ev}
    )
    exact, _ = _evaluate(client, path, tmp_path / "b", {"methods": methods, "evaluate": ev})
    for c in ("knn1", "knn5"):
        assert _get(with_graph, "identity", 7, "knn_recall", c)["search"] == "graph"
        for m in ("top1_error", "top5_error"):
            assert _get(with_graph, "identity", 7, m, c)["value"] == _get(exact, "identity", 7, m, c)["value"]
    # PCA to 3 of 7 dimensions changes the distances: it searches its own codes
    assert not [r for r in with_graph if r["method"] == "pca" and r["metric"] == "knn_recall"]
    assert not [r for r in exact if r["metric"] == "knn_recall"]


@pytest.mark.integration  # stages on the session cluster
def test_knn_through_an_ivf_index_of_the_codes_past_the_threshold(client, tmp_path, monkeypatch):
    X, y = make_blobs(n=3000, d=16, classes=6, sep=0.4)
    np.savez(tmp_path / "b.npz", X=X, y=y)
    # PCA with every dimension kept is a rotation: it searches the graph's index of the features too
    raw = {
        "methods": [{"method": "pca", "dim": [8, 16]}, {"method": "identity"}],
        "evaluate": {"retrieval": False, "classification": {"classifiers": ["knn1", "knn10"]}},
    }
    exact, _ = _evaluate(client, tmp_path / "b.npz", tmp_path / "e", raw)
    monkeypatch.setattr(ivf, "EXACT_MAX_TRAIN", 100)
    # a graph of 300 sampled train rows through a faiss index (as when its queries are too many to
    # hold): the identity's kNN searches the graph's own IVF index
    with monkeypatch.context() as m:
        m.setattr(ivf, "STREAM_QUERY_BYTES", 0)
        approx, _ = _evaluate(
            client,
            tmp_path / "b.npz",
            tmp_path / "i",
            {**raw, "neighbours": {"k": 10, "method": "ivf", "queries": 300}},
        )
    for c in ("knn1", "knn10"):
        rec = _get(approx, "pca", 8, "knn_recall", c)
        assert rec["search"].startswith("IVF") and rec["search"].endswith("nprobe 16")
        for m, d in (("identity", 16), ("pca", 16)):
            assert _get(approx, m, d, "knn_recall", c)["search"].endswith("(the neighbours stage's index)")
        for m, d in (("pca", 8), ("pca", 16), ("identity", 16)):
            assert 0.9 <= _get(approx, m, d, "knn_recall", c)["value"] <= 1.0
            e, a = _get(exact, m, d, "top1_error", c)["value"], _get(approx, m, d, "top1_error", c)["value"]
            assert abs(e - a) <= 0.02 and e > 0.05  # not a trivial task: both classify, nearly alike
    assert list((tmp_path / "i").glob("evaluation/*/*")) and not list((tmp_path / "i").glob("evaluation/*/knn-index*"))
    # a sampled graph is searched over the streamed rows and keeps no index; kNN, whose classified
    # rows every task can hold, searches each view's train codes the same way
    sampled, _ = _evaluate(
        client, tmp_path / "b.npz", tmp_path / "s", {**raw, "neighbours": {"k": 10, "method": "ivf", "queries": 300}}
    )
    for m, d in (("identity", 16), ("pca", 16), ("pca", 8)):
        for c in ("knn1", "knn10"):
            rec = _get(sampled, m, d, "knn_recall", c)
            assert re.fullmatch(r"IVF\d+,Flat over the streamed codes, nprobe 16", rec["search"]), rec
            assert 0.9 <= rec["value"] <= 1.0
            e, a = _get(exact, m, d, "top1_error", c)["value"], _get(sampled, m, d, "top1_error", c)["value"]
            assert abs(e - a) <= 0.02
    assert not list((tmp_path / "s").glob("evaluation/*/knn-index*"))


@pytest.mark.integration  # stages on the session cluster
def test_a_pq_index_of_the_codes_is_reranked_exactly_as_the_graph_s_is(client, tmp_path, monkeypatch):
    from metricpipe import ivf

    X, y = make_blobs(n=3000, d=16, classes=6, sep=0.4)
    np.savez(tmp_path / "b.npz", X=X, y=y)
    monkeypatch.setattr(ivf, "EXACT_MAX_TRAIN", 100)
    monkeypatch.setattr(ivf, "IVF_FLAT_BYTES", 0)  # PQ codes, as when a worker cannot hold IVF-Flat
    monkeypatch.setattr(ivf, "STREAM_QUERY_BYTES", 0)  # and the classified rows too many to hold
    raw = {
        "methods": [{"method": "pca", "dim": 8}],
        "evaluate": {"retrieval": False, "classification": {"classifiers": ["knn10"]}},
    }
    recall = {}
    for rerank in (1, 8):
        recs, _ = _evaluate(
            client,
            tmp_path / "b.npz",
            tmp_path / f"r{rerank}",
            {**raw, "neighbours": {"k": 10, "method": "ivf", "queries": 300, "rerank": rerank}},
        )
        rec = _get(recs, "pca", 8, "knn_recall", "knn10")
        assert ",PQ" in rec["search"] and rec["search"].endswith(", rerank 8" if rerank > 1 else "nprobe 16")
        recall[rerank] = rec["value"]
    # PQ's coarse distances miss neighbours; re-scoring 8 x 10 candidates exactly finds nearly all
    assert recall[1] < 0.85 and recall[8] >= 0.95, recall


@pytest.mark.integration  # stages on the session cluster
def test_classification_queries_are_a_stratified_sample_scored_exactly(client, tmp_path, integer_npz):
    path, X, y = integer_npz
    raw = {
        "methods": [{"method": "identity"}],
        "seed": 3,
        "evaluate": {"retrieval": False, "classification": {"classifiers": ["knn1"], "queries": 60}},
    }
    recs, data = _evaluate(client, path, tmp_path / "s", raw)
    test, train = data.rows(stages.TEST), data.rows(stages.TRAIN)
    keys = open_array(f"{data.url}/row_key")[:][test]
    rows = test[stream.sample(y[test], 60, keys, 3, stream.EVALUATED)]
    assert 55 <= len(rows) <= 65 and len(rows) < len(test)
    # reference: brute force (distance, then row) over the train rows
    _, idx = brute_force_knn(X[rows], X[train], 1)
    want = np.mean(y[train][idx[:, 0]] != y[rows])
    assert _get(recs, "identity", 7, "top1_error", "knn1")["value"] == pytest.approx(want)


def test_keeps_distances_only_for_the_identity_and_rotations():
    rng = np.random.default_rng(0)
    Q, _ = np.linalg.qr(rng.normal(size=(6, 6)))
    assert LinearModel(None).keeps_distances(6)
    assert LinearModel(Q.astype(np.float32)).keeps_distances(6)
    assert not LinearModel(Q[:, :4].astype(np.float32)).keeps_distances(6)  # dimensions dropped
    assert not LinearModel((2 * Q).astype(np.float32)).keeps_distances(6)  # scaled
    assert not LinearModel(Q.astype(np.float32), score="inner").keeps_distances(6)


def test_read_rows_reads_any_order_chunk_by_chunk(tmp_path):
    from metricpipe.store import create_array

    X = np.arange(3000, dtype=np.int64).reshape(1000, 3)
    create_array(str(tmp_path / "a"), X.shape, (64, 3), np.int64)[:] = X
    for idx in (np.array([5, 999, 3, 3, 64, 0]), np.array([], np.int64), np.arange(1000), np.array([999])):
        np.testing.assert_array_equal(read_rows(str(tmp_path / "a"), idx), X[idx])


# ---- the memory rule --------------------------------------------------------------------------------


def _info(n, d, chunk_mb=64, test=0.1, classes=10):
    split = np.zeros(n, np.int8)
    split[: int(n * test)] = stages.TEST
    return SimpleNamespace(
        n_features=d, chunk_rows=int(chunk_mb * 1e6 // (4 * d)), split=split, classes=list(range(classes))
    )


def _client(limit):
    return SimpleNamespace(
        scheduler_info=lambda: {"workers": {"a": {"memory_limit": limit}, "b": {"memory_limit": limit}}}
    )


def test_6m_rows_on_1gb_workers_plan_a_streamed_search_or_an_ivf_pq_index_that_fits(monkeypatch):
    cfg = parse_config(
        {
            "data": {"source": "synthetic"},
            "memory_limit": "1GB",
            "neighbours": {"k": 10, "method": "ivf", "queries": 20000},
            "methods": [{"method": "pca", "dim": 32}],
        }
    )
    plan = needs(_info(6_000_000, 128), cfg, 1e9)
    [scan] = [need for what, need, _ in plan if "20,500 queries over the streamed rows" in what]
    assert scan <= 0.6e9 and not [w for w, _, _ in plan if "IVF index (" in w]
    check_memory(_client(1e9), _info(6_000_000, 128), cfg)  # passes
    # queries too many to hold: a faiss index, IVF-PQ at 1 GB
    monkeypatch.setattr(ivf, "STREAM_QUERY_BYTES", 0)
    plan = needs(_info(6_000_000, 128), cfg, 1e9)
    index = [need for what, need, _ in plan if "IVF index (" in what]
    assert len(index) == 1 and index[0] <= 0.6e9
    [what] = [w for w, _, _ in plan if "IVF index (" in w]
    # flat would need 2.8 GB; 32 bytes a row fit; 1,024 lists for the 20,000 queries (+ 500 of the
    # recall check), ~7 sqrt(Q), not 2 sqrt(n) = 4,096
    assert "IVF1024,PQ32" in what
    check_memory(_client(1e9), _info(6_000_000, 128), cfg)  # passes


def test_the_memory_rule_refuses_before_staging_naming_the_setting():
    cfg = parse_config(
        {
            "data": {"source": "synthetic"},
            "neighbours": {"k": 10, "method": "ivf"},
            "methods": [{"method": "pca", "dim": 32}],
        }
    )
    with pytest.raises(
        InputError,
        match=r"IVF index of 99,000,000 train rows needs ~\d[\d,]* MB at one byte per "
        r"row, over the \d+ MB a worker can give it; raise memory_limit",
    ):
        check_memory(_client(1e9), _info(110_000_000, 128), cfg)
    with pytest.raises(InputError, match=r"over the \d+ MB a worker can give it; raise --memory-limit"):  # given so
        check_memory(_client(1e9), _info(110_000_000, 128), cfg.from_command_line(memory_limit="1GB"))
    # a running scheduler's workers: memory_limit does not size them (the note says so), so it is not named
    with pytest.raises(
        InputError,
        match=r"over the \d+ MB a worker can give it; raise the workers' memory limit "
        r"\(dask worker --memory-limit, or the cluster spec's\)$",
    ):
        check_memory(
            _client(1e9),
            _info(110_000_000, 128),
            cfg.from_command_line(memory_limit="2GB", cluster="tcp://127.0.0.1:8786"),
        )
    wide = parse_config({"data": {"source": "synthetic"}, "methods": [{"method": "pca", "dim": 32}]})
    with pytest.raises(
        InputError,
        match=r"8000 x 8000 covariance .* needs ~1,5\d\d MB, over the 1,200 MB a task may "
        r"use .*; set statistics.max_dense_dim below 8000",
    ):
        check_memory(_client(2e9), _info(10_000, 8000, chunk_mb=16), wide)


def test_factory_string_fits_the_budget():
    assert ivf.factory_string(100_000, 32, 512, budget=1e9) == "IVF512,Flat"
    assert ivf.factory_string(100_000, 32, 512, budget=5e6) == "IVF512,PQ8"  # 16 B a row: PQ8
    assert ivf.factory_string(1_000_000, 128, 2048, budget=30e6) == "IVF2048,PQ16"
    assert ivf.factory_string(1_000_000, 256, 4096, budget=30e6) == "IVF4096_HNSW32,PQ16"
    with pytest.raises(InputError, match="raise memory_limit"):
        ivf.factory_string(1_000_000, 128, 2048, budget=5e6)


def test_kernel_slem_pool_is_counted_by_the_memory_rule():
    def cfg(count, **kw):
        return parse_config(
            {
                "data": {"source": "synthetic"},
                "methods": [
                    {
                        "method": "slem",
                        "kernel": "gaussian",
                        "gamma": 1.0,
                        "negatives": {"split": "train", "count": count},
                        **kw,
                    }
                ],
            }
        )

    info = _info(200_000, 64, chunk_mb=16)
    with pytest.raises(
        InputError,
        match=r"kernel SLEM's 15,000 x 15,000 kernel matrices \(5 copies, float64\) needs "
        r"~9,000 MB, over the 1,200 MB .*; lower its negatives.count, use "
        r"decomposition: icd with a rank, or raise memory_limit",
    ):
        check_memory(_client(2e9), info, cfg(15000))
    check_memory(_client(2e9), info, cfg(5000))  # 1,000 MB
    check_memory(_client(2e9), info, cfg(15000, decomposition="icd", rank=200))  # 48 MB


def test_a_retrieval_database_that_cannot_be_held_is_refused_before_staging():
    cfg = parse_config(
        {"data": {"source": "synthetic"}, "methods": [{"method": "identity"}, {"method": "pca", "dim": 32}]}
    )
    with pytest.raises(
        InputError,
        match=r"a retrieval task's database \(the 2,000,000 test rows' codes, up to 128 "
        r"dimensions\) needs ~1,124 MB, over the 600 MB .*; set evaluate.retrieval: "
        r"false, lower data.split's test share, or raise memory_limit",
    ):
        check_memory(_client(1e9), _info(20_000_000, 128), cfg)
    check_memory(
        _client(1e9),
        _info(20_000_000, 128),
        parse_config(
            {"data": {"source": "synthetic"}, "methods": [{"method": "identity"}], "evaluate": {"retrieval": False}}
        ),
    )
    # the codes' width as the config gives it, not D: LDA's classes - 1, SL-NE's input_dim
    narrow = parse_config(
        {
            "data": {"source": "synthetic"},
            "neighbours": {"queries": 1000},
            "methods": [{"method": "lda"}, {"method": "slne", "input_dim": 16}],
        }
    )
    check_memory(_client(1e9), _info(20_000_000, 128), narrow)
    with pytest.raises(InputError, match=r"up to 128 dimensions"):  # 200 classes: LDA's codes are D wide
        check_memory(_client(1e9), _info(20_000_000, 128, classes=200), narrow)
    # without dim, a class's default code width: a sparse projector's 64, NCMML's 32 (not D = 4,096)
    wide = _info(2_000_000, 4096)
    for method in ("sparse", "ncmml"):
        check_memory(
            _client(1e9), wide, parse_config({"data": {"source": "synthetic"}, "methods": [{"method": method}]})
        )
    with pytest.raises(InputError, match=r"up to 4096 dimensions"):
        check_memory(
            _client(1e9), wide, parse_config({"data": {"source": "synthetic"}, "methods": [{"method": "pca"}]})
        )


def test_sl_ne_and_sl_de_training_rows_are_counted_by_the_memory_rule():
    """An SL-NE task holds its training rows in its input space and their neighbour graph; it passed
    the rule and then lost its worker. neighbours.queries bounds it (sampled rows and neighbours)."""

    def cfg(method, **kw):
        return parse_config(
            {
                "data": {"source": "synthetic"},
                "neighbours": {"k": 50, **kw},
                "evaluate": {"retrieval": False},
                "methods": [method],
            }
        )

    info = _info(5_000_000, 256)
    with pytest.raises(
        InputError,
        match=r"an SL-NE task: its 4,500,000 training rows in 256 dimensions and their "
        r"50-neighbour graph needs ~27,\d\d\d MB, over the 1,200 MB .*; set "
        r"neighbours.queries .*, lower input_dim, or raise memory_limit",
    ):
        check_memory(_client(2e9), info, cfg({"method": "slne"}))
    with pytest.raises(
        InputError,
        match=r"an SL-DE member \(32 dimensions\): its 4,500,000 training rows .*lower "
        r"input_dim or member_dim",
    ):
        check_memory(_client(2e9), info, cfg({"method": "slde", "member_dim": 32}))
    check_memory(_client(2e9), info, cfg({"method": "slne"}, queries=2000))  # 102,000 rows
    [(what, need, _)] = [
        t for t in needs(info, cfg({"method": "slne", "input_dim": 64}, queries=2000), 2e9) if "SL-NE" in t[0]
    ]
    rows = 2000 * 51  # the sampled rows and their neighbours; only the 2,000 sampled list theirs
    assert "102,000 training rows in 64 dimensions" in what
    assert need == rows * (8 * 64 + 32 * 50) + 2000 * 48 * 50 + 32 * 64 * 64


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_rescore_gives_the_exact_distances_of_the_candidates_in_its_block(tmp_path, metric):
    from metricpipe import ivf
    from metricpipe.store import create_array, open_array

    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 6)).astype(np.float32)
    create_array(str(tmp_path / "db"), X.shape, (20, 6), np.float32)
    open_array(str(tmp_path / "db"), mode="r+")[:] = X
    Q = rng.normal(size=(4, 6)).astype(np.float32)
    ids = rng.integers(-1, 50, size=(4, 5))  # two pieces of 2 queries, 5 candidates, -1: none
    pieces = [(None, ids[:2]), (None, ids[2:])]
    pos, d = ivf.rescore(str(tmp_path / "db"), 20, 40, Q, *pieces, metric=metric)
    flat = ids.reshape(-1)
    assert np.array_equal(pos, np.flatnonzero((flat >= 20) & (flat < 40)))
    q, x = Q[pos // 5].astype(np.float64), X[flat[pos]].astype(np.float64)
    want = -(q * x).sum(1) if metric == "ip" else ((q - x) ** 2).sum(1)
    np.testing.assert_allclose(d, want, rtol=1e-5, atol=1e-5)


def test_knn_indexes_have_fewer_lists_when_few_test_rows_are_classified():
    """kNN's IVF indexes follow the classified rows as the graph follows its queries: 20,000 sampled
    test rows at 800,000 train rows search 1,024 lists; every one of 200,000 test rows, 2 sqrt(n)."""
    from types import SimpleNamespace

    from metricpipe.stages.evaluate import knn_index

    data = SimpleNamespace(split=np.r_[np.zeros(800_000, np.int8), np.ones(200_000, np.int8)])
    sampled = parse_config(
        {
            "data": {"source": "synthetic"},
            "methods": [{"method": "pca", "dim": 8}],
            "evaluate": {"classification": {"classifiers": ["knn1"], "queries": 20000}},
        }
    )
    every = parse_config(
        {
            "data": {"source": "synthetic"},
            "methods": [{"method": "pca", "dim": 8}],
            "evaluate": {"classification": {"classifiers": ["knn1"]}},
        }
    )
    assert knn_index.knn_nlist(SimpleNamespace(config=sampled), data, 800_000) == 1024
    assert knn_index.knn_nlist(SimpleNamespace(config=every), data, 800_000) == ivf.nlist_for(800_000) == 2048


@pytest.mark.integration  # stages on the session cluster
def test_an_evaluation_with_an_ivf_index_does_not_depend_on_the_other_models_of_the_run(client, tmp_path, monkeypatch):
    """Its k-means sample and recall probe were seeded by its place in the run's list of indexed
    evaluations: the same key gave other metrics beside other models (and a resume reused either)."""
    X, y = make_blobs(n=3000, d=16, classes=6, sep=0.4)
    np.savez(tmp_path / "b.npz", X=X, y=y)
    monkeypatch.setattr(ivf, "EXACT_MAX_TRAIN", 100)
    ev = {"retrieval": False, "classification": {"classifiers": ["knn1", "knn10"]}}
    alone, _ = _evaluate(
        client, tmp_path / "b.npz", tmp_path / "a", {"methods": [{"method": "identity"}], "evaluate": ev}
    )
    beside, _ = _evaluate(
        client,
        tmp_path / "b.npz",
        tmp_path / "b",
        {"methods": [{"method": "pca", "dim": [4, 8]}, {"method": "identity"}], "evaluate": ev},
    )
    assert _get(alone, "identity", 16, "knn_recall", "knn1")["search"].startswith("IVF")
    assert [r for r in alone if r["method"] == "identity"] == [r for r in beside if r["method"] == "identity"]
    keys = [sorted(p.name for p in (tmp_path / s / "evaluation").iterdir() if p.is_dir()) for s in ("a", "b")]
    assert set(keys[0]) <= set(keys[1])  # the same unit: a store holding one reuses it for the other


@pytest.mark.integration  # stages on the session cluster
def test_the_new_class_control_rows_are_in_the_evaluation_key(client, tmp_path):
    """Every model reports its error on the classes a class-subset model left out (the control); a
    store that had evaluated the identity without such a model reused that evaluation, without them."""
    X, y = make_blobs(n=600, d=8, classes=4)
    np.savez(tmp_path / "b.npz", X=X, y=y)
    ev = {"retrieval": False, "classification": {"classifiers": ["ncm"]}}
    first, _ = _evaluate(
        client, tmp_path / "b.npz", tmp_path / "s", {"methods": [{"method": "identity"}], "evaluate": ev}
    )
    methods = [{"method": "identity"}, {"method": "ncmml", "dim": 4, "iters": 20, "classes": [0, 1]}]
    again, _ = _evaluate(client, tmp_path / "b.npz", tmp_path / "s", {"methods": methods, "evaluate": ev})
    fresh, _ = _evaluate(client, tmp_path / "b.npz", tmp_path / "f", {"methods": methods, "evaluate": ev})
    assert not [r for r in first if r["metric"] == "top1_error_new_classes"]
    control = [r for r in again if r["method"] == "identity" and r["metric"] == "top1_error_new_classes"]
    assert control and control == [
        r for r in fresh if r["method"] == "identity" and r["metric"] == "top1_error_new_classes"
    ]


def test_the_soft_vote_task_s_neighbour_rows_are_counted_by_the_memory_rule():
    cfg = parse_config(
        {
            "data": {"source": "synthetic"},
            "neighbours": {"k": 50},
            "evaluate": {"retrieval": False, "classification": {"classifiers": ["softvote10"]}},
            "methods": [{"method": "identity"}],
        }
    )
    [(what, need, fix)] = [t for t in needs(_info(1_000_000, 784), cfg, 2e9) if "soft-vote" in t[0]]
    rows = 4096 * 50  # every query's neighbours distinct: fewer than the 900,000 train rows
    assert f"{rows:,} rows of codes up to 784 dimensions" in what and need == (rows + 4096) * 784 * 4 + (64 << 20)
    with pytest.raises(
        InputError,
        match=r"a soft-vote task .* needs ~7\d\d MB, over the 600 MB .*; lower "
        r"neighbours.k, drop the softvote classifiers",
    ):
        check_memory(_client(1e9), _info(1_000_000, 784, chunk_mb=16), cfg)
    small = [t for t in needs(_info(10_000, 784), cfg, 2e9) if "soft-vote" in t[0]]
    assert "9,000 rows of codes" in small[0][0]  # no more rows than the train split has
    slne = parse_config(
        {
            "data": {"source": "synthetic"},
            "neighbours": {"k": 50},
            "evaluate": {"retrieval": False, "classification": {"classifiers": ["softvote10"]}},
            "methods": [{"method": "slne", "dim": 32}],
        }
    )
    [what] = [t[0] for t in needs(_info(10_000, 784), slne, 2e9) if "soft-vote" in t[0]]
    assert "up to 784 dimensions" in what  # its exact view is the input space, not the 32-d codes
