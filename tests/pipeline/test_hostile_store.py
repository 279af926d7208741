"""A store from someone else cannot hurt you (issue 44).

A store made by a real run on digits is altered as its sender could alter it: links for ``.lock``,
``report/``, ``runs/latest.json``, a unit's folder and a unit's file, a manifest naming units
outside the store, an array added to a model, edited and truncated records, a FIFO for a chunk.
Every command that reads a store is then run on it: nothing outside the store may change, and each
command either works on verified data (its results are those of the untouched store) or refuses in
one line (exit 2, no traceback)."""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

import metricpipe
from metricpipe.cli import main
from metricpipe.store import MARKER_SUFFIX, record_digest, size_crc
from metricpipe.tasks.errors import InputError

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def made(client, tmp_path_factory):
    """(the folder holding the untouched store ``good``, {method: model key}, the digits rows): one
    run on the session's cluster, two baselines and a learner with class means."""
    tmp = tmp_path_factory.mktemp("hostile")
    cfg = {
        "store": str(tmp / "good"),
        "cluster": client.scheduler.address,
        "dashboard": ":0",
        "data": {"source": "digits"},
        "methods": [
            {"method": "identity"},
            {"method": "pca", "dim": 8},
            {"method": "ncmml", "dim": 8, "iters": 20, "select": False},
        ],
        "evaluate": {"retrieval": {"k": [5]}, "classification": {"classifiers": ["knn1", "ncm"]}},
    }
    (tmp / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    res = _cli("run", tmp / "cfg.yaml")
    assert res.exit_code == 0, res.output
    from metricpipe.store.models import describe

    keys = {r["method"]: r["key"] for r in describe(str(tmp / "good"))}
    from sklearn.datasets import load_digits

    return tmp, keys, load_digits().data


def _cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _copy(made, tmp_path) -> Path:
    store = tmp_path / "s"
    shutil.copytree(made[0] / "good", store, symlinks=True)
    (tmp_path / "home" / "elsewhere").mkdir(parents=True)
    (tmp_path / "home" / "victim.txt").write_text("the user's own file")
    (tmp_path / "out").mkdir()
    cfg = yaml.safe_load((made[0] / "cfg.yaml").read_text())
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump({**cfg, "store": str(store)}))
    return store


def _outside(tmp_path) -> dict:
    """Every file and link under ``tmp_path`` but the store and the outputs' folder, with its bytes."""
    seen = {}
    for folder, dirs, files in os.walk(tmp_path):
        if Path(folder) == tmp_path:
            dirs[:] = [d for d in dirs if d not in ("s", "out")]
        for name in dirs + files:
            p = Path(folder) / name
            seen[str(p)] = f"link to {os.readlink(p)}" if p.is_symlink() else p.read_bytes() if p.is_file() else "dir"
    return seen


def _move_out(store: Path, rel: str, home: Path) -> Path:
    """Move ``rel`` of the store outside and leave a link to it in its place."""
    target = home / rel.replace("/", "_")
    shutil.move(store / rel, target)
    (store / rel).symlink_to(target)
    return target


def _unit(store: Path, kind: str, method: str | None = None) -> str:
    """The store path of the first committed unit of ``kind`` (of the model of ``method``)."""
    for marker in sorted((store / kind).glob(f"*{MARKER_SUFFIX}")):
        meta = json.loads(marker.read_text())
        if method is None or (meta.get("spec") or {}).get("method") == method:
            return f"{kind}/{marker.name.removesuffix(MARKER_SUFFIX)}"
    raise AssertionError(f"no {kind} unit")


def _add_array(store: Path, rel: str, name: str = "components_") -> None:
    import zarr

    zarr.open_group(str(store / rel), mode="r+").create_array(name, shape=(64, 64), dtype="f4")[...] = np.eye(
        64, dtype=np.float32
    )[::-1]


def _edit_records(store: Path, truncate: bool = False) -> None:
    records = store / _unit(store, "evaluation") / "records.json"
    if truncate:
        records.write_bytes(records.read_bytes()[:100])
        return
    recs = json.loads(records.read_text())
    for r in recs:
        if r["metric"] == "map":
            r["value"] = 0.9999
    records.write_text(json.dumps(recs))


