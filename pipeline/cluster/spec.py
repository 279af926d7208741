"""A cluster from a YAML spec: SLURM (dask-jobqueue), its keys and its worker job checked before any
job is submitted, or Kubernetes (dask-kubernetes)."""

import contextlib
import subprocess
from pathlib import Path

from distributed import Client

from metricpipe.cluster.dashboard import taken_port_quiet
from metricpipe.config import read_yaml
from metricpipe.tasks.errors import InputError

# How long a run waits for its first worker from a SLURM or Kubernetes cluster (queued jobs, pulled images).
WORKER_WAIT = 600


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
def spec_cluster_client(cluster: str, workers: int):
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
