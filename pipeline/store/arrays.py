"""The store's Zarr access: arrays written in row-blocks, read by rows or whole, their attributes and
checksums, and the row-block sizes of staged data."""

import json
import os
import zlib

import numpy as np

from metricpipe.store.keys import to_json


def stop_zarr_loop() -> None:
    """zarr's exit handler stops its I/O loop, waits 0.2 s for the loop's thread and then closes the
    loop: when the thread is still busy (a loaded machine, a read in flight) the close raises "Cannot
    close a running event loop", a traceback after a run that succeeded. This stops the loop first and
    waits up to 10 s; registered after zarr's own handler, it runs before it (atexit runs the last
    registered first), which then finds the loop stopped."""
    try:
        from zarr.core import sync

        lp, th = sync.loop[0], sync.iothread[0]
        if lp is not None and th is not None and th.is_alive():
            lp.call_soon_threadsafe(lp.stop)
            th.join(timeout=10)
    except Exception:  # noqa: BLE001 - best effort at exit: zarr's own handler follows
        pass


def _register_zarr_exit() -> None:
    import atexit

    import zarr.core.sync  # noqa: F401 - zarr registers its exit handler when this is first imported

    atexit.register(stop_zarr_loop)


_register_zarr_exit()


def size_crc(fs, path: str) -> list[int]:
    """[size, CRC-32] of one file; raises FileNotFoundError."""
    with fs.open(path, "rb") as f:
        data = f.read()
    return [len(data), zlib.crc32(data)]


def size_crcs(fs, root: str, names: list) -> dict:
    """{name: [size, CRC-32] or None when missing} for files under ``root`` (a worker's share)."""
    out = {}
    for rel in names:
        try:
            out[rel] = size_crc(fs, f"{root}/{rel}")
        except FileNotFoundError:
            out[rel] = None
    return out


# ---- Zarr helpers (the only place that talks to zarr directly) -------------------------------------


def remove_tree(url: str) -> None:
    """Remove the folder (or prefix) ``url`` and everything below it, if it exists (a task's scratch)."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    if fs.exists(path):
        fs.rm(path, recursive=True)


def open_array(url: str, mode: str = "r"):
    import zarr

    return zarr.open_array(store=url, mode=mode)


# Row-block arrays are LZ4-compressed only where that saves a third of the bytes. Decoding costs
# ~0.045 s per 64 MB here: on dense float descriptors (1.07x) it doubles a block's read (0.052 s bare,
# 0.097 s LZ4, measured), while on Fashion-MNIST (1.7x) the smaller file pays for it (990 MB/s LZ4
# against 963 MB/s bare) and the store is 1.7x smaller.
COMPRESS_MIN_RATIO = 1.5


def row_codecs(sample: np.ndarray | None = None) -> tuple:
    """Compression of the row-block arrays (features, codes, graphs): Blosc LZ4 with byte shuffle,
    or none when ``sample`` (a few thousand rows as they will be stored) compresses less than
    COMPRESS_MIN_RATIO. Every stage reads these again, the kNN stage once per query piece, so
    decoding speed matters more than size (Zarr's default zstd reads Fashion-MNIST at 500 MB/s)."""
    from zarr.codecs import BloscCodec

    if sample is not None and lz4_ratio(sample) < COMPRESS_MIN_RATIO:
        return ()
    return (BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),)


def lz4_ratio(sample: np.ndarray) -> float:
    """Raw bytes over Blosc-LZ4-shuffle bytes for ``sample``."""
    from numcodecs import Blosc

    raw = np.ascontiguousarray(sample)
    if raw.nbytes == 0:
        return 1.0
    return raw.nbytes / len(Blosc(cname="lz4", clevel=5, shuffle=Blosc.SHUFFLE).encode(raw))


def create_array(
    url: str,
    shape,
    chunks,
    dtype,
    fill_value=None,
    attrs=None,
    rows: bool = False,
    sample: np.ndarray | None = None,
    bare: bool = False,
):
    """A new array; ``rows`` marks a row-block array that stages read repeatedly, compressed when
    ``sample`` says it pays (see row_codecs); ``bare``: never compressed (e.g. PQ codes)."""
    import zarr

    extra = {"compressors": () if bare else row_codecs(sample)} if rows or bare else {}
    a = zarr.create_array(
        store=url, shape=shape, chunks=chunks, dtype=dtype, fill_value=fill_value, overwrite=True, **extra
    )
    if attrs:
        a.attrs.update(attrs)
    return a


