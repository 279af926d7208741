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
from metricpipe.sources.base import ConcatReader, Source, SyntheticReader, fingerprint
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
from metricpipe.tasks.synthetic import GENERATION, SyntheticSpec


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
            s.samples,
            s.dim,
            s.classes,
            s.seed,
            separation=s.separation,
            nonnegative=s.nonnegative,
            nuisance=s.nuisance,
            overlap=s.overlap,
        )
        return Source(
            "builtin:synthetic",
            SyntheticReader(spec),
            spec.labels(),
            fingerprint={"builtin": "synthetic", "generation": GENERATION, **s.__dict__},
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


def _labels_in(cfg: DataConfig, columns, path: Path):
    """The labels of a file of several arrays: none, a .npy of labels beside it, or one of its columns."""
    if not cfg.labels:  # labels="" opens the features alone (predicting unlabelled data)
        return None
    if cfg.labels.endswith(".npy"):
        return _labels_from_npy(cfg)
    return _column(columns, cfg.labels, path, "data.labels")


def _labels_beside(cfg: DataConfig, refusal: str):
    """The labels of a file of features alone: a .npy of labels, or none; a column name is ``refusal``."""
    if cfg.labels and not cfg.labels.endswith(".npy"):
        raise InputError(refusal)
    return _labels_from_npy(cfg) if cfg.labels else None


def _open_npy(cfg: DataConfig, path: Path, suffix: str) -> tuple:
    """(reader, labels, extra columns) of a .npy file."""
    reader = NpyReader(path)
    refusal = f"{path}: a .npy file holds one array; give data.labels as the path of a .npy file of labels"
    return reader, _labels_beside(cfg, refusal), {}


def _open_npz(cfg: DataConfig, path: Path, suffix: str) -> tuple:
    """(reader, labels, extra columns) of a .npz file."""
    with np.load(path, allow_pickle=False) as z:
        if cfg.features not in z.files:
            raise InputError(f"{path}: no array {cfg.features!r} (data.features); it holds {sorted(z.files)}")
        y = _labels_in(cfg, z, path)
        extra = _extra_columns(cfg, z, path)
    return NpzReader(path, cfg.features), y, extra


def _open_h5(cfg: DataConfig, path: Path, suffix: str) -> tuple:
    """(reader, labels, extra columns) of an HDF5 file."""
    import h5py

    reader = H5Reader(path, cfg.features)
    with h5py.File(path, "r") as f:
        cols = CheckedH5(f, path)
        return reader, _labels_in(cfg, cols, path), _extra_columns(cfg, cols, path)


def _open_zarr(cfg: DataConfig, path: Path, suffix: str) -> tuple:
    """(reader, labels, extra columns) of a Zarr group."""
    import zarr

    g = zarr.open_group(store=str(path), mode="r")
    names = {k for k, _ in g.arrays()}
    if cfg.features not in names:
        raise InputError(f"{path}: no array {cfg.features!r} (data.features); it holds {sorted(names)}")
    reader = ZarrReader(path, cfg.features)
    cols = CheckedGroup(g, names, path)
    return reader, _labels_in(cfg, cols, path), _extra_columns(cfg, cols, path)


def _open_parquet(cfg: DataConfig, path: Path, suffix: str) -> tuple:
    """(reader, labels, extra columns) of a Parquet file."""
    reader = ParquetReader(path, cfg.features)
    cols = ParquetColumns(path)
    return reader, _labels_in(cfg, cols, path), _extra_columns(cfg, cols, path)


def _open_vecs(cfg: DataConfig, path: Path, suffix: str) -> tuple:
    """(reader, labels, extra columns) of an .fvecs or .bvecs file."""
    reader = VecsReader(path)
    return reader, _labels_beside(cfg, f"{path}: {suffix} files hold no labels; give data.labels as a .npy path"), {}


def _open_idx(cfg: DataConfig, path: Path, suffix: str) -> tuple:
    """(reader, labels, extra columns) of one IDX file."""
    reader = IdxReader(path)
    refusal = (
        f"{path}: give data.labels as a .npy path or point data.path at a folder with "
        f"train-/t10k- images and labels IDX files"
    )
    return reader, _labels_beside(cfg, refusal), {}


# A file's reader by its suffix (a folder with zarr.json is Zarr whatever its name says).
_OPENERS = {
    ".npy": _open_npy,
    ".npz": _open_npz,
    ".h5": _open_h5,
    ".hdf5": _open_h5,
    ".zarr": _open_zarr,
    ".parquet": _open_parquet,
    ".pq": _open_parquet,
    ".fvecs": _open_vecs,
    ".bvecs": _open_vecs,
}


def _open_path(cfg: DataConfig, path: Path) -> Source:
    """The Source of the file or folder ``path``: the reader its suffix names, its labels and columns."""
    suffix = "".join(path.suffixes[-1:]).lower()
    separate_labels = cfg.labels.endswith(".npy")
    if path.is_file() and path.stat().st_size == 0:
        raise InputError(f"{path}: file is empty (data.path)")
    if path.is_dir() and (path / "zarr.json").exists():
        suffix = ".zarr"  # a Zarr v3 folder whatever its name says
    if suffix in _OPENERS:
        reader, y, extra = _OPENERS[suffix](cfg, path, suffix)
    elif path.is_dir() and all(find_idx(path, s) for s in FASHION_FILES):
        return idx_source(path, str(path), cfg.verify_source)
    elif "idx" in path.name:
        reader, y, extra = _open_idx(cfg, path, suffix)
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