def _fifo(store: Path, home: Path) -> None:
    chunk = next((store / _unit(store, "data")).glob("features/c/*/*"))
    chunk.unlink()
    os.mkfifo(chunk)


HOSTILE = {
    "lock linked to a user's file": lambda s, h: (
        (s / ".lock").unlink(missing_ok=True),
        (s / ".lock").symlink_to(h / "victim.txt"),
    ),
    "lock linked, set-aside units": lambda s, h: (
        (s / ".lock").unlink(missing_ok=True),
        (s / ".lock").symlink_to(h / "victim.txt"),
        (s / ".replaced" / "models").mkdir(parents=True),
    ),
    "report linked to a folder": lambda s, h: (shutil.rmtree(s / "report"), (s / "report").symlink_to(h / "elsewhere")),
    "runs/latest.json linked outside": lambda s, h: _move_out(s, "runs/latest.json", h),
    "a unit's folder linked outside": lambda s, h: _move_out(s, _unit(s, "models", "pca"), h),
    "a unit's file linked outside": lambda s, h: _move_out(s, f"{_unit(s, 'models', 'identity')}/zarr.json", h),
    "records linked outside": lambda s, h: _move_out(s, f"{_unit(s, 'evaluation')}/records.json", h),
    "a manifest naming units outside": lambda s, h: (s / "runs/latest.json").write_text(
        json.dumps({**json.loads((s / "runs/latest.json").read_text()), "units": {"models": ["../../home/elsewhere"]}})
    ),
    "a manifest of the wrong shape": lambda s, h: (s / "runs/latest.json").write_text('{"units": 5}'),
    "an array added to a model": lambda s, h: _add_array(s, _unit(s, "models", "identity")),
    "edited records": lambda s, h: _edit_records(s),
    "truncated records": lambda s, h: _edit_records(s, truncate=True),
    "a FIFO for a chunk": _fifo,
}
# alterations of a unit's own files, which `inspect --verify` must name
IN_UNITS = {
    "a unit's file linked outside",
    "records linked outside",
    "an array added to a model",
    "edited records",
    "truncated records",
    "a FIFO for a chunk",
}


def _refused_in_one_line(res) -> bool:
    """Exit 2 with one `error:` line and no traceback (a command that started a run logs before it)."""
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error: ")]
    return res.exit_code == 2 and len(errors) == 1 and "Traceback" not in res.output


def _records(store: Path) -> list:
    return json.loads((store / "report" / "metrics.json").read_text())["records"]


@pytest.mark.parametrize("case", HOSTILE)
def test_every_command_on_a_hostile_store_works_on_verified_data_or_refuses_in_one_line(made, tmp_path, case):
    tmp, keys, X = made
    good = tmp / "good"
    store = _copy(made, tmp_path)
    home, out = tmp_path / "home", tmp_path / "out"
    HOSTILE[case](store, home)
    before = _outside(tmp_path)
    good_records = _records(good)

    for args in (["models", store], ["inspect", store], ["gc", store], ["gc", store, "--delete"]):
        res = _cli(*args)
        assert res.exit_code == 0 or _refused_in_one_line(res), (args, res.output)
        assert res.exception is None or isinstance(res.exception, SystemExit), (args, res.exception)
    res = _cli("inspect", "--verify", store)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    if case in IN_UNITS:  # the damage is named, or the store refused
        assert (res.exit_code == 1 and "DAMAGED" in res.output) or _refused_in_one_line(res), res.output
    else:
        assert res.exit_code in (0, 1) or _refused_in_one_line(res), res.output

    res = _cli("report", store)
    assert res.exit_code == 0 or _refused_in_one_line(res), res.output
    if res.exit_code == 0:
        assert _records(store) == good_records

    for method in ("identity", "ncmml"):
        try:
            est = metricpipe.load_model(str(store), keys[method])
        except InputError as e:
            assert "\n" not in str(e)
        else:
            np.testing.assert_array_equal(est.transform(X), metricpipe.load_model(str(good), keys[method]).transform(X))

    for method in ("identity", "ncmml"):
        codes = out / f"{method}.npy"
        res = _cli("encode", store, "digits", "--model", keys[method], "--out", codes)
        assert res.exit_code == 0 or _refused_in_one_line(res), res.output
        if res.exit_code == 0:
            ref = out / f"{method}-good.npy"
            assert _cli("encode", good, "digits", "--model", keys[method], "--out", ref).exit_code == 0
            assert codes.read_bytes() == ref.read_bytes()
        else:
            assert not codes.exists()
    for method, k in (("ncmml", []), ("pca", ["--k", "5"])):  # class means; the run's train codes
        res = _cli("predict", store, "digits", "--model", keys[method], *k)
        assert res.exit_code == 0 or _refused_in_one_line(res), res.output
        if res.exit_code == 0:
            assert res.output == _cli("predict", good, "digits", "--model", keys[method], *k).output

    res = _cli("run", tmp_path / "cfg.yaml")  # resuming: every unit is reused only once verified
    assert res.exit_code == 0 or _refused_in_one_line(res), res.output
    if res.exit_code == 0:
        assert _records(store) == good_records
    assert _outside(tmp_path) == before, case


