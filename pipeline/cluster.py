"""Clusters: an embedded LocalCluster, an existing scheduler address, or a spec file for SLURM
(dask-jobqueue) or Kubernetes (dask-kubernetes)."""

import contextlib
import errno
import ipaddress
import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import dask
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import WorkerPlugin

from metricpipe.config import RunConfig, read_yaml
from metricpipe.errors import WorkersGone
from metricpipe.tasks.errors import InputError

# A task may lose its worker this many times (pre-emption, OOM kill) before the run stops with a
# message naming the stage and block; its retries recompute the identical result.
ALLOWED_FAILURES = 3
# How long a run waits for its first worker from a SLURM or Kubernetes cluster (queued jobs, pulled images).
WORKER_WAIT = 600
CONNECT_TIMEOUT = "10s"  # a scheduler address that does not answer within it is an input error
# How often the watch of a connected cluster asks the scheduler for its workers (seconds).
WATCH_INTERVAL = 1.0
# The signal the watch stops the main thread with (a real signal: it wakes a wait blocked in a lock).
WATCH_SIGNAL = signal.SIGUSR1


TLS_ENV = ("METRICPIPE_TLS_CA_FILE", "METRICPIPE_TLS_CERT", "METRICPIPE_TLS_KEY")


def tls_security(cluster: str, tls: tuple | None):
    """Dask's Security for a tls:// scheduler: the config's ``tls: {ca_file, cert, key}``, else the
    environment (METRICPIPE_TLS_CA_FILE, _CERT, _KEY), else Dask's own ``distributed.comm.tls``
    settings; encryption required. Missing or unreadable files are one line naming the setting."""
    import os

    from distributed.security import Security

    if tls is None and all(os.environ.get(k) for k in TLS_ENV):
        tls, where = tuple(os.environ[k] for k in TLS_ENV), "environment " + ", ".join(TLS_ENV)
    else:
        where = "config tls"
    if tls is None:
        sec = Security(require_encryption=True)
        if not (sec.tls_ca_file and sec.tls_client_cert):
            raise InputError(
                f"cluster {cluster}: a tls:// scheduler needs certificates; give tls: {{ca_file, cert, "
                f"key}} in the config or set {', '.join(TLS_ENV)}"
            )
        return sec
    for name, path in zip(("ca_file", "cert", "key"), tls):
        if not os.path.isfile(path):
            raise InputError(f"{path}: file not found ({where}: {name}); give the PEM file's path")
    return Security(tls_ca_file=tls[0], tls_client_cert=tls[1], tls_client_key=tls[2], require_encryption=True)


def dashboard_address(dashboard: str | None) -> str | None:
    """Where the local dashboard listens: 127.0.0.1 unless the config names a host (``0.0.0.0:8787``
    opens it to the network deliberately); a taken port is swapped for a free one here, so Dask does
    not warn about it (the link printed is the real one)."""
    if dashboard is None:
        return None
    host, _, port = dashboard.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if port != "0" and not _port_free(host, int(port)):
        port = "0"
    return f"{host}:{port}"


def dashboard_lines(client) -> list[str]:
    """``Dashboard: LINK`` for where the dashboard really listens, and a warning line when that is every
    interface of this machine; none when there is no dashboard.

    Dask's own link names the scheduler's host (127.0.0.1 for a local cluster) whatever the dashboard
    binds, so ``0.0.0.0:8791`` or ``0:8787`` printed a loopback link for a dashboard open to the
    network. A scheduler that runs in this process (a local or SLURM cluster) says where its dashboard
    listens; a remote one's link is Dask's."""
    from distributed.utils import format_dashboard_link, get_ip

    server = getattr(getattr(getattr(client, "cluster", None), "scheduler", None), "http_server", None)
    host, port = getattr(server, "address", None), getattr(server, "port", None)
    if host is None or port is None:
        link = client.dashboard_link
        return [f"Dashboard: {link}"] if link else []
    if not ipaddress.ip_address(host).is_unspecified:
        return [f"Dashboard: {format_dashboard_link(f'[{host}]' if ':' in host else host, port)}"]
    return [
        f"Dashboard: {format_dashboard_link(get_ip(), port)}",  # the address other machines reach
        f"warning: the dashboard listens on every interface of this machine ({host}:{port}): whoever can "
        f"reach it can watch the run and stop its tasks; dashboard: 127.0.0.1:{port} keeps it to this machine",
    ]


