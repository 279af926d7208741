"""Stores on object storage: the pipeline writes its store to S3, served by moto's S3 server on
127.0.0.1 and reached through s3fs, as a cloud cluster would. A full run, a client killed mid-run and
resumed, ``inspect --verify`` and the one-writer lock, with metrics identical to a local store's."""

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from metricpipe.cli import main
from metricpipe.store import Store
from metricpipe.store import lock as store_lock
from metricpipe.tasks.errors import InputError
from tests.integration.helpers import assert_same_results, run_results

pytestmark = pytest.mark.integration

BUCKET = "metricpipe-test"
ROOT = Path(__file__).resolve().parents[2]
# digits, two baselines and one learner at its defaults (select: false) cut short: a run of seconds
CONFIG = {
    "workers": 2,
    "dashboard": ":0",
    "data": {"source": "digits", "normalize": "l2", "split": {"test": 0.2, "seed": 0}},
    "methods": [
        {"method": "identity"},
        {"method": "pca", "dim": 16},
        {"method": "ncmml", "dim": 16, "iters": 40, "batch": 200, "validate_every": 20, "select": False},
    ],
    "evaluate": {"retrieval": {"k": [10]}, "classification": {"classifiers": ["knn1", "ncm"]}},
}


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server on a free port of 127.0.0.1 with one bucket; the environment points botocore
    (hence s3fs, in this process, its subprocesses and the Dask workers they start) at it."""
    import s3fs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{server.get_host_and_port()[1]}"
    with pytest.MonkeyPatch.context() as mp:
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_CA_BUNDLE"):
            mp.delenv(name, raising=False)
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")  # moto accepts any credentials
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        mp.setenv("AWS_CONFIG_FILE", os.devnull)  # nothing from the machine's ~/.aws
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
        mp.setenv("AWS_ENDPOINT_URL_S3", endpoint)  # the setting the user guide documents
        mp.setenv("NO_PROXY", ",".join(filter(None, ["127.0.0.1", "localhost", os.environ.get("NO_PROXY")])))
        s3fs.S3FileSystem.clear_instance_cache()
        fs = s3fs.S3FileSystem(use_listings_cache=False)
        fs.mkdir(BUCKET)
        yield fs
        s3fs.S3FileSystem.clear_instance_cache()  # no later test may reuse a client of a stopped server
    server.stop()


@pytest.fixture(scope="module")
def cluster(s3):
    """One LocalCluster for the in-process runs, started after ``s3`` so its workers have the endpoint."""
    import dask
    from distributed import LocalCluster

    # spawned, not forked from the test process's forkserver (tests/conftest.py), which was started
    # before ``s3`` set the environment
    with (
        dask.config.set({"distributed.worker.multiprocessing-method": "spawn"}),
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0", memory_limit="2GB"
        ) as lc,
    ):
        yield lc.scheduler_address


def _config(path: Path) -> Path:
    path.write_text(yaml.safe_dump({**CONFIG, "store": str(path.with_suffix(""))}))
    return path


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _results(store):
    return run_results(store)


def _same(a, b):
    assert_same_results(a, b)


def _objects(fs, prefix: str) -> dict:
    """{key: (size, ETag)} of every object under ``prefix`` but the lock."""
    return {k: (v["size"], v["ETag"]) for k, v in fs.find(prefix, detail=True).items() if not k.endswith("/.lock")}


@pytest.fixture(scope="module")
def runs(s3, cluster, tmp_path_factory):
    """The same config run on a local store and on s3://BUCKET/run, on the module's cluster."""
    tmp = tmp_path_factory.mktemp("s3")
    cfg = _config(tmp / "local.yaml")
    res = _run("run", cfg, "--cluster", cluster)
    assert res.exit_code == 0, res.output
    url = f"s3://{BUCKET}/run"
    res = _run("run", cfg, "--store", url, "--cluster", cluster)
    assert res.exit_code == 0, res.output
    return {"cfg": cfg, "url": url, "local": _results(str(tmp / "local")), "s3": _results(url), "output": res.output}


def test_a_run_on_s3_gives_the_metrics_of_a_local_store(s3, runs):
    _same(runs["s3"], runs["local"])
    assert "Report: s3://" in runs["output"]
    assert not s3.exists(f"{BUCKET}/run/.lock")  # the lock object is removed when the run ends
    markers = [k for k in s3.find(f"{BUCKET}/run") if k.endswith(".committed.json")]
    assert len(markers) >= 8 and not [k for k in s3.find(f"{BUCKET}/run") if ".tmp-" in k]


