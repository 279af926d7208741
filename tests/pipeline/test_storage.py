import numpy as np
import pytest

from metricpipe.store import Store, hash_key, load_arrays, save_arrays
from metricpipe.tasks.errors import InputError


def test_unit_is_done_only_after_commit_with_its_key(tmp_path):
    store = Store(str(tmp_path / "s"))
    store.check_writable()
    u = store.unit("models", "abc")
    assert not u.done()
    u.begin()
    save_arrays(u.url, {"W": np.eye(2)})
    assert not u.done()  # written but not committed: a killed writer's leftovers
    u.commit({"seconds": 1})
    assert u.done() and u.meta()["key"] == "abc"
    # a rerun wipes the unit and its marker before writing again
    u.begin()
    assert not u.done() and not any((tmp_path / "s" / "models" / "abc").iterdir())


def test_marker_with_another_key_is_not_done(tmp_path):
    store = Store(str(tmp_path))
    u = store.unit("data", "k1")
    u.begin()
    store.write_text("data/k1.committed.json", '{"key": "other"}')
    assert not u.done()


def test_a_refused_command_removes_the_new_store_it_locked_but_never_one_another_run_holds(tmp_path):
    from metricpipe.runner import removed_if_refused

    mine = Store(str(tmp_path / "mine"))
    with pytest.raises(InputError, match="bad input"):
        with removed_if_refused(mine), mine.lock("stage"):
            raise InputError("bad input")  # refused after this process created and locked it
    assert not (tmp_path / "mine").exists()

    path = tmp_path / "theirs"
    me, them = Store(str(path)), Store(str(path))  # two lock holders: flock is per open file
    with pytest.raises(InputError, match="the store is in use by"):
        with removed_if_refused(me):  # the folder does not exist yet when this command starts
            them.check_writable()
            with them.lock("run"):  # ... another run creates and locks it meanwhile
                (path / "uncommitted").write_text("work in progress")
                with me.lock("stage"):
                    pass
    assert (path / "uncommitted").read_text() == "work in progress"


def test_hash_key_is_stable_and_order_free():
    assert hash_key({"a": 1, "b": [1, 2]}) == hash_key({"b": [1, 2], "a": 1})
    assert hash_key({"a": 1}) != hash_key({"a": 2})


def test_keys_change_with_the_numerical_libraries_release(tmp_path, monkeypatch):
    """Another numpy (its BLAS), scipy, ... can change a result's bits: its results are not reused,
    and a unit's marker names what made it (so a model's codes are found again after an upgrade)."""
    from importlib import metadata

    from metricpipe.store import keys as storage

    storage.code_version.cache_clear()
    now = hash_key({"a": 1})
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "1.0.0" if name == "numpy" else real(name))
    storage.code_version.cache_clear()
    try:
        assert "numpy-1.0" in storage.code_version()
        assert hash_key({"a": 1}) != now
        u = Store(str(tmp_path)).unit("models", "k")
        u.begin()
        u.commit({})
        assert u.meta()["version"] == storage.code_version()
        assert hash_key({"a": 1}, u.meta()["version"]) == hash_key({"a": 1})
        # a marker of this release without its record digest is damaged (a flipped byte in "record")
        import json

        marker = tmp_path / "models" / "k.committed.json"
        meta = json.loads(marker.read_text())
        marker.write_text(json.dumps({k: v for k, v in meta.items() if k != "record"}))
        assert not u.done() and u.marker_damaged()
        marker.write_text(json.dumps({"key": "k", "version": "0.3.7"}))  # an earlier release's: none
        assert u.done()
    finally:
        monkeypatch.undo()
        storage.code_version.cache_clear()
    assert hash_key({"a": 1}) == now


def test_store_path_that_is_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(InputError, match="store path is a file"):
        Store(str(f)).check_writable()


def test_save_and_load_arrays_with_scalars(tmp_path):
    save_arrays(str(tmp_path / "g"), {"W": np.arange(6.0).reshape(2, 3), "n": np.int64(5)}, {"dim": 3})
    arrays, attrs = load_arrays(str(tmp_path / "g"))
    assert arrays["n"] == 5 and attrs["dim"] == 3 and arrays["W"].shape == (2, 3)


