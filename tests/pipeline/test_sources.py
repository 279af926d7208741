import gzip
import struct

import numpy as np
import pytest

from metricpipe.config import parse_config
from metricpipe.sources import open_source
from metricpipe.tasks.errors import InputError


def _cfg(path, **data):
    return parse_config({"data": {"path": str(path), **data}}).data


def _read_in_blocks(reader, size=7):
    return np.vstack([reader.read(a, min(a + size, reader.shape[0])) for a in range(0, reader.shape[0], size)])


@pytest.fixture
def arrays():
    rng = np.random.default_rng(0)
    return rng.normal(size=(30, 5)).astype(np.float32), rng.integers(0, 3, 30)


def test_npy_with_separate_labels(tmp_path, arrays):
    X, y = arrays
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    src = open_source(_cfg(tmp_path / "X.npy", labels=str(tmp_path / "y.npy")))
    np.testing.assert_array_equal(_read_in_blocks(src.reader), X)
    np.testing.assert_array_equal(src.labels, y)


@pytest.mark.parametrize("compressed", [False, True])
def test_npz_blocks_with_split_column(tmp_path, arrays, compressed):
    X, y = arrays
    split = np.array(["train"] * 20 + ["test"] * 10)
    (np.savez_compressed if compressed else np.savez)(tmp_path / "f.npz", feats=X, lab=y, split=split)
    src = open_source(_cfg(tmp_path / "f.npz", features="feats", labels="lab", split={"column": "split"}))
    np.testing.assert_array_equal(_read_in_blocks(src.reader), X)
    assert list(src.split[18:22]) == ["train", "train", "test", "test"]


def test_h5_and_zarr(tmp_path, arrays):
    import h5py
    import zarr

    X, y = arrays
    with h5py.File(tmp_path / "f.h5", "w") as f:
        f["X"], f["y"] = X, y
    g = zarr.open_group(str(tmp_path / "f.zarr"), mode="w")
    g.create_array("X", data=X, chunks=(8, 5))
    g.create_array("y", data=y)
    for p in ("f.h5", "f.zarr"):
        src = open_source(_cfg(tmp_path / p))
        np.testing.assert_array_equal(_read_in_blocks(src.reader), X)
        np.testing.assert_array_equal(src.labels, y)


@pytest.mark.parametrize("ext, dtype", [(".fvecs", np.float32), (".bvecs", np.uint8)])
def test_vecs(tmp_path, arrays, ext, dtype):
    X = (np.abs(arrays[0]) * 40).astype(dtype)
    rows = np.hstack([np.full((30, 1), 5, np.int32).view(np.uint8), X.view(np.uint8)])
    (tmp_path / f"f{ext}").write_bytes(rows.tobytes())
    np.save(tmp_path / "y.npy", arrays[1])
    src = open_source(_cfg(tmp_path / f"f{ext}", labels=str(tmp_path / "y.npy")))
    np.testing.assert_array_equal(_read_in_blocks(src.reader), X)


def test_truncated_fvecs_is_refused(tmp_path):
    (tmp_path / "f.fvecs").write_bytes(np.array([3], np.int32).tobytes() + b"\0" * 10)
    np.save(tmp_path / "y.npy", np.zeros(1))
    with pytest.raises(InputError, match="truncated or not fvecs"):
        open_source(_cfg(tmp_path / "f.fvecs", labels=str(tmp_path / "y.npy")))
    # text renamed .fvecs: 'not a multiple of a 1819043176-d row (7276172708 bytes)' told nothing
    (tmp_path / "t.fvecs").write_bytes(b"hello world, not vectors\n" * 40)
    with pytest.raises(
        InputError,
        match=r"t.fvecs: its first 4 bytes read as dimension 1819043176, which a 1000-byte "
        r"file cannot hold; it is not a fvecs file",
    ):
        open_source(_cfg(tmp_path / "t.fvecs", labels=str(tmp_path / "y.npy")))


