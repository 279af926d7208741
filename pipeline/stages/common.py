"""What the stages share: the staged data's description (DataInfo), the output template writer,
commit with timing, row reads and the moments tree reduction."""

import time
from dataclasses import dataclass
from functools import lru_cache

import dask.array as da
import numpy as np
import xarray as xr

from metricpipe.context import StageContext
from metricpipe.store import (
    Unit,
    array_names,
    load_estimator,
    open_array,
    read_block,
    read_rows,
    row_chunks,
    row_codecs,
)
from metricpipe.tasks import moments
from metricpipe.tasks.rows import TrainingRows, take_rows
from metricpipe.tasks.splits import TEST, TRAIN, VAL  # noqa: F401 - the stages' names for the split codes


@dataclass(frozen=True)
class DataInfo:
    unit: Unit
    n_samples: int
    n_features: int
    chunk_rows: int
    classes: list
    labels: np.ndarray
    split: np.ndarray
    groups: np.ndarray | None

    @property
    def url(self):
        return self.unit.url

    @property
    def chunks(self):
        return row_chunks(self.n_samples, self.chunk_rows)

    def rows(self, code: int) -> np.ndarray:
        return np.flatnonzero(self.split == code)


@dataclass(frozen=True)
class Fed:
    """What a feeder hands a learner's fit, as the memory rule sizes it: ``rows`` rows, ``k`` neighbours
    each for ``anchors`` of them; ``fix``: the run's setting that shrinks it."""

    rows: int
    k: int = 0
    anchors: int | None = None
    fix: str = ""


def labels_list(classes) -> list:
    """Class labels as JSON and a learner's ``labels`` take them (numpy scalars as Python numbers and text)."""
    return np.asarray(classes).tolist()


def spec_params(spec: dict) -> dict:
    """A model's parameters as its records (and the report's labels) carry them: method and dim aside."""
    return {k: v for k, v in (spec or {}).items() if k not in ("method", "dim")}


def commit_timed(ctx: StageContext, unit: Unit, started: float, meta: dict, written: dict | None = None) -> None:
    """Commit ``unit`` with its wall time; ``written``: checksums its tasks took (:meth:`StageContext.commit`)."""
    ctx.commit(unit, {**meta, "seconds": round(time.perf_counter() - started, 3)}, written)


def under(name: str, sums: dict) -> dict:
    """Checksums of an array's chunk files (:func:`metricpipe.store.write_rows`) as paths inside its unit."""
    return {f"{name}/{k}": v for k, v in sums.items()}


def write_template(
    url: str,
    variables: dict,
    coords: dict,
    attrs: dict,
    chunk_rows: int,
    samples: dict | None = None,
    compress: bool = True,
) -> None:
    """Write the metadata and coordinates of an xarray Dataset; data chunks are filled by tasks.
    ``samples`` (name -> a few rows as stored) lets a variable go uncompressed where LZ4 gains little;
    ``compress=False`` stores every variable bare."""
    data_vars, encoding = {}, {}
    for name, (dims, shape, dtype, fill) in variables.items():
        chunks = (min(chunk_rows, shape[0]),) + tuple(shape[1:])
        data_vars[name] = (dims, da.full(shape, fill, dtype=dtype, chunks=chunks))
        encoding[name] = {"chunks": chunks, "compressors": row_codecs((samples or {}).get(name)) if compress else ()}
    ds = xr.Dataset(data_vars, coords={k: ("sample", v) for k, v in coords.items()}, attrs=attrs)
    ds.to_zarr(url, mode="w", compute=False, consolidated=False, encoding=encoding)


def load_features(url: str, start: int, stop: int, rows: np.ndarray | None = None) -> np.ndarray:
    """Rows ``start:stop`` of a staged array (optionally only the local positions ``rows``)."""
    X = read_block(f"{url}/features", start, stop)
    return X if rows is None else take_rows(X, rows)


def tree_combine(ctx, parts, name) -> tuple[list, object]:
    """(the part futures, the future of their moments combined) from ``parts``, an iterable that
    submits each part as it is drawn (a generator). Each pair is combined as soon as it is submitted,
    like a binary counter: a combine is queued right behind its two parts, ahead of later parts, so a
    worker holds a few partials and not one per block (every block's 4,096-d moments, 167 MB each,
    were held until the last block finished: 128 of them on 2 workers of 4.8 GB, and a worker was
    restarted). The tree's shape depends on the number of parts only: the same sums on any cluster."""
    done, stack = [], []  # stack: (level, future), levels strictly decreasing from the bottom
    for future in parts:
        done.append(future)
        level = 0
        while stack and stack[-1][0] == level:
            future = ctx.submit(moments.combine_moments, stack.pop()[1], future, name=name)
            level += 1
        stack.append((level, future))
    total = stack.pop()[1]
    while stack:  # the smaller trees left, from the right
        total = ctx.submit(moments.combine_moments, stack.pop()[1], total, name=name)
    return done, total


class StagedRows(TrainingRows):
    """Staged rows (sorted global ``rows``) as a learner reads its training rows
    (:class:`metricpipe.tasks.rows.TrainingRows`): their labels, content keys and groups in full, the
    rows by position or one staged row-block at a time. All of them are fit rows described by the
    statistics, with no given validation rows; :class:`metricpipe.stages.train.rows.StoreRows` is a
    fold's training rows."""

    def __init__(self, data_url: str, chunks: list, rows: np.ndarray):
        self._url, self._chunks, self._rows = data_url, chunks, np.asarray(rows, np.int64)
        self.labels = open_array(f"{data_url}/label")[:][self._rows].astype(np.int64)
        self.keys = open_array(f"{data_url}/row_key")[:][self._rows]
        self.groups = open_array(f"{data_url}/group")[:][self._rows] if "group" in array_names(data_url) else None
        self.n_features = int(open_array(f"{data_url}/features").shape[1])
        self.in_stats = self.fit = np.ones(len(self._rows), bool)
        self.val = None

    def take(self, positions):
        return read_rows(f"{self._url}/features", self._rows[np.asarray(positions, np.int64)])

    def blocks(self, mask):
        features = open_array(f"{self._url}/features")
        for a, b in self._chunks:  # one staged row-block at a time
            lo, hi = np.searchsorted(self._rows, [a, b])
            local = np.flatnonzero(mask[lo:hi])
            if len(local):
                yield (features[a:b][self._rows[lo:hi][local] - a].astype(np.float64), self.labels[lo:hi][local])


def moments_block(
    url: str, start: int, stop: int, n_classes: int, second: bool, array_url: str | None = None, code: int = TRAIN
):
    """Moments of the train rows (split ``code``) of block start:stop (of ``array_url``, default the
    staged features)."""
    split = open_array(f"{url}/split")[start:stop]
    y = open_array(f"{url}/label")[start:stop]
    train = np.flatnonzero(split == code)
    X = read_block(array_url or f"{url}/features", start, stop)
    return moments.partial_moments(X, y[train], n_classes, second=second, rows=train)


@lru_cache(maxsize=8)
def cached_estimator(model_url: str):
    """The fitted estimator of a model unit (cached per worker: every block of a model reuses it)."""
    return load_estimator(model_url)
