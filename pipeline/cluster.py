"""Clusters: an embedded LocalCluster, an existing scheduler address, or a spec file for SLURM
(dask-jobqueue) or Kubernetes (dask-kubernetes)."""
import contextlib
import subprocess
from pathlib import Path

import yaml
from distributed import Client, LocalCluster

from metricpipe.tasks.errors import InputError

# A task may lose its worker this many times (pre-emption, OOM kill) before the run stops with a
# message naming the stage and block; its retries recompute the identical result.
ALLOWED_FAILURES = 3
# How long a run waits for its first worker from a SLURM or Kubernetes cluster (queued jobs, pulled images).
WORKER_WAIT = 600


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
        if kind == "slurm":
            check_slurm_job(cluster, c.job_script())
        c.scale(workers)
        try:
            client.wait_for_workers(1, timeout=WORKER_WAIT)
        except TimeoutError:
            raise InputError(f"{cluster}: no worker joined the scheduler at {c.scheduler_address} within "
                             f"{WORKER_WAIT} s ({kind}); see whether the jobs still wait for resources or "
                             f"ended (squeue, kubectl get pods) and the workers' logs (a worker that cannot "
                             f"reach that address needs the spec's interface)") from None
        yield client


def check_slurm_job(cluster: str, script: str) -> None:
    """Refuse a worker job SLURM would reject (partition, account, memory, walltime), with SLURM's
    own words, before any job is submitted: a rejected submission would otherwise surface only as a
    worker that never comes."""
    try:
        res = subprocess.run(["sbatch", "--test-only"], input=script, capture_output=True, text=True,
                             timeout=60)
    except FileNotFoundError:
        raise InputError(f"{cluster}: sbatch not found; run on a machine that can submit SLURM jobs "
                         f"(a login node)") from None
    if res.returncode != 0:
        why = "; ".join(line.strip().removeprefix("sbatch: error: ") for line in res.stderr.splitlines()
                        if line.strip()) or f"exit code {res.returncode}"
        raise InputError(f"{cluster}: SLURM refuses the worker job: {why}; check the spec's queue, account, "
                         f"cores, memory and walltime") from None
