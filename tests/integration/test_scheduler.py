"""The same config on a LocalCluster with 1 and with 3 workers and on a real `dask scheduler` with
two `dask worker` processes on 127.0.0.1 gives identical models and metrics."""
import json
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

CONFIG = {"data": {"source": "digits", "split": {"test": 0.25, "seed": 1}, "chunk_mb": 0.1},
          "methods": [{"method": "pca", "dim": [8, 16]}, {"method": "lda"}, {"method": "pcaw", "dim": 16},
                      {"method": "random", "dim": 8, "random_state": 3},
                      {"method": "slne", "input_dim": 24, "step": 0.02, "epochs": 2},
                      {"method": "slde", "members": 3, "member_dim": 8, "step": 0.02, "epochs": 2, "refine": True},
                      {"method": "slde", "members": 2, "member_dim": 8, "subspace": "random", "epochs": 1}],
          "neighbours": {"k": 5}, "dashboard": ":0",
          "evaluate": {"retrieval": {"k": [1, 10]}, "classification": {"classifiers": ["knn1", "knn5", "ncm", "softvote3"]}}}


@pytest.fixture
def scheduler(tmp_path):
    file = tmp_path / "scheduler.json"
    dask = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
    procs = [subprocess.Popen(dask + ["--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                      "--scheduler-file", str(file)], stderr=subprocess.DEVNULL)]
    try:
        for _ in range(2):
            procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file",
                                           str(file), "--nthreads", "1", "--host", "127.0.0.1", "--no-dashboard"],
                                          stderr=subprocess.DEVNULL))
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
    monkeypatch.setattr(cluster, "CONNECT_TIMEOUT", "1s")   # the error, not the 10 s wait, is under test
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({**CONFIG, "store": str(tmp_path / "s"), "cluster": "tcp://127.0.0.1:1"}))
    res = CliRunner().invoke(main, ["run", str(cfg)])
    assert res.exit_code == 2 and "cannot reach the scheduler" in res.output
