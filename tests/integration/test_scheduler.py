"""The same config on a LocalCluster with 1 and with 3 workers and on a real `dask scheduler` with
two `dask worker` processes on 127.0.0.1 gives identical models and metrics."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from metricpipe.cli import main
from tests.integration.helpers import run_results

pytestmark = pytest.mark.integration

CONFIG = {
    "data": {"source": "digits", "split": {"test": 0.25, "seed": 1}, "chunk_mb": 0.1},
    "methods": [
        {"method": "pca", "dim": [8, 16]},
        {"method": "lda"},
        {"method": "pcaw", "dim": 16},
        {"method": "random", "dim": 8, "random_state": 3},
        {"method": "slne", "input_dim": 24, "step": 0.02, "epochs": 2},
        {"method": "slde", "members": 3, "member_dim": 8, "step": 0.02, "epochs": 2, "refine": True},
        {"method": "slde", "members": 2, "member_dim": 8, "subspace": "random", "epochs": 1},
    ],
    "neighbours": {"k": 5},
    "dashboard": ":0",
    "evaluate": {"retrieval": {"k": [1, 10]}, "classification": {"classifiers": ["knn1", "knn5", "ncm", "softvote3"]}},
}


@pytest.fixture
def scheduler(tmp_path):
    file = tmp_path / "scheduler.json"
    dask = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
    procs = [
        subprocess.Popen(
            dask + ["--host", "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file", str(file)],
            stderr=subprocess.DEVNULL,
        )
    ]
    try:
        for _ in range(2):
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "distributed.cli.dask_worker",
                        "--scheduler-file",
                        str(file),
                        "--nthreads",
                        "1",
                        "--host",
                        "127.0.0.1",
                        "--no-dashboard",
                    ],
                    stderr=subprocess.DEVNULL,
                )
            )
        deadline = time.time() + 60
        while not file.exists() and time.time() < deadline:
            time.sleep(0.2)
        address = json.loads(file.read_text())["address"]
        from distributed import Client

        with Client(address) as c:
            c.wait_for_workers(2, timeout=60)
        yield address
    finally:
        for p in procs[::-1]:
            p.terminate()
            p.wait(timeout=30)


def _run(tmp_path, name, *extra):
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({**CONFIG, "store": str(tmp_path / name)}))
    res = CliRunner().invoke(main, ["run", str(cfg), *extra], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return (*run_results(tmp_path / name), res.output)


def test_one_three_and_remote_workers_agree_exactly(tmp_path, scheduler):
    remote, remote_models, out = _run(tmp_path, "remote", "--cluster", scheduler)
    assert "Dashboard:" in out and "Completed 7 of 7 stages" in out
    local, local_models, _ = _run(tmp_path, "local", "--workers", "1")
    three, three_models, _ = _run(tmp_path, "three", "--workers", "3")
    for other, other_models in ((local, local_models), (three, three_models)):
        assert remote == other  # every metric, exactly
        assert remote_models.keys() == other_models.keys()
        for spec, arrays in remote_models.items():
            for name, value in arrays.items():
                np.testing.assert_array_equal(value, other_models[spec][name], err_msg=f"{spec} {name}")


def test_unreachable_scheduler_is_a_one_line_error(tmp_path, monkeypatch):
    from metricpipe import cluster

    monkeypatch.setattr(cluster.scheduler, "CONNECT_TIMEOUT", "1s")  # the error, not the 10 s wait, is under test
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({**CONFIG, "store": str(tmp_path / "s"), "cluster": "tcp://127.0.0.1:1"}))
    res = CliRunner().invoke(main, ["run", str(cfg)])
    assert res.exit_code == 2 and "cannot reach the scheduler" in res.output


@pytest.fixture
def bare_scheduler(tmp_path):
    """A `dask scheduler` on 127.0.0.1 with no worker; ``add_worker(*args)`` starts one (no nanny: a
    killed worker stays dead)."""
    file = tmp_path / "bare-scheduler.json"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "distributed.cli.dask_scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--no-dashboard",
                "--scheduler-file",
                str(file),
            ],
            stderr=subprocess.DEVNULL,  # its connections to workers give up after 3 s
            env={**os.environ, "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "3s"},
        )
    ]

    def add_worker(*where):
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "distributed.cli.dask_worker",
                    "--scheduler-file",
                    str(file),
                    "--nthreads",
                    "1",
                    *(where or ("--host", "127.0.0.1")),
                    "--no-dashboard",
                    "--no-nanny",
                ],
                stderr=subprocess.DEVNULL,
            )
        )
        from distributed import Client

        with Client(address) as c:
            c.wait_for_workers(1, timeout=60)

    try:
        deadline = time.time() + 60
        while not file.exists() and time.time() < deadline:
            time.sleep(0.2)
        address = json.loads(file.read_text())["address"]
        yield address, add_worker
    finally:
        for p in procs[::-1]:
            p.terminate()
            p.wait(timeout=30)


def _invoke_timed(*args):
    t0 = time.monotonic()
    res = CliRunner().invoke(main, [str(a) for a in args])
    return res, time.monotonic() - t0


def test_a_scheduler_without_workers_is_one_line_within_the_wait_timeout(tmp_path, bare_scheduler):
    """It waited for ever, without a word."""
    address, _ = bare_scheduler
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({**CONFIG, "store": str(tmp_path / "s"), "wait_timeout": 3}))
    res, seconds = _invoke_timed("run", cfg, "--cluster", address)
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert res.output.strip().splitlines()[-1] == (
        f"error: cluster {address}: no worker joined the scheduler within 3 s (wait_timeout); start one "
        f"('dask worker {address}') and run again, or raise wait_timeout (--wait-timeout)"
    ), res.output
    assert seconds < 30, seconds


def test_a_run_whose_only_worker_is_killed_stops_with_the_resume_hint(tmp_path, bare_scheduler, monkeypatch):
    """Killing the only worker mid-train left the run at "train: 24/42 tasks done" for minutes; it
    stops once the scheduler has had no worker for --wait-timeout, and its hint resumes it."""
    address, add_worker = bare_scheduler
    add_worker()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({**CONFIG, "store": str(tmp_path / "s")}))
    monkeypatch.setenv("METRICPIPE_FAILPOINT", f"train-pca:{tmp_path / 'killed'}")  # once: its task kills the worker
    # (10 s, not less: the same bound covers the scheduler's answers, which a loaded machine delays)
    res, seconds = _invoke_timed("run", cfg, "--cluster", address, "--wait-timeout", "10")
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    error, hint = res.output.strip().splitlines()[-2:]
    assert error == (
        f"error: cluster {address}: no worker for 10 s (wait_timeout): the scheduler's workers are gone; "
        f"start workers ('dask worker {address}') and run again"
    ), res.output
    assert (
        hint == f"to resume: metricpipe run {cfg} --cluster {address} --wait-timeout 10 --resume (finished "
        f"stages are kept)"
    ), res.output
    assert seconds < 60, seconds
    add_worker()
    res = CliRunner().invoke(main, hint.removeprefix("to resume: metricpipe ").split(" (")[0].split(" "))
    assert res.exit_code == 0 and "Completed 7 of 7 stages" in res.output, res.output


def test_a_task_longer_than_the_wait_timeout_on_a_present_worker_runs_on(bare_scheduler):
    """The bound is on having no worker, not on a slow task."""
    from metricpipe.cluster import connect

    address, add_worker = bare_scheduler
    add_worker()
    with connect(address, 1, wait_timeout=1) as client:
        assert client.submit(time.sleep, 4, pure=False).result() is None


def test_a_worker_at_an_address_nobody_reaches_is_one_line(tmp_path, bare_scheduler):
    """A worker that registered an address the scheduler cannot reach (behind NAT, a container's):
    evaluate's scatter raised the scheduler's OSError, a traceback."""
    address, add_worker = bare_scheduler
    add_worker("--listen-address", "tcp://127.0.0.1:0", "--contact-address", "tcp://127.0.0.1:1")  # nothing on port 1
    X, y = np.random.default_rng(0).normal(size=(60, 4)), np.arange(60) % 3
    np.savez(tmp_path / "e.npz", X=X, y=y)
    res = CliRunner().invoke(main, ["evaluate", str(tmp_path / "e.npz"), "--cluster", address])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    lines = [ln for ln in res.output.strip().splitlines() if not ln.startswith("Dashboard: ")]
    assert lines == [  # (the workers' plugin meets it before or after the dashboard's link is printed)
        f"error: cluster {address}: Timed out trying to connect to tcp://127.0.0.1:1 after 3 s; a worker (or the "
        f"scheduler) cannot be reached at the address it registered: start workers with an address the scheduler "
        f"and this machine reach (dask worker --host, --contact-address)"
    ], res.output
