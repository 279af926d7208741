"""The store: one package owns its layout, its atomic commits and its Zarr access.

Layout (every result is a *unit* ``KIND/KEY/`` where KEY hashes everything the result depends on):

    STORE/data/KEY/          staged features (xarray Dataset in Zarr): features (sample, feature),
                             coordinates label, split, [group, id]
    STORE/statistics/KEY/    mean, covariance, class means, scatter matrices, PCA basis
    STORE/neighbours/KEY/    kNN graph of the train split: neighbours, distances, same_label
    STORE/shuffled/KEY/      the SGD learners' shuffled copy of the training rows
    STORE/models/KEY/        one trained estimator: its fitted arrays (dense or sparse) and state JSON
                             (`save_estimator`), attributes method, dim, params
    STORE/selection/KEY/     a spec's candidates' validation scores and the choice
    STORE/codes/KEY/         one model's codes for every sample (sample, code)
    STORE/pq/KEY/            an encoded database (encode.pq): a product quantiser (trained) and every
                             sample's PQ code (sample, byte), of a model's codes or the raw features
    STORE/evaluation/KEY/    one model's metrics (records.json)
    STORE/runs/latest.json   the last run's config and the units it used (`metricpipe gc` keeps those)
    STORE/runs/forcing.json  a --force run that has not finished yet: its stage and attempts (runner.forcing)
    STORE/report/            metrics.json, index.html, plots
    STORE/logs/              the workers' log files (local stores)

A unit is complete only when its marker ``KIND/KEY.committed.json`` exists, holds its key and
matches the digest of its own record it carries (:func:`record_digest`); the
marker sits beside the unit (so the unit stays a clean Zarr hierarchy) and is written last (write to
a temporary name, then rename), so a killed writer leaves a unit without a marker, which is never
read and is wiped before the unit is written again.

Zarr v3's default codecs carry no checksum and a missing chunk reads silently as the fill value, so
the marker also lists every file of the unit with its size and CRC-32 (``files``). A unit is reused
only after :meth:`Unit.verify` finds every listed file present and unchanged (``metricpipe inspect
--verify`` runs the same check over a whole store).

One run at a time writes a store: the run holds an exclusive ``flock`` on ``STORE/.lock`` (which also
records the holder's host and pid); the operating system drops it when that process ends. Object
stores have no flock: there ``STORE/.lock`` is an object created only if absent (a conditional PUT)
and refreshed by its holder, see :class:`ObjectLock`.

A store may come from someone else, so nothing inside it is trusted: every path in a local store is
resolved by :meth:`Store.inside`, which refuses a symbolic link anywhere below the store's folder
(``.lock`` linked to ``~/.bashrc``, ``report`` to another folder), files are opened without
following links and only when they are regular files, and a unit's check (:meth:`Unit.verify`) counts
a link, a special file or a file its commit does not list as damage. (The store's folder itself may
be a link: that one the user chose.)
"""

from metricpipe.store.arrays import (
    array_names,
    chunk_bytes,
    chunk_rows_for,
    create_array,
    load_arrays,
    load_scalar,
    lz4_ratio,
    open_array,
    read_attrs,
    read_block,
    read_rows,
    remove_tree,
    row_chunk,
    row_chunks,
    row_codecs,
    save_arrays,
    size_crc,
    size_crcs,
    stop_zarr_loop,
    stored_rows,
    write_rows,
)
from metricpipe.store.estimators import load_estimator, save_estimator, save_model
from metricpipe.store.keys import (
    KINDS,
    LAYOUT,
    MARKER_SUFFIX,
    NUMERIC_LIBRARIES,
    REPLACED,
    code_version,
    hash_key,
    is_key,
    json_number,
    record_digest,
    to_json,
)
from metricpipe.store.lock import LOCK_LEASE, LOCK_REFRESH, LOCK_TRIES, ObjectLock
from metricpipe.store.store import Store, manifest_problem, write_fix
from metricpipe.store.units import Unit

__all__ = [
    "KINDS",
    "LAYOUT",
    "LOCK_LEASE",
    "LOCK_REFRESH",
    "LOCK_TRIES",
    "MARKER_SUFFIX",
    "NUMERIC_LIBRARIES",
    "REPLACED",
    "ObjectLock",
    "Store",
    "Unit",
    "array_names",
    "chunk_bytes",
    "chunk_rows_for",
    "code_version",
    "create_array",
    "hash_key",
    "is_key",
    "json_number",
    "load_arrays",
    "load_estimator",
    "load_scalar",
    "lz4_ratio",
    "manifest_problem",
    "open_array",
    "read_attrs",
    "read_block",
    "read_rows",
    "remove_tree",
    "record_digest",
    "row_chunk",
    "stored_rows",
    "row_chunks",
    "row_codecs",
    "save_arrays",
    "save_estimator",
    "save_model",
    "size_crc",
    "size_crcs",
    "write_rows",
    "stop_zarr_loop",
    "to_json",
    "write_fix",
]