def test_an_array_added_to_a_model_is_named_by_verify_and_never_loaded(made, tmp_path):
    """components_ created in an identity model's group passed `inspect --verify` ("0 problems") and
    load_model set it, so encode and predict projected with it (top-1 error 0.18 -> 0.97). Verify now
    names every file its commit does not list; and with the commit record rewritten to list it too,
    the estimator still sets only the attributes its class declares."""
    tmp, keys, X = made
    store = _copy(made, tmp_path)
    rel = f"models/{keys['identity']}"
    _add_array(store, rel)
    res = _cli("inspect", "--verify", store)
    assert (
        res.exit_code == 1 and f"DAMAGED {rel}/components_/zarr.json: not among the files of its commit" in res.output
    )
    with pytest.raises(InputError, match=f"model {keys['identity']} is damaged: {rel}/components_/c/0/0: not among"):
        metricpipe.load_model(str(store), keys["identity"])
    res = _cli("encode", store, "digits", "--model", keys["identity"], "--out", tmp_path / "out" / "c.npy")
    assert _refused_in_one_line(res) and "is damaged" in res.output, res.output
    # a sender who also rewrites the commit record (its checksums are not a signature)
    marker = store / f"{rel}{MARKER_SUFFIX}"
    meta = json.loads(marker.read_text())
    import fsspec

    fs = fsspec.filesystem("file")
    meta["files"] = {
        str(p.relative_to(store / rel)): size_crc(fs, str(p)) for p in sorted((store / rel).rglob("*")) if p.is_file()
    }
    meta["record"] = record_digest(meta)
    marker.write_text(json.dumps(meta))
    assert _cli("inspect", "--verify", store).exit_code == 0
    est = metricpipe.load_model(str(store), keys["identity"])
    assert not hasattr(est, "components_")
    np.testing.assert_array_equal(est.transform(X), X.astype(np.float32))


@pytest.mark.parametrize("truncate", [False, True], ids=["edited", "truncated"])
def test_report_checks_the_evaluation_records_as_a_run_does(made, tmp_path, truncate):
    """An edited records.json (mAP set to 0.9999) was reported as real, and a truncated one was a
    JSONDecodeError traceback: report reads a unit only once its files match its commit."""
    store = _copy(made, tmp_path)
    _edit_records(store, truncate)
    rel = _unit(store, "evaluation")
    res = _cli("report", store)
    assert _refused_in_one_line(res) and f"{rel}/records.json: " in res.output, res.output
    assert "the last run's results are damaged: rerun 'metricpipe run CONFIG --repair'" in res.output
    assert _records(store) == _records(made[0] / "good")  # the report as it was
    assert _cli("run", tmp_path / "cfg.yaml", "--repair").exit_code == 0
    assert _refused_in_one_line(_cli("report", store)) is False and _records(store) == _records(made[0] / "good")