def test_row_arrays_are_compressed_only_where_lz4_pays(tmp_path):
    from metricpipe.store import create_array, lz4_ratio, open_array, row_codecs

    rng = np.random.default_rng(0)
    dense = rng.standard_normal((4096, 64)).astype(np.float32)  # descriptors: ~1.1x
    pixels = np.where(rng.random((4096, 64)) < 0.5, 0, rng.integers(0, 256, (4096, 64))).astype(np.float32)
    assert lz4_ratio(dense) < 1.5 <= lz4_ratio(pixels)
    assert row_codecs(dense) == () and len(row_codecs(pixels)) == 1 and len(row_codecs()) == 1
    for name, X in (("dense", dense), ("pixels", pixels)):
        a = create_array(str(tmp_path / name), X.shape, (1000, 64), np.float32, rows=True, sample=X[:500])
        a[:] = X
        b = open_array(str(tmp_path / name))
        np.testing.assert_array_equal(b[:], X)
        assert len(b.compressors) == (name == "pixels")


def test_a_busy_zarr_loop_at_exit_leaves_no_traceback(tmp_path):
    """zarr's exit handler waited 0.2 s for its I/O thread and then closed a loop still running: "Cannot
    close a running event loop", a traceback after a run that succeeded (seen once in ~60 runs)."""
    import subprocess
    import sys

    script = tmp_path / "busy.py"
    script.write_text(f"""
import asyncio, time
import zarr
from zarr.core import sync
import metricpipe.store  # noqa: F401
g = zarr.open_group({str(tmp_path / "a.zarr")!r}, mode="w")
g.create_array("a", shape=(4,), dtype="f4")[:] = 1
async def busy():
    time.sleep(0.6)
asyncio.run_coroutine_threadsafe(busy(), sync.loop[0])
time.sleep(0.05)
""")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr and "running event loop" not in proc.stderr, (
        proc.stderr
    )


def test_a_committed_unit_being_recomputed_comes_back_unless_its_replacement_commits(tmp_path):
    """Unit.begin on a committed unit (--force, --no-resume, --repair) sets it aside; restore_replaced
    puts it back after a stopped run, from either state a kill can leave, and drops it once the new
    copy commits."""
    import os

    from metricpipe.store import MARKER_SUFFIX

    store = Store(str(tmp_path / "s"))

    def committed(key, value):
        unit = store.unit("models", key)
        unit.begin()
        save_arrays(unit.url, {"w": np.full(3, value)})
        unit.commit({"value": value})
        return unit

    a, b = committed("a" * 16, 1.0), committed("b" * 16, 2.0)
    a.begin()  # a run starts recomputing a, then stops
    save_arrays(a.url, {"w": np.zeros(3)})  # half-written
    b_aside = b._aside()
    b.begin()  # and b, killed between the two moves:
    os.replace(b_aside, b.root)  # its files back in place, the marker aside
    assert not a.done() and not b.done()
    assert sorted(store.restore_replaced()) == [a.rel, b.rel]
    assert a.done() and b.done() and a.verify() == [] and b.verify() == []
    assert load_arrays(a.url)[0]["w"].tolist() == [1.0] * 3 and a.meta()["value"] == 1.0
    assert load_arrays(b.url)[0]["w"].tolist() == [2.0] * 3
    a.begin()  # recomputed and committed this time
    save_arrays(a.url, {"w": np.full(3, 5.0)})
    a.commit({"value": 5.0})
    assert not os.path.exists(a._aside() + MARKER_SUFFIX) and store.restore_replaced() == []
    assert load_arrays(a.url)[0]["w"].tolist() == [5.0] * 3
    assert not any((tmp_path / "s" / ".replaced").rglob("*"))  # nothing left behind


