"""Results that leave a run: encode new data with a stored model (``metricpipe encode``), export a
model's database codes as a faiss index or the model as plain arrays (``metricpipe export``), and
classify new rows with any model (``metricpipe predict``).

Encoding streams the input in row-blocks. Small inputs are encoded in this process; larger ones
(or any input when a cluster is given) on the cluster, one task per block, a bounded number in
flight, the client writing each block of codes as it arrives (codes are small next to features),
so the output can be a single file on the client's disk whatever the cluster. Outputs are written
to a temporary name and renamed when complete: an interrupted encode leaves no partial file.
"""

import contextlib
import errno
import json
import os
import shutil
import uuid
import zipfile
from functools import lru_cache
from pathlib import Path

import numpy as np

from metricpipe.cluster import dashboard_lines
from metricpipe.config import SPLIT_NAMES, DataConfig, absolute_path, file_only_given
from metricpipe.context import raise_refused, refusing
from metricpipe.sources import open_source
from metricpipe.store import Store, chunk_rows_for, load_estimator, open_array, read_attrs, row_chunks
from metricpipe.store.models import codes_of, find_model, staged_arrays
from metricpipe.tasks.base import one_blas_thread
from metricpipe.tasks.code_metric import vector_metric
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.normalize import normalize_rows
from metricpipe.tasks.validate import check_feature_block, label_values

BUILTIN = ("digits", "fashion-mnist")
FORMATS = (".npy", ".npz", ".zarr", ".parquet")
# Inputs are encoded in the calling process (one block at a time: bounded memory) unless a cluster is
# named or the work is large: more than LOCAL_BYTES of features, or more than LOCAL_FLOPS multiply-adds
# (the model's cost per image times the rows). A LocalCluster costs ~8 s to start and import on (1M x 128
# through PCA: 2.4 s in process, 15.6 s on two local workers).
LOCAL_BYTES = 2e9
LOCAL_FLOPS = 2e10
# Rows per block when the model's staged data gives none (the encode stage's blocks otherwise, so
# that the codes are bit for bit the stored ones).
BLOCK_ROWS = 16384


def data_config(data: str, features: str = "X", labels: str = "", ids: str | None = None) -> DataConfig:
    """A source: a builtin data set name or a path (a built-in has its own arrays: naming others is refused,
    as a config's data.source refuses them)."""
    if data in BUILTIN:
        key = file_only_given({"features": features, "labels": labels or None, "ids": ids})
        if key:
            value = {"features": features, "labels": labels, "ids": ids}[key]
            raise InputError(
                f"--{key} {value}: names an array or column of a DATA file; DATA {data} has its own (remove --{key})"
            )
        return DataConfig(source=data)
    return DataConfig(path=data, features=features, labels=labels, ids=ids)


def open_input(data: str, features: str = "X", labels: str | None = None, ids: str | None = None):
    """The source of DATA with its labels when it has them: ``labels`` None tries ``y`` and goes on
    without labels when there is no such array; a name the user gave must exist."""
    if labels is None and data not in BUILTIN:
        try:
            return open_source(data_config(data, features, "y", ids))
        except InputError as e:
            if "no array 'y'" not in str(e) and "(data.labels)" not in str(e) and "give data.labels" not in str(e):
                raise
            return open_source(data_config(data, features, "", ids))
    return open_source(data_config(data, features, labels or "", ids))


@lru_cache(maxsize=4)
def _model(model_url: str):
    return load_estimator(model_url)


@lru_cache(maxsize=4)
def _reader(data: str, features: str):
    return open_source(data_config(data, features)).reader


def encode_rows(model_url: str, data: str, features: str, normalize: str, start: int, stop: int) -> np.ndarray:
    """Codes of rows start:stop of DATA: read, checked and normalised as staging does (so the codes
    equal the encode stage's bit for bit), then the model's transform."""
    X = np.asarray(_reader(data, features).read(start, stop))
    X = X.reshape(len(X), -1)
    check_feature_block(X, start, f"{data} (features)")
    with one_blas_thread():  # as the workers run it: a product's bits depend on BLAS's thread count
        return _model(model_url).transform(normalize_rows(X, normalize).astype(np.float32))


