"""IDX files (MNIST's format) and Fashion-MNIST's folder: Debian's package, $METRICPIPE_DATA or data.root."""

import gzip
import os
import struct
from pathlib import Path

import numpy as np

from metricpipe.config import DataConfig
from metricpipe.sources.base import ConcatReader, Source, fingerprint
from metricpipe.tasks.errors import InputError

FASHION_DEBIAN = "/usr/share/datasets/fashion-mnist"
FASHION_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


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
        if size is not None and (size != want % 2**32 if gz else size != want):  # a .gz's size is modulo 2^32
            raise InputError(
                f"{self.path}: {size:,} bytes, but its header ({' x '.join(map(str, dims))} values of "
                f"{self.item.itemsize} byte(s)) needs {want:,}; the file is truncated or not an IDX file"
            )

    def read(self, start, stop):
        try:
            with _open_idx(self.path) as f:
                f.seek(self.offset + start * self.shape[1] * self.item.itemsize)
                buf = f.read((stop - start) * self.shape[1] * self.item.itemsize)
        except (EOFError, gzip.BadGzipFile) as e:  # a .gz cut short, its trailer gone with it
            raise InputError(f"{self.path}: the compressed data ends early ({e}); the file is truncated") from None
        if len(buf) != (stop - start) * self.shape[1] * self.item.itemsize:  # (a .gz whose size was not known)
            raise InputError(
                f"{self.path}: ends before row {start + len(buf) // max(1, self.shape[1] * self.item.itemsize):,} "
                f"of the {self.shape[0]:,} its header names; the file is truncated"
            )
        return np.frombuffer(buf, self.item).reshape(stop - start, self.shape[1]).astype(self.dtype)

    def read_all_1d(self):
        return self.read(0, self.shape[0]).reshape(-1)


def find_idx(folder: Path, stem: str) -> Path | None:
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
            if all(find_idx(q, s) for s in FASHION_FILES):
                return q
    if given:
        raise InputError(
            f"{given[0]}: no Fashion-MNIST IDX files in {given[1]} (nor in its fashion-mnist folder); "
            f"give the folder holding {FASHION_FILES[0]}.gz and the other three files, or "
            f"{'drop data.root' if cfg.root else 'unset METRICPIPE_DATA'}"
        )
    raise InputError(
        f"data.source fashion-mnist: IDX files not found in {', '.join(candidates)}; install them with "
        f"'apt-get install dataset-fashion-mnist', or set data.root or METRICPIPE_DATA to a folder holding "
        f"{FASHION_FILES[0]}.gz and the other three files"
    )


def idx_source(folder: Path, name: str, contents: bool = False) -> Source:
    files = [find_idx(folder, s) for s in FASHION_FILES]
    tr, tr_lab, te, te_lab = [IdxReader(f) for f in files]
    y = np.concatenate([tr_lab.read_all_1d(), te_lab.read_all_1d()])
    split = np.array(["train"] * tr.shape[0] + ["test"] * te.shape[0])
    return Source(name, ConcatReader([tr, te]), y, split=split, fingerprint=fingerprint(*files, contents=contents))
