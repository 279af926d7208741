"""Feature sources: picklable readers that give row ranges of a feature file without loading it whole.

A :class:`Source` bundles a reader (``shape``, ``dtype``, ``read(start, stop)``) that workers call on
their own row-block, the labels and optional split/group/id columns (1-D, small), and a fingerprint
(path, size, mtime) that keys the staged data.
"""
import gzip
from collections.abc import Mapping
import os
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from metricpipe.config import DataConfig
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.synthetic import SyntheticSpec

FASHION_DEBIAN = "/usr/share/datasets/fashion-mnist"
FASHION_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte")


@dataclass
class Source:
    name: str                      # what error messages call it (a file path or builtin:NAME)
    reader: object
    labels: np.ndarray
    split: np.ndarray | None = None   # strings train/test/val/negatives, or None for a random split
    groups: np.ndarray | None = None
    ids: np.ndarray | None = None
    fingerprint: dict = field(default_factory=dict)


def fingerprint(*paths, contents: bool = False) -> dict:
    """What identifies the data of ``paths`` (files or folders such as a Zarr source): for a folder,
    every file's relative path, size and mtime (nanoseconds) hashed into one digest, with the count
    and total bytes, under the resolved path. A rewrite that keeps a file's size and mtime (``cp -p``,
    ``touch -r``) goes unseen. ``contents`` (``data.verify_source: true`` or ``metricpipe run
    --verify-source``) hashes every byte instead of the mtimes and the paths (a folder's relative
    paths stay): such a rewrite gets a new key, and a touched, copied, moved or renamed file with the
    same bytes keeps its key (the staged data is reused)."""
    import hashlib
    out = {}
    for n, p in enumerate(paths):
        p = Path(p)
        files = sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else [p]
        h, total = hashlib.sha256(), 0
        for f in files:
            st = f.stat()
            total += st.st_size
            if contents:
                h.update(f"{f.relative_to(p) if p.is_dir() else ''}\0{st.st_size}\n".encode())
                with open(f, "rb") as fh:
                    for block in iter(lambda: fh.read(1 << 24), b""):
                        h.update(block)
            else:
                h.update(f"{f.relative_to(p) if p.is_dir() else f.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        out[f"contents of path {n + 1}" if contents else str(p.resolve())] = {
            "files": len(files), "bytes": total, "digest": h.hexdigest()[:32], **({"contents": True} if contents else {})}
    return out



def _refuse_objects(dtype, path, key, field_name: str) -> None:
    """Object arrays hold pickled Python objects: never unpickled from a user's file."""
    if dtype.hasobject:
        raise InputError(f"{path}: array {key!r} ({field_name}) holds pickled Python objects (dtype object), which "
                         f"metricpipe does not unpickle; save it as a numeric (or, for labels, string) array")


class MemoryReader:
    """Rows of an in-memory array (small built-ins only)."""

    def __init__(self, X):
        self.X = np.asarray(X)
        self.shape, self.dtype = self.X.shape, self.X.dtype

    def read(self, start, stop):
        return self.X[start:stop]


class NpyReader:
    def __init__(self, path):
        self.path = str(path)
        _refuse_objects(_npy_dtype(self.path), self.path, "", "data.path")
        a = np.load(self.path, mmap_mode="r")
        self.shape, self.dtype = a.shape, a.dtype

    def read(self, start, stop):
        return np.array(np.load(self.path, mmap_mode="r")[start:stop])


class NpzReader:
    """One array of an .npz; seeks inside the zip member so blocks are read without loading it all."""

    def __init__(self, path, key):
        self.path, self.key = str(path), key
        with zipfile.ZipFile(self.path) as z, z.open(key + ".npy") as f:
            self.shape, fortran, self.dtype = _npy_header(f)
            self.offset = f.tell()
        if fortran:
            raise InputError(f"{self.path}: array {key!r} is stored in Fortran order; save it C-ordered")
        _refuse_objects(self.dtype, self.path, key, "data.features")

    def read(self, start, stop):
        row = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        with zipfile.ZipFile(self.path) as z, z.open(self.key + ".npy") as f:
            f.seek(self.offset + start * row)
            buf = f.read((stop - start) * row)
        return np.frombuffer(buf, self.dtype).reshape((stop - start,) + tuple(self.shape[1:]))


