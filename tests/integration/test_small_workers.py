"""Workers of 1 GB: a run whose graph goes through IVF lists and whose evaluation goes through IVF
indexes (PQ, as at millions of rows) keeps every worker under its limit, and the memory rule sized
the indexes from it."""
import pytest
from distributed import Client, LocalCluster

from tests.integration.helpers import record, run

pytestmark = pytest.mark.integration

LIMIT = 1e9


def _peak_rss():
    from metricpipe.runner import max_rss_mb
    return max_rss_mb() * 2**20


def test_ivf_graph_and_ivf_evaluation_on_1gb_workers(tmp_path, monkeypatch):
    from metricpipe import ivf, stages
    monkeypatch.setattr(ivf, "IVF_FLAT_BYTES", 0)                 # IVF-PQ, re-ranked: the large-N path
    monkeypatch.setattr(stages.evaluate, "EXACT_MAX_TRAIN", 1000)  # kNN classification through an index
    # (kNN's classified rows would be searched over the streamed codes, as the graph's are: the index
    # path is what holds more here, so it is the one run on small workers)
    monkeypatch.setattr(stages.evaluate, "_knn_streamed", lambda *a: False)
    with LocalCluster(n_workers=2, threads_per_worker=1, memory_limit=LIMIT, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as lc, Client(lc) as client:
        m = run({"store": str(tmp_path), "memory_limit": "1GB",
                 "data": {"source": "synthetic", "chunk_mb": 16,
                          "synthetic": {"samples": 60_000, "dim": 64, "classes": 20},
                          "split": {"test": 0.2, "seed": 0}},
                 "neighbours": {"k": 10, "method": "ivf", "queries": 2000},
                 "methods": [{"method": "identity"}, {"method": "pca", "dim": 16}],
                 "evaluate": {"retrieval": {"k": [10], "queries": 500},
                              "classification": {"classifiers": ["knn1", "ncm"], "queries": 2000}}}, client)
        peaks = client.run(_peak_rss)
        workers = list(client.scheduler_info()["workers"])
    assert len(workers) == 2 and all(p < LIMIT for p in peaks.values()), peaks
    graph = m["timings"][2]
    # the graph's 2,000 sampled queries are held by each scan task: no index; kNN's index is IVF-PQ
    assert graph["stage"] == "neighbours" and "Flat, nprobe 16, over the streamed rows" in graph["note"], graph
    for method, dim in (("identity", 64), ("pca", 16)):
        rec = [r for r in m["records"] if r["method"] == method and r["metric"] == "knn_recall"]
        assert len(rec) == 1 and ",PQ" in rec[0]["search"] and 0.3 < rec[0]["value"] <= 1.0, rec
        # through the index, kNN still classifies: well under chance (0.95 with 20 classes)
        assert record(m["records"], method, dim, "top1_error", "knn1") < 0.5
