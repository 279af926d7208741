"""Faults injected into real runs: a worker SIGKILLed mid-stage, the client SIGKILLed mid-stage, a
flipped or missing chunk, a second run on the same store. Each run must finish (or refuse) with the
same models and metrics as an undisturbed run, bit for bit."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from metricpipe.cli import main
from tests.conftest import hold_lock, make_blobs
from tests.integration.helpers import assert_same_results, run_results

pytestmark = pytest.mark.integration

# lr and lam fixed: one model each, not a selection among three (test_selection covers that)
METHODS = [
    {"method": "pca", "dim": 4},
    {"method": "nml", "dim": 4, "pairs": 4000, "iters": 400000, "lr": 0.001},  # a train task of seconds
    {"method": "esvm", "epochs": 40, "negatives": {"count": 200}, "lam": 0.01},
]  # encode tasks of ~1 s


def _config(tmp_path, name, **extra):
    X, y = make_blobs(n=900, d=10, seed=5)
    np.savez(tmp_path / "d.npz", X=np.abs(X), y=y)
    cfg = {
        "store": str(tmp_path / name),
        "workers": 2,
        "dashboard": ":0",
        "data": {"path": str(tmp_path / "d.npz"), "chunk_mb": 0.01, "split": {"test": 0.3, "seed": 0}},
        "methods": METHODS,
        "evaluate": {"retrieval": {"k": [5]}, "classification": {"classifiers": ["knn1"]}},
        **extra,
    }
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def _results(store):
    return run_results(store)


def _same(a, b):
    assert_same_results(a, b)


def _run(*args, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


@pytest.fixture(scope="module")
def reference(client, tmp_path_factory):
    """The undisturbed run, on the session's cluster: the runs that a fault hits start their own
    local clusters (whose workers inherit the fault), so their results are also compared across
    clusters. Runs that only resume or check a store use the session's cluster too (``--cluster``)."""
    tmp = tmp_path_factory.mktemp("ref")
    cfg = _config(tmp, "store")
    res = _run("run", cfg, "--cluster", client.scheduler.address)
    assert res.exit_code == 0, res.output
    return tmp, _results(tmp / "store"), cfg, ("--cluster", client.scheduler.address)


def _copy(reference, tmp_path):
    """A copy of the reference store, and the reference config's arguments pointed at it."""
    import shutil

    store = tmp_path / "store"
    shutil.copytree(reference[0] / "store", store)
    return store, (reference[2], "--store", store, *reference[3])


@pytest.mark.parametrize("task", ["train-nml", "encode-esvm"])
def test_a_worker_killed_mid_stage_costs_a_retry_not_the_run(reference, tmp_path, monkeypatch, task):
    flag = tmp_path / "killed"
    monkeypatch.setenv("METRICPIPE_FAILPOINT", f"{task}:{flag}")  # read by the client when it submits
    res = _run("run", _config(tmp_path, "store"))
    assert res.exit_code == 0, res.output
    assert flag.exists()  # a worker really died inside that stage
    _same(_results(tmp_path / "store"), reference[1])


