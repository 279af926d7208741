"""The watch of a connected cluster: a run with no worker, or no answer from its scheduler, for
wait_timeout seconds stops with one line."""

import signal
import threading
import time

from metricpipe.errors import WorkersGone

# How often the watch of a connected cluster asks the scheduler for its workers (seconds).
WATCH_INTERVAL = 1.0
# The signal the watch stops the main thread with (a real signal: it wakes a wait blocked in a lock).
WATCH_SIGNAL = signal.SIGUSR1


class WorkerWatch:
    """While a run uses the cluster, stop it with one line when the scheduler has had no worker, or
    has not answered, for ``bound`` seconds: a run whose only worker was killed otherwise waited for
    ever at "train: 24/42 tasks done". The scheduler is asked for its workers every WATCH_INTERVAL
    seconds from a thread; busy workers are workers, so a long task never trips it. It stops the main
    thread, wherever that waits (a gather, a scatter, a sync call), with WATCH_SIGNAL, whose handler
    raises :class:`WorkersGone` there. Main thread only (signal handlers are its): from another thread
    it cannot interrupt the wait (``error`` says what it found)."""

    def __init__(self, client, cluster: str, bound: float, interval: float = WATCH_INTERVAL):
        self.client, self.cluster, self.bound, self.interval = client, cluster, bound, interval
        self.error: WorkersGone | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._armed = False  # the handler may raise (once)
        self._installed = False  # the handler is ours until the block ends; then ``_old`` again
        self._old = None
        self._thread = threading.Thread(target=self._run, name="metricpipe-worker-watch", daemon=True)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(WATCH_SIGNAL, self._raise)
            self._installed = self._armed = True
        self._thread.start()
        return self

    def __exit__(self, kind, value, tb):
        with self._lock:
            self._armed = False
            self._stop.set()
        self._thread.join()
        if self._installed:
            signal.signal(WATCH_SIGNAL, signal.SIG_DFL if self._old is None else self._old)
        return False

    def _raise(self, signum, frame):
        if self._armed and self.error is not None:
            self._armed = False  # once: the cleanup that follows must not be cut short again
            raise self.error

    def workers(self) -> int | None:
        """The scheduler's worker count; None when it does not answer."""
        try:
            return len(self.client.nthreads(callback_timeout=max(1.0, self.interval * 5)))
        except Exception:  # noqa: BLE001 - a closed comm, a timeout: the scheduler is not answering
            return None

    def _run(self) -> None:
        since = None  # when the workers were last seen gone
        while not self._stop.wait(self.interval):
            n = self.workers()
            if n:
                since = None
                continue
            since = since if since is not None else time.monotonic()
            if time.monotonic() - since < self.bound:
                continue
            with self._lock:
                if self._stop.is_set():
                    return
                self.error = WorkersGone(self.message(n))
                if self._armed:
                    signal.pthread_kill(threading.main_thread().ident, WATCH_SIGNAL)
            return

    def message(self, n: int | None) -> str:
        where = f"cluster {self.cluster}"
        if n is None:
            return (
                f"{where}: the scheduler has not answered for {self.bound:g} s (wait_timeout); restart it "
                f"and its workers, or check the network, and run again"
            )
        if self.cluster == "local":
            return (
                f"{where}: no worker for {self.bound:g} s (wait_timeout): the local workers stopped and did "
                f"not restart; see the worker log in the store's logs/ and run again"
            )
        return (
            f"{where}: no worker for {self.bound:g} s (wait_timeout): the scheduler's workers are gone; "
            f"start workers ('dask worker {self.client.scheduler.address}') and run again"
        )
