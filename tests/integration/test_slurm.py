"""cluster/slurm.yaml on a real SLURM: a one-node cluster on this machine (Debian's slurm-wlm and
munge; munged, slurmctld and slurmd started here as root processes with their config, key, state and
logs in a tmp dir; proctrack/linuxproc, no cgroups) runs the pipeline's workers as batch jobs through
dask-jobqueue. The metrics equal a LocalCluster run's, the workers really were SLURM jobs, and
nothing the run starts listens beyond 127.0.0.1."""

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import yaml
from click.testing import CliRunner

from metricpipe.cli import main
from metricpipe.cluster import connect
from metricpipe.cluster import spec as cluster_spec
from tests.integration.helpers import run_results

pytestmark = pytest.mark.integration

SPEC = Path(__file__).parents[2] / "cluster/slurm.yaml"
PARTITION = "metricpipe"
DAEMONS = ("munged", "slurmctld", "slurmd")
COMMANDS = ("sbatch", "squeue", "sinfo", "scancel")
CONFIG = {
    "data": {"source": "digits", "split": {"test": 0.25, "seed": 1}, "chunk_mb": 0.1},
    "methods": [{"method": "identity"}, {"method": "pca", "dim": [8, 16]}],
    "evaluate": {"retrieval": {"k": [1, 10]}, "classification": {"classifiers": ["knn1", "ncm"]}},
    "workers": 1,
    "dashboard": "127.0.0.1:0",
}

SLURM_CONF = """\
ClusterName=metricpipe-test
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={root}/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
NodeName={node} NodeAddr=127.0.0.1 CPUs=2 RealMemory=2048 State=UNKNOWN
PartitionName={partition} Nodes={node} Default=YES MaxTime=30 State=UP
"""


def _which(name: str) -> str | None:
    # the daemons live in /usr/sbin, which a non-login PATH may leave out
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _logs(root: Path) -> str:
    return "\n".join(
        f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:])
        for p in sorted((root / "log").glob("*"))
    )


def _wait(what: str, ready, root: Path, procs: list, timeout: float = 60):
    deadline = time.time() + timeout
    while not ready():
        dead = [p.args[0] for p in procs if p.poll() is not None]
        if dead or time.time() > deadline:
            pytest.fail(
                f"one-node SLURM: {what} not ready after {timeout:g} s"
                f"{f' ({dead} exited)' if dead else ''}\n{_logs(root)}"
            )
        time.sleep(0.3)


def _slurm(*args) -> str:
    return subprocess.run([_which(args[0]), *args[1:]], capture_output=True, text=True, check=True, timeout=30).stdout


def _jobs() -> set[str]:
    return set(_slurm("squeue", "-h", "-p", PARTITION, "-o", "%i").split())


