"""``metricpipe gc``: what the last run used is kept, the rest is listed and only --delete removes it."""

import json

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from metricpipe.cli import main
from metricpipe.store import MARKER_SUFFIX, Store, to_json
from metricpipe.store.describe import verify_store
from tests.conftest import hold_lock, make_blobs


def _invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def K(name):
    """A unit key (16 hex digits, as hash_key makes them) spelled from a short name."""
    return name.encode().hex().ljust(16, "0")


def R(rel):
    kind, name = rel.split("/")
    return f"{kind}/{K(name)}"


def _unit(store, kind, key, commit=True, attrs=None, **meta):
    key = K(key)
    u = store.unit(kind, key)
    u.begin()
    if attrs is not None:
        from metricpipe.store import save_arrays

        save_arrays(u.url, {}, attrs)
    store.fs.pipe_file(f"{store.root}/{kind}/{key}/payload", bytes(100))
    if commit:
        u.commit(meta)
    return u


def _all(store):
    return {
        u.rel
        for kind in ("data", "statistics", "neighbours", "shuffled", "models", "selection", "codes", "evaluation")
        for u in store.units(kind)
    }


@pytest.fixture
def store(tmp_path):
    """A store whose last run used one unit of each kind, a selection with two candidates and a shuffled
    copy; beside them an earlier config's units, a model add-classes made from the run's model, one
    made from the earlier config's, a killed writer's unit and a marker whose unit is gone."""
    st = Store(str(tmp_path / "s"))
    run = {
        "data": R("data/d1"),
        "statistics": R("statistics/s1"),
        "neighbours": None,
        "models": [R("models/m1")],
        "codes": [R("codes/c1")],
        "selection": [R("selection/x1")],
    }
    for kind, key in [("data", "d1"), ("statistics", "s1"), ("codes", "c1"), ("evaluation", "e1"), ("models", "cand")]:
        _unit(st, kind, key)
    _unit(st, "shuffled", "h1", attrs={"data": K("d1")})
    _unit(st, "shuffled", "h2", attrs={"data": K("d1")})  # another seed's copy of its data: kept too
    _unit(st, "shuffled", "h0", attrs={"data": K("d0")})
    _unit(st, "models", "m1", spec={"method": "ncmml"}, dim=4)
    _unit(
        st,
        "selection",
        "x1",
        candidates=[{"model": K("m1")}, {"model": K("cand")}, {"model": None, "error": "diverged"}],
    )
    _unit(st, "models", "ext1", spec={"method": "ncmml"}, dim=4, extends=K("m1"))  # add-classes of the run's model
    _unit(st, "models", "ext2", spec={"method": "ncmml"}, dim=4, extends=K("ext1"))  # ... and of that copy
    for kind, key in [("data", "d0"), ("codes", "c0"), ("evaluation", "e0")]:
        _unit(st, kind, key)
    _unit(st, "models", "m0", spec={"method": "pca"}, dim=4)
    _unit(st, "models", "ext0", spec={"method": "ncmml"}, dim=4, extends=K("m0"))  # of an earlier config's model
    _unit(st, "models", "extc", spec={"method": "ncmml"}, dim=4, extends=K("cand"))  # of a kept candidate
    _unit(st, "models", "killed", commit=False)
    st.fs.pipe_file(f"{st.root}/codes/{K('gone')}{MARKER_SUFFIX}", b"{}")
    # a user's own folders and files inside the store's folders (a store made in a project folder):
    # not units, never listed nor removed
    for kind, name in [("data", "raw"), ("models", "notes"), ("codes", "0123456789ABCDEF")]:
        st.fs.makedirs(f"{st.root}/{kind}/{name}", exist_ok=True)
        st.fs.pipe_file(f"{st.root}/{kind}/{name}/keep.txt", b"mine")
    st.fs.pipe_file(f"{st.root}/data/raw{MARKER_SUFFIX}", b"{}")
    import time

    st.write_text(
        "runs/latest.json", to_json({"units": run, "evaluation_units": [R("evaluation/e1")], "started": time.time()})
    )
    time.sleep(0.01)
    _unit(st, "models", "later")  # committed by a run that started after it and did not finish
    return st