def _write_idx(path, arr):
    codes = {np.uint8: 0x08}
    head = b"\0\0" + bytes([codes[arr.dtype.type], arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(head + arr.tobytes())


def test_idx_folder_gives_train_test_split(tmp_path):
    rng = np.random.default_rng(0)
    imgs = {s: rng.integers(0, 255, (n, 4, 4)).astype(np.uint8) for s, n in (("train", 12), ("t10k", 5))}
    for s, a in imgs.items():
        _write_idx(tmp_path / f"{s}-images-idx3-ubyte.gz", a)
        _write_idx(tmp_path / f"{s}-labels-idx1-ubyte.gz", (np.arange(len(a)) % 3).astype(np.uint8))
    src = open_source(_cfg(tmp_path))
    np.testing.assert_array_equal(
        _read_in_blocks(src.reader, 5), np.vstack([imgs["train"], imgs["t10k"]]).reshape(17, 16)
    )
    assert list(src.split).count("test") == 5
    # a test fraction would be silently ignored on such a source: refused, before anything is written
    from metricpipe.stages import prepare_data

    cfg = parse_config({"data": {"path": str(tmp_path), "split": {"test": 0.3}}}, where="cfg.yaml")
    with pytest.raises(
        InputError,
        match=r"comes with its own train/test split, which data.split.test would not "
        r"change; drop data.split.test",
    ):
        prepare_data(cfg, None)


def test_fashion_mnist_not_found_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.delenv("METRICPIPE_DATA", raising=False)
    monkeypatch.setattr("metricpipe.sources.idx.FASHION_DEBIAN", str(tmp_path / "none"))
    with pytest.raises(InputError, match="apt-get install dataset-fashion-mnist"):
        open_source(parse_config({"data": {"source": "fashion-mnist"}}).data)


def test_a_metricpipe_data_folder_without_the_files_is_refused_not_passed_over(tmp_path, monkeypatch):
    """It fell back to Debian's copy without a word: the run used other files than the user meant."""
    from metricpipe.sources import FASHION_FILES

    (tmp_path / "debian").mkdir()
    for name in FASHION_FILES:
        (tmp_path / "debian" / f"{name}.gz").write_bytes(b"")
    monkeypatch.setattr("metricpipe.sources.idx.FASHION_DEBIAN", str(tmp_path / "debian"))
    monkeypatch.setenv("METRICPIPE_DATA", str(tmp_path / "typo"))
    with pytest.raises(
        InputError,
        match=r"METRICPIPE_DATA: no Fashion-MNIST IDX files in .*/typo \(nor in its "
        r"fashion-mnist folder\).* or unset METRICPIPE_DATA",
    ):
        open_source(parse_config({"data": {"source": "fashion-mnist"}}).data)


def test_a_data_root_without_the_files_is_refused_not_passed_over(tmp_path, monkeypatch):
    from metricpipe.sources import FASHION_FILES, fashion_mnist_root

    (tmp_path / "copy").mkdir()
    for name in FASHION_FILES:
        (tmp_path / "copy" / f"{name}.gz").write_bytes(b"")
    monkeypatch.setenv("METRICPIPE_DATA", str(tmp_path / "copy"))  # a copy that would be found next
    assert fashion_mnist_root(parse_config({"data": {"source": "fashion-mnist"}}).data) == tmp_path / "copy"
    with pytest.raises(InputError, match=r"data.root: no Fashion-MNIST IDX files in .*/typo \(nor in its"):
        open_source(parse_config({"data": {"source": "fashion-mnist", "root": str(tmp_path / "typo")}}).data)


@pytest.mark.parametrize(
    "setup, match",
    [
        (lambda p: None, "file not found"),
        (lambda p: p.write_bytes(b""), "file is empty"),
        (lambda p: p.write_bytes(b"not a zip"), "cannot read"),
    ],
)
def test_unreadable_files(tmp_path, setup, match):
    p = tmp_path / "f.npz"
    setup(p)
    with pytest.raises(InputError, match=match):
        open_source(_cfg(p))


def test_missing_array_name_lists_what_is_there(tmp_path, arrays):
    np.savez(tmp_path / "f.npz", feats=arrays[0], y=arrays[1])
    with pytest.raises(InputError, match=r"no array 'X' \(data.features\); it holds \['feats', 'y'\]"):
        open_source(_cfg(tmp_path / "f.npz"))


def test_folders_are_fingerprinted_by_every_file_and_contents_on_request(tmp_path):
    """Issue 19: only the first 1,000 files counted, so relabelling a Zarr source reused the old stage."""
    import os

    from metricpipe.sources import fingerprint

    d = tmp_path / "src"
    d.mkdir()
    for i in range(1200):
        (d / f"c{i:05d}").write_bytes(b"ab")
    base, base_c = fingerprint(d), fingerprint(d, contents=True)
    last = d / "c01199"
    st = last.stat()
    last.write_bytes(b"abc")
    assert fingerprint(d) != base  # file 1,200 changed size
    last.write_bytes(b"xy")  # same size, and the same mtime put back
    os.utime(last, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert fingerprint(d) == base  # what sizes and mtimes cannot see ...
    assert fingerprint(d, contents=True) != base_c  # ... a content hash does
    assert fingerprint(d)[str(d.resolve())]["files"] == 1200


def test_a_zarr_source_with_a_missing_chunk_is_refused(tmp_path):
    import zarr

    from metricpipe.config import DataConfig
    from metricpipe.sources import open_source
    from metricpipe.tasks.errors import InputError

    g = zarr.open_group(str(tmp_path / "d.zarr"), mode="w")
    g.create_array("X", shape=(100, 4), chunks=(10, 4), dtype="f4")[:] = np.ones((100, 4))
    g.create_array("y", shape=(100,), chunks=(10,), dtype="i8")[:] = np.arange(100) % 3
    open_source(DataConfig(path=str(tmp_path / "d.zarr")))  # complete: fine
    (tmp_path / "d.zarr/y/c/4").unlink()
    with pytest.raises(
        InputError,
        match=r"d.zarr: array 'y' \(a column\) is missing 1 of its 10 chunk\(s\), which "
        r"would read as 0",
    ):
        open_source(DataConfig(path=str(tmp_path / "d.zarr")))
    (tmp_path / "d.zarr/X/c/3/0").unlink()
    with pytest.raises(InputError, match=r"array 'X' \(data.features\) is missing 1 of its 10 chunk"):
        open_source(DataConfig(path=str(tmp_path / "d.zarr")))


def test_an_hdf5_source_with_unwritten_chunks_is_refused(tmp_path):
    """Rows whose chunks HDF5 never allocated read as the fill value: run, evaluate and encode went on."""
    import h5py

    from metricpipe.config import DataConfig
    from metricpipe.sources import open_source
    from metricpipe.tasks.errors import InputError

    with h5py.File(tmp_path / "d.h5", "w") as f:
        x = f.create_dataset("X", shape=(3000, 16), chunks=(500, 16), dtype="f4", fillvalue=-1.0)
        x[:2000] = 1.0
        f.create_dataset("y", shape=(3000,), chunks=(1000,), dtype="i8")[:] = np.arange(3000) % 3
        f.create_dataset("g", shape=(3000,), dtype="i8")  # contiguous, never written
        f.create_dataset("wide", shape=(10, 8), chunks=(5, 4), dtype="f4")[:, :4] = 1.0  # a column block missing
    with pytest.raises(
        InputError,
        match=r"d.h5: dataset 'X' \(data.features\) has 2 of its 6 chunk\(s\) never "
        r"written \(the first from row 2,000\), which would read as -1.0 \(its fill "
        r"value\); write every row, or rewrite the file$",
    ):
        open_source(DataConfig(path=str(tmp_path / "d.h5")))
    with h5py.File(tmp_path / "d.h5", "a") as f:
        f["X"][2000:] = 2.0
    assert open_source(DataConfig(path=str(tmp_path / "d.h5"))).reader.shape == (3000, 16)  # complete: fine
    with pytest.raises(InputError, match=r"dataset 'g' \(a column\) was never written, so every row would read as 0"):
        open_source(DataConfig(path=str(tmp_path / "d.h5"), groups="g"))
    with pytest.raises(
        InputError,
        match=r"dataset 'wide' \(data.features\) has 2 of its 4 chunk\(s\) never written "
        r"\(the first from row 0\)",
    ):
        open_source(DataConfig(path=str(tmp_path / "d.h5"), features="wide", labels=""))


def test_the_ids_array_is_part_of_the_staged_data_s_key(tmp_path, arrays):
    """The staged unit stores the ids as its ``id`` coordinate: other ids are another unit."""
    from metricpipe.stages import prepare_data
    from metricpipe.store import Store

    X, y = arrays
    np.savez(tmp_path / "d.npz", X=X, y=y, i=np.arange(30), j=np.arange(30) + 100)

    def key(**data):
        cfg = parse_config({"store": str(tmp_path / "s"), "data": {"path": str(tmp_path / "d.npz"), **data}})
        return prepare_data(cfg, Store(cfg.store)).info.unit.key

    assert len({key(), key(ids="i"), key(ids="j")}) == 3
    assert key(ids="i") == key(ids="i")


def test_one_file_spelled_another_way_is_the_same_staged_data(tmp_path, arrays, monkeypatch):
    """cfg/../d.npy, the absolute path, one relative to another folder, a symlink: one file, one key
    (the second spelling restaged everything and recomputed every stage after it)."""
    from metricpipe.stages import prepare_data
    from metricpipe.store import Store

    X, y = arrays
    (tmp_path / "cfg").mkdir()
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    (tmp_path / "link").symlink_to(tmp_path)

    def key(path, labels, base):
        cfg = parse_config({"store": str(tmp_path / "s"), "data": {"path": path, "labels": labels}}, base_dir=base)
        return prepare_data(cfg, Store(cfg.store)).info.unit.key

    keys = {
        key("../X.npy", "../y.npy", tmp_path / "cfg"),
        key(str(tmp_path / "X.npy"), str(tmp_path / "y.npy"), None),
        key("X.npy", "y.npy", tmp_path),
        key(str(tmp_path / "link/X.npy"), "link/y.npy", tmp_path),
    }
    assert len(keys) == 1
    np.save(tmp_path / "y2.npy", y[::-1])  # other labels: another unit
    assert key("X.npy", "y2.npy", tmp_path) not in keys


@pytest.mark.parametrize("fixed", [False, True])
def test_parquet_rows_read_across_row_groups_and_batches_equal_the_file(tmp_path, monkeypatch, fixed):
    """Rows are decoded a batch at a time up to the last one asked for (a whole row group was decoded
    per block before): any range, across groups and batches, is the file's rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from metricpipe import sources

    rng = np.random.default_rng(1)
    X = rng.normal(size=(50, 4)).astype(np.float32)
    col = pa.array(list(X), type=pa.list_(pa.float32(), 4) if fixed else pa.list_(pa.float32()))
    pq.write_table(pa.table({"emb": col, "label": np.arange(50) % 3}), tmp_path / "f.parquet", row_group_size=16)
    monkeypatch.setattr(sources.readers, "PARQUET_BATCH_ROWS", 5)
    src = open_source(_cfg(tmp_path / "f.parquet", features="emb", labels="label"))
    assert src.reader.shape == (50, 4)
    for a, b in [(0, 50), (3, 4), (14, 35), (16, 32), (47, 50), (20, 20)]:
        np.testing.assert_array_equal(src.reader.read(a, b), X[a:b])
    np.testing.assert_array_equal(_read_in_blocks(src.reader, 7), X)


def test_parquet_null_and_ragged_rows_are_named_in_any_row_group(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    X = np.ones((40, 3), np.float32)
    rows = [list(map(float, r)) for r in X]
    rows[33] = None
    pq.write_table(pa.table({"emb": rows, "y": np.arange(40) % 2}), tmp_path / "n.parquet", row_group_size=10)
    rows[33], rows[25] = [1.0, 2.0, 3.0], [1.0]
    pq.write_table(pa.table({"emb": rows, "y": np.arange(40) % 2}), tmp_path / "r.parquet", row_group_size=10)
    n = open_source(_cfg(tmp_path / "n.parquet", features="emb")).reader
    with pytest.raises(InputError, match=r"column 'emb' \(data.features\) is null in row 33; drop or fill that row"):
        n.read(30, 40)
    r = open_source(_cfg(tmp_path / "r.parquet", features="emb")).reader
    with pytest.raises(InputError, match=r"rows of lengths \[1, 3\] in rows 20..29 against 3"):
        r.read(20, 30)


def test_idx_gz_sizes_are_read_modulo_2_32_and_a_cut_gz_is_one_line(tmp_path):
    """A .gz's trailer holds its size modulo 2^32: a valid file of 4 GiB or more was refused as
    truncated; a .gz cut before its trailer raised EOFError from gzip."""
    import gzip
    import struct

    from metricpipe.sources import IdxReader

    head = struct.pack(">BBBBIII", 0, 0, 0x0E, 3, 70000, 78, 100)  # 70,000 x 7,800 float64: 4.4 GB
    p = tmp_path / "big-idx3.gz"
    p.write_bytes(gzip.compress(head)[:-4] + struct.pack("<I", (len(head) + 70000 * 7800 * 8) % 2**32))
    assert IdxReader(str(p)).shape == (70000, 7800)
    rows = np.arange(60, dtype=np.uint8).reshape(10, 6)
    body = struct.pack(">BBBBII", 0, 0, 8, 2, 10, 6) + rows.tobytes()
    good = tmp_path / "x-idx2.gz"
    good.write_bytes(gzip.compress(body))
    np.testing.assert_array_equal(IdxReader(str(good)).read(0, 10), rows)
    cut = tmp_path / "cut-idx2.gz"
    cut.write_bytes(gzip.compress(body)[:-6])
    with pytest.raises(InputError, match=r"cut-idx2.gz: .*truncated"):
        IdxReader(str(cut)).read(0, 10)


def test_a_null_inside_a_parquet_row_is_named(tmp_path):
    """An integer list with a null element read back as -2^63 (a float one as NaN)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"emb": [[1, 2], [3, 4], [5, None]], "y": [0, 1, 0]}), tmp_path / "i.parquet")
    r = open_source(_cfg(tmp_path / "i.parquet", features="emb")).reader
    with pytest.raises(InputError, match=r"column 'emb' \(data.features\) holds a null value in row 2; fill it"):
        r.read(0, 3)
    np.testing.assert_array_equal(r.read(0, 2), [[1, 2], [3, 4]])