class DashboardHostError(InputError):
    """The dashboard's host is not an address of this machine: found when the cluster starts, so the
    run adds its config file's name."""


def _port_free(host: str, port: int) -> bool:
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:  # an unknown name (gaierror) or another machine's address: the host's fault
            if isinstance(e, socket.gaierror) or e.errno == errno.EADDRNOTAVAIL:
                raise DashboardHostError(
                    f"dashboard: {host} is not an address of this machine (or does not "
                    f"resolve); give 127.0.0.1:PORT, 0.0.0.0:PORT to open it to the "
                    f"network, or false"
                ) from None
            return False  # taken
    return True


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
def taken_port_quiet():
    """Dask's multi-line "Port 8787 is already in use ... Hosting the HTTP server on port N instead"
    warning, silenced while a scheduler starts here: the port is taken between dashboard_address's
    check and the bind when another run starts at the same moment, and the link printed is the real
    one either way."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Port \d+ is already in use", category=UserWarning)
        yield


@contextlib.contextmanager
def connect(
    cluster: str,
    workers: int,
    threads_per_worker: int = 1,
    memory_limit="auto",
    dashboard: str | None = ":8787",
    tls: tuple | None = None,
    wait_timeout: float | None = None,
):
    """Yield a connected Client (`cluster_client`); a failed connection between the cluster's members
    while it is used (a worker registered at an address the scheduler or this machine cannot reach:
    OSError from a scatter or a gather) is one line naming the address."""
    with cluster_client(cluster, workers, threads_per_worker, memory_limit, dashboard, tls, wait_timeout) as client:
        try:
            yield client
        except OSError as e:
            if not comm_failure(e):
                raise
            raise InputError(
                f"cluster {cluster}: {str(e).splitlines()[0]}; a worker (or the scheduler) cannot be "
                f"reached at the address it registered: start workers with an address the scheduler "
                f"and this machine reach (dask worker --host, --contact-address)"
            ) from None


def comm_failure(e: BaseException) -> bool:
    """Whether ``e`` was raised by Dask's comm layer, here or on the scheduler (whose traceback comes
    with the error it sends back): a connection between the cluster's members that failed, not a file."""
    tb, last = e.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    module = last.tb_frame.f_globals.get("__name__", "") if last is not None else ""
    return module.startswith("distributed.comm") or type(e).__module__.startswith("distributed.comm")


@contextlib.contextmanager
def cluster_client(
    cluster: str,
    workers: int,
    threads_per_worker: int = 1,
    memory_limit="auto",
    dashboard: str | None = ":8787",
    tls: tuple | None = None,
    wait_timeout: float | None = None,
):
    """Yield a connected Client; close what this function started on exit.

    ``cluster`` is ``local``, ``tcp://HOST:PORT``, ``tls://HOST:PORT`` (its Security from ``tls``, the
    environment or Dask's settings: `tls_security`) or the path of a YAML spec with ``kind: slurm`` or
    ``kind: kubernetes`` and the keyword arguments of that cluster class.

    No wait on the cluster is longer than ``wait_timeout`` seconds (None: the config's default): a
    scheduler's answer (at most CONNECT_TIMEOUT), its first worker, and, while the block runs, a time
    with no worker at all (`WorkerWatch`).
    """
    if wait_timeout is None:
        wait_timeout = RunConfig.wait_timeout
    if cluster == "local":
        connected = _local(workers, threads_per_worker, memory_limit, dashboard)
    elif cluster.startswith(("tcp://", "tls://")):
        connected = _scheduler(cluster, tls, wait_timeout)
    else:
        connected = _spec_cluster(cluster, workers)
    with connected as client, WorkerWatch(client, cluster, wait_timeout):
        yield client


