"""Clusters: an embedded LocalCluster, an existing scheduler address, or a spec file for SLURM
(dask-jobqueue) or Kubernetes (dask-kubernetes)."""
import contextlib
from pathlib import Path

import yaml
from distributed import Client, LocalCluster

from metricpipe.tasks.errors import InputError

# A task may lose its worker this many times (pre-emption, OOM kill) before the run stops with a
# message naming the stage and block; its retries recompute the identical result.
ALLOWED_FAILURES = 3


@contextlib.contextmanager
def connect(cluster: str, workers: int, threads_per_worker: int = 1, memory_limit="auto",
            dashboard: str | None = ":8787"):
    """Yield a connected Client; close what this function started on exit.

    ``cluster`` is ``local``, ``tcp://HOST:PORT`` or the path of a YAML spec with ``kind: slurm`` or
    ``kind: kubernetes`` and the keyword arguments of that cluster class.
    """
    if cluster == "local":
        import dask
        dask.config.set({"distributed.scheduler.allowed-failures": ALLOWED_FAILURES})
        with LocalCluster(n_workers=workers, threads_per_worker=threads_per_worker, processes=True,
                          memory_limit=memory_limit, dashboard_address=dashboard) as lc, Client(lc) as client:
            yield client
        return
    if cluster.startswith(("tcp://", "tls://", "ucx://")):
        try:
            client = Client(cluster, timeout="10s")
        except (OSError, TimeoutError) as e:
            raise InputError(f"cluster {cluster}: cannot reach the scheduler ({e}); start it with "
                             f"'dask scheduler' or check the address") from None
        with client:
            yield client
        return
    spec_path = Path(cluster)
    if not spec_path.is_file():
        raise InputError(f"{cluster}: cluster spec not found (cluster); use local, tcp://HOST:PORT or a spec "
                         f"under cluster/")
    spec = yaml.safe_load(spec_path.read_text()) or {}
    kind = spec.pop("kind", None)
    if kind == "slurm":
        try:
            from dask_jobqueue import SLURMCluster
        except ImportError:
            raise InputError(f"{cluster}: kind slurm needs dask-jobqueue; pip install 'metricpipe[slurm]'") from None
        cm = SLURMCluster(**spec)
    elif kind == "kubernetes":
        try:
            from dask_kubernetes.operator import KubeCluster
        except ImportError:
            raise InputError(f"{cluster}: kind kubernetes needs dask-kubernetes; "
                             f"pip install 'metricpipe[kubernetes]'") from None
        cm = KubeCluster(**spec)
    else:
        raise InputError(f"{cluster}: kind must be slurm or kubernetes (cluster spec), got {kind!r}")
    with cm as c, Client(c) as client:
        c.scale(workers)
        client.wait_for_workers(1, timeout=600)
        yield client