class H5Reader:
    def __init__(self, path, key):
        import h5py
        self.path, self.key = str(path), key
        with h5py.File(self.path, "r") as f:
            if key not in f:
                raise InputError(f"{self.path}: no dataset {key!r} (data.features); it holds {sorted(f.keys())}")
            if not isinstance(f[key], h5py.Dataset):
                raise InputError(f"{self.path}: {key!r} is a group, not a dataset (data.features); name one of its "
                                 f"datasets, e.g. {key}/{sorted(f[key].keys())[0] if len(f[key]) else 'NAME'}")
            check_h5_complete(f[key], self.path, key, "data.features")
            self.shape, self.dtype = f[key].shape, f[key].dtype

    def read(self, start, stop):
        import h5py
        with h5py.File(self.path, "r") as f:
            return f[self.key][start:stop]


def check_zarr_complete(a, path, key: str, field_name: str) -> None:
    """A Zarr array whose chunk files are missing reads their rows as the fill value (zeros): refuse it
    (the store's own units are protected by checksums; a user's source is not)."""
    missing = a.nchunks - a.nchunks_initialized
    if missing:
        fill = np.asarray(a.fill_value).item()
        raise InputError(f"{path}: array {key!r} ({field_name}) is missing {missing} of its {a.nchunks} chunk(s), "
                         f"which would read as {fill!r}; rewrite or re-copy the Zarr source completely")