def test_inspect_verify_on_s3_names_a_corrupted_object(s3, runs):
    url = runs["url"]
    res = _run("inspect", url, "--verify")
    assert res.exit_code == 0 and " 0 problem(s)" in res.output, res.output
    codes = Store(url).read_json("runs/latest.json")["units"]["codes"][0]
    chunk = sorted(k for k in s3.find(f"{BUCKET}/run/{codes}") if not k.endswith("zarr.json"))[0]
    good = s3.cat_file(chunk)
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF
    s3.pipe_file(chunk, bytes(bad))
    try:
        res = _run("inspect", url, "--verify")
        damaged = [ln for ln in res.output.splitlines() if ln.startswith("DAMAGED")]
        assert res.exit_code == 1 and damaged == [
            f"DAMAGED {chunk.split('/run/', 1)[1]}: checksum differs from the commit's (corrupt)"
        ], res.output
    finally:
        s3.pipe_file(chunk, good)  # the next tests use the store (and verify it again)


def test_gc_on_s3_removes_a_stale_unit_under_the_lock_object_and_keeps_the_run_s(s3, runs):
    url = runs["url"]
    st = Store(url)
    stale = st.unit("models", "0123456789abcdef")  # an earlier config's model, committed before the run
    stale.begin()
    st.fs.pipe_file(f"{st.root}/models/0123456789abcdef/w", b"x" * 10)
    st.write_text("models/0123456789abcdef.committed.json", '{"key": "0123456789abcdef", "committed": 0}')
    before = sorted(k for k in s3.find(f"{BUCKET}/run") if "0123456789abcdef" not in k)
    res = _run("gc", url)
    assert res.exit_code == 0 and res.output.startswith("models/0123456789abcdef") and "1 unit," in res.output, (
        res.output
    )
    res = _run("gc", url, "--delete")
    assert res.exit_code == 0 and "removed 1 unit" in res.output, res.output
    assert sorted(s3.find(f"{BUCKET}/run")) == before and not s3.exists(f"{BUCKET}/run/.lock")
    assert _run("inspect", url, "--verify").exit_code == 0


def test_a_client_killed_mid_run_resumes_on_s3_with_identical_metrics(s3, runs, cluster):
    url = f"s3://{BUCKET}/killed"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "metricpipe.cli",
            "run",
            str(runs["cfg"]),
            "--store",
            url,
            "--workers",
            "1",
        ],  # results do not depend on the worker count
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=ROOT,
    )
    seen = []
    for line in proc.stderr:  # the first stage has committed its unit
        seen.append(line)
        if "Completed 1 of" in line:
            break
    os.killpg(proc.pid, signal.SIGKILL)  # the client and its local cluster, at once
    proc.wait(timeout=30)
    assert any("Completed 1 of" in s for s in seen), "".join(seen)
    lock = json.loads(s3.cat_file(f"{BUCKET}/killed/.lock"))
    assert lock["pid"] == proc.pid  # SIGKILL left the lock object behind
    res = _run("inspect", url, "--verify")  # whatever was committed is whole: no unit only looks committed
    assert res.exit_code == 0, res.output
    res = _run("run", runs["cfg"], "--store", url, "--resume", "--cluster", cluster)
    assert res.exit_code == 0, res.output
    assert (
        f"Took over the lock of {url} from pid {proc.pid} on {socket.gethostname()} (metricpipe run): "
        f"pid {proc.pid} no longer runs on this host" in res.output
    ), res.output
    assert "stage: reusing data/" in res.output  # the committed stage is not redone
    assert "train: reusing" not in res.output and "encode: reusing" not in res.output
    _same(_results(url), runs["local"])
    assert not s3.exists(f"{BUCKET}/killed/.lock")


def test_a_second_writer_on_s3_gets_one_line_and_leaves_the_store_untouched(s3, runs, cluster):
    url, prefix = runs["url"], f"{BUCKET}/run"
    before = _objects(s3, prefix)
    with Store(url).lock("metricpipe run"):  # a live run on this host (this process) holds the lock object
        res = _run("run", runs["cfg"], "--store", url, "--cluster", cluster)
        errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
        assert res.exit_code == 2 and len(errors) == 1, res.output
        assert f"in use by pid {os.getpid()} on {socket.gethostname()} (metricpipe run)" in errors[0]
        assert f"'metricpipe unlock {url}'" in errors[0]
        res = _run("unlock", url)  # a holder still running here is not unlocked
        assert res.exit_code == 2 and "still running on this host" in res.output, res.output
        assert json.loads(s3.cat_file(f"{prefix}/.lock"))["pid"] == os.getpid()
    assert not s3.exists(f"{prefix}/.lock")
    assert _objects(s3, prefix) == before  # the refused writer wrote nothing
    assert _run("inspect", url, "--verify").exit_code == 0


