"""Encoded databases in the store (``pq/KEY``, for ``encode.pq``): a faiss product quantiser of M bytes
per vector, trained on a seeded sample of a model's train codes (or of the staged features: the
unsupervised anchor, faiss's OPQ + PQ of the raw features), and every staged row's PQ code. The maths
is :mod:`metricpipe.tasks.pq`'s; here is where the rows come from, and what is written and read back.

A unit holds the group's attributes, ``trained`` (the empty quantiser: ``faiss.serialize_index`` bytes)
and ``codes`` (sample, byte), one chunk per row-block, each written by its own task. The index a
search reads is the quantiser filled with some rows' codes, their staged rows as ids
(:func:`filled_index`): the evaluate stage's databases, and the file ``metricpipe export --faiss --pq``
writes. Each unit is committed with its files' checksums, verified when reused or exported.
"""

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from metricpipe.stages.common import TRAIN, DataInfo
from metricpipe.store import Unit, create_array, hash_key, open_array, read_rows, save_arrays
from metricpipe.tasks import pq, stream

KIND = "pq"
#: Bytes of the rows a quantiser trains on at most (besides pq.TRAIN_ROWS): 31,250 rows of 1,024-d
#: features, 7,800 of 4,096-d raw features; OPQ holds about 4 more copies while it trains.
TRAIN_BYTES = 128e6
TRAIN_COPIES = 5


class Source(NamedTuple):
    """What a quantiser encodes: a model's codes, or the staged features (the anchor, ``model`` None)."""

    spec: dict  # the model's spec as its records name it ({"method": pq.ANCHOR} for the anchor)
    model: str | None  # the model's key
    url: str  # the rows' vectors (sample, dim): the model's codes, or the staged features
    dim: int
    metric: str  # "l2" or "ip" (tasks.code_metric.vector_metric)
    rotate: bool  # OPQ before PQ (the anchor)


class Encoded(NamedTuple):
    """One encoded database: its source, its size (encode.pq) and its unit."""

    source: Source
    pq_bytes: int
    unit: Unit


def anchor(data: DataInfo) -> Source:
    """faiss's own OPQ + PQ of the staged (normalised) features: the unsupervised anchor."""
    return Source({"method": pq.ANCHOR}, None, f"{data.url}/features", data.n_features, "l2", True)


def sample_size(n_train: int, dim: int) -> int:
    """Train rows a quantiser of ``dim``-dimensional vectors trains on: pq.TRAIN_ROWS within TRAIN_BYTES."""
    return int(min(pq.TRAIN_ROWS, TRAIN_BYTES // (4 * dim), n_train))


def sample_rows(data: DataInfo, dim: int, seed: int) -> np.ndarray:
    """The seeded, class-stratified sample of train rows (sorted) the quantisers of a run train on."""
    train = data.rows(TRAIN)
    keys = open_array(f"{data.url}/row_key")[:][train]
    return train[stream.sample(data.labels[train], sample_size(len(train), dim), keys, seed, stream.QUANTISER)]


def unit_for(store, data: DataInfo, source: Source, pq_bytes: int, seed: int) -> Unit:
    """The unit of ``source``'s quantiser of ``pq_bytes`` bytes, keyed by everything that changes it."""
    inputs = {
        "stage": KIND,
        "model": source.model,
        "data": data.unit.key,
        "pq_bytes": pq_bytes,
        "seed": seed,
        "sample": sample_size(len(data.rows(TRAIN)), source.dim),
        "index": pq.factory(source.dim, pq_bytes, source.rotate),
        "metric": source.metric,
    }
    return store.unit(KIND, hash_key(inputs))


def begin(unit: Unit, source: Source, pq_bytes: int) -> None:
    """Start the unit: the group and what it encodes, in its attributes."""
    unit.begin()
    attrs = {"model": source.model, "spec": source.spec, "pq_bytes": pq_bytes, "metric": source.metric}
    save_arrays(unit.url, {}, {**attrs, "index": pq.factory(source.dim, pq_bytes, source.rotate)})


def train_quantiser(src_url: str, rows: np.ndarray, unit_url: str, pq_bytes: int, metric: str, rotate: bool, seed):
    """Train the quantiser on the sample ``rows`` of ``src_url`` and store it as the unit's ``trained``;
    returns it (faiss.serialize_index bytes, what the encode tasks read)."""
    trained = pq.train(read_rows(src_url, rows), pq_bytes, metric, rotate, seed)
    create_array(f"{unit_url}/trained", trained.shape, trained.shape, np.uint8)[:] = trained
    return trained


def create_codes(unit_url: str, n_samples: int, chunk_rows: int, trained: np.ndarray) -> int:
    """The unit's ``codes`` array (one row of ``sa_code_size`` bytes per staged row, one chunk per
    row-block, stored bare: PQ codes do not compress), made once its quantiser is trained (a task
    after the training's); returns the bytes per vector."""
    size = pq.code_size(trained)
    create_array(f"{unit_url}/codes", (n_samples, size), (chunk_rows, size), np.uint8, rows=True, bare=True)
    return size


def encode_rows(src_url: str, unit_url: str, trained: np.ndarray, size: int, a: int, b: int) -> int:
    """Encode rows a:b of ``src_url`` into the same rows of the unit's ``codes`` (one chunk); ``size``:
    what :func:`create_codes` returned (its task's result: so the block is written after the array
    exists)."""
    codes = pq.encode(trained, open_array(src_url)[a:b])
    if codes.shape[1] != size:
        raise ValueError(f"{unit_url}: codes of {codes.shape[1]} bytes for an array of {size}")
    open_array(f"{unit_url}/codes", mode="r+")[a:b] = codes
    return b - a


def read_trained(unit_url: str) -> np.ndarray:
    return open_array(f"{unit_url}/trained")[:]


def index_of(unit_url: str, rows: np.ndarray):
    """The index of the staged ``rows`` (sorted; their ids) from the unit's quantiser and codes."""
    return pq.filled(read_trained(unit_url), read_rows(f"{unit_url}/codes", rows), rows)


@lru_cache(maxsize=2)
def _cached(unit_url: str, split_url: str, code: int, token):
    rows = np.flatnonzero(open_array(split_url)[:] == code)
    return index_of(unit_url, rows), rows


def filled_index(unit_url: str, data_url: str, code: int, token):
    """(index, its rows) of the staged rows of split ``code`` (cached per worker: every query block of a
    database reuses it; n rows x M bytes). ``token`` names the unit's commit, so that a unit written
    again under the same key is read again."""
    return _cached(unit_url, f"{data_url}/split", code, token)