def check_h5_complete(d, path, key: str, field_name: str) -> None:
    """An HDF5 dataset whose chunks (or, stored contiguously, whose data) were never written reads
    those rows as its fill value (zeros): refuse it, as a Zarr source with missing chunks is. HDF5
    allocates a chunk when it is first written, so the allocated chunks are the written ones (a file
    made with early allocation has every chunk, and is read as it is)."""
    if d.size == 0 or d.is_virtual:
        return
    fill = np.asarray(d.fillvalue).item()
    if d.chunks is None:
        if d.id.get_storage_size() == 0:
            raise InputError(f"{path}: dataset {key!r} ({field_name}) was never written, so every row would read as "
                             f"{fill!r} (its fill value); write its values, or rewrite the file")
        return
    grid = [-(-n // c) for n, c in zip(d.shape, d.chunks)]
    total = int(np.prod(grid, dtype=np.int64))
    have = d.id.get_num_chunks()
    if have < total:
        import itertools
        written = set()
        d.id.chunk_iter(lambda info: written.add(tuple(info.chunk_offset)))
        first = next(tuple(i * c for i, c in zip(at, d.chunks)) for at in itertools.product(*map(range, grid))
                     if tuple(i * c for i, c in zip(at, d.chunks)) not in written)
        raise InputError(f"{path}: dataset {key!r} ({field_name}) has {total - have} of its {total} chunk(s) never "
                         f"written (the first from row {first[0]:,}), which would read as {fill!r} (its fill value); "
                         f"write every row, or rewrite the file")


class _CheckedH5:
    """The datasets of an HDF5 file, each checked for unwritten chunks when a column is read from it."""

    def __init__(self, f, path):
        self.f, self.path = f, path

    def __contains__(self, key):
        return key in self.f

    def keys(self):
        return self.f.keys()

    def __getitem__(self, key):
        import h5py
        obj = self.f[key]
        if isinstance(obj, h5py.Dataset):
            check_h5_complete(obj, self.path, key, "a column")
        return obj


class _CheckedGroup:
    """The arrays of a Zarr group, each checked for missing chunks when a column is read from it."""

    def __init__(self, group, names, path):
        self.group, self.names, self.path = group, names, path

    def __contains__(self, key):
        return key in self.names

    def keys(self):
        return self.names

    def __getitem__(self, key):
        a = self.group[key]
        check_zarr_complete(a, self.path, key, "a column")
        return a


class ZarrReader:
    def __init__(self, path, key):
        import zarr
        self.path, self.key = str(path), key
        a = zarr.open_array(store=f"{self.path}/{key}", mode="r")
        check_zarr_complete(a, path, key, "data.features")
        self.shape, self.dtype = a.shape, a.dtype
        self.chunk_rows = a.chunks[0]   # readers of whole chunks decompress each once

    def read(self, start, stop):
        import zarr
        return zarr.open_array(store=f"{self.path}/{self.key}", mode="r")[start:stop]


class ParquetReader:
    """A list (or fixed-size list) column of a Parquet file, one embedding per row, read by row groups
    (pyarrow)."""

    def __init__(self, path, key):
        import pyarrow as pa
        import pyarrow.parquet as pq
        self.path, self.key = str(path), key
        pf = pq.ParquetFile(self.path)
        names = pf.schema_arrow.names
        if key not in names:
            raise InputError(f"{self.path}: no column {key!r} (data.features); it holds {names}")
        t = pf.schema_arrow.field(key).type
        if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)) \
                or not (pa.types.is_integer(t.value_type) or pa.types.is_floating(t.value_type)):
            raise InputError(f"{self.path}: column {key!r} (data.features) is {t}; expected a list of numbers "
                             f"per row (one embedding per row)")
        self.dtype = np.dtype(t.value_type.to_pandas_dtype())
        sizes = [pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups)]
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        n = int(self.starts[-1])
        dim = t.list_size if pa.types.is_fixed_size_list(t) else (self._first_length() if n else 0)
        self.shape = (n, dim)

    def _first_length(self) -> int:
        """The embeddings' length, read from the first row; a first row that is an empty list is refused
        as ragged when a later row of its batch has values (the shape was (n, 0)), else as empty."""
        first = int(self._checked(self.read_groups(0, 1), 0, None)[0])
        if first:
            return first
        lengths = self._checked(self.read_groups(0, min(PARQUET_BATCH_ROWS, int(self.starts[-1]))), 0, None)
        longer = np.flatnonzero(lengths)
        if len(longer):
            self._checked(self.read_groups(0, len(lengths)), 0, int(lengths[longer[0]]))   # raises: ragged
        raise InputError(f"{self.path}: column {self.key!r} (data.features) holds empty lists (rows 0.."
                         f"{len(lengths) - 1} at least); every row needs its embedding")

    def read_groups(self, start, stop):
        """Rows start..stop of the column as one Arrow list array, decoded a batch of rows at a time:
        only the rows up to ``stop`` of the row groups they are in (a whole group held decoded was
        0.5 GB for 200,000 x 128 in one group, whatever the block)."""
        import pyarrow as pa
        import pyarrow.parquet as pq
        pf = pq.ParquetFile(self.path)
        g0 = int(np.searchsorted(self.starts, start, side="right")) - 1
        parts = []
        for g in range(max(0, g0), len(self.starts) - 1):
            pos = int(self.starts[g])
            if pos >= stop:
                break
            for b in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, row_groups=[g], columns=[self.key],
                                     use_threads=False):
                if pos + b.num_rows > start:
                    a0, a1 = max(start, pos), min(stop, pos + b.num_rows)
                    parts.append(b.column(0).slice(a0 - pos, a1 - a0))
                pos += b.num_rows
                if pos >= stop:
                    break
        if not parts:
            return pa.array([], type=pf.schema_arrow.field(self.key).type)
        return pa.concat_arrays(parts)

    def _checked(self, col, start: int, dim: int | None) -> np.ndarray:
        """Each row's length, after refusing a null row (an embedding never computed) and, with
        ``dim``, rows of another length."""
        import pyarrow.compute as pc
        if col.null_count:
            row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
            raise InputError(f"{self.path}: column {self.key!r} (data.features) is null in row {start + row:,}; drop "
                             f"or fill that row")
        lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
        if dim is not None and len(lengths) and (lengths != dim).any():
            raise InputError(f"{self.path}: column {self.key!r} has rows of lengths {sorted(set(lengths.tolist()))[:4]} "
                             f"in rows {start}..{start + len(lengths) - 1} against {dim}; every embedding needs "
                             f"one length")
        return lengths

    def read(self, start, stop):
        col = self.read_groups(start, stop)
        if not len(col):
            return np.empty((0, self.shape[1]), self.dtype)
        self._checked(col, start, self.shape[1])
        values = col.flatten()
        if values.null_count:    # (as NaN a float column's would be refused at staging; an int's became -2^63)
            lengths = np.cumsum(self._checked(col, start, self.shape[1]))
            at = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
            raise InputError(f"{self.path}: column {self.key!r} (data.features) holds a null value in row "
                             f"{start + int(np.searchsorted(lengths, at, side='right')):,}; fill it")
        values = values.to_numpy(zero_copy_only=False)
        return values.reshape(len(col), self.shape[1]).astype(self.dtype, copy=False)