def _run_until_train(cfg, env=None, args=()):
    """``metricpipe run cfg`` in a session of its own, read up to its train stage's start: (proc, lines seen)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "metricpipe.cli", "run", str(cfg), *map(str, args)],
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=Path(__file__).resolve().parents[2],
        env=env,
    )
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "train ..." in line:
            break
    return proc, seen


def test_client_killed_mid_stage_resumes_from_that_stage_with_identical_results(reference, tmp_path):
    cfg = _config(tmp_path, "store")
    proc, seen = _run_until_train(cfg)  # the train stage is under way
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)  # the client and its local cluster, at once
    proc.wait(timeout=30)
    assert any("train ..." in s for s in seen), "".join(seen)
    res = _run("run", cfg, "--resume", *reference[3])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "stage: reusing" in out and "statistics: reusing" in out  # finished stages are not redone
    assert "train: reusing 3 of 3" not in out  # the interrupted stage is redone
    assert "encode: reusing" not in out and "evaluate: reusing" not in out
    _same(_results(tmp_path / "store"), reference[1])


def test_sigterm_is_handled_like_ctrl_c_with_a_resume_hint(reference, tmp_path):
    cfg = _config(tmp_path, "store")
    proc, seen = _run_until_train(cfg)
    proc.send_signal(signal.SIGTERM)  # the client only, as a batch system's stop would
    rest = proc.stderr.read()
    assert proc.wait(timeout=60) == 143, "".join(seen) + rest
    assert rest.strip().splitlines()[-1] == (
        f"terminated (SIGTERM); finished stages are kept; to resume: metricpipe run {cfg} --resume"
    ), rest
    res = _run("run", cfg, "--resume", *reference[3])
    assert res.exit_code == 0 and "statistics: reusing" in res.output, res.output
    _same(_results(tmp_path / "store"), reference[1])


def test_ctrl_c_stops_the_local_cluster_quietly_with_a_resume_hint(tmp_path):
    """A terminal's Ctrl-C reaches the whole process group: the client, its local workers and
    multiprocessing's resource tracker. Only the one-line hint may reach the terminal (no worker's
    traceback, no tracker warning about the semaphores of workers stopped mid-task)."""
    cfg = _config(tmp_path, "store")
    # as a user's shell starts it: no warnings filter of ours, workers spawned (not the tests' forkserver)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONWARNINGS", "DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD")
    }
    proc, seen = _run_until_train(cfg, env)
    time.sleep(1.0)  # the workers are inside training tasks
    os.killpg(proc.pid, signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(timeout=60) == 130, "".join(seen) + rest
    lines = [ln for ln in rest.splitlines() if ln.strip() and not ln.startswith("  train:")]
    assert lines == [f"interrupted; finished stages are kept; to resume: metricpipe run {cfg} --resume"], rest


def test_local_workers_ignore_sigint_and_the_tracker_filter_does_not_outlive_the_start(monkeypatch):
    """(The run's output after a Ctrl-C is the test above; the tracker's own environment is not
    reachable from here, and the tests' workers come from a forkserver started earlier.)"""
    import signal as sig

    from metricpipe.cluster import connect

    monkeypatch.setenv("PYTHONWARNINGS", "default")
    with connect("local", 1, dashboard=None) as client:
        assert os.environ["PYTHONWARNINGS"] == "default"  # restored once the workers are up
        handlers = client.run(lambda: sig.getsignal(sig.SIGINT) == sig.SIG_IGN)
    assert list(handlers.values()) == [True]


def test_a_truncated_commit_marker_fails_verify_and_is_recomputed(reference, tmp_path):
    store, cfg = _copy(reference, tmp_path)
    rel = json.loads((store / "runs/latest.json").read_text())["units"]["models"][0]
    marker = store / f"{rel}.committed.json"
    marker.write_bytes(marker.read_bytes()[:40])  # e.g. a full disk while it was copied
    res = _run("inspect", store, "--verify")
    assert res.exit_code == 1 and f"models/{marker.name}: commit marker damaged" in res.output, res.output
    res = _run("run", *cfg)
    assert res.exit_code == 0 and "train: reusing 2 of 3" in res.output, res.output
    assert f"train: {rel} has a damaged commit marker; recomputing it" in res.output, res.output
    assert _run("inspect", store, "--verify").exit_code == 0
    _same(_results(store), reference[1])
    latest = store / "runs/latest.json"  # gc and report read it: verify checks it too
    latest.write_bytes(latest.read_bytes()[:50])
    res = _run("inspect", store, "--verify")
    assert res.exit_code == 1 and "runs/latest.json is corrupt" in res.output, res.output


def test_flipped_bytes_are_named_by_verify_refused_by_run_and_repaired(reference, tmp_path, monkeypatch):
    from metricpipe import context

    monkeypatch.setattr(context, "CHECKSUM_TASK_BYTES", 1024)  # run checks every file on the workers
    store, cfg = _copy(reference, tmp_path)
    assert _run("inspect", store, "--verify").exit_code == 0
    codes = json.loads((store / "runs/latest.json").read_text())["units"]["codes"][0]
    chunk = sorted(p for p in (store / codes / "codes").rglob("*") if p.is_file() and p.name != "zarr.json")[0]
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    rel = str(chunk.relative_to(store))
    res = _run("inspect", store, "--verify")
    assert res.exit_code == 1 and f"DAMAGED {rel}: checksum differs" in res.output, res.output
    res = _run("run", *cfg)
    assert res.exit_code == 2 and rel in res.output and "--repair" in res.output, res.output
    res = _run("run", *cfg, "--repair")
    assert res.exit_code == 0 and f"repairing {codes}" in res.output, res.output
    assert _run("inspect", store, "--verify").exit_code == 0
    _same(_results(store), reference[1])
    chunk.unlink()  # a missing chunk would read as the fill value
    res = _run("inspect", store, "--verify")
    assert res.exit_code == 1 and f"{rel}: missing" in res.output


def test_force_recomputes_one_stage_and_those_after_it(reference, tmp_path):
    store, cfg = _copy(reference, tmp_path)
    models = json.loads((store / "runs/latest.json").read_text())["units"]["models"]
    marker = store / f"{models[0]}.committed.json"
    before = marker.read_text()
    res = _run("run", *cfg, "--force", "encode")
    assert res.exit_code == 0, res.output
    assert "train: reusing 3 of 3 models" in res.output and "encode: reusing" not in res.output
    assert marker.read_text() == before  # the model was not touched
    _same(_results(store), reference[1])
    # the report's config is what ran: the file's, with what the command line replaced
    run = json.loads((store / "report/metrics.json").read_text())["run"]
    assert run["config"]["store"] == str(store) and run["config"]["cluster"] == reference[3][1], run["config"]


def _committed_units(store) -> dict:
    units = json.loads((store / "runs/latest.json").read_text())["units"]
    names = [u for v in units.values() for u in ([v] if isinstance(v, str) else v or [])]
    return {u: (store / f"{u}.committed.json").read_text() for u in names}


def test_a_force_run_that_fails_leaves_the_last_run_s_models_in_place(reference, tmp_path, monkeypatch):
    """--force train wiped each committed model before recomputing it, so a run that stopped midway
    left the last run's report naming models that were gone (and inspect --verify saw nothing)."""
    store, cfg = _copy(reference, tmp_path)
    before = _committed_units(store)
    monkeypatch.setenv("METRICPIPE_FAILPOINT", "train-nml:always")  # the NML task kills its worker
    res = _run("run", *cfg[:3], "--force", "train", "--workers", "2")  # a local cluster of its own
    assert res.exit_code == 2 and "stage train failed on model nml-4" in res.output, res.output
    after = _committed_units(store)  # (raises if a unit of the last run is gone)
    assert after.keys() == before.keys()
    # the ones it could not recompute, restored: NML's fit on the train rows less the validation rows
    # it borrows (which the failpoint stops) and its refit on every train row
    nml = [u for u in before if u.startswith("models/") and '"method": "nml"' in before[u]]
    assert len(nml) == 2 and all(after[u] == before[u] for u in nml)
    assert not any((store / ".replaced").rglob("*.committed.json"))
    _same(_results(store), reference[1])
    assert _run("inspect", "--verify", store).exit_code == 0
    # the resume hint's command (--force train again) continues that run: the two models it did
    # recompute are kept, not trained a third time; only NML, put back as it was, is recomputed
    monkeypatch.delenv("METRICPIPE_FAILPOINT")
    res = _run("run", *cfg, "--force", "train")
    assert res.exit_code == 0, res.output
    assert "Continuing the --force train run" in res.output and "train: reusing 2 of 3 models" in res.output, res.output
    done = _committed_units(store)
    assert all(done[u] != before[u] and json.loads(done[u])["run"] != json.loads(after[u]).get("run") for u in nml)
    assert not (store / "runs/forcing.json").exists()  # finished: a later --force starts afresh
    _same(_results(store), reference[1])


def test_a_killed_force_run_s_set_aside_models_come_back_at_the_next_run(reference, tmp_path):
    store, cfg = _copy(reference, tmp_path)
    before = _committed_units(store)
    proc, seen = _run_until_train(cfg[0], args=("--store", store, "--force", "train"))
    for _ in range(100):  # until a model is set aside (the NML task takes seconds)
        if any((store / ".replaced").rglob("*.committed.json")):
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert any((store / ".replaced").rglob("*.committed.json")), "".join(seen)
    res = _run("run", *cfg)
    assert res.exit_code == 0, res.output
    assert "Restored " in res.output and "train: reusing 3 of 3 models" in res.output, res.output
    assert {u: m for u, m in _committed_units(store).items() if u.startswith("models/")} == {
        u: m for u, m in before.items() if u.startswith("models/")
    }  # the very same commits
    _same(_results(store), reference[1])


def test_a_second_run_on_a_busy_store_is_refused_until_the_holder_dies(reference, tmp_path):
    store, cfg = _copy(reference, tmp_path)
    holder = hold_lock(store)
    try:
        res = _run("run", *cfg)
        assert res.exit_code == 2 and f"in use by pid {holder.pid} on {socket.gethostname()}" in res.output, res.output
        assert len([ln for ln in res.output.splitlines() if ln.startswith("error:")]) == 1
    finally:
        holder.kill()  # SIGKILL: no clean-up code runs in the holder
        holder.wait()
    res = _run("run", *cfg)  # the system released its lock with the process
    assert res.exit_code == 0, res.output


def test_a_task_that_kills_its_worker_every_time_ends_the_run_naming_stage_and_block(tmp_path, monkeypatch):
    monkeypatch.setenv("METRICPIPE_FAILPOINT", "train-nml:always")
    cfg = _config(tmp_path, "store")
    res = _run("run", cfg, "--workers", "2")
    assert res.exit_code == 2, res.output
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "stage train failed on model nml-4" in errors[0] and "KilledWorker" in errors[0], (
        res.output
    )
    # the hint reruns where it ran (it dropped --cluster, --workers and --memory-limit)
    assert f"to resume: metricpipe run {cfg} --workers 2 --resume (finished stages are kept)" in res.output
    # the workers' logs went to the store, not the terminal; the one line says where
    log = errors[0].rsplit("(worker tracebacks: ", 1)[1].rstrip(")")
    assert log.startswith(str(tmp_path / "store" / "logs" / "workers-")) and Path(log).is_file()
    # (a SIGKILLed worker writes nothing there: the file is where other failures' tracebacks go)
    assert "Traceback" not in res.output and "Compute Failed" not in res.output
