"""``metricpipe evaluate EMBEDDINGS``: records equal to pytorch-metric-learning's definitions computed
in memory (tests/pml_reference.py) for npy, npz and parquet inputs; bad input exits 2 with one line."""

import json
import re

import numpy as np
import pytest
from click.testing import CliRunner

from metricpipe.cli import main
from tests.pml_reference import pml_accuracy, tied_case

ACC = ("map@r", "r_precision", "precision@1", "mrr")


def _run(*args):
    return CliRunner().invoke(main, ["evaluate", *[str(a) for a in args]])


def _values(path):
    recs = json.loads(path.read_text())
    assert {r["classifier"] for r in recs} == {None} and all({"method", "dim", "params"} <= set(r) for r in recs)
    return {r["metric"]: r["value"] for r in recs}


def _write(fmt, path, X, y):
    if fmt == "npy":
        np.save(path.with_suffix(".npy"), X)
        np.save(path.with_name(path.stem + "_y.npy"), y)
        return path.with_suffix(".npy"), path.with_name(path.stem + "_y.npy")
    if fmt == "npz":
        np.savez(path.with_suffix(".npz"), X=X, y=y)
        return path.with_suffix(".npz"), "y"
    if fmt == "h5":
        import h5py

        with h5py.File(path.with_suffix(".h5"), "w") as f:
            f["X"], f["y"] = X, y
        return path.with_suffix(".h5"), "y"
    if fmt == "zarr":
        import zarr

        g = zarr.open_group(store=str(path.with_suffix(".zarr")), mode="w")
        g.create_array("X", shape=X.shape, chunks=(40, X.shape[1]), dtype=X.dtype)[:] = X  # 40-row chunks
        g.create_array("y", shape=y.shape, dtype=y.dtype)[:] = y
        return path.with_suffix(".zarr"), "y"
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"X": pa.array(list(X), pa.list_(pa.float32())), "y": pa.array(y)})
    pq.write_table(table, path.with_suffix(".parquet"), row_group_size=37)  # row groups cut the read blocks
    return path.with_suffix(".parquet"), "y"


@pytest.mark.integration
@pytest.mark.parametrize("fmt", ["npy", "npz", "h5", "zarr", "parquet"])
def test_all_against_all_equals_the_pml_definitions(client, tmp_path, fmt):
    X, y = tied_case(11, n_ref=150, dim=3, classes=5)
    path, labels = _write(fmt, tmp_path / "emb", X, y)
    out = tmp_path / "m.json"
    res = _run(path, "--labels", labels, "--cluster", client.scheduler.address, "--out", out)
    assert res.exit_code == 0, res.output
    got, ref = _values(out), pml_accuracy(X, y)
    for name in ACC:
        assert got[name] == pytest.approx(ref[name], abs=1e-9), name
    assert -1 <= got["ami"] <= got["nmi"] <= 1


@pytest.mark.integration
def test_separate_reference_with_a_lone_label_and_a_query_sample(client, tmp_path):
    X, y, Q, yq = tied_case(5, n_ref=120, dim=2, classes=4, n_query=40)
    yq[:3] = 4  # label 4 is absent from the reference: left out
    np.savez(tmp_path / "q.npz", X=Q, y=yq)
    np.savez(tmp_path / "r.npz", X=X, y=y)
    out = tmp_path / "m.json"
    res = _run(
        tmp_path / "q.npz", "--reference", tmp_path / "r.npz", "--cluster", client.scheduler.address, "--out", out
    )
    assert res.exit_code == 0, res.output
    got, ref = _values(out), pml_accuracy(Q, yq, X, y)
    for name in ACC:
        assert got[name] == pytest.approx(ref[name], abs=1e-9), name
    assert json.loads(out.read_text())[0]["params"]["lone_queries"] == int((yq == 4).sum())
    # the same roles given the other way: --queries FILE against EMBEDDINGS as the reference
    res = _run(tmp_path / "r.npz", "--queries", tmp_path / "q.npz", "--cluster", client.scheduler.address, "--out", out)
    assert res.exit_code == 0, res.output
    assert {m: v for m, v in _values(out).items() if m in ACC} == {m: v for m, v in got.items() if m in ACC}
    # --queries N: a stratified sample queries all of the file, itself left out (PML's ref_includes_query
    # with the queries first; continuous values, so no tie depends on the layout)
    from metricpipe.tasks import stream

    X = np.random.default_rng(0).normal(size=X.shape).astype(np.float32) + y[:, None]
    np.savez(tmp_path / "r.npz", X=X, y=y)
    res = _run(tmp_path / "r.npz", "--queries", 30, "--seed", 3, "--cluster", client.scheduler.address, "--out", out)
    assert res.exit_code == 0, res.output
    rows = stream.sample(y, 30, None, 3, stream.QUERIES)
    order = np.r_[rows, np.setdiff1d(np.arange(len(y)), rows)]
    ref = pml_accuracy(X[rows], y[rows], X[order], y[order], ref_includes_query=True)
    got = _values(out)
    assert json.loads(out.read_text())[0]["params"]["queries"] == len(rows)
    for name in ACC:
        assert got[name] == pytest.approx(ref[name], abs=1e-9), name


