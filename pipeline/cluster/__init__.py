"""Clusters: an embedded LocalCluster, an existing scheduler address, or a spec file for SLURM
(dask-jobqueue) or Kubernetes (dask-kubernetes).

connection  connect(): the cluster a setting names, connected and watched
local       the embedded LocalCluster, its workers and the signals while it starts
scheduler   a running scheduler (tcp://, tls://): TLS settings, the handshake check
spec        a spec file's SLURM or Kubernetes cluster; the SLURM spec and job checks
watch       WorkerWatch: stop a run that has had no worker for wait_timeout seconds
dashboard   where the dashboard listens and the link printed for it
heap        HeapTemporaries: workers' numpy temporaries from the heap, not fresh pages
"""

from metricpipe.cluster.connection import cluster_client, comm_failure, connect
from metricpipe.cluster.dashboard import DashboardHostError, dashboard_address, dashboard_lines, taken_port_quiet
from metricpipe.cluster.local import ALLOWED_FAILURES, interrupts_deferred, quiet_resource_tracker, raise_pending
from metricpipe.cluster.scheduler import check_scheduler, tls_security
from metricpipe.cluster.spec import check_slurm_job, check_slurm_spec, slurm_cluster_class, slurm_keys
from metricpipe.cluster.watch import WATCH_INTERVAL, WATCH_SIGNAL, WorkerWatch

__all__ = [
    "ALLOWED_FAILURES",
    "WATCH_INTERVAL",
    "WATCH_SIGNAL",
    "DashboardHostError",
    "WorkerWatch",
    "check_scheduler",
    "check_slurm_job",
    "check_slurm_spec",
    "cluster_client",
    "comm_failure",
    "connect",
    "dashboard_address",
    "dashboard_lines",
    "interrupts_deferred",
    "quiet_resource_tracker",
    "raise_pending",
    "slurm_cluster_class",
    "slurm_keys",
    "taken_port_quiet",
    "tls_security",
]
