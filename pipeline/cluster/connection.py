"""The one way in: the cluster a setting names (local, a scheduler address, a spec file), connected
and watched, with a failed connection between its members one line."""

import contextlib

from metricpipe.cluster.heap import HeapTemporaries
from metricpipe.cluster.local import local_client
from metricpipe.cluster.scheduler import scheduler_client
from metricpipe.cluster.spec import spec_cluster_client
from metricpipe.cluster.watch import WorkerWatch
from metricpipe.config import RunConfig
from metricpipe.tasks.errors import InputError


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
    """Yield a connected Client (`cluster_client`), its workers' heap set (:class:`HeapTemporaries`); a
    failed connection between the cluster's members while it is used (a worker registered at an
    address the scheduler or this machine cannot reach: OSError from the plugin's registration, a
    scatter or a gather) is one line naming the address."""
    with cluster_client(cluster, workers, threads_per_worker, memory_limit, dashboard, tls, wait_timeout) as client:
        try:
            client.register_plugin(HeapTemporaries())  # (reaches every worker: a failure is the one line below)
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
        connected = local_client(workers, threads_per_worker, memory_limit, dashboard)
    elif cluster.startswith(("tcp://", "tls://")):
        connected = scheduler_client(cluster, tls, wait_timeout)
    else:
        connected = spec_cluster_client(cluster, workers)
    with connected as client, WorkerWatch(client, cluster, wait_timeout):
        yield client