def _fail(args, match):
    res = _run(*args)
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in res.output, res.output
    assert re.search(match, lines[0]), lines[0]


def test_bad_inputs_exit_2_with_one_line(tmp_path):
    X, y = tied_case(0, n_ref=40)
    np.savez(tmp_path / "ok.npz", X=X, y=y)
    np.savez(tmp_path / "short.npz", X=X, y=y[:-1])
    np.savez(tmp_path / "one.npz", X=X, y=np.zeros(len(X), int))
    np.savez(tmp_path / "empty.npz", X=np.zeros((0, 2), np.float32), y=np.zeros(0, int))
    np.savez(tmp_path / "wide.npz", X=np.zeros((5, 7), np.float32), y=np.arange(5) % 2)
    np.save(tmp_path / "x.npy", X)
    import h5py

    with h5py.File(tmp_path / "holes.h5", "w") as f:  # rows 10-19 never written: zeros
        f.create_dataset("X", shape=X.shape, chunks=(10, X.shape[1]), dtype=X.dtype)[:10] = X[:10]
        f["X"][20:] = X[20:]
        f["y"] = y
    cases = [
        (
            [tmp_path / "holes.h5"],
            r"holes.h5: dataset 'X' \(--features\) has 1 of its 4 chunk\(s\) never written \(the "
            r"first from row 10\)",
        ),
        ([tmp_path / "missing.npz"], r"missing.npz: file not found \(EMBEDDINGS\)"),
        ([tmp_path / "ok.npz", "--features", "Z"], r"ok.npz: no array 'Z' \(--features\); it holds"),
        ([tmp_path / "ok.npz", "--labels", "lab"], r"ok.npz: no array 'lab' \(--labels\)"),
        ([tmp_path / "short.npz"], r"short.npz: labels \(--labels\) have shape \(39,\) for 40 embeddings"),
        ([tmp_path / "one.npz"], r"one.npz: the reference holds one class \(EMBEDDINGS, labels \d\);"),
        ([tmp_path / "empty.npz"], r"empty.npz: no embeddings"),
        ([tmp_path / "ok.npz", "--reference", tmp_path / "wide.npz"], r"queries have 2 features, .* 7"),
        (
            [tmp_path / "x.npy"],
            r"x.npy: a .npy file holds one array; give --labels as the path of a .npy file of "
            r"labels$",
        ),
        (
            [tmp_path / "ok.npz", "--queries", tmp_path / "ok.npz", "--reference", tmp_path / "ok.npz"],
            r"--queries FILE and --reference FILE together",
        ),
        ([tmp_path / "ok.npz", "--out", tmp_path / "no" / "m.json"], r"its folder does not exist \(--out\)"),
        (
            [tmp_path / "ok.npz", "--queries", "-3"],
            r"^error: --queries -3: expected a number of query rows N >= 1 \(a "
            r"class-stratified sample\) or a FILE of queries$",
        ),  # was "no labels"
        ([tmp_path / "ok.npz", "--queries", "0"], r"^error: --queries 0: expected a number of query rows N >= 1"),
        ([tmp_path / "ok.npz", "--queries", "2.5"], r"^error: --queries 2.5: expected a number of query rows"),
    ]
    for args, match in cases:
        _fail(args, match)