def _fake_lock(s3, prefix: str, age: float) -> None:
    """The lock object of a run on another host, last refreshed ``age`` seconds ago."""
    s3.pipe_file(
        f"{prefix}/.lock",
        json.dumps(
            {"host": "elsewhere", "pid": 4242, "what": "metricpipe run", "token": "x", "refreshed": time.time() - age}
        ).encode(),
    )


def test_a_lock_from_another_host_holds_for_its_lease_and_unlock_clears_it(s3):
    prefix = f"{BUCKET}/other-host"
    url = f"s3://{prefix}"
    t0 = time.time()
    _fake_lock(s3, prefix, age=5)
    with pytest.raises(
        InputError, match=r"in use by pid 4242 on elsewhere \(metricpipe run\), lock refreshed \d+ s"
    ) as e:
        with Store(url).lock():
            pass
    age = int(re.search(r"lock refreshed (\d+) s", str(e.value)).group(1))  # 5 s, and what the lock attempt took
    assert 5 <= age <= 5.5 + time.time() - t0, (age, time.time() - t0)  # (rounded; a loaded machine said 6 s)
    res = _run("unlock", url)
    assert res.exit_code == 0 and "removed the lock of pid 4242 on elsewhere" in res.output, res.output
    assert not s3.exists(f"{prefix}/.lock")
    assert "not locked" in _run("unlock", url).output
    _fake_lock(s3, prefix, age=store_lock.LOCK_LEASE + 5)  # its holder stopped refreshing: taken over
    said = []
    with Store(url).lock(log=said.append) as held:
        assert json.loads(s3.cat_file(f"{prefix}/.lock"))["token"] == held.me["token"]
    assert said and "not refreshed for 125 s" in said[0]
    assert not s3.exists(f"{prefix}/.lock")


@pytest.mark.parametrize(
    "refreshed, why",
    [
        ('"yesterday"', "refresh time 'yesterday' is not a time"),
        ("1e400", "refresh time inf is not a time"),  # JSON's inf
        (None, "refresh time None is not a time"),
        (str(10**10), r"refresh time is \d+ s in the future"),
    ],
)
def test_a_lock_whose_refresh_time_is_not_a_time_is_stale(s3, refreshed, why):
    """A lock object with "refreshed": "yesterday" was a ValueError traceback; with 1e400 (inf) it was
    never stale, so no run could take the store until someone ran unlock."""
    prefix = f"{BUCKET}/damaged-lock"
    record = '{"host": "elsewhere", "pid": 4242, "what": "metricpipe run", "token": "x"%s}' % (
        f', "refreshed": {refreshed}' if refreshed else ""
    )
    s3.pipe_file(f"{prefix}/.lock", record.encode())
    said = []
    with Store(f"s3://{prefix}").lock(log=said.append) as held:
        assert json.loads(s3.cat_file(f"{prefix}/.lock"))["token"] == held.me["token"]
    assert len(said) == 1 and re.search(f"from pid 4242 on elsewhere \\(metricpipe run\\): its record's {why}", said[0])
    assert not s3.exists(f"{prefix}/.lock")


def test_a_holder_whose_lock_was_taken_over_commits_nothing_more(s3, monkeypatch):
    monkeypatch.setattr(store_lock, "LOCK_REFRESH", 0.05)
    prefix = f"{BUCKET}/lost"
    store = Store(f"s3://{prefix}")
    with store.lock() as held:
        store.write_text("runs/a.json", "{}")
        _fake_lock(s3, prefix, age=0)  # e.g. this holder was paused past its lease
        for _ in range(100):
            if held.lost:
                break
            time.sleep(0.05)
        assert held.lost == "taken over by pid 4242 on elsewhere (metricpipe run)"
        with pytest.raises(InputError, match=r"lost the store's lock .* stops before writing runs/b.json"):
            store.write_text("runs/b.json", "{}")
    assert not s3.exists(f"{prefix}/runs/b.json")
    assert json.loads(s3.cat_file(f"{prefix}/.lock"))["host"] == "elsewhere"  # the new holder's lock stays


def test_missing_credentials_or_an_endpoint_that_does_not_answer_is_one_line(s3, tmp_path, monkeypatch):
    """botocore's errors (no credentials, nothing listening) were a traceback and exit 1."""
    import s3fs

    url = f"s3://{BUCKET}/nothing-here"
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    s3fs.S3FileSystem.clear_instance_cache()
    res = _run("models", url)
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert res.output.startswith(f"error: {url}: Unable to locate credentials (S3); set AWS_ACCESS_KEY_ID"), res.output
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{sock.getsockname()[1]}")
        s3fs.S3FileSystem.clear_instance_cache()
        res = _run("run", _config(tmp_path / "c.yaml"), "--store", url)
    s3fs.S3FileSystem.clear_instance_cache()
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert f"error: {url}: Could not connect to the endpoint URL" in res.output and "AWS_ENDPOINT_URL_S3" in res.output
