"""Workers of the clusters a run connects to take numpy's temporaries from the heap: Dask's nanny
fixes glibc's mmap threshold at 128 KiB (MALLOC_TRIM_THRESHOLD_), which made every array over it a
fresh mapping faulted in page by page (linear ML's fit cost twice its CPU in a worker)."""

import resource
import sys

import numpy as np
import pytest
from distributed import Client, LocalCluster

from metricpipe.cluster import connect
from metricpipe.cluster.heap import heap_temporaries

pytestmark = pytest.mark.integration

ROUNDS, ARRAY_BYTES, PAGE = 200, 1 << 20, 4096


def faults_of_temporaries() -> int:
    """Minor page faults of this process while ROUNDS arrays of 1 MiB are written and freed, one after another."""
    np.ones(ARRAY_BYTES // 8).sum()  # the first one may grow the heap
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(ROUNDS):
        np.ones(ARRAY_BYTES // 8).sum()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_run_s_workers_reuse_the_heap_for_temporaries_where_a_plain_dask_worker_faults():
    fresh_pages = ROUNDS * ARRAY_BYTES // PAGE  # every array mapped anew: each of its pages faulted in
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as lc,
        Client(lc) as plain,
    ):
        dask_faults = plain.submit(faults_of_temporaries, pure=False).result()
    with connect("local", 1, dashboard=None) as client:
        run_faults = client.submit(faults_of_temporaries, pure=False).result()
    assert dask_faults > fresh_pages // 2  # the defect this guards against, as Dask starts a worker
    assert run_faults < fresh_pages // 20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_heap_temporaries_says_it_set_the_threshold_with_glibc():
    assert heap_temporaries()