def test_queries_or_reference_that_are_the_embeddings_themselves_exit_2(tmp_path):
    """`evaluate X.npy --queries X.npy` scored the set against itself without a word: every query found
    itself at distance 0 (precision@1 1.0), which leaving out --queries avoids (its own row left out)."""
    import shutil

    X, y = tied_case(0, n_ref=40)
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    np.savez(tmp_path / "ok.npz", X=X, y=y)
    shutil.copy(tmp_path / "ok.npz", tmp_path / "copy.npz")
    (tmp_path / "link.npz").symlink_to(tmp_path / "ok.npz")
    cases = [
        (
            [
                tmp_path / "X.npy",
                "--labels",
                tmp_path / "y.npy",
                "--queries",
                tmp_path / "X.npy",
                "--query-labels",
                tmp_path / "y.npy",
            ],
            r"X.npy: --queries is the same file as EMBEDDINGS \(.*X.npy\): each of its rows would find itself as its "
            r"nearest neighbour; leave out --queries",
        ),
        ([tmp_path / "ok.npz", "--queries", tmp_path / "link.npz"], r"link.npz: --queries is the same file as"),
        ([tmp_path / "ok.npz", "--queries", tmp_path / "copy.npz"], r"copy.npz: --queries holds the same bytes as"),
        ([tmp_path / "ok.npz", "--reference", tmp_path / "copy.npz"], r"copy.npz: --reference holds the same bytes as"),
    ]
    for args, match in cases:
        _fail(args, match)


@pytest.mark.integration
def test_non_finite_embeddings_exit_2_naming_file_and_rows(client, tmp_path):
    X, y = tied_case(0, n_ref=40)
    X[17, 1] = np.nan
    np.savez(tmp_path / "nan.npz", X=X, y=y)
    out = tmp_path / "m.json"
    _fail(
        [tmp_path / "nan.npz", "--cluster", client.scheduler.address, "--out", out],
        r"nan.npz \(EMBEDDINGS\): features contain 1 non-finite .* row 17",
    )
    assert not out.exists() and not list(tmp_path.glob("m.json*"))