@contextlib.contextmanager
def _local(workers: int, threads_per_worker: int, memory_limit, dashboard: str | None):
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


@contextlib.contextmanager
def _scheduler(cluster: str, tls: tuple | None, wait_timeout: float):
    """A client of a running scheduler (tcp:// or tls://), once it answers and has a worker."""
    security = tls_security(cluster, tls) if cluster.startswith("tls://") else None
    try:
        check_scheduler(cluster, security, min(_seconds(CONNECT_TIMEOUT), wait_timeout))
        client = Client(cluster, timeout=CONNECT_TIMEOUT, security=security)
    except (OSError, TimeoutError) as e:
        raise InputError(
            f"cluster {cluster}: cannot reach the scheduler ({e}); start it with "
            f"'dask scheduler' or check the address" + (" and the tls certificates" if security else "")
        ) from None
    with client:
        try:
            client.wait_for_workers(1, timeout=wait_timeout)
        except TimeoutError:
            raise InputError(
                f"cluster {cluster}: no worker joined the scheduler within {wait_timeout:g} s "
                f"(wait_timeout); start one ('dask worker {cluster}') and run again, or raise "
                f"wait_timeout (--wait-timeout)"
            ) from None
        yield client


def _spec_class(cluster: str, spec: dict):
    """(the cluster class a spec's ``kind`` names, checked, ready to start, the kind)."""
    kind = spec.pop("kind", None)
    if kind == "slurm":
        try:
            SLURMCluster = slurm_cluster_class()
        except ImportError:
            raise InputError(f"{cluster}: kind slurm needs dask-jobqueue; pip install 'metricpipe[slurm]'") from None
        except ValueError as e:  # dask-jobqueue sets a signal handler when imported: main thread only
            raise InputError(
                f"{cluster}: dask-jobqueue cannot be imported outside the main thread ({e}); start "
                f"the SLURM run from the main thread, or import dask_jobqueue there first"
            ) from None
        check_slurm_spec(cluster, spec, SLURMCluster)
        return SLURMCluster, kind
    if kind == "kubernetes":
        try:
            from dask_kubernetes.operator import KubeCluster  # (optional: the kubernetes extra)
        except ImportError:
            raise InputError(
                f"{cluster}: kind kubernetes needs dask-kubernetes; pip install 'metricpipe[kubernetes]'"
            ) from None
        return KubeCluster, kind
    raise InputError(f"{cluster}: kind must be slurm or kubernetes (cluster spec), got {kind!r}")


@contextlib.contextmanager
def _spec_cluster(cluster: str, workers: int):
    """The SLURM or Kubernetes cluster a YAML spec describes, scaled to ``workers``, and its client."""
    spec_path = Path(cluster)
    if not spec_path.is_file():
        raise InputError(
            f"{cluster}: cluster spec not found (cluster); use local, tcp://HOST:PORT or a spec under cluster/"
        )
    spec = read_yaml(spec_path, "a cluster spec") or {}
    if not isinstance(spec, dict):
        raise InputError(
            f"{cluster}: a cluster spec is a YAML mapping (kind: slurm | kubernetes, then that "
            f"cluster's arguments), got a {type(spec).__name__}; see cluster/slurm.yaml"
        )
    cls, kind = _spec_class(cluster, spec)
    if kind != "slurm":
        cm = cls(**spec)
    else:
        try:
            with taken_port_quiet():  # its scheduler's dashboard runs here, on 8787 unless the spec says
                cm = cls(**spec)
        except (ValueError, TypeError) as e:  # a value of a kind the checks above do not know
            raise InputError(
                f"{cluster}: dask-jobqueue refuses the SLURM spec: {str(e).splitlines()[0]}; check "
                f"its values against cluster/slurm.yaml"
            ) from None
    with cm as c, Client(c) as client:
        if kind == "slurm":
            check_slurm_job(cluster, c.job_script())
        c.scale(workers)
        try:
            client.wait_for_workers(1, timeout=WORKER_WAIT)
        except TimeoutError:
            raise InputError(
                f"{cluster}: no worker joined the scheduler at {c.scheduler_address} within "
                f"{WORKER_WAIT} s ({kind}); see whether the jobs still wait for resources or "
                f"ended (squeue, kubectl get pods) and the workers' logs (a worker that cannot "
                f"reach that address needs the spec's interface)"
            ) from None
        yield client