KEPT = {
    R(x)
    for x in {
        "data/d1",
        "statistics/s1",
        "codes/c1",
        "evaluation/e1",
        "shuffled/h1",
        "shuffled/h2",
        "models/m1",
        "models/cand",
        "selection/x1",
        "models/ext1",
        "models/ext2",
        "models/extc",
        "models/later",
    }
}
LISTED = {
    R(x)
    for x in {
        "data/d0",
        "codes/c0",
        "evaluation/e0",
        "shuffled/h0",
        "models/m0",
        "models/ext0",
        "models/killed",
        "codes/gone",
    }
}


def test_gc_lists_what_the_last_run_did_not_use_and_removes_nothing(store):
    before = sorted(store.fs.find(store.root))
    res = _invoke("gc", store.url)
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[-1].endswith(
        "kept 1 unit committed after the last finished run started (a run "
        "that did not finish, or add-classes: --resume reuses them)"
    )
    listed = {line.split()[0] for line in res.output.splitlines()[:-1]}
    assert listed == LISTED
    killed = R("models/killed")
    assert killed in res.output and "unfinished" in res.output.split(killed)[1].splitlines()[0]
    assert res.output.splitlines()[-1].startswith(f"{len(LISTED)} units, ")
    assert sorted(store.fs.find(store.root)) == before


def test_gc_delete_removes_exactly_the_listed_units_and_the_kept_ones_stay_intact(store):
    res = _invoke("gc", store.url, "--delete")
    assert res.exit_code == 0, res.output
    assert _all(store) == KEPT
    assert not store.fs.exists(f"{store.root}/codes/{K('gone')}{MARKER_SUFFIX}")
    for kind, name in [("data", "raw"), ("models", "notes"), ("codes", "0123456789ABCDEF")]:  # the user's
        assert store.fs.cat_file(f"{store.root}/{kind}/{name}/keep.txt") == b"mine"
    assert store.fs.exists(f"{store.root}/data/raw{MARKER_SUFFIX}")
    checked, problems = verify_store(store.url)
    assert (checked, problems) == (len(KEPT), [])
    again = _invoke("gc", store.url)
    assert again.exit_code == 0 and "nothing to remove" in again.output


def test_gc_says_unfinished_units_may_be_a_running_run_s_while_the_store_is_in_use(store):
    """Listed as 'left by a killed run' while a run under way was writing them."""
    proc = hold_lock(store.root)
    try:
        res = _invoke("gc", store.url)
        assert res.exit_code == 0, res.output
        line = next(ln for ln in res.output.splitlines() if ln.startswith(R("models/killed")))
        assert f"unfinished (the store is in use: pid {proc.pid}" in line and "it may be writing it)" in line, line
    finally:
        proc.kill()
        proc.wait()


def test_gc_delete_is_refused_while_another_process_holds_the_store(store):
    proc = hold_lock(store.root)
    try:
        before = sorted(store.fs.find(store.root))
        res = _invoke("gc", store.url, "--delete")
        assert res.exit_code == 2
        assert res.output.strip().startswith("error:") and "in use" in res.output and len(res.output.splitlines()) == 1
        assert sorted(store.fs.find(store.root)) == before
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("latest, match", [(None, "no finished run"), (b"{not json", "corrupt")])
def test_gc_without_a_readable_last_run_removes_nothing(store, latest, match):
    if latest is None:
        store.fs.rm(f"{store.root}/runs/latest.json")
    else:
        store.fs.pipe_file(f"{store.root}/runs/latest.json", latest)
    before = sorted(store.fs.find(store.root))
    res = _invoke("gc", store.url, "--delete")
    assert res.exit_code == 2 and match in res.output and len(res.output.splitlines()) == 1
    assert sorted(store.fs.find(store.root)) == before