@pytest.mark.integration
def test_non_finite_embeddings_on_a_local_cluster_print_no_worker_traceback(tmp_path):
    """On spawned local workers (whose stderr is the terminal's) a bad block comes back as a value, so
    the worker logs no "Compute Failed" and its traceback; the user sees the one error line."""
    import subprocess
    import sys

    X, y = tied_case(0, n_ref=40)
    X[3, 0] = np.inf
    np.savez(tmp_path / "inf.npz", X=X, y=y)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "metricpipe.cli",
            "evaluate",
            str(tmp_path / "inf.npz"),
            "--workers",
            "1",
            "--out",
            str(tmp_path / "m.json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and "Compute Failed" not in res.stderr, res.stderr
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and re.search(
        r"inf.npz \(EMBEDDINGS\): features contain 1 non-finite .* row 3", errors[0]
    ), res.stderr
    assert not list(tmp_path.glob("m.json*"))


@pytest.mark.integration
def test_cutoff_metrics_equal_the_pipeline_s_own_retrieval_on_untied_data(client, tmp_path):
    """mprec@K and recall@K come from the same neighbour lists, for every K up to k; on continuous
    data (no ties) they equal the evaluate stage's own kernel (tasks.evaluation.retrieval)."""
    from metricpipe.tasks import evaluation, metrics

    rng = np.random.default_rng(3)
    y = np.repeat([0, 1, 2], [120, 100, 80])
    X = (rng.normal(size=(300, 4)) + 1.5 * y[:, None]).astype(np.float32)
    np.savez(tmp_path / "e.npz", X=X, y=y)
    out = tmp_path / "m.json"
    res = _run(tmp_path / "e.npz", "--cluster", client.scheduler.address, "--out", out)
    assert res.exit_code == 0, res.output
    got = _values(out)
    idx = np.arange(len(X))
    ref = evaluation.retrieval(X, idx, idx, X, y, (1, 10, 100), False, "euclidean", 4096, 512)
    for j, K in enumerate((1, 10, 100)):  # k = 119 (the largest class less the query): K = 100 fits
        assert got[f"mprec@{K}"] == pytest.approx(float(metrics.class_average(ref["prec"][:, j], y)), abs=1e-12)
        assert got[f"recall@{K}"] == pytest.approx(float(np.nanmean(ref["recall"][:, j])), abs=1e-12)
    assert "mprec@1000" not in got and "map" not in got


@pytest.mark.integration
def test_a_parquet_file_from_metricpipe_encode_is_read_without_naming_its_columns(client, tmp_path):
    """encode --out codes.parquet writes columns id, label, code; evaluate's defaults are X and y."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    X, y = tied_case(12, n_ref=120, dim=3, classes=4)
    pq.write_table(
        pa.table(
            {"id": pa.array(np.arange(len(y))), "label": pa.array(y), "code": pa.array(list(X), pa.list_(pa.float32()))}
        ),
        tmp_path / "codes.parquet",
    )
    out = tmp_path / "m.json"
    res = _run(tmp_path / "codes.parquet", "--cluster", client.scheduler.address, "--out", out)
    assert res.exit_code == 0, res.output
    got, ref = _values(out), pml_accuracy(X, y)
    assert all(got[name] == pytest.approx(ref[name], abs=1e-9) for name in ACC)
    # either option given alone (the right name) leaves the other found: --labels label said "no column 'X'"
    for opt in (["--labels", "label"], ["--features", "code"]):
        res = _run(tmp_path / "codes.parquet", *opt, "--cluster", client.scheduler.address, "--out", out)
        assert res.exit_code == 0 and _values(out) == got, res.output
    # encode of DATA without labels writes code alone: its labels come from a .npy
    pq.write_table(pa.table({"code": pa.array(list(X), pa.list_(pa.float32()))}), tmp_path / "nolab.parquet")
    np.save(tmp_path / "labs.npy", y)
    res = _run(
        tmp_path / "nolab.parquet",
        "--labels",
        tmp_path / "labs.npy",
        "--cluster",
        client.scheduler.address,
        "--out",
        out,
    )
    assert res.exit_code == 0 and _values(out) == got, res.output


def test_query_groups_are_sized_to_the_workers_memory_limit_or_refused():
    """Groups were sized by a fixed 400 MB whatever the workers had: a user's 500 MB workers were
    killed (a FutureCancelledError traceback, exit 1) and 1 GB ones paused at 87%."""
    from metricpipe import budget
    from metricpipe.commands import assess
    from metricpipe.tasks.errors import InputError

    k = 10147
    per_query = (2 * k + 4096) * 16 * 3.5
    sizes = {lim: assess.group_size(k, 100000, 2, lim) for lim in (None, 4e9, 1e9, 6e8, 5e8)}
    assert sizes[None] == sizes[4e9] == int(assess.POOL_BYTES // per_query)
    assert sizes[4e9] >= sizes[1e9] > sizes[6e8] > sizes[5e8] >= assess.MIN_GROUP
    for lim, g in sizes.items():  # each group, two reference blocks and the worker below Dask's pause
        if lim:
            assert g * per_query + 2 * assess.BLOCK_BYTES <= budget.usable(lim)
            assert g * per_query + 2 * assess.BLOCK_BYTES + budget.WORKER_RESIDENT <= budget.PAUSE_FRACTION * lim
    assert assess.group_size(k, 10, 2, 6e8) == 3  # few queries: still two tasks per worker
    with pytest.raises(
        InputError,
        match=r"^--memory-limit: a worker limit of 400 MB cannot hold the top-10,147 pools "
        r"of 16 queries \(22 MB\) beside two 64 MB reference blocks and the worker "
        r"itself; give workers at least 500 MB$",
    ):
        assess.group_size(k, 100000, 2, 4e8)
    assert assess.group_size(k, 100000, 2, 5.0e8) >= assess.MIN_GROUP  # the figure it names is enough
    # a huge class (k = 300,000): MIN_GROUP queries need more than POOL_BYTES, which is no reason to
    # refuse a large worker, nor to fail without a limit (it raised TypeError there)
    assert assess.group_size(300_000, 100000, 2, 64e9) == assess.MIN_GROUP == assess.group_size(300_000, 100000, 2)
    with pytest.raises(InputError, match=r"^the workers' limit: a worker limit of 1,000 MB cannot hold"):
        assess.group_size(300_000, 100000, 2, 1e9, "the workers' limit")
    # a reference smaller than one block holds its own bytes, not 64 MB (a 96 KB file was refused at 400 MB)
    assert assess.group_size(k, 100000, 2, 4e8, block_bytes=96e3) >= assess.MIN_GROUP


@pytest.mark.integration
def test_a_small_input_is_evaluated_on_400_mb_workers(client, tmp_path, monkeypatch):
    """evaluate refused --memory-limit 400MB for a 96 KB input: two 64 MB reference blocks were counted."""
    from metricpipe.commands import assess

    monkeypatch.setattr(assess, "worker_limit", lambda client: 4e8)  # the session's workers, as 400 MB ones
    X, y = tied_case(0, n_ref=1500, dim=16, classes=5)
    np.savez(tmp_path / "e.npz", X=X.astype(np.float32), y=y)
    res = _run(tmp_path / "e.npz", "--cluster", client.scheduler.address)
    assert res.exit_code == 0 and "map@r" in res.output, res.output


@pytest.mark.integration
def test_relative_paths_are_read_on_workers_that_run_in_another_folder(client, tmp_path, monkeypatch):
    """The readers went to the workers with the path as typed: FileNotFoundError on a worker whose
    working directory is not the command's (a remote cluster's; the session cluster's too)."""
    X, y = tied_case(0, n_ref=40)
    monkeypatch.chdir(tmp_path)
    import os

    assert str(tmp_path) not in client.run(os.getcwd).values()  # the workers' folder is not ours
    np.savez("q.npz", X=X[:20], y=y[:20])
    np.savez("r.npz", X=X, y=y)
    res = _run("r.npz", "--queries", "q.npz", "--cluster", client.scheduler.address, "--out", "m.json")
    assert res.exit_code == 0, res.output
    assert _values(tmp_path / "m.json")["map@r"] >= 0
    recs = json.loads((tmp_path / "m.json").read_text())
    assert recs[0]["params"]["reference"] == "r.npz"  # the records keep the paths as given


def _no_cluster(monkeypatch):
    """connect() replaced by a refusal that records the call: (calls, ...)."""
    import metricpipe.cluster
    from metricpipe.tasks.errors import InputError

    calls = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise InputError("a cluster was started")

    monkeypatch.setattr(metricpipe.cluster, "connect", refuse)
    return calls


@pytest.mark.integration
def test_a_small_input_is_evaluated_in_process_as_on_the_cluster(client, tmp_path, monkeypatch):
    """1,500 x 32-like inputs took 7-30 s for the LocalCluster alone: below the bound, no cluster
    starts, and the records are the cluster's and pytorch-metric-learning's."""
    X, y = tied_case(5, n_ref=150, dim=3, classes=5)
    np.savez(tmp_path / "e.npz", X=X, y=y)
    res = _run(tmp_path / "e.npz", "--cluster", client.scheduler.address, "--out", tmp_path / "cluster.json")
    assert res.exit_code == 0, res.output
    calls = _no_cluster(monkeypatch)
    res = _run(tmp_path / "e.npz", "--queries", 60, "--out", tmp_path / "sample.json")
    assert res.exit_code == 0 and not calls and "in this process" in res.output, res.output
    res = _run(tmp_path / "e.npz", "--out", tmp_path / "local.json")
    assert res.exit_code == 0 and not calls and "in this process" in res.output, res.output
    assert _values(tmp_path / "local.json") == _values(tmp_path / "cluster.json")
    ref = pml_accuracy(X, y)
    for name in ACC:
        assert _values(tmp_path / "local.json")[name] == pytest.approx(ref[name], abs=1e-9), name


def test_a_larger_input_or_a_named_cluster_goes_to_the_cluster(tmp_path, monkeypatch):
    from metricpipe.commands import assess

    X, y = tied_case(5, n_ref=150, dim=3, classes=5)
    np.savez(tmp_path / "e.npz", X=X, y=y)
    calls = _no_cluster(monkeypatch)
    for option in (["--cluster", "local"], ["--workers", "1"], ["--memory-limit", "2GB"]):
        res = _run(tmp_path / "e.npz", *option)
        assert res.exit_code == 2 and "a cluster was started" in res.output, (option, res.output)
    assert len(calls) == 3
    monkeypatch.setattr(assess, "IN_PROCESS_VALUES", X.size - 1)  # one value too many
    res = _run(tmp_path / "e.npz")
    assert res.exit_code == 2 and len(calls) == 4, res.output
    monkeypatch.setattr(assess, "IN_PROCESS_VALUES", X.size)
    monkeypatch.setattr(assess, "IN_PROCESS_PAIRS", len(X) ** 2 - 1)  # every row queries every row
    res = _run(tmp_path / "e.npz")
    assert res.exit_code == 2 and len(calls) == 5, res.output
