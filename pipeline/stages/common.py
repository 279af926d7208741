"""What the stages share: the staged data's description (DataInfo), the output template writer,
commit with timing, row reads and the moments tree reduction."""
import time
from dataclasses import dataclass

import dask.array as da
import numpy as np
import xarray as xr

from metricpipe.context import StageContext
from metricpipe.storage import Unit, open_array, row_chunks, row_codecs
from metricpipe.tasks import moments
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


def spec_params(spec: dict) -> dict:
    """A model's parameters as its records (and the report's labels) carry them: method and dim aside."""
    return {k: v for k, v in (spec or {}).items() if k not in ("method", "dim")}


def _timed(ctx: StageContext, unit: Unit, started: float, meta: dict) -> None:
    ctx.commit(unit, {**meta, "seconds": round(time.perf_counter() - started, 3)})


def _write_template(url: str, variables: dict, coords: dict, attrs: dict, chunk_rows: int,
                    samples: dict | None = None, compress: bool = True) -> None:
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
    X = open_array(f"{url}/features")[start:stop]
    return X if rows is None else X[rows]

def _tree_combine(ctx, futures, name):
    while len(futures) > 1:
        futures = [ctx.submit(moments.combine_moments, futures[i], futures[i + 1], name=name)
                   if i + 1 < len(futures) else futures[i] for i in range(0, len(futures), 2)]
    return futures[0]