class _Writer:
    """Codes (n, d) written in row order to .npy, .npz, .zarr or .parquet under a temporary name;
    ``close`` adds the labels and ids columns and renames it into place."""

    def __init__(self, out: str, n: int, d: int, labels, ids):
        self.out, self.n, self.d, self.labels, self.ids = out, n, d, labels, ids
        self.suffix = Path(out).suffix.lower()
        self.tmp = temp_beside(out)
        self.member = self.zip = self.pq = None  # the open handles of the formats that have them
        if self.suffix == ".npy":
            self.arr = np.lib.format.open_memmap(self.tmp, mode="w+", dtype=np.float32, shape=(n, d))
        elif self.suffix == ".npz":  # members streamed into the zip: X, then y and ids at close
            self.zip = zipfile.ZipFile(self.tmp, "w", allowZip64=True)
            self.member = self.zip.open("X.npy", "w", force_zip64=True)
            np.lib.format.write_array_header_1_0(self.member, {"descr": "<f4", "fortran_order": False, "shape": (n, d)})
        elif self.suffix == ".zarr":
            import zarr

            g = zarr.open_group(self.tmp, mode="w")
            self.arr = g.create_array(
                "X", shape=(n, d), chunks=(min(max(n, 1), BLOCK_ROWS), max(d, 1)), dtype="float32"
            )
            self.group = g
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            self.pa = pa
            fields = (
                ([pa.field("id", pa.from_numpy_dtype(np.asarray(ids).dtype))] if ids is not None else [])
                + ([pa.field("label", pa.array(np.asarray(labels)[:1]).type)] if labels is not None else [])
                + [pa.field("code", pa.list_(pa.float32(), d))]
            )
            self.schema = pa.schema(fields, metadata={"metricpipe": "codes"})
            self.pq = pq.ParquetWriter(self.tmp, self.schema)

    def write(self, start: int, codes: np.ndarray) -> None:
        codes = np.ascontiguousarray(codes, np.float32)
        stop = start + len(codes)
        if self.suffix in (".npy", ".zarr"):
            self.arr[start:stop] = codes
        elif self.suffix == ".npz":
            self.member.write(codes.tobytes())
        else:
            pa = self.pa
            cols = (
                ([pa.array(np.asarray(self.ids)[start:stop])] if self.ids is not None else [])
                + ([pa.array(np.asarray(self.labels)[start:stop])] if self.labels is not None else [])
                + [pa.FixedSizeListArray.from_arrays(pa.array(codes.reshape(-1)), self.d)]
            )
            self.pq.write_table(pa.Table.from_arrays(cols, schema=self.schema))

    def close(self) -> None:
        extra = {k: np.asarray(v) for k, v in (("y", self.labels), ("ids", self.ids)) if v is not None}
        if self.suffix == ".npy":
            self.arr.flush()
            del self.arr
        elif self.suffix == ".npz":
            self.member.close()
            for k, v in extra.items():
                with self.zip.open(f"{k}.npy", "w", force_zip64=True) as m:
                    np.lib.format.write_array(m, v, allow_pickle=False)
            self.zip.close()
        elif self.suffix == ".zarr":
            for k, v in extra.items():
                arr = self.group.create_array(
                    k, shape=v.shape, chunks=(max(len(v), 1),), dtype=str if v.dtype.kind == "U" else v.dtype
                )
                arr[:] = v
        else:
            self.pq.close()
        publish(self.tmp, self.out)  # a file is replaced; a folder never (check_out refused one)

    def abort(self) -> None:
        for handle in (self.member, self.zip, self.pq):
            try:
                if handle is not None:
                    handle.close()
            except Exception:  # noqa: BLE001 - best effort: the partial file is removed below
                pass
        self.__dict__.pop("arr", None)
        remove_partial(self.tmp)