# Not a spec's to set: the cluster class passes them itself.
SLURM_INTERNAL = {"self", "scheduler", "job_cls", "loop", "asynchronous"}


def slurm_keys(SLURMCluster) -> set:
    """The keys a SLURM spec may hold: SLURMCluster's own arguments and its job class's (dask-jobqueue
    hands the rest of the spec to the job, whose bases take what it passes on)."""
    import inspect

    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    keys = {p.name for p in inspect.signature(SLURMCluster.__init__).parameters.values() if p.kind in named}
    for c in SLURMCluster.job_cls.__mro__:
        if "__init__" not in c.__dict__:
            continue
        params = inspect.signature(c.__dict__["__init__"]).parameters.values()
        keys |= {p.name for p in params if p.kind in named}
        if not any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params):
            break
    return keys - SLURM_INTERNAL


def check_slurm_spec(cluster: str, spec: dict, SLURMCluster) -> None:
    """One line naming the spec file and the key for what dask-jobqueue refuses in several lines (a
    ValueError naming job_kwargs, or asking for SLURMCluster(cores=..., memory=...)): an unknown key,
    cores or memory missing (from the spec and from Dask's jobqueue.slurm settings), or not a count
    and a size."""
    import difflib

    import dask
    from dask.utils import parse_bytes

    keys = slurm_keys(SLURMCluster)
    for key in spec:
        if key not in keys:
            near = difflib.get_close_matches(str(key), sorted(keys), n=1)
            raise InputError(
                f"{cluster}: {key}: unknown key of a SLURM spec (the arguments of dask-jobqueue's "
                f"SLURMCluster); " + (f"did you mean '{near[0]}'?" if near else "see cluster/slurm.yaml")
            )
    for key in ("cores", "memory"):
        if spec.get(key) is None and dask.config.get(f"jobqueue.slurm.{key}", None) is None:
            raise InputError(
                f"{cluster}: {key}: missing; a SLURM spec gives each job's cores and memory (e.g. "
                f"cores: 4, memory: 16GB; see cluster/slurm.yaml)"
            )
    for key in ("cores", "processes"):
        v = spec.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise InputError(f"{cluster}: {key}: expected a whole number >= 1, got {v!r}")
    v = spec.get("memory")
    try:
        ok = v is None or not isinstance(v, bool) and (parse_bytes(v) if isinstance(v, str) else v) > 0
    except (ValueError, TypeError, OverflowError):
        ok = False
    if not ok:
        raise InputError(f"{cluster}: memory: expected each job's memory as a size such as 16GB, got {v!r}")


def _seconds(t) -> float:
    from dask.utils import parse_timedelta

    return parse_timedelta(t, "s")


