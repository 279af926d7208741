"""Feature sources: picklable readers that give row ranges of a feature file without loading it whole.

A :class:`Source` bundles a reader (``shape``, ``dtype``, ``read(start, stop)``) that workers call on
their own row-block, the labels and optional split/group/id columns (1-D, small), and a fingerprint
(path, size, mtime) that keys the staged data.
"""

import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from metricpipe.config import DataConfig
from metricpipe.sources.base import ConcatReader, Source, fingerprint
from metricpipe.sources.idx import FASHION_FILES, IdxReader, fashion_mnist_root, find_idx, idx_source
from metricpipe.sources.readers import (
    CheckedGroup,
    CheckedH5,
    H5Reader,
    MemoryReader,
    NpyReader,
    NpzReader,
    ParquetColumns,
    ParquetReader,
    VecsReader,
    ZarrReader,
    npy_dtype,
    npy_header,
    refuse_objects,
)
from metricpipe.tasks.errors import InputError
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


def _column(container, key, path, field_name, n=None):
    if key not in container:
        raise InputError(f"{path}: no array {key!r} ({field_name}); it holds {sorted(container.keys())}")
    try:
        obj = container[key]  # read once (an npz member or a Parquet column is decoded here)
        if isinstance(obj, Mapping):  # an HDF5 group
            raise InputError(
                f"{path}: {key!r} is a group, not an array ({field_name}); name one of its arrays ({key}/NAME)"
            )
        return np.asarray(obj[...])
    except ValueError as e:
        if "allow_pickle" in str(e):
            refuse_objects(np.dtype(object), path, key, field_name)
        raise


def open_source(cfg: DataConfig) -> Source:
    """Open the configured source lazily; raises InputError naming the file and key on any problem."""
    if cfg.source == "digits":
        from sklearn.datasets import load_digits

        d = load_digits()
        return Source(
            "builtin:digits", MemoryReader(d.data.astype(np.float32)), d.target, fingerprint={"builtin": "digits"}
        )
    if cfg.source == "fashion-mnist":
        return idx_source(fashion_mnist_root(cfg), "builtin:fashion-mnist", cfg.verify_source)
    if cfg.source == "synthetic":
        s = cfg.synthetic
        spec = SyntheticSpec(
            s.samples, s.dim, s.classes, s.seed, separation=s.separation, nonnegative=s.nonnegative, nuisance=s.nuisance
        )
        return Source(
            "builtin:synthetic",
            SyntheticReader(spec),
            spec.labels(),
            fingerprint={"builtin": "synthetic", **s.__dict__},
        )
    path = Path(cfg.path)
    if not path.exists():
        raise InputError(
            f"{path}: file not found (data.path); check the path (a config's relative paths are read from its folder)"
        )
    try:
        return _open_path(cfg, path)
    except InputError:
        raise
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
        raise InputError(f"{path}: cannot read (data.path): {type(e).__name__}: {e}".splitlines()[0]) from None