def check_out(out: str, option: str = "--out", formats=FORMATS, inputs=(), store: str | None = None) -> None:
    """The one guard of a file a command writes where the user says (--out, --faiss, --npz,
    --performance-report): refuse a path that cannot be written, or whose writing would destroy
    something: the command's input (``inputs``: (path or name, the argument or option that gave it)
    pairs: data, labels, config files), anything inside ``store`` (its units, markers and
    runs/latest.json), or an existing folder (a .zarr is replaced whole). An existing file is
    replaced, atomically, once the new one is complete (:func:`written_whole`). ``formats``: the
    suffixes allowed (None: any)."""
    if "://" in out:
        raise InputError(f"{out}: a URL ({option}); this file is written on this machine: give a local path")
    suffix = Path(out).suffix.lower()
    if formats is not None and suffix not in formats:
        raise InputError(f"{out}: unknown output format ({option}); name it with one of {', '.join(formats)}")
    target = Path(out).resolve()
    parent = target.parent
    if not parent.exists():
        raise InputError(f"{out}: its folder does not exist ({option}); create it or choose another path")
    if not parent.is_dir():
        raise InputError(f"{out}: {parent} is a file, not a folder ({option}); choose another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{out}: {parent} is not writable ({option}); choose another path")
    for given, name in inputs:
        if name.endswith("labels") and not str(given).endswith(".npy"):
            continue  # an array or column name inside the data file, not a file of its own
        if isinstance(given, str) and given and given not in BUILTIN and "://" not in given:
            src = Path(given).resolve()
            if src == target or target in src.parents:
                raise InputError(
                    f"{out}: is the input {name} ({option}); writing it would destroy the input: choose another path"
                )
    root = _local_root(store)
    if root is not None and (target == root or root in target.parents):
        raise InputError(
            f"{out}: is inside the store {store} ({option}); writing there would damage its results: "
            f"choose a path outside it"
        )
    if target.is_dir():
        raise InputError(
            f"{out}: a folder that already exists ({option}); remove it or choose another path "
            f"(metricpipe does not replace folders)"
        )
    if suffix == ".parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise InputError(
                f"{out}: writing Parquet needs pyarrow ({option}); pip install 'metricpipe[parquet]' "
                f"or write .npz / .zarr"
            ) from None


def _local_root(store: str | None) -> Path | None:
    """The folder of a local store (None: no store, or one on object storage)."""
    if not store:
        return None
    if store.startswith("file://"):
        store = store[len("file://") :]
    return None if "://" in store else Path(store).resolve()


def temp_beside(out: str) -> str:
    """A name in OUT's folder that no other command uses (its pid and a random part), keeping OUT's
    suffix (numpy adds .npy / .npz to a name without it): two commands writing OUT at once each
    write their own, and the last rename wins whole."""
    p = Path(out)
    return str(p.with_name(f".{p.stem}.{os.getpid()}-{uuid.uuid4().hex[:8]}.partial{p.suffix}"))


def publish(tmp: str, out: str, option: str = "--out") -> None:
    """Move the complete ``tmp`` onto OUT in one rename. A file replaces a file; a folder (.zarr)
    takes OUT only while nothing is there (a rename never merges two folders): one written there
    meanwhile (a second command to the same OUT) is kept and this one refused."""
    try:
        os.replace(tmp, out)
    except OSError as e:
        remove_partial(tmp)
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.EISDIR, errno.ENOTDIR):
            raise InputError(
                f"{out}: was written by another command meanwhile ({option}); it is kept, whole: "
                f"rerun to replace it, or choose another path"
            ) from None
        raise


def remove_partial(tmp: str) -> None:
    if os.path.isdir(tmp):
        shutil.rmtree(tmp, ignore_errors=True)
    elif os.path.lexists(tmp):
        os.remove(tmp)