def _no_jobs_left(timeout: float = 30) -> bool:
    """Whether the partition empties within ``timeout`` (a cancelled job lingers while completing)."""
    deadline = time.time() + timeout
    while _jobs():
        if time.time() > deadline:
            return False
        time.sleep(0.5)
    return True


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A one-node SLURM on 127.0.0.1 (partition ``metricpipe``, 2 CPUs, 2 GB), SLURM_CONF set for
    sbatch/squeue; yields its tmp dir (``jobcomp.txt`` lists every finished job), stops it all after."""
    missing = [b for b in DAEMONS + COMMANDS if _which(b) is None]
    if missing:
        pytest.fail(
            f"SLURM is not installed ({', '.join(missing)} not found): apt-get install slurm-wlm munge "
            f"(Debian's packages; .ci/run installs them)"
        )
    if os.geteuid() != 0:
        pytest.fail("the one-node SLURM needs root: slurmd starts each job as its user (CI runs as root)")
    root = tmp_path_factory.mktemp("slurm")
    for d in ("munge", "state", "spool", "log"):
        (root / d).mkdir()
    key = root / "munge/munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)  # munged refuses a key others can read
    node = socket.gethostname().split(".")[0]
    ctld_port, slurmd_port = _free_ports(2)
    conf = root / "slurm.conf"
    conf.write_text(
        SLURM_CONF.format(root=root, node=node, ctld_port=ctld_port, slurmd_port=slurmd_port, partition=PARTITION)
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    commands = {
        "munged": [
            "-F",
            "--force",
            f"--key-file={key}",
            f"--socket={root}/munge/munge.socket",
            f"--pid-file={root}/munge/munged.pid",
            f"--seed-file={root}/munge/munged.seed",
            f"--log-file={root}/log/munged.log",
        ],
        "slurmctld": ["-D", "-i", "-f", str(conf)],
        "slurmd": ["-D", "-N", node, "-f", str(conf)],
    }
    procs = []
    try:
        for name in DAEMONS:
            with open(root / f"log/{name}.out", "w") as out:
                procs.append(
                    subprocess.Popen(
                        [_which(name), *commands[name]],
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )
            if name == "munged":
                _wait("munged's socket", (root / "munge/munge.socket").exists, root, procs)

        def idle():
            state = subprocess.run(
                [_which("sinfo"), "-h", "-N", "-o", "%T"], env=env, capture_output=True, text=True, timeout=30
            )
            return state.stdout.strip() == "idle"

        _wait("the node (sinfo: idle)", idle, root, procs)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("SLURM_CONF", str(conf))
            yield root
            if _jobs():  # a test that failed half-way may leave its workers' jobs
                _slurm("scancel", "-p", PARTITION)
                _no_jobs_left()
    finally:
        for p in procs[::-1]:
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _spec(tmp_path, slurm, **change) -> Path:
    """cluster/slurm.yaml with this cluster's partition and a job size that fits its one node."""
    spec = yaml.safe_load(SPEC.read_text())
    spec.update(
        {
            "queue": PARTITION,
            "cores": 1,
            "processes": 1,
            "memory": "1GB",
            "walltime": "00:10:00",
            "log_directory": str(tmp_path / "slurm-logs"),
            **change,
        }
    )
    path = tmp_path / "slurm-spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _run(tmp_path, name, cluster="local"):
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({**CONFIG, "store": str(tmp_path / name), "cluster": str(cluster)}))
    res = CliRunner().invoke(main, ["run", str(cfg)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return run_results(tmp_path / name)


def _finished_workers(slurm) -> dict[str, str]:
    """jobcomp's record of finished dask-worker jobs: job id -> final state."""
    path = slurm / "jobcomp.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    fields = [dict(f.split("=", 1) for f in line.split() if "=" in f) for line in lines]
    return {f["JobId"]: f["JobState"] for f in fields if f.get("Name") == "dask-worker"}


def test_pipeline_on_slurm_workers_matches_local(tmp_path, slurm):
    before = _finished_workers(slurm)
    records, models = _run(tmp_path, "slurm", cluster=_spec(tmp_path, slurm))
    local, local_models = _run(tmp_path, "local")
    assert records == local  # every metric, exactly
    assert models.keys() == local_models.keys()
    for spec, arrays in models.items():
        for name, value in arrays.items():
            np.testing.assert_array_equal(value, local_models[spec][name], err_msg=f"{spec} {name}")
    # the run's one worker was a SLURM job, ended when the run closed its cluster
    jobs = {j: s for j, s in _finished_workers(slurm).items() if j not in before}
    assert len(jobs) == 1 and set(jobs.values()) <= {"CANCELLED", "COMPLETED"}, (jobs, _logs(slurm))
    assert _no_jobs_left()


def test_workers_are_slurm_jobs_listening_on_loopback(tmp_path, slurm):
    with connect(str(_spec(tmp_path, slurm)), 2) as client:
        client.wait_for_workers(2, timeout=120)
        running = _jobs()
        job_ids = client.run(lambda: os.environ.get("SLURM_JOB_ID"))  # os.environ.get would ship ours
        assert sorted(job_ids.values()) == sorted(running) and len(running) == 2, (job_ids, running)
        assert all(a.startswith("tcp://127.0.0.1:") for a in job_ids), job_ids
        assert client.scheduler.address.startswith("tcp://127.0.0.1:")
        # the scheduler and its dashboard (in this process, beside whatever else the session runs),
        # and every socket of the workers and their nannies
        ours = {int(a.rsplit(":", 1)[1]) for a in (client.scheduler.address, client.dashboard_link.split("/")[2])}
        listening = [
            c.laddr
            for c in psutil.Process().net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port in ours
        ]
        for pid in [*client.run(os.getpid).values(), *client.run(os.getpid, nanny=True).values()]:
            listening += [c.laddr for c in psutil.Process(pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN]
        assert len(listening) >= 2 + 2 * 2 and all(addr.ip == "127.0.0.1" for addr in listening), listening
    assert _no_jobs_left()  # closing the cluster cancels its jobs


@pytest.mark.parametrize(
    "spec, expected",
    [
        (
            {"memory": "10GB"},  # more memory than the node has: SLURM's own reason, before any job
            ("SLURM refuses the worker job: ", "Requested node configuration is not available"),
        ),
        (
            {"python": "/bin/false"},  # the job starts, but its worker command fails at once
            ("no worker joined the scheduler at tcp://127.0.0.1:", "within 5 s (slurm)"),
        ),
    ],
    ids=["job SLURM refuses", "worker that never joins"],
)
def test_a_cluster_that_cannot_give_workers_is_a_one_line_error(tmp_path, slurm, monkeypatch, spec, expected):
    monkeypatch.setattr(cluster_spec, "WORKER_WAIT", 5)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        yaml.safe_dump({**CONFIG, "store": str(tmp_path / "s"), "cluster": str(_spec(tmp_path, slurm, **spec))})
    )
    res = CliRunner().invoke(main, ["run", str(cfg)])
    assert res.exit_code == 2, res.output
    assert all(part in res.output for part in expected), res.output
    assert _no_jobs_left()
