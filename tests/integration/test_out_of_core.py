"""Data larger than a worker's memory limit is staged and processed: no task holds more than a
row-block, and no worker's peak RSS reaches its limit."""

import pytest
from distributed import Client, LocalCluster

from tests.integration.helpers import record, run

pytestmark = pytest.mark.integration

LIMIT = 700e6
N, D = 200_000, 1000  # 800 MB of float32 features, more than one worker may hold


def _peak_rss():
    from metricpipe.runner import max_rss_mb

    return max_rss_mb() * 2**20


def test_synthetic_array_larger_than_worker_memory(tmp_path):
    assert N * D * 4 > LIMIT
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, memory_limit=LIMIT, host="127.0.0.1", dashboard_address="127.0.0.1:0"
        ) as lc,
        Client(lc) as client,
    ):
        m = run(
            {
                "store": str(tmp_path),
                "data": {
                    "source": "synthetic",
                    "chunk_mb": 32,
                    "synthetic": {
                        "samples": N,
                        "dim": D,
                        "classes": 10,
                        # separable, no nuisance: PCA finds the signal
                        "separation": 3.0,
                        "nuisance": 0.0,
                    },
                    "split": {"test": 0.01, "seed": 0},
                },
                "methods": [{"method": "pca", "dim": 16}, {"method": "random", "dim": 16}],
                "evaluate": {"retrieval": {"k": [10]}, "classification": {"classifiers": ["knn10", "ncm"]}},
            },
            client,
        )
        peaks = client.run(_peak_rss)
        workers = list(client.scheduler_info()["workers"])
    assert len(workers) == 2  # none was lost to an out-of-memory kill
    print({w: f"peak RSS {p / 1e6:.0f} MB of {LIMIT / 1e6:.0f} MB" for w, p in peaks.items()})
    assert all(p < LIMIT for p in peaks.values()), {w: f"{p / 1e6:.0f} MB" for w, p in peaks.items()}
    # the learned codes are meaningful: PCA on class-structured data beats a random projection
    assert record(m["records"], "pca", 16, "top1_error", "ncm") < record(
        m["records"], "random", 16, "top1_error", "ncm"
    )