def write_rows(url: str, start: int, values: np.ndarray) -> dict:
    """Write ``values`` as rows ``start:start + len(values)`` of the array at ``url`` and return
    {chunk file inside the array: [size, CRC-32]} of every chunk file written, taken from the bytes as
    they go to the store: a commit reuses them instead of reading the files back (1 GB of staged
    features took 3.1 s of checksum tasks after the blocks were written; the CRC of the bytes in
    memory is a third of that, spread over the writing tasks). One whole chunk of an uncompressed
    local array is written as its file directly (:func:`read_block`'s case; zarr copies the block into
    a new buffer first: 338 ms against 245 ms with the CRC for 64 MB blocks, interleaved on a machine
    at load 10), anything else through zarr."""
    import zarr

    arr = zarr.open_array(store=url, mode="r+")
    path = _bare_chunk_file(arr, start, start + len(values))
    if path is not None:  # one whole uncompressed chunk: its file is the values' bytes
        data = np.ascontiguousarray(values, arr.dtype)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(f"{path}.partial", "wb") as f:  # (renamed whole, as zarr writes a chunk)
            f.write(memoryview(data).cast("B"))
        os.replace(f"{path}.partial", path)
        return {os.path.relpath(path, url): [int(data.nbytes), zlib.crc32(data)]}
    rec = _recording(arr.store)
    zarr.open_array(store=rec, path=arr.path, mode="r+")[start : start + len(values)] = values
    prefix = f"{arr.path}/" if arr.path else ""
    return {k[len(prefix) :]: v for k, v in rec.sums.items() if k.startswith(prefix)}


def _recording(store):
    """``store`` wrapped so that it keeps [size, CRC-32] of each value set through it (``sums``), and
    forgets a deleted one (zarr removes a chunk left at the fill value instead of writing it)."""
    from zarr.storage import WrapperStore

    class Recording(WrapperStore):
        def __init__(self, inner):
            super().__init__(inner)
            self.sums = {}

        async def set(self, key, value):
            data = value.as_numpy_array()
            self.sums[key] = [int(data.nbytes), zlib.crc32(data)]
            await super().set(key, value)

        async def delete(self, key):
            self.sums.pop(key, None)
            await super().delete(key)

    return Recording(store)


def save_arrays(url: str, arrays: dict, attrs: dict | None = None) -> None:
    """Write small arrays (statistics, models) as one Zarr group."""
    import zarr

    g = zarr.open_group(store=url, mode="w")
    scalars = {}
    for name, value in arrays.items():
        value = np.asarray(value)
        if value.ndim == 0:
            scalars[name] = value.item()
            continue
        a = g.create_array(name, shape=value.shape, dtype=value.dtype, chunks=value.shape)
        a[...] = value
    g.attrs.update(json.loads(to_json({**(attrs or {}), "scalars": scalars})))


def load_scalar(url: str, name: str):
    """One scalar that :func:`save_arrays` kept in the group's attributes (no array is read)."""
    import zarr

    return zarr.open_group(store=url, mode="r").attrs["scalars"][name]


def load_arrays(url: str, names: tuple | None = None) -> tuple[dict, dict]:
    """(arrays and scalars, attributes) of a group saved by :func:`save_arrays`; ``names``: only those
    (a learner's ``reads_statistics``: a 4,096-d covariance is 134 MB it need not read)."""
    import zarr

    g = zarr.open_group(store=url, mode="r")
    attrs = dict(g.attrs)
    scalars = attrs.pop("scalars", {})
    keep = (lambda k: True) if names is None else (lambda k: k in names)
    return {**{k: v for k, v in scalars.items() if keep(k)}, **{k: a[...] for k, a in g.arrays() if keep(k)}}, attrs


def read_rows(url: str, idx: np.ndarray) -> np.ndarray:
    """Rows ``idx`` of a stored 2-D array; only the chunks holding them are read, one at a
    time. (A single orthogonal selection lets zarr decode its whole batch of chunks at once: 20,000
    rows spread over a 2.5M x 128 array took 612 MB for a 10 MB result, which killed 1 GB workers.)"""
    arr = open_array(url)
    idx = np.asarray(idx, np.int64)
    if len(idx) > 1 and (np.diff(idx) < 0).any():
        order = np.argsort(idx, kind="stable")
        out = np.empty((len(idx),) + arr.shape[1:], arr.dtype)
        out[order] = read_rows(url, idx[order])
        return out
    step = arr.chunks[0]
    out = np.empty((len(idx),) + arr.shape[1:], arr.dtype)
    cuts = np.searchsorted(idx, np.arange(0, arr.shape[0] + step, step))
    for c in np.flatnonzero(np.diff(cuts)):
        lo, hi = cuts[c], cuts[c + 1]
        out[lo:hi] = arr.get_orthogonal_selection((idx[lo:hi], slice(None)))
    return out