def _labels_from_npy(cfg, n_hint=None):
    p = Path(cfg.labels)
    if not p.is_file():
        raise InputError(f"{p}: labels file not found (data.labels)")
    try:
        dtype = npy_dtype(p)
    except (OSError, ValueError) as e:
        raise InputError(
            f"{p}: cannot read the labels (data.labels): {type(e).__name__}: {e}".splitlines()[0]
        ) from None
    if dtype.hasobject:  # (the file is the array: no array name to give)
        raise InputError(
            f"{p}: the labels (data.labels) are pickled Python objects (dtype object), which metricpipe "
            f"does not unpickle; save them as a numeric or string array"
        )
    try:
        return np.load(p, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise InputError(
            f"{p}: cannot read the labels (data.labels): {type(e).__name__}: {e}".splitlines()[0]
        ) from None


def _open_path(cfg: DataConfig, path: Path) -> Source:
    suffix = "".join(path.suffixes[-1:]).lower()
    extra = {}
    want = bool(cfg.labels)  # labels="" opens the features alone (predicting unlabelled data)
    separate_labels = cfg.labels.endswith(".npy")
    if path.is_file() and path.stat().st_size == 0:
        raise InputError(f"{path}: file is empty (data.path)")
    if path.is_dir() and (path / "zarr.json").exists():
        suffix = ".zarr"  # a Zarr v3 folder whatever its name says
    if suffix == ".npy":
        reader = NpyReader(path)
        if want and not separate_labels:
            raise InputError(
                f"{path}: a .npy file holds one array; give data.labels as the path of a .npy file of labels"
            )
        y = _labels_from_npy(cfg) if want else None
    elif suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            if cfg.features not in z.files:
                raise InputError(f"{path}: no array {cfg.features!r} (data.features); it holds {sorted(z.files)}")
            y = (
                None
                if not want
                else _labels_from_npy(cfg)
                if separate_labels
                else _column(z, cfg.labels, path, "data.labels")
            )
            extra = _extra_columns(cfg, z, path)
        reader = NpzReader(path, cfg.features)
    elif suffix in (".h5", ".hdf5"):
        import h5py

        reader = H5Reader(path, cfg.features)
        with h5py.File(path, "r") as f:
            cols = CheckedH5(f, path)
            y = (
                None
                if not want
                else _labels_from_npy(cfg)
                if separate_labels
                else _column(cols, cfg.labels, path, "data.labels")
            )
            extra = _extra_columns(cfg, cols, path)
    elif suffix == ".zarr":
        import zarr

        g = zarr.open_group(store=str(path), mode="r")
        names = {k for k, _ in g.arrays()}
        if cfg.features not in names:
            raise InputError(f"{path}: no array {cfg.features!r} (data.features); it holds {sorted(names)}")
        reader = ZarrReader(path, cfg.features)
        cols = CheckedGroup(g, names, path)
        y = (
            None
            if not want
            else _labels_from_npy(cfg)
            if separate_labels
            else _column(cols, cfg.labels, path, "data.labels")
        )
        extra = _extra_columns(cfg, cols, path)
    elif suffix in (".parquet", ".pq"):
        reader = ParquetReader(path, cfg.features)
        cols = ParquetColumns(path)
        y = (
            None
            if not want
            else _labels_from_npy(cfg)
            if separate_labels
            else _column(cols, cfg.labels, path, "data.labels")
        )
        extra = _extra_columns(cfg, cols, path)
    elif suffix in (".fvecs", ".bvecs"):
        reader = VecsReader(path)
        if want and not separate_labels:
            raise InputError(f"{path}: {suffix} files hold no labels; give data.labels as a .npy path")
        y = _labels_from_npy(cfg) if want else None
    elif path.is_dir() and all(find_idx(path, s) for s in FASHION_FILES):
        return idx_source(path, str(path), cfg.verify_source)
    elif "idx" in path.name:
        reader = IdxReader(path)
        if want and not separate_labels:
            raise InputError(
                f"{path}: give data.labels as a .npy path or point data.path at a folder with "
                f"train-/t10k- images and labels IDX files"
            )
        y = _labels_from_npy(cfg) if want else None
    else:
        raise InputError(
            f"{path}: unknown format (data.path); use .npy, .npz, .h5, .zarr, .parquet, .fvecs, .bvecs "
            f"or an IDX file/folder"
        )
    if len(reader.shape) != 2:
        raise InputError(
            f"{path}: features must be a 2-D (sample, feature) array; got shape "
            f"{tuple(reader.shape)}; reshape to (n_samples, n_features)"
        )
    return Source(
        str(path),
        reader,
        y,
        fingerprint=fingerprint(path, *([cfg.labels] if separate_labels else []), contents=cfg.verify_source),
        **extra,
    )


def _extra_columns(cfg, container, path) -> dict:
    out = {}
    if cfg.split.column:
        out["split"] = _column(container, cfg.split.column, path, "data.split.column").astype(str)
    if cfg.groups:
        out["groups"] = _column(container, cfg.groups, path, "data.groups")
    if cfg.ids:
        out["ids"] = _column(container, cfg.ids, path, "data.ids")
    return out


__all__ = [
    "FASHION_FILES",
    "ConcatReader",
    "H5Reader",
    "IdxReader",
    "MemoryReader",
    "NpyReader",
    "NpzReader",
    "ParquetReader",
    "Source",
    "VecsReader",
    "ZarrReader",
    "fashion_mnist_root",
    "fingerprint",
    "npy_header",
    "open_source",
]