def test_an_object_labels_array_in_an_npz_is_refused_as_pickled(tmp_path):
    np.savez(tmp_path / "o.npz", X=np.ones((4, 2)), y=np.array([1, "a", 2, 3], dtype=object))
    with pytest.raises(InputError, match=r"array 'y' \(data.labels\) holds pickled Python objects"):
        open_source(_cfg(tmp_path / "o.npz"))


def test_verify_source_keys_the_staged_data_by_its_bytes_not_its_path_or_mtime(tmp_path):
    """The staged data's key held each file's path and mtime, so a touched, copied or moved data set
    was staged again (and everything after it recomputed); under data.verify_source (a full read
    that hashes the bytes) the bytes are the key, and a change of one byte still is a new one."""
    import os
    import shutil

    from metricpipe.config import SPLIT_NAMES, parse_config
    from metricpipe.stages import prepare_data
    from metricpipe.store import Store

    rng = np.random.default_rng(0)
    (tmp_path / "a").mkdir()
    np.save(tmp_path / "a" / "X.npy", rng.normal(size=(60, 5)).astype(np.float32))
    np.save(tmp_path / "a" / "y.npy", np.arange(60) % 3)

    def info(folder, by_bytes, with_pairs=False):
        cfg = parse_config(
            {
                "store": str(tmp_path / "s"),
                "data": {
                    "path": str(tmp_path / folder / "X.npy"),
                    "labels": str(tmp_path / folder / "y.npy"),
                    "verify_source": by_bytes,
                    **({"pairs": str(tmp_path / folder / "pairs.npz")} if with_pairs else {}),
                },
                "methods": [{"method": "pca", "dim": 2}],
            }
        )
        return prepare_data(cfg, Store(cfg.store)).info

    def key(*args):
        return info(*args).unit.key

    train = np.flatnonzero(info("a", False).split == SPLIT_NAMES.index("train"))  # pairs join training rows
    pairs = {"i": train[:3], "j": train[3:6], "y": np.array([1, 1, -1])}
    np.savez(tmp_path / "a" / "pairs.npz", **pairs)
    first, first_by_bytes = key("a", False), key("a", True)
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # another folder, new mtimes
    os.utime(tmp_path / "a" / "X.npy", ns=(1, 10**18))  # and the original touched
    assert key("b", True) == key("a", True) == first_by_bytes
    assert key("b", False) != first and key("a", False) != first  # what paths and mtimes key
    # the pairs file too (a review: it was keyed by path and mtime under verify_source as well)
    paired = key("a", True, True)
    assert key("b", True, True) == paired != first_by_bytes
    stat = os.stat(tmp_path / "b" / "pairs.npz")
    np.savez(tmp_path / "b" / "pairs.npz", **{**pairs, "j": train[[3, 4, 6]]})  # same size
    os.utime(tmp_path / "b" / "pairs.npz", ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and mtime (cp -p)
    assert os.stat(tmp_path / "b" / "pairs.npz").st_size == stat.st_size
    assert key("b", True, True) != paired
    X = np.load(tmp_path / "b" / "X.npy")
    X[59, 4] += 1
    np.save(tmp_path / "b" / "X.npy", X)
    assert key("b", True) != first_by_bytes


@pytest.mark.parametrize(
    "X",
    [
        np.arange(600, dtype=np.float32).reshape(100, 3, 2),
        np.asfortranarray(np.arange(200.0).reshape(50, 4)),  # (read through the mapping)
        np.arange(7, dtype=np.int16)[:, None],
    ],
)
def test_an_npy_block_is_read_into_its_own_array_as_the_file_holds_it(tmp_path, X):
    from metricpipe.sources.readers import NpyReader

    np.save(tmp_path / "x.npy", X)
    reader = NpyReader(tmp_path / "x.npy")
    for a, b in ((0, len(X)), (3, 6), (len(X) - 1, len(X)), (5, 5)):
        block = reader.read(a, b)
        np.testing.assert_array_equal(block, X[a:b])
        assert block.flags.writeable and block.flags.owndata  # not a view of the file