@contextlib.contextmanager
def written_whole(out: str, option: str = "--out"):
    """Yield a temporary name beside OUT (:func:`temp_beside`); the block writes it, and OUT is
    replaced by it in one rename when the block ends (:func:`publish`), or it is removed: OUT is
    an old file or a new one, whole, never part of one or a mix of two commands' outputs."""
    tmp = temp_beside(out)
    try:
        yield tmp
    except BaseException:
        remove_partial(tmp)
        raise
    publish(tmp, out, option)


def model_and_data(store_url: str, key: str):
    """(store, model unit, its commit record, its normalisation, its staged data's unit) of model KEY."""
    store = Store(store_url)
    store.check_exists()
    unit, meta = find_model(store, key)
    normalize = meta.get("normalize", read_attrs(unit.url).get("normalize")) or "none"
    data_unit = store.unit("data", meta["data"]) if meta.get("data") else None
    return store, unit, meta, normalize, data_unit


def encode(
    store_url: str,
    key: str,
    data: str,
    out: str,
    features: str = "X",
    labels: str | None = None,
    ids: str | None = None,
    client_factory=None,
    cluster_given: bool = False,
    log=print,
) -> dict:
    """Encode every row of DATA with model KEY of STORE into OUT; returns what was written.

    ``client_factory``: a context manager giving a Dask client, entered when ``cluster_given`` or the
    work is large (LOCAL_BYTES, LOCAL_FLOPS); otherwise the blocks are encoded here, one at a time."""
    check_out(out, inputs=((data, "DATA"), (labels, "--labels")), store=store_url)
    data_config(data, features, labels, ids)  # a built-in's refusals, before the store is read
    store, unit, meta, normalize, data_unit = model_and_data(store_url, key)
    src = open_input(data, features, labels, ids)
    n, D = src.reader.shape[0], int(np.prod(src.reader.shape[1:]))
    est = _model(unit.url)
    if D != est.n_features_in_:
        raise InputError(
            f"{src.name}: features have {D} dimensions but model {unit.key} takes {est.n_features_in_}; "
            f"encode data of the kind the model was trained on"
        )
    where = {
        "labels": f"{src.name} (--labels {labels})" if labels else f"{src.name} (labels)",
        "ids": f"{src.name} (--ids {ids})",
    }
    for what, column in (("labels", src.labels), ("ids", src.ids)):  # one value per row, of every output format
        if column is not None and np.ndim(column) != 1:
            raise InputError(
                f"{where[what]}: {what} of shape {np.shape(column)}; give a 1-D array with one "
                f"{what[:-1] if what == 'ids' else 'label'} per row"
            )
    y = None if src.labels is None else label_values(np.asarray(src.labels), where["labels"])
    if y is not None and len(y) != n:
        raise InputError(f"{where['labels']}: {len(y)} labels for {n} rows; give one label per row")
    if src.ids is not None and len(src.ids) != n:
        raise InputError(f"{where['ids']}: {len(src.ids)} ids for {n} rows; give one id per row")
    if n == 0:
        raise InputError(f"{src.name}: no rows to encode (DATA); give a file with at least one feature row")
    rows = _block_rows(data_unit, D)
    blocks = row_chunks(n, rows)
    d = int(meta["dim"])
    writer = _Writer(out, n, d, y, src.ids)
    done = 0
    try:
        flops = n * float((meta.get("cost") or {}).get("flops_per_image") or 0)
        if cluster_given or n * D * 4 > LOCAL_BYTES or flops > LOCAL_FLOPS:
            with client_factory() as client:
                for line in dashboard_lines(client):
                    log(line)
                for start, codes in _on_cluster(client, unit.url, data, features, normalize, blocks):
                    writer.write(start, codes)
                    done += len(codes)
                    log(f"  encode: {done:,}/{n:,} rows")
        else:
            for a, b in blocks:
                writer.write(a, encode_rows(unit.url, data, features, normalize, a, b))
        writer.close()
    except BaseException:
        writer.abort()
        raise
    return {
        "rows": n,
        "dim": d,
        "model": unit.key,
        "method": meta["spec"]["method"],
        "out": out,
        "labels": y is not None,
        "ids": src.ids is not None,
    }


