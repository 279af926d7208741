"""A store on a read-only or full file system (real tmpfs mounts, as root): run, report and
add-classes refuse with one line, leave no temporary files and damage nothing committed."""

import hashlib
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from metricpipe.cli import main

pytestmark = pytest.mark.integration


def _digest(root: Path) -> dict:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def _mount(target: Path, opts: str):
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(target)], capture_output=True, text=True)
    assert res.returncode == 0, f"this test mounts a tmpfs (needs root / CAP_SYS_ADMIN): {res.stderr.strip()}"


@pytest.fixture
def disk(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    _mount(mnt, "size=16m")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _one_error(res, match):
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and match in lines[0], res.output


def test_read_only_and_full_stores_are_refused_with_one_line(client, disk, tmp_path):
    store = disk / "store"
    cfg = tmp_path / "c.yaml"  # on the session's cluster: the store's file system is what is tested
    cfg.write_text(
        yaml.safe_dump(
            {
                "store": str(store),
                "cluster": client.scheduler.address,
                "data": {"source": "digits"},
                "methods": [{"method": "pca", "dim": 8}, {"method": "ncmml", "dim": 8, "iters": 50, "select": False}],
                "evaluate": {"retrieval": {"k": [5]}, "classification": {"classifiers": ["ncm"]}},
            }
        )
    )
    res = CliRunner().invoke(main, ["run", str(cfg)])
    assert res.exit_code == 0, res.output
    before = _digest(store)
    new = tmp_path / "new.npz"
    np.savez(new, X=np.ones((4, 64), np.float32), y=np.array([20] * 4))

    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    for args in (["run", str(cfg)], ["report", str(store)], ["add-classes", str(store), str(new)]):
        _one_error(
            CliRunner().invoke(main, args),
            "the store is not writable (Read-only file system); the store is read-only here",
        )
    subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)
    assert _digest(store) == before

    # full, but for a few pages: the start-up probe passes, the report's files do not fit
    filler = disk / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=4096"], capture_output=True)
    filler.write_bytes(filler.read_bytes()[: -3 * 4096])
    for args in (["report", str(store)], ["run", str(cfg)]):
        res = CliRunner().invoke(main, args)
        _one_error(res, "No space left on device")
        assert "free space on its disk" in res.output
        assert not list(store.rglob("*.tmp-*")), list(store.rglob("*.tmp-*"))
        kept = ("report/", "runs/", "logs/")  # rewritten whole (atomically) by a run, or not at all; logs
        assert {k: v for k, v in _digest(store).items() if not k.startswith(kept)} == {
            k: v for k, v in before.items() if not k.startswith(kept)
        }
        import json

        json.loads((store / "runs/latest.json").read_text())
    filler.unlink()
    res = CliRunner().invoke(main, ["run", str(cfg)])  # space again: the run finishes from its units
    assert res.exit_code == 0 and "train: reusing" in res.output, res.output
