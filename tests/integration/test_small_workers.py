"""Workers of 1 GB: a run whose graph goes through a faiss IVF-PQ index (as at millions of rows) and
whose kNN evaluation searches IVF lists over the streamed codes keeps every worker under its limit,
and the memory rule sized the index from it."""

import pytest
from distributed import Client, LocalCluster

from metricpipe import ivf
from tests.integration.helpers import record, run

pytestmark = pytest.mark.integration

LIMIT = 1e9


def _peak_rss():
    from metricpipe.runner import max_rss_mb

    return max_rss_mb() * 2**20


def test_ivf_graph_and_ivf_evaluation_on_1gb_workers(tmp_path, monkeypatch):
    from metricpipe import stages

    monkeypatch.setattr(ivf, "IVF_FLAT_BYTES", 0)  # IVF-PQ, re-ranked: the large-N path
    monkeypatch.setattr(ivf, "EXACT_MAX_TRAIN", 1000)  # kNN classification through an index
    # the graph through a faiss IVF-PQ index (as when its queries are too many to hold), kNN's 2,000
    # classified rows over the streamed codes: both paths on small workers
    monkeypatch.setattr(stages.neighbours, "_streamed", lambda *a: False)
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, memory_limit=LIMIT, host="127.0.0.1", dashboard_address="127.0.0.1:0"
        ) as lc,
        Client(lc) as client,
    ):
        m = run(
            {
                "store": str(tmp_path),
                "memory_limit": "1GB",
                "data": {
                    "source": "synthetic",
                    "chunk_mb": 16,
                    "synthetic": {"samples": 60_000, "dim": 64, "classes": 20},
                    "split": {"test": 0.2, "seed": 0},
                },
                "neighbours": {"k": 10, "method": "ivf", "queries": 2000},
                "methods": [{"method": "identity"}, {"method": "pca", "dim": 16}],
                "evaluate": {
                    "retrieval": {"k": [10], "queries": 500},
                    "classification": {"classifiers": ["knn1", "ncm"], "queries": 2000},
                },
            },
            client,
        )
        peaks = client.run(_peak_rss)
        workers = list(client.scheduler_info()["workers"])
    assert len(workers) == 2 and all(p < LIMIT for p in peaks.values()), peaks
    graph = m["timings"][2]
    assert graph["stage"] == "neighbours" and ",PQ" in graph["note"] and "rerank 4" in graph["note"], graph
    # identity keeps the features' distances: it searches the graph's own IVF-PQ index; PCA-16 its codes
    for method, dim, how, low in (
        ("identity", 64, ",PQ16, nprobe 16, rerank 4 (the neighbours stage's index)", 0.3),
        ("pca", 16, ",Flat over the streamed codes, nprobe 16", 0.9),
    ):
        rec = [r for r in m["records"] if r["method"] == method and r["metric"] == "knn_recall"]
        assert len(rec) == 1 and rec[0]["search"].endswith(how) and low < rec[0]["value"] <= 1.0, rec
        # through the lists, kNN still classifies: well under chance (0.95 with 20 classes)
        assert record(m["records"], method, dim, "top1_error", "knn1") < 0.5