def _block_rows(data_unit, n_features: int) -> int:
    """The staged data's row-block when it was cut into several (the encode stage's blocks, so codes
    match bit for bit), else the staging default's for this width."""
    if (
        data_unit is not None
        and data_unit.done()
        and not data_unit.verify(keep=lambda rel: rel in ("zarr.json", "features/zarr.json"))
    ):
        try:
            a = open_array(f"{data_unit.url}/features")
            if a.chunks[0] < a.shape[0]:
                return int(a.chunks[0])
        except (OSError, KeyError, FileNotFoundError):
            pass
    return chunk_rows_for(n_features, DataConfig.chunk_mb)


def _on_cluster(client, model_url, data, features, normalize, blocks, in_flight: int | None = None):
    """Yield (start, codes) in row order; at most ``in_flight`` blocks submitted but not yet written."""
    from distributed import wait

    in_flight = in_flight or 2 * max(1, len(client.scheduler_info().get("workers", {}))) + 2
    path = absolute_path(data) if data not in BUILTIN else data
    futures = {}
    nxt = 0
    for i, (a, b) in enumerate(blocks):
        futures[i] = client.submit(
            refusing,
            encode_rows,
            model_url,
            path,
            features,
            normalize,
            a,
            b,
            key=f"encode-rows-{os.getpid()}-{a}",
            pure=False,
        )
        while len(futures) >= in_flight or (i == len(blocks) - 1 and futures):
            wait([futures[nxt]])
            fut = futures.pop(nxt)
            res = fut.result()
            raise_refused(res)
            yield blocks[nxt][0], res
            nxt += 1
            if not futures:
                break


# -- export -------------------------------------------------------------------------------------------------

# Past this many database rows, --faiss writes an IVF index (nlist ~ 4 sqrt(n), trained on a sample).
IVF_ABOVE = 200_000
SPLITS = ("test", "train", "val", "all")