def read_block(url: str, start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of a stored array. A block that is exactly one chunk of an uncompressed
    array in a local store is read straight into the result: zarr reads the file into bytes and
    copies them again (74 ms against 30 ms for a 64 MB block at load 3, 293 against 137 ms at load 10,
    paid by every stage per row-block and by the kNN stage per query piece). Anything else is read
    through zarr."""
    arr = open_array(url)
    path = _bare_chunk_file(arr, start, stop)
    if path is not None:
        out = np.empty((stop - start,) + arr.shape[1:], arr.dtype)
        try:
            with open(path, "rb") as f:
                if f.readinto(memoryview(out).cast("B")) == out.nbytes and not f.read(1):
                    return out
        except FileNotFoundError:
            pass  # a chunk left at the fill value has no file: zarr fills it in
    return arr[start:stop]


def _bare_chunk_file(arr, start: int, stop: int) -> str | None:
    """The file of chunk ``start:stop`` when it holds exactly those rows' bytes as numpy lays them out
    (Zarr v3, local store, only the bytes codec in this machine's byte order, C order, one chunk across
    the other dimensions); None otherwise."""
    import sys

    from zarr.codecs import BytesCodec
    from zarr.storage import LocalStore

    meta, rows = arr.metadata, arr.chunks[0]
    codecs = getattr(meta, "codecs", ())
    if (
        not isinstance(arr.store, LocalStore)
        or len(codecs) != 1
        or not isinstance(codecs[0], BytesCodec)
        or (codecs[0].endian is not None and codecs[0].endian.value != sys.byteorder)
        or arr.order != "C"
        or start % rows
        or stop - start != rows
        or tuple(arr.chunks[1:]) != tuple(arr.shape[1:])
    ):
        return None
    key = meta.encode_chunk_key((start // rows,) + (0,) * (arr.ndim - 1))
    return os.path.join(str(arr.store.root), *([arr.path] if arr.path else []), key)


def array_names(url: str) -> set:
    """Names of the arrays in a Zarr group."""
    import zarr

    return {k for k, _ in zarr.open_group(store=url, mode="r").arrays()}


def chunk_bytes(url: str) -> float:
    """Bytes of a Zarr group's arrays as whole chunks, uncompressed: what the disk rule counts of a
    unit (its files may be smaller: LZ4)."""
    import zarr

    total = 0.0
    for _, a in zarr.open_group(store=url, mode="r").arrays():
        total += float(np.prod([-(-s // c) * c for s, c in zip(a.shape, a.chunks)])) * a.dtype.itemsize
    return total


def read_attrs(url: str) -> dict:
    """The attributes of a Zarr group, without reading its arrays."""
    import zarr

    return dict(zarr.open_group(store=url, mode="r").attrs)


def row_chunks(n_rows: int, chunk_rows: int) -> list[tuple[int, int]]:
    return [(a, min(a + chunk_rows, n_rows)) for a in range(0, n_rows, chunk_rows)]


def chunk_rows_for(n_features: int, chunk_mb: float, itemsize: int = 4) -> int:
    """Rows per chunk so that one chunk of float32 features is about ``chunk_mb`` MB."""
    return max(1, int(chunk_mb * 1e6 // (n_features * itemsize)))


def stored_rows(n_rows: int, chunk_rows: int) -> int:
    """Rows an ``n_rows``-row array chunked by ``chunk_rows`` (``row_chunk``) takes on disk: Zarr
    writes its edge chunk whole."""
    c = row_chunk(chunk_rows, n_rows)
    return -(-n_rows // c) * c


def row_chunk(chunk_rows: int, n_rows: int) -> int:
    """Rows per chunk of an ``n_rows``-row array: ``chunk_rows``, but no more than the rows. Zarr stores
    and decodes an edge chunk whole, so a 64 MB chunk over 1,150 rows made every read decode 64 MB."""
    return min(chunk_rows, max(1, n_rows))