def check_scheduler(address: str, security, timeout: float) -> None:
    """Connect to ``address`` and complete Dask's handshake within ``timeout`` seconds: OSError when
    nothing accepts the connection, InputError when what does is not a Dask scheduler. distributed
    bounds the TCP connect only (its handshake read has no timeout), so Client() at a port that
    accepts connections but does not speak Dask (a silent listener, an HTTP server) waited forever.
    Run in a thread of its own: this process may already run an event loop."""
    import asyncio
    import socket

    from distributed.comm import connect as comm_connect
    from distributed.comm.addressing import get_address_host_port

    with socket.create_connection(get_address_host_port(address), timeout=timeout):  # OSError: nothing accepts
        pass  # (first on its own: the handshake's bound below must not cut a slow connect short)
    args = security.get_connection_args("client") if security is not None else {}

    async def probe():
        comm = await comm_connect(address, timeout=timeout, **args)
        await comm.close()

    outcome = []

    def run():
        try:
            asyncio.run(asyncio.wait_for(probe(), timeout))
            outcome.append(None)
        except (asyncio.TimeoutError, TimeoutError):  # connected (a failed connect is an OSError)
            outcome.append(f"no Dask handshake within {timeout:g} s")
        except OSError as e:
            outcome.append(e)
        except Exception as e:  # noqa: BLE001 - whatever the port sent back: not a scheduler's answer
            outcome.append(f"its answer is not Dask's ({type(e).__name__})")

    t = threading.Thread(target=run, name="metricpipe-scheduler-check", daemon=True)
    t.start()
    t.join(timeout + 5)
    why = outcome[0] if outcome else f"no Dask handshake within {timeout:g} s"
    if isinstance(why, OSError):
        raise why
    if why is not None:
        raise InputError(
            f"cluster {address}: a program listens there but it is not a Dask scheduler ({why}); "
            f"check the address and port ('dask scheduler' prints its address)"
        )


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


def slurm_cluster_class():
    """dask-jobqueue's SLURMCluster, imported without the SIGINT handler its runner module sets when
    imported (``signal.signal(SIGINT, lambda *_: sys.exit())``, dask-jobqueue 0.9): with that handler
    a Ctrl-C during a SLURM run raised SystemExit, not KeyboardInterrupt, so the run exited with
    status 0 and no resume hint, and stayed so for the rest of the process."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():  # nothing to restore from here
        from dask_jobqueue import SLURMCluster

        return SLURMCluster
    before = signal.getsignal(signal.SIGINT)  # None: a handler not set from Python, left as it is
    try:
        from dask_jobqueue import SLURMCluster
    finally:
        if before is not None and signal.getsignal(signal.SIGINT) is not before:
            signal.signal(signal.SIGINT, before)
    return SLURMCluster


# sbatch's words when it reaches no controller (no slurm.conf, slurmctld down): not the spec's fault
UNREACHABLE_SLURM = (
    "Could not establish a configuration source",
    "Unable to contact slurm controller",
    "Socket timed out on send/recv operation",
    "Unable to establish control machine",
)


def check_slurm_job(cluster: str, script: str) -> None:
    """Refuse a worker job SLURM would reject (partition, account, memory, walltime), with SLURM's
    own words, before any job is submitted: a rejected submission would otherwise surface only as a
    worker that never comes."""
    try:
        res = subprocess.run(["sbatch", "--test-only"], input=script, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise InputError(
            f"{cluster}: sbatch not found; run on a machine that can submit SLURM jobs (a login node)"
        ) from None
    if res.returncode != 0:
        why = (
            "; ".join(line.strip().removeprefix("sbatch: error: ") for line in res.stderr.splitlines() if line.strip())
            or f"exit code {res.returncode}"
        )
        if any(s in res.stderr for s in UNREACHABLE_SLURM):  # nothing in the spec can fix this
            raise InputError(
                f"{cluster}: SLURM's controller cannot be reached from this machine ({why}); run on "
                f"a login node of a working SLURM cluster, or check slurmctld and slurm.conf"
            ) from None
        raise InputError(
            f"{cluster}: SLURM refuses the worker job: {why}; check the spec's queue, account, "
            f"cores, memory and walltime"
        ) from None
