"""Readers of row ranges of a feature file without loading it whole: npy, npz, HDF5, Zarr, Parquet, fvecs/bvecs."""

import os
import zipfile

import numpy as np

from metricpipe.tasks.errors import InputError


def refuse_objects(dtype, path, key, field_name: str) -> None:
    """Object arrays hold pickled Python objects: never unpickled from a user's file."""
    if dtype.hasobject:
        raise InputError(
            f"{path}: array {key!r} ({field_name}) holds pickled Python objects (dtype object), which "
            f"metricpipe does not unpickle; save it as a numeric (or, for labels, string) array"
        )


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
        refuse_objects(npy_dtype(self.path), self.path, "", "data.path")
        a = np.load(self.path, mmap_mode="r")
        self.shape, self.dtype = a.shape, a.dtype

    def read(self, start, stop):
        a = np.load(self.path, mmap_mode="r")
        if not a.flags.c_contiguous:
            return np.array(a[start:stop])
        # read into the block: copying from the file's mapping page-faults it in (36-50 ms a 64 MB
        # block against 28-33 ms, measured)
        out = np.empty((stop - start,) + a.shape[1:], a.dtype)
        with open(self.path, "rb") as f:
            f.seek(a.offset + start * (a.strides[0] if a.ndim else 0))
            if f.readinto(out.reshape(-1).view(np.uint8)) != out.nbytes:
                return np.array(a[start:stop])  # (a file cut short: as the mapping reads it)
        return out


class NpzReader:
    """One array of an .npz; seeks inside the zip member so blocks are read without loading it all."""

    def __init__(self, path, key):
        self.path, self.key = str(path), key
        with zipfile.ZipFile(self.path) as z, z.open(key + ".npy") as f:
            self.shape, fortran, self.dtype = npy_header(f)
            self.offset = f.tell()
        if fortran:
            raise InputError(f"{self.path}: array {key!r} is stored in Fortran order; save it C-ordered")
        refuse_objects(self.dtype, self.path, key, "data.features")

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
                raise InputError(
                    f"{self.path}: {key!r} is a group, not a dataset (data.features); name one of its "
                    f"datasets, e.g. {key}/{sorted(f[key].keys())[0] if len(f[key]) else 'NAME'}"
                )
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
        raise InputError(
            f"{path}: array {key!r} ({field_name}) is missing {missing} of its {a.nchunks} chunk(s), "
            f"which would read as {fill!r}; rewrite or re-copy the Zarr source completely"
        )


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
            raise InputError(
                f"{path}: dataset {key!r} ({field_name}) was never written, so every row would read as "
                f"{fill!r} (its fill value); write its values, or rewrite the file"
            )
        return
    grid = [-(-n // c) for n, c in zip(d.shape, d.chunks)]
    total = int(np.prod(grid, dtype=np.int64))
    have = d.id.get_num_chunks()
    if have < total:
        import itertools

        written = set()
        d.id.chunk_iter(lambda info: written.add(tuple(info.chunk_offset)))
        first = next(
            tuple(i * c for i, c in zip(at, d.chunks))
            for at in itertools.product(*map(range, grid))
            if tuple(i * c for i, c in zip(at, d.chunks)) not in written
        )
        raise InputError(
            f"{path}: dataset {key!r} ({field_name}) has {total - have} of its {total} chunk(s) never "
            f"written (the first from row {first[0]:,}), which would read as {fill!r} (its fill value); "
            f"write every row, or rewrite the file"
        )


class CheckedH5:
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


class CheckedGroup:
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
        self.chunk_rows = a.chunks[0]  # readers of whole chunks decompress each once

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
        if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)) or not (
            pa.types.is_integer(t.value_type) or pa.types.is_floating(t.value_type)
        ):
            raise InputError(
                f"{self.path}: column {key!r} (data.features) is {t}; expected a list of numbers "
                f"per row (one embedding per row)"
            )
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
            self._checked(self.read_groups(0, len(lengths)), 0, int(lengths[longer[0]]))  # raises: ragged
        raise InputError(
            f"{self.path}: column {self.key!r} (data.features) holds empty lists (rows 0.."
            f"{len(lengths) - 1} at least); every row needs its embedding"
        )

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
            for b in pf.iter_batches(
                batch_size=PARQUET_BATCH_ROWS, row_groups=[g], columns=[self.key], use_threads=False
            ):
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
            raise InputError(
                f"{self.path}: column {self.key!r} (data.features) is null in row {start + row:,}; drop "
                f"or fill that row"
            )
        lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
        if dim is not None and len(lengths) and (lengths != dim).any():
            raise InputError(
                f"{self.path}: column {self.key!r} has rows of lengths {sorted(set(lengths.tolist()))[:4]} "
                f"in rows {start}..{start + len(lengths) - 1} against {dim}; every embedding needs "
                f"one length"
            )
        return lengths

    def read(self, start, stop):
        col = self.read_groups(start, stop)
        if not len(col):
            return np.empty((0, self.shape[1]), self.dtype)
        self._checked(col, start, self.shape[1])
        values = col.flatten()
        if values.null_count:  # (as NaN a float column's would be refused at staging; an int's became -2^63)
            lengths = np.cumsum(self._checked(col, start, self.shape[1]))
            at = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
            raise InputError(
                f"{self.path}: column {self.key!r} (data.features) holds a null value in row "
                f"{start + int(np.searchsorted(lengths, at, side='right')):,}; fill it"
            )
        values = values.to_numpy(zero_copy_only=False)
        return values.reshape(len(col), self.shape[1]).astype(self.dtype, copy=False)


# Rows a Parquet features column is decoded by (its row groups may hold a million rows or more).
PARQUET_BATCH_ROWS = 4096


class ParquetColumns:
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
        if d <= 0 or (d >= 1 << 24 and self.row_bytes > size):  # the first row's header is no dimension
            raise InputError(
                f"{self.path}: its first 4 bytes read as dimension {d}, which a {size}-byte file "
                f"cannot hold; it is not a {self.path[-5:]} file (each row: an int32 dimension, "
                f"then the values)"
            )
        if size % self.row_bytes:
            raise InputError(
                f"{self.path}: size {size} is not a multiple of a {d}-d row "
                f"({self.row_bytes} bytes); the file is truncated or not {self.path[-5:]}"
            )
        self.shape = (size // self.row_bytes, d)

    def read(self, start, stop):
        raw = np.fromfile(self.path, np.uint8, (stop - start) * self.row_bytes, offset=start * self.row_bytes)
        raw = raw.reshape(stop - start, self.row_bytes)
        dims = raw[:, :4].copy().view(np.int32).ravel()
        if (dims != self.shape[1]).any():
            raise InputError(
                f"{self.path}: rows {start}..{stop - 1} are ragged (dimensions "
                f"{sorted(set(dims.tolist()))[:4]} vs {self.shape[1]}); every vector needs one length"
            )
        return raw[:, 4:].copy().view(self.dtype)


def npy_header(f) -> tuple:
    """(shape, fortran_order, dtype) of the .npy stream ``f``, read from its header only (the file
    position is left at the data)."""
    version = np.lib.format.read_magic(f)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    return read_header(f)


def npy_dtype(path) -> np.dtype:
    with open(path, "rb") as f:
        return npy_header(f)[2]