def test_a_committed_unit_whose_folder_is_gone_is_recomputed_and_set_aside_units_return_on_open(tmp_path):
    """--repair of a unit whose folder was deleted (its marker kept) crashed moving the missing folder
    aside; and after a kill only `run` put set-aside units back, so `models` and `inspect` saw none."""
    import shutil

    from metricpipe.store import MARKER_SUFFIX

    store = Store(str(tmp_path / "s"))
    unit = store.unit("models", "c" * 16)
    unit.begin()
    save_arrays(unit.url, {"w": np.ones(2)})
    unit.commit({})
    shutil.rmtree(unit.root)  # the folder gone, the marker left
    unit.begin()  # recomputing it: nothing to set aside
    assert not (tmp_path / "s" / ".replaced" / "models" / ("c" * 16 + MARKER_SUFFIX)).exists()
    save_arrays(unit.url, {"w": np.ones(2)})
    unit.commit({})
    unit.begin()  # a run sets it aside and is killed
    assert not unit.done()
    (tmp_path / "s" / ".replaced" / "notes.txt").write_text("a stray file")  # not a kind's folder: skipped
    again = Store(str(tmp_path / "s"))  # any command that opens the store
    assert again.restored == [unit.rel] and unit.done() and unit.verify() == []
    assert Store(str(tmp_path / "s")).restored == []


def test_a_lock_held_for_an_instant_delays_a_writer_instead_of_refusing_it(tmp_path):
    """gc's listing and a store's opening take the lock for an instant to probe it; a run starting then
    was refused as if another run held the store. A writer now tries for about a second; a probe once."""
    import threading

    from tests.conftest import hold_lock

    store = Store(str(tmp_path / "s"))
    store.check_writable()
    holder = hold_lock(store.root)
    threading.Timer(0.3, holder.kill).start()  # an instant's probe, as seen from here
    with pytest.raises(InputError, match="in use by"):
        with store.lock("probe", tries=1):
            pass
    with store.lock("metricpipe run"):  # waits the 0.3 s out
        pass
    holder.wait()


def test_a_force_continued_reuses_only_what_its_own_stopped_attempts_committed(tmp_path):
    """--force train stopped midway, then rerun as its hint says (--force train again), retrained the
    models the first attempt had already recomputed. The continuation reuses exactly those: not units
    of another --force, of a run that forced nothing, or of any run once --no-resume starts afresh."""
    from metricpipe.context import StageContext
    from metricpipe.runner import FORCING, forcing

    store = Store(str(tmp_path / "s"))
    logged, ids = [], []

    def attempt(force, resume=True):
        """A run's start: its id, its forcing record, its context (``force`` None: forces nothing)."""
        store.run_id = f"run{len(ids)}"
        ids.append(store.run_id)
        earlier = forcing(store, force if resume else "stage", resume, logged.append)
        return StageContext(None, store, None, resume=resume, force=force, log=logged.append, forced_by=earlier)

    def committed(key):
        unit = store.unit("models", key)
        unit.begin()
        save_arrays(unit.url, {"w": np.ones(2)})
        unit.commit({})
        return unit

    store.run_id = "plain"
    old = committed("a" * 16)  # an earlier, finished run's model
    first = attempt("train")  # --force train: recomputes it, keeps the stages before
    assert not first.reuse(old, "train") and first.reuse(old, "statistics")
    new = committed("b" * 16)  # ... commits one model, then stops
    assert new.meta()["run"] == "run0"
    again = attempt("train")  # the hint's command
    assert again.forced_by == ("run0",) and again.reuse(new, "train") and not again.reuse(old, "train")
    assert any(str(m).startswith("Continuing the --force train run") for m in logged)
    third = attempt("train")  # a third attempt continues both
    assert third.forced_by == ("run0", "run1") and third.reuse(new, "train")
    other = attempt("evaluate")  # another --force: a new record, nothing spared
    assert other.forced_by == () and store.read_json(FORCING) == {"stage": "evaluate", "runs": ["run3"]}
    assert attempt("train").forced_by == ()
    assert not attempt("train", resume=False).forced_by  # --no-resume: every stage, from scratch ...
    assert attempt("stage").forced_by == ("run5",)  # ... and its hint (--force stage) continues it
    plain = attempt(None)  # a run that forces nothing ends the record
    assert plain.forced_by == () and not (tmp_path / "s" / FORCING).exists()
    assert attempt("train").forced_by == ()


