"""What every source is: a reader of row ranges with its labels and split, and the fingerprint that keys it."""

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from metricpipe.tasks.synthetic import SyntheticSpec


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


@dataclass
class Source:
    name: str  # what error messages call it (a file path or builtin:NAME)
    reader: object
    labels: np.ndarray
    split: np.ndarray | None = None  # strings train/test/val/negatives, or None for a random split
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
            "files": len(files),
            "bytes": total,
            "digest": h.hexdigest()[:32],
            **({"contents": True} if contents else {}),
        }
    return out


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