@pytest.mark.parametrize(
    "latest, problem",
    [
        ("[]", "a list, not a mapping"),
        ('{"units": 5}', "units: not a mapping"),
        ('{"units": {"models": [3]}}', "units.models: not models/KEY paths"),
        ('{"units": {"data": "data/../../../home"}}', "units.data: not data/KEY paths"),  # outside the store
        ('{"units": {}, "evaluation_units": "evaluation/0123456789abcdef"}', "evaluation_units: not a list"),
        ('{"units": {}, "started": "yesterday"}', "started: not a number"),
        ('{"units": {}, "timings": [1]}', "timings: not a list of"),
    ],
)
def test_a_manifest_of_the_wrong_shape_is_one_line_for_gc_report_and_inspect(store, latest, problem):
    """runs/latest.json of the wrong shape was a TypeError (or AttributeError) traceback in gc and report."""
    store.fs.pipe_file(f"{store.root}/runs/latest.json", latest.encode())
    before = sorted(store.fs.find(store.root))
    for cmd in (("gc", store.url, "--delete"), ("report", store.url)):
        res = CliRunner().invoke(main, [str(a) for a in cmd])
        assert res.exit_code == 2 and len(res.output.splitlines()) == 1, (cmd, res.output)
        assert res.output.startswith(f"error: {store.url}: runs/latest.json is corrupt ({problem}"), res.output
    assert sorted(store.fs.find(store.root)) == before
    checked, problems = verify_store(store.url)
    assert any(p.startswith(f"runs/latest.json is corrupt ({problem}") for p in problems)
    res = _invoke("inspect", store.url)
    assert res.exit_code == 0 and "last run: runs/latest.json is corrupt" in res.output


def test_gc_of_a_folder_that_is_not_a_store(tmp_path):
    res = _invoke("gc", tmp_path)
    assert res.exit_code == 2 and res.output.startswith("error:")


@pytest.mark.integration
def test_after_gc_the_last_config_reruns_from_the_store_and_an_earlier_one_is_recomputed(client, tmp_path):
    X, y = make_blobs(n=300, d=8)
    np.savez(tmp_path / "ok.npz", X=X, y=y)

    def config(name, iters, cluster=client.scheduler.address):
        cfg = {
            "store": str(tmp_path / "store"),
            "cluster": cluster,
            "workers": 1,
            "dashboard": ":0",
            "data": {"path": str(tmp_path / "ok.npz")},
            "methods": [{"method": "pca", "dim": 4}, {"method": "ncmml", "dim": 4, "iters": iters}],
            "evaluate": {"retrieval": {"k": [5]}, "classification": {"classifiers": ["ncm"]}},
        }
        p = tmp_path / name
        p.write_text(yaml.safe_dump(cfg))
        return p

    a, b = config("a.yaml", 20), config("b.yaml", 30)
    assert _invoke("run", a).exit_code == 0
    assert _invoke("run", config("b.yaml", 30, "local")).exit_code == 0
    # a local run's workers log to STORE/logs; a finished run leaves no empty log file (a worker can still
    # log a heartbeat error while the cluster closes: that file stays)
    assert (tmp_path / "store/logs").is_dir()
    assert all(p.stat().st_size > 0 for p in (tmp_path / "store/logs").iterdir())
    b = config("b.yaml", 30)
    store = Store(str(tmp_path / "store"))
    copies = {u.rel for u in store.units("shuffled")}
    assert copies  # NCMML read a shuffled copy of the staged data, which gc must keep
    records = json.loads((tmp_path / "store/report/metrics.json").read_text())["records"]
    res = _invoke("gc", store.url, "--delete")
    assert res.exit_code == 0 and "removed" in res.output
    rerun = _invoke("run", b)
    assert rerun.exit_code == 0, rerun.output
    assert "reusing 2 of 2 models" in rerun.output and "reusing 2 of 2 evaluations" in rerun.output
    assert {u.rel for u in store.units("shuffled")} == copies and "shuffled" not in rerun.output  # kept, not rewritten
    assert json.loads((tmp_path / "store/report/metrics.json").read_text())["records"] == records
    first = _invoke("run", a)
    assert first.exit_code == 0 and "reusing 1 of 2 models" in first.output  # PCA is the same; NCMML was removed
    assert "shuffled" not in first.output  # its retraining read the copy gc kept


def test_inspect_lists_a_store_whose_manifest_is_corrupt(store):
    store.fs.pipe_file(f"{store.root}/runs/latest.json", b"{trunc")
    res = _invoke("inspect", store.url)
    assert res.exit_code == 0 and "runs/latest.json is corrupt" in res.output and f"\n  {K('m1')}  done" in res.output


def test_a_shuffled_copy_whose_group_metadata_is_gone_is_kept_not_a_traceback(store):
    store.fs.rm(f"{store.root}/shuffled/{K('h0')}/zarr.json")
    res = _invoke("gc", store.url, "--delete")
    assert res.exit_code == 0 and R("shuffled/h0") in {u.rel for u in store.units("shuffled")}, res.output
