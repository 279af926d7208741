"""Shared fixtures: seeded synthetic data with chunks that do not divide evenly, a session LocalCluster."""

import os

# scikit-learn's estimator checks include check_array_api_input, which runs only when scipy's array
# API support is switched on before scipy is first imported (else it skips itself)
os.environ.setdefault("SCIPY_ARRAY_API", "1")
# One BLAS thread in the test process, as Dask gives its workers (distributed.nanny.pre-spawn-environ):
# on 2 cores shared with the session's workers, OpenBLAS threads on the small matrices of the kernel
# tests oversubscribe the cores and made them 3-4 times slower. The environment reaches the
# subprocesses (a CLI client started by a test); numpy may already be loaded (pytest plugins), hence
# the limit set through threadpoolctl as well. A BLAS thread count set by the caller is kept.
if not any(v in os.environ for v in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")):
    os.environ["OPENBLAS_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    from threadpoolctl import threadpool_limits

    threadpool_limits(1, user_api="blas")

# The Ctrl-C tests check what a terminal's Ctrl-C does. A shell that starts the suite in the background
# (`pytest &`, `nohup ... &` from a script) starts it with SIGINT ignored, which every process it starts
# inherits: those runs and their CLI subprocesses would then ignore the test's Ctrl-C (the product's
# rule: a signal the process ignored stays ignored). The suite takes Python's default back.
import signal  # noqa: E402

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Workers forked from a warm forkserver (which has imported distributed, numpy and the rest) instead
# of spawned interpreters that import everything again: dask's own test suite does the same. The
# suite starts ~60 clusters, and a spawned worker costs ~2.5 s of CPU on its imports before it
# serves a task. The environment variable reaches the CLI subprocesses the tests start; runs outside
# the tests keep Dask's default (spawn).
os.environ.setdefault("DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD", "forkserver")
import dask  # noqa: E402  (a plugin may have imported dask before the variable was set)

dask.config.set(
    {"distributed.worker.multiprocessing-method": os.environ["DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD"]}
)
if os.environ["DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD"] == "forkserver":
    # the forkserver imports what a worker's first task would (scikit-learn, zarr, the stages: ~2 s
    # each time); distributed's own list (itself and its optional packages) is kept
    from distributed.utils import get_mp_context  # noqa: E402

    _ctx = get_mp_context()
    _ctx.set_forkserver_preload(["distributed", "numpy", "pandas", "scipy", "sklearn", "zarr", "metricpipe.runner"])

import numpy as np  # noqa: E402
import pytest  # noqa: E402


def _sigint_state():
    import signal

    return signal.getsignal(signal.SIGINT), signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])


@pytest.fixture(autouse=True)
def _sigint_left_as_found(request):
    """A test, or the library code it runs in this process, that leaves Ctrl-C's handler changed,
    ignored or blocked breaks the Ctrl-C tests that run after it in the same test process (and a
    library user's session): it fails here, named, not there. (dask-jobqueue's import set SIGINT to
    sys.exit() in the process that ran the SLURM tests.)"""
    before = _sigint_state()
    yield
    after = _sigint_state()
    assert after == before, f"{request.node.nodeid} left SIGINT (handler, blocked) {after}, found {before}"


@pytest.fixture(scope="session")
def client():
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
            memory_limit="2GB",
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c


def make_blobs(n=600, d=12, classes=4, seed=0, sep=3.0):
    """Small seeded class-structured data (float32) with integer labels."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    rng.shuffle(y)
    centers = rng.normal(0, sep, (classes, d))
    X = (centers[y] + rng.normal(0, 1, (n, d))).astype(np.float32)
    return X, y


@pytest.fixture
def blobs_npz(tmp_path):
    X, y = make_blobs()
    p = tmp_path / "blobs.npz"
    np.savez(p, X=X, y=y)
    return p, X, y


def hold_lock(store_dir):
    """A separate process holding the store's lock (as a running metricpipe would); kill it to release."""
    import subprocess
    import sys

    code = (
        "import sys, time; from metricpipe.store import Store\n"
        "with Store(sys.argv[1]).lock('metricpipe run'):\n    print('locked', flush=True); time.sleep(120)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(store_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def numerical_gradient(f, M, h=1e-6):
    """Central finite differences of the scalar function f at the matrix M."""
    grad = np.zeros_like(M, dtype=np.float64)
    for idx in np.ndindex(M.shape):
        E = np.zeros_like(M, dtype=np.float64)
        E[idx] = h
        grad[idx] = (f(M + E) - f(M - E)) / (2 * h)
    return grad


def staged(client, store_dir, raw: dict):
    """(context, data, statistics) for config ``raw`` on a fresh store: data staged, statistics done."""
    from metricpipe.config import parse_config
    from metricpipe.context import StageContext
    from metricpipe.stages import run_stage, run_statistics
    from metricpipe.store import Store

    ctx = StageContext(client, Store(str(store_dir)), parse_config(raw), log=lambda m: None)
    data = run_stage(ctx)
    return ctx, data, run_statistics(ctx, data)