# ---- a store from someone else: no link followed, no file outside the store written ---------------


def _victim(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own file")
    return victim


def test_a_lock_that_is_a_link_a_hard_link_or_a_fifo_is_refused_and_its_target_left_alone(tmp_path):
    """The lock opened STORE/.lock following links, truncated it and wrote JSON: `ln -s ~/victim.txt
    st/.lock; metricpipe gc st` overwrote the victim; so did `models` and `inspect` on a store with a
    .replaced/ folder (they take the lock to restore set-aside units)."""
    import os

    victim = _victim(tmp_path)
    root = tmp_path / "s"
    (root / "models").mkdir(parents=True)
    (root / ".lock").symlink_to(victim)
    with pytest.raises(InputError, match=r"s: \.lock is a symbolic link \(to .*victim\.txt\); .* remove the link"):
        with Store(str(root)).lock():
            pass
    (root / ".replaced" / "models").mkdir(parents=True)
    assert Store(str(root)).restored == []  # opening it restores nothing, locks nothing
    with pytest.raises(InputError, match=r"\.lock is a symbolic link"):
        Store(str(root)).check_is_store()  # every command refuses the store
    (root / ".lock").unlink()
    os.link(victim, root / ".lock")  # a hard link reaches the file as well
    with pytest.raises(InputError, match=r"\.lock has other hard links"):
        with Store(str(root)).lock():
            pass
    (root / ".lock").unlink()
    os.mkfifo(root / ".lock")  # opened without O_NONBLOCK, a FIFO blocks
    with pytest.raises(InputError, match=r"\.lock is not a regular file"):
        with Store(str(root)).lock():
            pass
    assert victim.read_text() == "the user's own file"


@pytest.mark.parametrize(
    "link", ["report", "runs", "runs/latest.json", "models", "models/KEY", "models/KEY.committed.json", ".replaced"]
)
def test_no_command_reads_or_writes_through_a_link_in_the_store(tmp_path, link):
    """A `report` linked to another folder got index.html written there; every path of the store now
    goes through Store.inside, which refuses a link anywhere below the store's folder."""
    import shutil

    victim, elsewhere = _victim(tmp_path), tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("mine")
    st = Store(str(tmp_path / "s"))
    key = "a" * 16
    unit = st.unit("models", key)
    unit.begin()
    save_arrays(unit.url, {"w": np.ones(2)})
    unit.commit({})
    st.write_text("runs/latest.json", '{"units": {}}')
    st.write_text("report/index.html", "old")
    (tmp_path / "s" / ".replaced" / "models").mkdir(parents=True)
    path = tmp_path / "s" / link.replace("KEY", key)
    shutil.move(path, elsewhere / path.name)  # what was there now lives outside, linked
    path.symlink_to(victim if (elsewhere / path.name).is_file() else elsewhere / path.name)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and not p.is_relative_to(tmp_path / "s")}
    with pytest.raises(InputError, match=r"is a symbolic link \(to .*\); metricpipe reads and writes nothing"):
        Store(str(tmp_path / "s")).check_exists()
    for attempt in (
        lambda: st.write_text("report/index.html", "new"),
        lambda: st.read_json("runs/latest.json"),
        st.last_run,
        unit.begin,
        unit.remove,
        lambda: st.write_text(f"models/{key}.committed.json", "{}"),
    ):
        try:
            attempt()
        except InputError as e:
            assert "is a symbolic link" in str(e)
    assert not unit.done() or link not in ("models", "models/KEY", "models/KEY.committed.json")
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and not p.is_relative_to(tmp_path / "s")}
    assert after == before


