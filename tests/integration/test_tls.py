"""Secure by default: a local run listens on 127.0.0.1 only, and a tls:// scheduler (a real
``dask scheduler --tls-*`` with ``dask worker`` on 127.0.0.1, certificates made here) runs the
pipeline with the same metrics as a LocalCluster; a plain client is refused by it."""

import contextlib
import json
import socket
import subprocess
import sys
import time
import warnings

import psutil
import pytest
import yaml
from click.testing import CliRunner

from metricpipe.cli import main
from tests.integration.helpers import portable_records

pytestmark = pytest.mark.integration

CONFIG = {
    "data": {"source": "digits", "split": {"test": 0.25, "seed": 1}},
    "methods": [{"method": "pca", "dim": 8}, {"method": "lda"}],
    "neighbours": {"k": 5},
    "dashboard": ":0",
    "evaluate": {"retrieval": {"k": [1, 10]}, "classification": {"classifiers": ["knn1", "ncm"]}},
}


def _listening(procs):
    out = []
    for p in procs:
        try:
            out += [c.laddr for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
        except psutil.NoSuchProcess:
            pass
    return out


@contextlib.contextmanager
def _taken_port_and_no_warnings():
    """A port something else listens on, while any warning (Dask's "Port ... is already in use") fails."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            yield taken.getsockname()[1]
    finally:
        taken.close()


def test_a_local_cluster_listens_on_loopback_only_and_a_taken_port_is_swapped_quietly():
    from metricpipe.cluster import connect

    with _taken_port_and_no_warnings() as port, connect("local", 2, dashboard=f":{port}") as client:
        me = psutil.Process()
        addrs = _listening([me] + me.children(recursive=True))
        link = client.dashboard_link
    assert len(addrs) >= 5  # scheduler, dashboard, 2 workers + nannies
    assert {a.ip for a in addrs} == {"127.0.0.1"}, addrs  # nothing on 0.0.0.0 or ::
    assert link.startswith("http://127.0.0.1:") and f":{port}/" not in link
    assert any(a.port == int(link.split(":")[2].split("/")[0]) for a in addrs)  # the printed link is real


def test_a_port_taken_between_the_check_and_the_bind_is_swapped_without_dask_s_warning(monkeypatch):
    """Another run taking the port at the same moment: the check says free, Dask's bind fails."""
    from metricpipe.cluster import connect

    monkeypatch.setattr("metricpipe.cluster.dashboard._port_free", lambda host, port: True)
    with _taken_port_and_no_warnings() as port, connect("local", 1, dashboard=f":{port}") as client:
        link = client.dashboard_link
    assert link.startswith("http://127.0.0.1:") and f":{port}/" not in link


def test_a_dashboard_opened_deliberately_listens_where_asked():
    from metricpipe.cluster import dashboard_address

    assert dashboard_address(":8787").startswith("127.0.0.1:") and dashboard_address("0.0.0.0:0") == "0.0.0.0:0"
    assert dashboard_address(None) is None


def _certs(d):
    """A CA and one certificate it signed (for 127.0.0.1), used by scheduler, workers and client."""

    def ssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    ssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=metricpipe-test-ca",
    )
    ssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem", "-out", "req.csr", "-subj", "/CN=127.0.0.1")
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    ssl(
        "x509",
        "-req",
        "-in",
        "req.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "cert.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    )
    return {k: str(d / f) for k, f in (("ca_file", "ca.pem"), ("cert", "cert.pem"), ("key", "key.pem"))}


@pytest.fixture
def tls_scheduler(tmp_path):
    tls = _certs(tmp_path)
    flags = ["--tls-ca-file", tls["ca_file"], "--tls-cert", tls["cert"], "--tls-key", tls["key"]]
    file = tmp_path / "scheduler.json"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "distributed.cli.dask_scheduler",
                "--protocol",
                "tls",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--no-dashboard",
                "--scheduler-file",
                str(file),
                *flags,
            ],
            stderr=subprocess.DEVNULL,
        )
    ]
    try:
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
                    *flags,
                ],
                stderr=subprocess.DEVNULL,
            )
        )
        deadline = time.time() + 60
        while not file.exists() and time.time() < deadline:
            time.sleep(0.2)
        address = json.loads(file.read_text())["address"]
        assert address.startswith("tls://127.0.0.1:")
        yield address, tls
    finally:
        for p in procs[::-1]:
            p.terminate()
            p.wait(timeout=30)


def _run(tmp_path, name, **extra):
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({**CONFIG, **extra, "store": str(tmp_path / name)}))
    res = CliRunner().invoke(main, ["run", str(cfg)])
    return res, tmp_path / name / "report/metrics.json"


def test_a_tls_scheduler_runs_the_pipeline_like_a_local_cluster(tmp_path, tls_scheduler):
    address, tls = tls_scheduler
    res, metrics = _run(tmp_path, "tls", cluster=address, tls=tls, workers=1)
    assert res.exit_code == 0, res.output
    local, local_metrics = _run(tmp_path, "local", workers=1)
    assert local.exit_code == 0, local.output
    assert portable_records(json.loads(metrics.read_text())["records"]) == portable_records(
        json.loads(local_metrics.read_text())["records"]
    )
    # without certificates: one line naming the settings, no traceback
    res, _ = _run(tmp_path, "plain", cluster=address, workers=1)
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert (
        res.output.strip()
        .splitlines()[-1]
        .startswith(
            f"error: cluster {address}: a tls:// scheduler needs certificates; give tls: {{ca_file, cert, key}}"
        )
    )
    # a certificate file that is not there: one line naming the setting
    res, _ = _run(tmp_path, "missing", cluster=address, workers=1, tls={**tls, "key": str(tmp_path / "nope.pem")})
    assert res.exit_code == 2 and "nope.pem: file not found (config tls: key)" in res.output


def test_ucx_is_refused_with_one_line(tmp_path):
    res, _ = _run(tmp_path, "ucx", cluster="ucx://127.0.0.1:8786")
    assert res.exit_code == 2 and res.output.strip() == (
        "error: " + str(tmp_path / "ucx.yaml") + ": cluster: ucx:// "
        "is not supported (metricpipe moves row-blocks through the "
        "store, not the comm); use tcp:// or tls://"
    )
