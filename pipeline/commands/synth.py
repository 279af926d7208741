"""``metricpipe synth``: class-structured synthetic features written as a Zarr store by the workers.

The store holds ``X`` (N, D) float32 in row chunks and ``y`` (N,) int32, and is read back by
``data: {path: STORE.zarr}`` like any other Zarr source. Rows come from `tasks.synthetic`, seeded per
unit of 1,024 rows, so the store is the same whatever the chunking or the number of workers. It is
written under ``PATH.partial`` and renamed when every chunk is in, so a killed run leaves no store
that looks complete.
"""

import os
import shutil
import time

import numpy as np

from metricpipe.progress import human_bytes
from metricpipe.store import chunk_rows_for, create_array, open_array
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.synthetic import GENERATION, SyntheticSpec


def _write_rows(url: str, spec: SyntheticSpec, labels: np.ndarray, a: int, b: int) -> int:
    open_array(f"{url}/X", mode="r+")[a:b] = spec.rows(a, b, labels)
    return b - a


def check_args(path: str, n: int, dim: int, classes: int) -> str:
    """The absolute store path, or a one-line error before any cluster starts."""
    path = os.path.abspath(path)
    if os.path.exists(path):
        raise InputError(f"{path}: already exists (synth --store); choose a new path or delete it")
    if os.path.splitext(path)[1].lower() in (".npy", ".npz", ".h5", ".hdf5", ".parquet", ".pq", ".fvecs", ".bvecs"):
        raise InputError(
            f"{path}: synth writes a Zarr folder, and this name says another format (synth --store); "
            f"give a name ending in .zarr"
        )
    if classes < 2 or n < 2 * classes or dim < 1:
        raise InputError(
            f"synth: need --classes >= 2, --samples >= 2 x classes and --dim >= 1; got {n} x {dim}, {classes} classes"
        )
    return path


def write_synthetic(
    client,
    path: str,
    n: int,
    dim: int,
    classes: int,
    seed: int = 0,
    nonnegative: bool = False,
    chunk_mb: float = 64.0,
    log=print,
    separation: float = 1.0,
    nuisance: float = 1.7,
    overlap: float = 0.0,
) -> str:
    from distributed import as_completed

    path = check_args(path, n, dim, classes)
    tmp = f"{path}.partial"
    shutil.rmtree(tmp, ignore_errors=True)  # leftovers of a killed synth
    spec = SyntheticSpec(
        n, dim, classes, seed=seed, nonnegative=nonnegative, separation=separation, nuisance=nuisance, overlap=overlap
    )
    labels = spec.labels()
    rows = chunk_rows_for(dim, chunk_mb)
    import zarr

    zarr.open_group(store=tmp, mode="w").attrs.update(
        {
            "synthetic": {
                "samples": n,
                "dim": dim,
                "classes": classes,
                "seed": seed,
                "nonnegative": nonnegative,
                "separation": separation,
                "nuisance": nuisance,
                "overlap": overlap,
                "generation": GENERATION,
            }
        }
    )
    create_array(f"{tmp}/X", (n, dim), (rows, dim), np.float32, rows=True, sample=spec.rows(0, min(n, 4096), labels))
    create_array(f"{tmp}/y", (n,), (min(n, 1 << 20),), np.int32)[:] = labels
    t0 = time.perf_counter()
    spec_f, labels_f = client.scatter([spec, labels], broadcast=True, hash=False)
    futures = [
        client.submit(_write_rows, tmp, spec_f, labels_f, a, min(a + rows, n), key=f"synth-{a}", pure=False, retries=2)
        for a in range(0, n, rows)
    ]
    done, last = 0, time.monotonic()
    for fut in as_completed(futures):
        done += fut.result()
        if time.monotonic() - last > 5:
            log(f"  synth: {done:,}/{n:,} rows")
            last = time.monotonic()
    os.rename(tmp, path)
    seconds = time.perf_counter() - t0
    log(
        f"Wrote {n:,} x {dim} float32 ({human_bytes(n * dim * 4)}) in {seconds:.1f} s "
        f"({n * dim * 4 / 1e6 / max(seconds, 1e-9):.0f} MB/s) to {path}"
    )
    return path