def test_verify_counts_a_file_its_commit_does_not_list_a_link_or_a_fifo_as_damage(tmp_path):
    """An array added to a committed model's group passed `inspect --verify` ("0 problems"), and was
    then loaded with the model: every file of a unit must be one its commit lists."""
    import os

    import zarr

    victim = _victim(tmp_path)
    st = Store(str(tmp_path / "s"))
    unit = st.unit("models", "b" * 16)
    unit.begin()
    save_arrays(unit.url, {"w": np.ones(2)})
    unit.commit({})
    assert unit.verify() == []
    zarr.open_group(unit.url, mode="r+").create_array("components_", shape=(2, 2), dtype="f4")[...] = 1
    assert unit.verify() == [
        f"{unit.rel}/components_/c/0/0: not among the files of its commit (added since)",
        f"{unit.rel}/components_/zarr.json: not among the files of its commit (added since)",
    ]
    root = tmp_path / "s" / unit.rel
    import shutil

    shutil.rmtree(root / "components_")
    chunk = root / "w" / "c" / "0"
    chunk.unlink()
    chunk.symlink_to(victim)
    os.mkfifo(root / "w" / "fifo")
    bad = unit.verify()  # the FIFO is not opened (it would block), the link not followed
    assert (
        bad[0] == f"{unit.rel}/w/c/0: a symbolic link (to {victim}); a unit holds regular files only (a store "
        f"from someone else?)"
    )
    assert bad[1].startswith(f"{unit.rel}/w/fifo: not a regular file") and len(bad) == 2


@pytest.mark.parametrize("sample_kind", ["compressible", "dense"])  # LZ4 chunks and bare ones
def test_write_rows_returns_the_checksums_of_the_chunk_files_as_written(tmp_path, sample_kind):
    import fsspec

    from metricpipe.store import create_array, open_array, size_crc, write_rows

    rng = np.random.default_rng(0)
    X = rng.integers(0, 3, (250, 16)) if sample_kind == "compressible" else rng.standard_normal((250, 16))
    X = X.astype(np.float32)
    url = str(tmp_path / "a")
    create_array(url, X.shape, (100, 16), np.float32, fill_value=0.0, rows=True, sample=X)
    fs = fsspec.filesystem("file")
    for start in (0, 100, 200):
        sums = write_rows(url, start, X[start : start + 100])
        chunk = f"c/{start // 100}/0"
        assert sums == {chunk: size_crc(fs, f"{url}/{chunk}")}
    np.testing.assert_array_equal(open_array(url)[:], X)
    # a compressed block left at the fill value is removed by zarr, not written: nothing to vouch for
    # (a bare whole chunk is written as it is)
    sums = write_rows(url, 100, np.zeros((100, 16), np.float32))
    assert (sums == {}) == (sample_kind == "compressible")
    assert (tmp_path / "a" / "c" / "1" / "0").exists() == (sample_kind == "dense")
    np.testing.assert_array_equal(open_array(url)[100:200], 0.0)


def test_read_block_reads_a_bare_chunk_s_file_and_anything_else_through_zarr(tmp_path, monkeypatch):
    from metricpipe.store import arrays, create_array, open_array, read_block

    X = np.random.default_rng(0).standard_normal((250, 16)).astype(np.float32)
    bare = create_array(str(tmp_path / "bare"), X.shape, (100, 16), np.float32, rows=True, sample=X)
    lz4 = create_array(str(tmp_path / "lz4"), X.shape, (100, 16), np.float32, rows=True, sample=np.zeros((9, 16)))
    keys = create_array(str(tmp_path / "keys"), (250,), (100,), np.uint64, rows=True, sample=X[:, 0])
    bare[:], lz4[:], keys[:] = X, X, np.arange(250, dtype=np.uint64)
    bare[100:200] = 0.0  # left at the fill value: zarr removes the chunk's file
    assert not (tmp_path / "bare" / "c" / "1" / "0").exists()
    direct = []
    real = arrays._bare_chunk_file
    monkeypatch.setattr(arrays, "_bare_chunk_file", lambda *a: direct.append(real(*a)) or direct[-1])
    for name in ("bare", "lz4", "keys"):
        for a, b in ((0, 100), (100, 200), (200, 250), (50, 150)):
            np.testing.assert_array_equal(read_block(str(tmp_path / name), a, b), open_array(str(tmp_path / name))[a:b])
    # bare whole chunks (the one at the fill value too, then read by zarr); the 1-D keys' as well
    assert [p is not None for p in direct] == [True, True, False, False] + [False] * 4 + [True, True, False, False]
