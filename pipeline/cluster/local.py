"""An embedded LocalCluster: its workers ignore the terminal's Ctrl-C and a heartbeat that races the
close, and a Ctrl-C while it starts waits until it has started whole."""

import contextlib
import logging
import os

import dask
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import WorkerPlugin

from metricpipe.cluster.dashboard import dashboard_address, taken_port_quiet

# A task may lose its worker this many times (pre-emption, OOM kill) before the run stops with a
# message naming the stage and block; its retries recompute the identical result.
ALLOWED_FAILURES = 3


class IgnoreInterrupt(WorkerPlugin):
    """A local cluster's workers share the terminal's process group, so a Ctrl-C reaches them too and
    kills them mid-task (a CancelledError traceback, leaked semaphores). They ignore it instead: the
    client, which gets it as well, stops the run and closes the cluster, workers included."""

    name = "metricpipe-ignore-sigint"

    def setup(self, worker):
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)


class HeartbeatAtClose(logging.Filter):
    """Drops a local worker's "Failed to communicate with scheduler during heartbeat" record and its
    traceback (~30 lines of CommClosedError): the scheduler runs in the client's process and closes
    with the cluster, so a heartbeat that races the close reaches a closed comm after a successful
    run (a new-user trial saw it once in ~60 runs). Were the client's process gone for another
    reason, its terminal would show the reason, not this."""

    def filter(self, record):
        return not record.getMessage().startswith("Failed to communicate with scheduler during heartbeat")


class QuietHeartbeat(WorkerPlugin):
    """Puts :class:`HeartbeatAtClose` on a local cluster's workers."""

    name = "metricpipe-quiet-heartbeat"

    def setup(self, worker):
        logging.getLogger("distributed.worker").addFilter(HeartbeatAtClose())


# multiprocessing's resource tracker (a process of its own, started with the first local worker)
# warns about the semaphores of worker processes that were stopped mid-task, then removes them:
# noise after a Ctrl-C
TRACKER_FILTER = "ignore:resource_tracker:UserWarning"


@contextlib.contextmanager
def quiet_resource_tracker():
    """PYTHONWARNINGS with the tracker's filter while a local cluster starts its workers (the tracker,
    started then, keeps it); restored after, so this process's later children are not affected."""
    have = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [have, TRACKER_FILTER]))
    try:
        yield
    finally:
        if have is None:
            os.environ.pop("PYTHONWARNINGS", None)
        else:
            os.environ["PYTHONWARNINGS"] = have


@contextlib.contextmanager
def interrupts_deferred(pending: list):
    """Ctrl-C and SIGTERM held while a local cluster starts, then re-raised by the caller (``pending``
    gets the signal numbers). Cut short, the start left half-started workers that printed their own
    tracebacks (a Ctrl-C reaches the whole process group) and a closing cluster that failed on a
    worker still starting (``AssertionError: Status.init``), burying the resume hint. The workers
    spawned meanwhile see METRICPIPE_STARTING_WORKER and ignore SIGINT from their first import of
    metricpipe (the client stops them). A second Ctrl-C is not held (a start that hangs can still be
    stopped); a signal this process ignored stays ignored. Main thread only (signal handlers are its)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    old = {s: h for s, h in old.items() if h is not None and h != signal.SIG_IGN}  # None: not set from Python

    def hold(signum, frame):
        if signum in pending and signum == signal.SIGINT:  # pressed again: stop now
            signal.signal(signum, old[signum])
            raise KeyboardInterrupt
        pending.append(signum)

    for s in old:
        signal.signal(s, hold)
    os.environ["METRICPIPE_STARTING_WORKER"] = "1"
    try:
        yield
    except Exception:
        if pending:  # a start that failed because of the interrupt (a worker killed by it): the interrupt
            raise KeyboardInterrupt from None
        raise
    finally:
        os.environ.pop("METRICPIPE_STARTING_WORKER", None)
        for s, handler in old.items():
            signal.signal(s, handler)


def raise_pending(pending: list) -> None:
    """Raise what the signal recorded by :func:`interrupts_deferred` would have raised."""
    import signal

    if signal.SIGTERM in pending:
        signal.raise_signal(signal.SIGTERM)  # the handler installed for it (Terminated in the CLI)
    if pending:
        raise KeyboardInterrupt


@contextlib.contextmanager
def local_client(workers: int, threads_per_worker: int, memory_limit, dashboard: str | None):
    """A LocalCluster of ``workers`` processes on 127.0.0.1 and its client."""
    dask.config.set({"distributed.scheduler.allowed-failures": ALLOWED_FAILURES})
    pending = []
    with interrupts_deferred(pending), quiet_resource_tracker(), taken_port_quiet():
        lc = LocalCluster(
            n_workers=workers,
            threads_per_worker=threads_per_worker,
            processes=True,
            host="127.0.0.1",
            memory_limit=memory_limit,
            dashboard_address=dashboard_address(dashboard),
            # no dashboard: the scheduler still serves its health routes over HTTP,
            # on Dask's 8787 unless told otherwise; a free loopback port instead
            scheduler_kwargs=None if dashboard else {"dashboard_address": "127.0.0.1:0"},
        )
    with lc:
        raise_pending(pending)  # a Ctrl-C during the start stops the run now, the cluster whole
        with Client(lc) as client:
            client.register_plugin(IgnoreInterrupt())
            client.register_plugin(QuietHeartbeat())
            yield client