def codes_unit(store: Store, unit, meta: dict, split: str) -> tuple:
    """(the committed codes of model ``unit`` on its run's staged data, the ``split`` split's rows),
    checked against the commit's checksums: the metadata and the chunks that hold those rows."""
    if not meta.get("data"):
        raise InputError(
            f"{store.url}: model {unit.key} records no staged data (it was added by add-classes?); "
            f"export the model it extends"
        )
    cu = codes_of(store, unit.key, meta)
    if not cu.done() and meta.get("extends"):
        raise InputError(
            f"{store.url}: model {unit.key} was made by add-classes from model {meta['extends']}, which "
            f"has the codes (its W is the same); use that model, or 'metricpipe encode' with this one"
        )
    if not cu.done():
        try:
            latest = store.last_run()["units"].get("models") or []
        except InputError:  # none, or damaged: the second message holds
            latest = []
        if f"models/{unit.key}" in latest:
            raise InputError(
                f"{store.url}: model {unit.key} has no committed codes; rerun 'metricpipe run CONFIG "
                f"--resume' to encode them"
            )
        raise InputError(
            f"{store.url}: model {unit.key} was not encoded by its run (a candidate that parameter "
            f"selection did not keep; `metricpipe models` marks them encoded: no); use an encoded "
            f"model, or 'metricpipe encode' to encode data with this one"
        )
    # the index or the neighbours built from these codes would be wrong without a word
    bad = cu.verify(keep=lambda rel: not rel.startswith("codes/c/"))
    rows = split_rows(store, meta, split)
    if not bad:  # only the chunks that will be read: on object storage each check is a download
        used = set((rows // open_array(f"{cu.url}/codes").chunks[0]).tolist())
        bad = cu.verify(keep=lambda rel: rel.startswith("codes/c/") and int(rel.split("/")[2]) in used)
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise InputError(
            f"{store.url}: the codes of model {unit.key} are damaged: {bad[0]}{more}; rerun the run "
            f"that made them with --repair (metricpipe run CONFIG --repair) to recompute them"
        )
    return cu, rows


def split_rows(store: Store, meta: dict, split: str) -> np.ndarray:
    flags = open_array(f"{staged_arrays(store, meta, ('split',))}/split")[:]
    if split == "all":
        return np.arange(len(flags))
    return np.flatnonzero(flags == SPLIT_NAMES.index(split))


def export_faiss(store_url: str, key: str, path: str, split: str = "test", log=print) -> dict:
    """The ``split`` rows' codes of model KEY as a faiss index, ids = the rows' positions in the
    staged data; inner product when the model's codes are compared by it (SL-NE, SL-DE, sparse),
    L2 otherwise; flat up to IVF_ABOVE rows, IVF above (nprobe stored in the index)."""
    import faiss

    store, unit, meta, _, _ = model_and_data(store_url, key)
    score = meta.get("score") or "euclidean"
    if vector_metric(score) is None:
        raise InputError(
            f"{store.url}: model {unit.key} ({meta['spec']['method']}) compares codes by {score}, "
            f"which faiss has no index for; export --npz and use its similarity"
        )
    cu, rows = codes_unit(store, unit, meta, split)
    if not len(rows):
        raise InputError(f"{store.url}: the {split} split is empty (--split); choose another split")
    codes = open_array(f"{cu.url}/codes")
    d = codes.shape[1]
    metric = faiss.METRIC_INNER_PRODUCT if vector_metric(score) == "ip" else faiss.METRIC_L2
    if len(rows) > IVF_ABOVE:
        nlist = int(4 * np.sqrt(len(rows)))
        quant = faiss.IndexFlatIP(d) if score == "inner" else faiss.IndexFlatL2(d)
        index = faiss.IndexIVFFlat(quant, d, nlist, metric)
        sample = np.sort(np.random.default_rng(0).choice(rows, min(len(rows), 64 * nlist), replace=False))
        index.train(_read(codes, sample))
        index.nprobe = max(1, nlist // 16)
    else:
        index = faiss.IndexFlat(d, metric)
    index = faiss.IndexIDMap2(index)
    for s in range(0, len(rows), BLOCK_ROWS * 4):
        r = rows[s : s + BLOCK_ROWS * 4]
        index.add_with_ids(_read(codes, r), r.astype(np.int64))
    with written_whole(path, "--faiss") as tmp:
        faiss.write_index(index, tmp)
    kind = "IVF" if len(rows) > IVF_ABOVE else "flat"
    return {
        "rows": len(rows),
        "dim": d,
        "metric": "inner product" if score == "inner" else "L2",
        "index": kind,
        "model": unit.key,
        "out": path,
    }


def _read(arr, rows: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(arr.get_orthogonal_selection((rows, slice(None))), np.float32)


def export_npz(store_url: str, key: str, path: str) -> dict:
    """Model KEY as plain arrays in an .npz plus the entry ``model_json`` (a JSON string: kind,
    normalisation, scalars): what the README's numpy formulas need, no metricpipe."""
    store, unit, meta, normalize, _ = model_and_data(store_url, key)
    kind, arrays, scalars = _model(unit.url).portable()
    info = {
        "kind": kind,
        "normalize": normalize,
        "method": meta["spec"]["method"],
        "model": unit.key,
        "dim": int(meta["dim"]),
        "score": meta.get("score") or "euclidean",
        **scalars,
    }
    with written_whole(path, "--npz") as tmp:
        np.savez(tmp, model_json=np.array(json.dumps(info)), **{k: np.asarray(v) for k, v in arrays.items()})
    return {**info, "arrays": sorted(arrays), "out": path}