# Rows a Parquet features column is decoded by (its row groups may hold a million rows or more).
PARQUET_BATCH_ROWS = 4096


class _ParquetColumns:
    """The scalar columns of a Parquet file (labels, ids), each read whole when asked for."""

    def __init__(self, path):
        import pyarrow.parquet as pq
        self.path, self.names = str(path), pq.ParquetFile(str(path)).schema_arrow.names

    def __contains__(self, key):
        return key in self.names

    def keys(self):
        return self.names

    def __getitem__(self, key):
        import pyarrow.parquet as pq
        return pq.read_table(self.path, columns=[key]).column(0).to_numpy(zero_copy_only=False)


class VecsReader:
    """.fvecs (float32) and .bvecs (uint8): each row is an int32 dimension followed by the values."""

    def __init__(self, path):
        self.path = str(path)
        self.dtype = np.dtype(np.float32 if self.path.endswith(".fvecs") else np.uint8)
        size = os.path.getsize(self.path)
        if size < 4:
            raise InputError(f"{self.path}: file is empty; expected {self.path[-5:]} vectors")
        d = int(np.fromfile(self.path, np.int32, 1)[0])
        self.row_bytes = 4 + d * self.dtype.itemsize
        if d <= 0 or (d >= 1 << 24 and self.row_bytes > size):   # the first row's header is no dimension
            raise InputError(f"{self.path}: its first 4 bytes read as dimension {d}, which a {size}-byte file "
                             f"cannot hold; it is not a {self.path[-5:]} file (each row: an int32 dimension, "
                             f"then the values)")
        if size % self.row_bytes:
            raise InputError(f"{self.path}: size {size} is not a multiple of a {d}-d row "
                             f"({self.row_bytes} bytes); the file is truncated or not {self.path[-5:]}")
        self.shape = (size // self.row_bytes, d)

    def read(self, start, stop):
        raw = np.fromfile(self.path, np.uint8, (stop - start) * self.row_bytes, offset=start * self.row_bytes)
        raw = raw.reshape(stop - start, self.row_bytes)
        dims = raw[:, :4].copy().view(np.int32).ravel()
        if (dims != self.shape[1]).any():
            raise InputError(f"{self.path}: rows {start}..{stop - 1} are ragged (dimensions "
                             f"{sorted(set(dims.tolist()))[:4]} vs {self.shape[1]}); every vector needs one length")
        return raw[:, 4:].copy().view(self.dtype)


IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _open_idx(path):
    return gzip.open(path, "rb") if str(path).endswith(".gz") else open(path, "rb")


def _idx_size(path: str) -> int | None:
    """The bytes an IDX file holds: its size, or a .gz's uncompressed size modulo 2^32 from its
    trailer (None when it has none; a truncated read is refused then)."""
    size = os.path.getsize(path)
    if not path.endswith(".gz"):
        return size
    with open(path, "rb") as f:
        f.seek(max(0, size - 4))
        tail = f.read(4)
    return struct.unpack("<I", tail)[0] if len(tail) == 4 else None


class IdxReader:
    """IDX files (MNIST format), optionally gzipped; images are flattened to rows."""

    def __init__(self, path):
        self.path = str(path)
        with _open_idx(self.path) as f:
            head = f.read(4)
            if len(head) < 4 or head[:2] != b"\0\0" or head[2] not in IDX_DTYPES:
                raise InputError(f"{self.path}: not an IDX file (bad magic number)")
            ndim = head[3]
            dims = struct.unpack(f">{ndim}I", f.read(4 * ndim))
        self.offset = 4 + 4 * ndim
        self.item = np.dtype(IDX_DTYPES[head[2]])
        self.dims = dims
        self.shape = (dims[0], int(np.prod(dims[1:], dtype=np.int64)))
        self.dtype = self.item.newbyteorder("=") if self.item.byteorder == ">" else self.item
        want = self.offset + self.shape[0] * self.shape[1] * self.item.itemsize
        size = _idx_size(self.path)
        gz = self.path.endswith(".gz")
        if size is not None and (size != want % 2 ** 32 if gz else size != want):   # a .gz's size is modulo 2^32
            raise InputError(f"{self.path}: {size:,} bytes, but its header ({' x '.join(map(str, dims))} values of "
                             f"{self.item.itemsize} byte(s)) needs {want:,}; the file is truncated or not an IDX file")

    def read(self, start, stop):
        try:
            with _open_idx(self.path) as f:
                f.seek(self.offset + start * self.shape[1] * self.item.itemsize)
                buf = f.read((stop - start) * self.shape[1] * self.item.itemsize)
        except (EOFError, gzip.BadGzipFile) as e:   # a .gz cut short, its trailer gone with it
            raise InputError(f"{self.path}: the compressed data ends early ({e}); the file is truncated") from None
        if len(buf) != (stop - start) * self.shape[1] * self.item.itemsize:   # (a .gz whose size was not known)
            raise InputError(f"{self.path}: ends before row {start + len(buf) // max(1, self.shape[1] * self.item.itemsize):,} "
                             f"of the {self.shape[0]:,} its header names; the file is truncated")
        return np.frombuffer(buf, self.item).reshape(stop - start, self.shape[1]).astype(self.dtype)

    def read_all_1d(self):
        return self.read(0, self.shape[0]).reshape(-1)


class ConcatReader:
    def __init__(self, readers):
        self.readers = readers
        self.bounds = np.cumsum([0] + [r.shape[0] for r in readers])
        self.shape = (int(self.bounds[-1]), readers[0].shape[1])
        self.dtype = readers[0].dtype

    def read(self, start, stop):
        parts = []
        for r, lo, hi in zip(self.readers, self.bounds[:-1], self.bounds[1:]):
            a, b = max(start, lo), min(stop, hi)
            if a < b:
                parts.append(r.read(a - lo, b - lo))
        return np.concatenate(parts) if len(parts) > 1 else parts[0]


class SyntheticReader:
    def __init__(self, spec: SyntheticSpec):
        self.spec = spec
        self.shape = (spec.n_samples, spec.n_features)
        self.dtype = np.dtype(np.float32)
        self._labels = None

    def read(self, start, stop):
        if self._labels is None:
            self._labels = self.spec.labels()
        return self.spec.rows(start, stop, self._labels)


def _find_idx(folder: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def fashion_mnist_root(cfg: DataConfig) -> Path:
    """data.root, else $METRICPIPE_DATA, else Debian's dataset-fashion-mnist location. A data.root or
    $METRICPIPE_DATA without the files is refused (a mistyped folder must not silently read another copy)."""
    env = os.environ.get("METRICPIPE_DATA")
    given = ("data.root", cfg.root) if cfg.root else ("METRICPIPE_DATA", env) if env else None
    candidates = [given[1]] if given else [FASHION_DEBIAN]
    for c in candidates:
        p = Path(c)
        for q in (p, p / "fashion-mnist"):
            if all(_find_idx(q, s) for s in FASHION_FILES):
                return q
    if given:
        raise InputError(f"{given[0]}: no Fashion-MNIST IDX files in {given[1]} (nor in its fashion-mnist folder); "
                         f"give the folder holding {FASHION_FILES[0]}.gz and the other three files, or "
                         f"{'drop data.root' if cfg.root else 'unset METRICPIPE_DATA'}")
    raise InputError(
        f"data.source fashion-mnist: IDX files not found in {', '.join(candidates)}; install them with "
        f"'apt-get install dataset-fashion-mnist', or set data.root or METRICPIPE_DATA to a folder holding "
        f"{FASHION_FILES[0]}.gz and the other three files")


def _idx_source(folder: Path, name: str, contents: bool = False) -> Source:
    files = [_find_idx(folder, s) for s in FASHION_FILES]
    tr, tr_lab, te, te_lab = [IdxReader(f) for f in files]
    y = np.concatenate([tr_lab.read_all_1d(), te_lab.read_all_1d()])
    split = np.array(["train"] * tr.shape[0] + ["test"] * te.shape[0])
    return Source(name, ConcatReader([tr, te]), y, split=split, fingerprint=fingerprint(*files, contents=contents))


def _column(container, key, path, field_name, n=None):
    if key not in container:
        raise InputError(f"{path}: no array {key!r} ({field_name}); it holds {sorted(container.keys())}")
    try:
        obj = container[key]    # read once (an npz member or a Parquet column is decoded here)
        if isinstance(obj, Mapping):   # an HDF5 group
            raise InputError(f"{path}: {key!r} is a group, not an array ({field_name}); name one of its arrays "
                             f"({key}/NAME)")
        return np.asarray(obj[...])
    except ValueError as e:
        if "allow_pickle" in str(e):
            _refuse_objects(np.dtype(object), path, key, field_name)
        raise


def open_source(cfg: DataConfig) -> Source:
    """Open the configured source lazily; raises InputError naming the file and key on any problem."""
    if cfg.source == "digits":
        from sklearn.datasets import load_digits
        d = load_digits()
        return Source("builtin:digits", MemoryReader(d.data.astype(np.float32)), d.target,
                      fingerprint={"builtin": "digits"})
    if cfg.source == "fashion-mnist":
        return _idx_source(fashion_mnist_root(cfg), "builtin:fashion-mnist", cfg.verify_source)
    if cfg.source == "synthetic":
        s = cfg.synthetic
        spec = SyntheticSpec(s.samples, s.dim, s.classes, s.seed, separation=s.separation,
                             nonnegative=s.nonnegative, nuisance=s.nuisance)
        return Source("builtin:synthetic", SyntheticReader(spec), spec.labels(),
                      fingerprint={"builtin": "synthetic", **s.__dict__})
    path = Path(cfg.path)
    if not path.exists():
        raise InputError(f"{path}: file not found (data.path); check the path (a config's relative paths are read from its "
                         f"folder)")
    try:
        return _open_path(cfg, path)
    except InputError:
        raise
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
        raise InputError(f"{path}: cannot read (data.path): {type(e).__name__}: {e}".splitlines()[0]) from None


def _npy_header(f) -> tuple:
    """(shape, fortran_order, dtype) of the .npy stream ``f``, read from its header only (the file
    position is left at the data)."""
    version = np.lib.format.read_magic(f)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    return read_header(f)


def _npy_dtype(path) -> np.dtype:
    with open(path, "rb") as f:
        return _npy_header(f)[2]


def _labels_from_npy(cfg, n_hint=None):
    p = Path(cfg.labels)
    if not p.is_file():
        raise InputError(f"{p}: labels file not found (data.labels)")
    try:
        dtype = _npy_dtype(p)
    except (OSError, ValueError) as e:
        raise InputError(f"{p}: cannot read the labels (data.labels): {type(e).__name__}: {e}".splitlines()[0]) \
            from None
    if dtype.hasobject:   # (the file is the array: no array name to give)
        raise InputError(f"{p}: the labels (data.labels) are pickled Python objects (dtype object), which metricpipe "
                         f"does not unpickle; save them as a numeric or string array")
    try:
        return np.load(p, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise InputError(f"{p}: cannot read the labels (data.labels): {type(e).__name__}: {e}".splitlines()[0]) \
            from None


def _open_path(cfg: DataConfig, path: Path) -> Source:
    suffix = "".join(path.suffixes[-1:]).lower()
    extra = {}
    want = bool(cfg.labels)  # labels="" opens the features alone (predicting unlabelled data)
    separate_labels = cfg.labels.endswith(".npy")
    if path.is_file() and path.stat().st_size == 0:
        raise InputError(f"{path}: file is empty (data.path)")
    if path.is_dir() and (path / "zarr.json").exists():
        suffix = ".zarr"    # a Zarr v3 folder whatever its name says
    if suffix == ".npy":
        reader = NpyReader(path)
        if want and not separate_labels:
            raise InputError(f"{path}: a .npy file holds one array; give data.labels as the path of a .npy "
                             f"file of labels")
        y = _labels_from_npy(cfg) if want else None
    elif suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            if cfg.features not in z.files:
                raise InputError(f"{path}: no array {cfg.features!r} (data.features); it holds {sorted(z.files)}")
            y = None if not want else _labels_from_npy(cfg) if separate_labels else \
                _column(z, cfg.labels, path, "data.labels")
            extra = _extra_columns(cfg, z, path)
        reader = NpzReader(path, cfg.features)
    elif suffix in (".h5", ".hdf5"):
        import h5py
        reader = H5Reader(path, cfg.features)
        with h5py.File(path, "r") as f:
            cols = _CheckedH5(f, path)
            y = None if not want else _labels_from_npy(cfg) if separate_labels else \
                _column(cols, cfg.labels, path, "data.labels")
            extra = _extra_columns(cfg, cols, path)
    elif suffix == ".zarr":
        import zarr
        g = zarr.open_group(store=str(path), mode="r")
        names = {k for k, _ in g.arrays()}
        if cfg.features not in names:
            raise InputError(f"{path}: no array {cfg.features!r} (data.features); it holds {sorted(names)}")
        reader = ZarrReader(path, cfg.features)
        cols = _CheckedGroup(g, names, path)
        y = None if not want else _labels_from_npy(cfg) if separate_labels else \
            _column(cols, cfg.labels, path, "data.labels")
        extra = _extra_columns(cfg, cols, path)
    elif suffix in (".parquet", ".pq"):
        reader = ParquetReader(path, cfg.features)
        cols = _ParquetColumns(path)
        y = None if not want else _labels_from_npy(cfg) if separate_labels else \
            _column(cols, cfg.labels, path, "data.labels")
        extra = _extra_columns(cfg, cols, path)
    elif suffix in (".fvecs", ".bvecs"):
        reader = VecsReader(path)
        if want and not separate_labels:
            raise InputError(f"{path}: {suffix} files hold no labels; give data.labels as a .npy path")
        y = _labels_from_npy(cfg) if want else None
    elif path.is_dir() and all(_find_idx(path, s) for s in FASHION_FILES):
        return _idx_source(path, str(path), cfg.verify_source)
    elif "idx" in path.name:
        reader = IdxReader(path)
        if want and not separate_labels:
            raise InputError(f"{path}: give data.labels as a .npy path or point data.path at a folder with "
                             f"train-/t10k- images and labels IDX files")
        y = _labels_from_npy(cfg) if want else None
    else:
        raise InputError(f"{path}: unknown format (data.path); use .npy, .npz, .h5, .zarr, .parquet, .fvecs, .bvecs "
                         f"or an IDX file/folder")
    if len(reader.shape) != 2:
        raise InputError(f"{path}: features must be a 2-D (sample, feature) array; got shape "
                         f"{tuple(reader.shape)}; reshape to (n_samples, n_features)")
    return Source(str(path), reader, y, fingerprint=fingerprint(path, *([cfg.labels] if separate_labels else []),
                                                    contents=cfg.verify_source),
                  **extra)


def _extra_columns(cfg, container, path) -> dict:
    out = {}
    if cfg.split.column:
        out["split"] = _column(container, cfg.split.column, path, "data.split.column").astype(str)
    if cfg.groups:
        out["groups"] = _column(container, cfg.groups, path, "data.groups")
    if cfg.ids:
        out["ids"] = _column(container, cfg.ids, path, "data.ids")
    return out
