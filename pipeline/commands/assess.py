"""``metricpipe evaluate EMBEDDINGS``: pytorch-metric-learning's AccuracyCalculator metrics (map@r,
r_precision, precision@1, mrr, nmi, ami) of any embeddings, out of core on the cluster.

Who queries whom (PML's ``get_accuracy``):
- EMBEDDINGS alone: every row queries all the others (the query set is the reference set, so a query
  never counts itself; R = its class count - 1).
- ``--queries N``: a seeded, class-stratified sample of N rows queries all of EMBEDDINGS (itself left out).
- ``--queries FILE``: FILE's rows query EMBEDDINGS; ``--reference FILE``: EMBEDDINGS query FILE's rows.

The work: one scan over the inputs (finite values; the sampled query rows are picked up on the way),
k-means centroids fitted on a seeded sample of at most 256 query rows per class (faiss's default
cap, which the AccuracyCalculator's k-means uses), then one task per group of queries that streams
the reference in row blocks into a pooled top-k (``tasks.knn.pooled_topk``, k = the largest class,
PML's ``max_bin_count``) and returns each query's metrics and cluster. No task holds the reference:
a group's memory is its queries and its pool, sized to POOL_BYTES.
"""

import asyncio
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from metricpipe.budget import PAUSE_FRACTION, SPILL_FRACTION, WORKER_RESIDENT, usable, worker_limit
from metricpipe.commands.export import written_whole
from metricpipe.config import DataConfig, absolute_path
from metricpipe.context import raise_refused, refusing
from metricpipe.errors import StageError
from metricpipe.sources import fingerprint, open_source
from metricpipe.tasks import evaluation, knn, metrics, stream
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.validate import check_feature_block

# A query group's pool (2k + tile candidates of 16 bytes, and the sort that cuts it) within this;
# with k = 10,000 that is about 290 queries.
POOL_BYTES = 4e8
# Reference rows read at once: about this many bytes, whole chunks of a Zarr source.
BLOCK_BYTES = 6.4e7
KMEANS_ROWS_PER_CLUSTER = 256
MIN_GROUP = 16  # queries per task at least (a smaller worker limit is refused)
METRICS = ("map@r", "r_precision", "precision@1", "mrr")
# The pipeline's cut-off metrics, mprec@K and recall@K, read from the same neighbour lists (K up to k).
RETRIEVAL_K = (1, 10, 100)
# Inputs this small are evaluated in this process, without a cluster (a LocalCluster takes 7-30 s to
# start; 1,500 x 32 codes score in well under a second here): at most IN_PROCESS_VALUES values (rows x
# dimensions of the queries and the reference: 16 MB of float32) and IN_PROCESS_PAIRS query-reference
# pairs. The same functions score the same query groups either way.
IN_PROCESS_VALUES = 4_000_000
IN_PROCESS_PAIRS = 4e8


@dataclass(frozen=True)
class Side:
    """One input: its reader, labels (codes), and the option names that error messages cite."""

    path: str
    reader: object
    labels: np.ndarray
    option: str


def _encoded_parquet_names(path: str, features: str, labels: str) -> tuple:
    """A Parquet file `metricpipe encode` wrote holds columns code and (when its DATA had labels) label:
    where an option is left at its default (X, y) and the file has no such column but code / label,
    that is the one meant (each option on its own: --labels label alone still finds the codes, and a
    file without labels takes --labels labs.npy)."""
    if not str(path).endswith((".parquet", ".pq")) or (features != "X" and labels != "y"):
        return features, labels
    try:
        import pyarrow.parquet as pq

        names = set(pq.read_schema(path).names)
    except Exception:  # noqa: BLE001 - unreadable: open_source names the problem
        return features, labels
    return (
        "code" if features == "X" and "X" not in names and "code" in names else features,
        "label" if labels == "y" and "y" not in names and "label" in names else labels,
    )


def _open(path: str, features: str, labels: str | None, option: str, labels_option: str):
    if labels is None:
        raise InputError(
            f"{path}: no labels for {option}; give {labels_option} (an array or column name inside "
            f"the file, or a .npy path)"
        )
    if not Path(path).exists():
        raise InputError(f"{path}: file not found ({option}); check the path")
    features, labels = _encoded_parquet_names(path, features, labels)
    try:  # the reader goes to the workers, which run in folders of their own
        src = open_source(DataConfig(path=absolute_path(path), features=features, labels=labels))
    except InputError as e:  # the shared readers cite config keys: name this command's options instead
        msg = str(e).splitlines()[0]
        for key, name in (("data.path", option), ("data.features", "--features"), ("data.labels", labels_option)):
            msg = msg.replace(f"({key})", f"({name})").replace(f"give {key} ", f"give {name} ")  # not in paths
        raise InputError(msg) from None
    n = src.reader.shape[0]
    if n == 0 or src.reader.shape[1] == 0:
        raise InputError(
            f"{path}: no embeddings ({option} is {tuple(src.reader.shape)}); give a non-empty (sample, feature) array"
        )
    y = np.asarray(src.labels)
    if y.ndim != 1 or len(y) != n:
        raise InputError(
            f"{path}: labels ({labels_option}) have shape {y.shape} for {n} embeddings; give one label per row"
        )
    if y.dtype.kind == "f" and not np.isfinite(y).all():
        raise InputError(f"{path}: labels ({labels_option}) hold NaN or inf; give every row a class")
    return src.reader, y


def query_count(queries: str | None) -> int | None:
    """--queries N (a sample of N rows) or FILE (None): a number that is no count of rows (-3, 0, 2.5)
    is refused, unless a file has that name."""
    if queries is None:
        return None
    text = str(queries).strip()
    try:
        value = float(text)
    except ValueError:
        return None
    if Path(queries).exists():
        return None
    if not value.is_integer() or value < 1:
        raise InputError(
            f"--queries {queries}: expected a number of query rows N >= 1 (a class-stratified sample) "
            f"or a FILE of queries"
        )
    return int(value)


def same_data(a: str, b: str) -> str | None:
    """How input ``b`` is input ``a`` ("is the same file as", "holds the same bytes as"), or None when
    they differ (or cannot be read: opening them says why). Bytes are compared only between inputs of
    one size."""
    try:
        if os.path.samefile(a, b):
            return "is the same file as"
        sizes = [next(iter(fingerprint(p).values()))["bytes"] for p in (a, b)]
        if sizes[0] != sizes[1]:
            return None
        if fingerprint(a, contents=True) == fingerprint(b, contents=True):
            return "holds the same bytes as"
    except OSError:
        pass
    return None


def plan_sides(
    embeddings: str,
    features: str,
    labels: str,
    queries: str | None,
    reference: str | None,
    query_labels: str | None,
    reference_labels: str | None,
    seed: int,
):
    """(query side, its query rows, reference side, self_in_ref) from the command's arguments."""
    sample = query_count(queries)
    if reference and queries is not None and sample is None:
        raise InputError(
            f"{queries}: --queries FILE and --reference FILE together leave EMBEDDINGS no role; "
            f"give one of them (or --queries N with --reference)"
        )
    other_default = None if labels.endswith(".npy") else labels
    reader, y = _open(embeddings, features, labels, "EMBEDDINGS", "--labels")
    for other, option in ((queries if sample is None else None, "--queries"), (reference, "--reference")):
        how = same_data(embeddings, other) if other else None
        if how:
            raise InputError(
                f"{other}: {option} {how} EMBEDDINGS ({embeddings}): each of its rows would find itself "
                f"as its nearest neighbour; leave out {option} to score EMBEDDINGS against itself (each "
                f"query's own row left out), or give --queries N"
            )
    if queries is not None and sample is None:
        qr, qy = _open(queries, features, query_labels or other_default, "--queries", "--query-labels")
        q_in, q_lab, r_in, r_lab = (queries, qr, "--queries"), qy, (embeddings, reader, "EMBEDDINGS"), y
    elif reference:
        rr, ry = _open(reference, features, reference_labels or other_default, "--reference", "--reference-labels")
        q_in, q_lab, r_in, r_lab = (embeddings, reader, "EMBEDDINGS"), y, (reference, rr, "--reference"), ry
    else:
        q_in, q_lab, r_in, r_lab = (embeddings, reader, "EMBEDDINGS"), y, (embeddings, reader, "EMBEDDINGS"), y
    if q_in[1].shape[1] != r_in[1].shape[1]:
        raise InputError(
            f"{q_in[0]}: queries have {q_in[1].shape[1]} features, the reference {r_in[0]} "
            f"{r_in[1].shape[1]} ({q_in[2]}); give embeddings of one model"
        )
    try:
        classes, codes = np.unique(np.concatenate([q_lab, r_lab]), return_inverse=True)
    except TypeError:
        raise InputError(
            f"{embeddings}: the labels of the queries and the reference are of different kinds "
            f"(e.g. numbers and strings); give both as one kind"
        ) from None
    qc, rc = codes[: len(q_lab)].astype(np.int64), codes[len(q_lab) :].astype(np.int64)
    if len(np.unique(rc)) < 2:
        raise InputError(
            f"{r_in[0]}: the reference holds one class ({r_in[2]}, labels {classes[rc[0]].item()!r}); "
            f"retrieval metrics need at least two classes"
        )
    rows = np.arange(len(qc))
    if sample is not None:
        rows = stream.sample(qc, sample, None, seed, stream.QUERIES)
    self_in = not reference and (queries is None or sample is not None)
    return Side(q_in[0], q_in[1], qc, q_in[2]), rows, Side(r_in[0], r_in[1], rc, r_in[2]), self_in


def _block_rows(reader) -> int:
    per = int(getattr(reader, "chunk_rows", 0) or 0)
    row_bytes = reader.shape[1] * 4
    if per:
        return per * max(1, int(BLOCK_BYTES // (per * row_bytes)))
    return max(1, int(BLOCK_BYTES // row_bytes))


def _blocks(reader):
    n, step = reader.shape[0], _block_rows(reader)
    return [(a, min(n, a + step)) for a in range(0, n, step)]


def _read(reader, a: int, b: int, where: str) -> np.ndarray:
    X = np.asarray(reader.read(a, b))
    check_feature_block(X, a, where)
    return np.asarray(X, np.float32)


def _scan(reader, a: int, b: int, where: str, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Check a row block; return the ``wanted`` rows (sorted global rows) it holds."""
    X = _read(reader, a, b, where)
    lo, hi = np.searchsorted(wanted, [a, b])
    return wanted[lo:hi], X[wanted[lo:hi] - a]


def _pick(scans: list, rows: np.ndarray) -> np.ndarray:
    have = np.concatenate([s[0] for s in scans])
    X = np.concatenate([s[1] for s in scans])
    return X[np.searchsorted(have, rows)]


def _centroids(scans: list, rows: np.ndarray, n_clusters: int, seed) -> np.ndarray:
    return evaluation.kmeans_fit(_pick(scans, rows), n_clusters, seed)


def _group(
    q_reader,
    q_rows: np.ndarray,
    scans,
    r_reader,
    r_blocks: list,
    where: str,
    k: int,
    self_in: bool,
    q_labels: np.ndarray,
    r_labels: np.ndarray,
    n_relevant: np.ndarray,
    centroids,
) -> dict:
    """One query group: its neighbours over the whole reference, then its per-query metrics (the
    reference is read again only for queries with no relevant reference among their k)."""
    if scans is None:  # the group is a contiguous range of the query file
        Q = _read(q_reader, int(q_rows[0]), int(q_rows[-1]) + 1, where)
    else:
        Q = _pick(scans, q_rows)

    def stream():
        return ((np.arange(a, b), _read(r_reader, a, b, where)) for a, b in r_blocks)

    out = evaluation.neighbour_accuracy(
        Q, stream, q_labels, r_labels, n_relevant, k, q_rows, self_in, ks=tuple(K for K in RETRIEVAL_K if K <= k)
    )
    out["cluster"] = evaluation.nearest_centroid(Q, centroids)
    return out


def group_size(
    k: int,
    n_queries: int,
    workers: int,
    limit: float | None = None,
    limit_setting: str = "--memory-limit",
    block_bytes: float = BLOCK_BYTES,
) -> int:
    """Queries per task: their pools within POOL_BYTES (or MIN_GROUP queries' when those need more)
    and, beside two reference blocks of ``block_bytes`` (the block and its distances: BLOCK_BYTES, or
    less for a reference smaller than one block) and the worker process, within
    the memory rule's share of the smallest worker's ``limit`` and below Dask's pause (None: no
    limit known); at least two tasks per worker when queries are few. A limit too small for
    MIN_GROUP queries is refused, naming ``limit_setting``."""
    # 2k + tile candidates of 16 bytes, 3.5 times: the sort that cuts them and the task's copies (with
    # it, k = 10,147 groups of 292 queries on 1 GB workers peaked at 661-693 MB; at 2.5 times groups of
    # 410 peaked at 833-873 MB, over Dask's pause, and 500 MB workers were killed)
    per_query = (2 * k + knn.POOL_TILE) * 16 * 3.5
    group = min(MIN_GROUP, n_queries)  # fewer per task: each task streams the whole reference
    pool = max(POOL_BYTES, group * per_query)
    if limit is not None:
        room = min(usable(limit), PAUSE_FRACTION * limit - WORKER_RESIDENT) - 2 * block_bytes
        if room < group * per_query:
            need = max(
                (group * per_query + 2 * block_bytes) / SPILL_FRACTION,
                (group * per_query + 2 * block_bytes + WORKER_RESIDENT) / PAUSE_FRACTION,
            )
            raise InputError(
                f"{limit_setting}: a worker limit of {limit / 1e6:,.0f} MB cannot hold the top-{k:,} "
                f"pools of {group} queries ({group * per_query / 1e6:,.0f} MB) beside two "
                f"{block_bytes / 1e6:,.0f} MB reference blocks and the worker itself; give workers at "
                f"least {need / 1e6:,.0f} MB"
            )
        pool = min(pool, room)
    return max(1, min(int(pool // per_query), -(-n_queries // (2 * workers))))


def fits_in_process(q: Side, rows: np.ndarray, ref: Side) -> bool:
    """Whether the evaluation is small enough for this process (IN_PROCESS_VALUES, IN_PROCESS_PAIRS)."""
    n_ref = ref.reader.shape[0]
    values = (q.reader.shape[0] + (n_ref if ref.path != q.path else 0)) * q.reader.shape[1]
    return values <= IN_PROCESS_VALUES and len(rows) * n_ref <= IN_PROCESS_PAIRS


@dataclass(frozen=True)
class _Plan:
    """What both ways of evaluating share: the queries' labels and R, k, the k-means sample."""

    yq: np.ndarray  # the query rows' labels
    R: np.ndarray  # each query's count of relevant references
    k: int
    n_clusters: int
    km: np.ndarray  # positions (in ``rows``) of the queries k-means is fitted on
    sampled: bool  # the queries are a sample of q's rows (else every row, in order)
    wanted: np.ndarray  # q's rows the scan picks up

    @property
    def km_rows(self) -> np.ndarray:
        """q's rows k-means is fitted on."""
        return self.wanted[self.km] if self.sampled else self.wanted


def _plan(q: Side, rows: np.ndarray, ref: Side, self_in: bool, seed: int) -> _Plan:
    yq = q.labels[rows]
    R, k = _relevant(q, ref, yq, self_in)
    n_clusters = len(np.unique(yq))
    rng = np.random.default_rng([seed, 21])
    km = np.sort(rng.choice(len(rows), min(len(rows), KMEANS_ROWS_PER_CLUSTER * n_clusters), replace=False))
    sampled = len(rows) < q.reader.shape[0]
    return _Plan(yq, R, k, n_clusters, km, sampled, rows if sampled else rows[km])


def evaluate_embeddings(
    client,
    q: Side,
    rows: np.ndarray,
    ref: Side,
    self_in: bool,
    seed: int = 0,
    log=print,
    limit_setting: str = "--memory-limit",
) -> list[dict]:
    """Metric records of the queries ``rows`` of ``q`` against ``ref``, in ``metrics.json``'s form
    (``limit_setting``: what sizes the workers, named when their limit is too small)."""
    p = _plan(q, rows, ref, self_in, seed)
    # before any scan: the groups' size depends only on k and the workers' limit
    block = min(ref.reader.shape[0], _block_rows(ref.reader)) * ref.reader.shape[1] * 4.0  # (96 KB of data: 96 KB)
    g = group_size(
        p.k, len(rows), max(1, len(client.scheduler_info()["workers"])), worker_limit(client), limit_setting, block
    )
    q_reader_f, r_reader_f = client.scatter([q.reader, ref.reader], broadcast=True, hash=False)
    scans = _scan_inputs(client, q, ref, q_reader_f, r_reader_f, p.wanted)
    centroids = client.submit(_centroids, scans, p.km_rows, p.n_clusters, [seed, 22])
    r_labels_f = client.scatter(ref.labels, broadcast=True, hash=False)
    log(
        f"evaluate: {len(rows):,} queries against {ref.reader.shape[0]:,} references, k = {p.k:,}, "
        f"{-(-len(rows) // g)} task(s) of up to {g} queries"
    )
    groups = [
        client.submit(
            _group,
            q_reader_f,
            rows[s : s + g],
            scans if p.sampled else None,
            r_reader_f,
            _blocks(ref.reader),
            f"{ref.path} ({ref.option})",
            p.k,
            self_in,
            p.yq[s : s + g],
            r_labels_f,
            p.R[s : s + g],
            centroids,
            pure=False,
        )
        for s in range(0, len(rows), g)
    ]
    values, cutoffs = _metric_values(_gather_groups(client, groups), p.yq, p.R)
    return _records(q, rows, ref, p.k, self_in, p.R, values, cutoffs)


def evaluate_in_process(q: Side, rows: np.ndarray, ref: Side, self_in: bool, seed: int = 0, log=print) -> list[dict]:
    """:func:`evaluate_embeddings` without a cluster, for inputs :func:`fits_in_process` admits: the
    same scan, centroids and query groups, called here one after the other."""
    p = _plan(q, rows, ref, self_in, seed)
    scans = [_scan(q.reader, a, b, f"{q.path} ({q.option})", p.wanted) for a, b in _blocks(q.reader)]
    if ref.path != q.path:  # the reference checked up front too, as on the cluster
        for a, b in _blocks(ref.reader):
            _scan(ref.reader, a, b, f"{ref.path} ({ref.option})", np.empty(0, np.int64))
    centroids = _centroids(scans, p.km_rows, p.n_clusters, [seed, 22])
    g = group_size(p.k, len(rows), 1)
    log(f"evaluate: {len(rows):,} queries against {ref.reader.shape[0]:,} references, k = {p.k:,}, in this process")
    parts = [
        _group(
            q.reader,
            rows[s : s + g],
            scans if p.sampled else None,
            ref.reader,
            _blocks(ref.reader),
            f"{ref.path} ({ref.option})",
            p.k,
            self_in,
            p.yq[s : s + g],
            ref.labels,
            p.R[s : s + g],
            centroids,
        )
        for s in range(0, len(rows), g)
    ]
    values, cutoffs = _metric_values(parts, p.yq, p.R)
    return _records(q, rows, ref, p.k, self_in, p.R, values, cutoffs)


def _relevant(q: Side, ref: Side, yq: np.ndarray, self_in: bool) -> tuple[np.ndarray, int]:
    """(each query's count of relevant references, k); refused when no query's label is in the reference."""
    R = evaluation.relevant_counts(yq, ref.labels, self_in)
    if not (R > 0).any():
        raise InputError(
            f"{q.path}: no query's label occurs in the reference {ref.path} ({q.option}); "
            f"give queries and a reference that share classes"
        )
    return R, evaluation.accuracy_k(R)


def _scan_inputs(client, q: Side, ref: Side, q_reader_f, r_reader_f, wanted: np.ndarray) -> list:
    """One scan of the queries' blocks (picking up the ``wanted`` rows) and of the reference's, checked
    before the long part: a bad block stops here, naming its file and rows."""
    q_where = f"{q.path} ({q.option})"
    # bad input comes back as a Refused value: no worker logs a "Compute Failed" traceback for it
    scans = [
        client.submit(refusing, _scan, q_reader_f, a, b, q_where, wanted, pure=False) for a, b in _blocks(q.reader)
    ]
    if ref.path != q.path:  # the reference is checked up front too, before the long part
        scans_ref = [
            client.submit(
                refusing, _scan, r_reader_f, a, b, f"{ref.path} ({ref.option})", np.empty(0, np.int64), pure=False
            )
            for a, b in _blocks(ref.reader)
        ]
        for r in client.gather(scans_ref):
            raise_refused(r)
    for r in client.gather(scans):  # a bad block stops here, naming its file and rows
        raise_refused(r)
    return scans


def _gather_groups(client, groups: list) -> list[dict]:
    """The query groups' results; a worker lost meanwhile is one line."""
    try:
        return client.gather(groups)
    except InputError:
        raise
    except (Exception, asyncio.CancelledError) as exc:  # a worker lost (killed, out of memory): one line
        raise StageError(f"evaluate failed on a query group: {type(exc).__name__}: {exc}".splitlines()[0]) from exc


def _metric_values(parts: list[dict], yq: np.ndarray, R: np.ndarray) -> tuple[dict, list]:
    """({metric: value} over every query, the cut-offs K the groups scored) from the groups' results."""
    per_query = {m: np.concatenate([p[m] for p in parts]) for m in METRICS}
    clusters = np.concatenate([p["cluster"] for p in parts])
    values = {**evaluation.mean_accuracy(per_query), **metrics.clustering_scores(yq, clusters)}
    cutoffs = [K for K in RETRIEVAL_K if f"prec@{K}" in parts[0]]
    served = R > 0
    for K in cutoffs:  # as the pipeline reports them: precision per class, then over classes
        prec = np.concatenate([p[f"prec@{K}"] for p in parts])
        values[f"mprec@{K}"] = float(metrics.class_average(prec[served], yq[served]))
        values[f"recall@{K}"] = float(np.nanmean(np.concatenate([p[f"recall@{K}"] for p in parts])))
    return values, cutoffs


def _records(
    q: Side, rows: np.ndarray, ref: Side, k: int, self_in: bool, R: np.ndarray, values: dict, cutoffs: list
) -> list[dict]:
    """The metric records, in ``metrics.json``'s form."""
    base = {
        "method": "embeddings",
        "dim": int(q.reader.shape[1]),
        "params": {
            "embeddings": q.path if q.option == "EMBEDDINGS" else ref.path,
            "queries": len(rows),
            "reference": ref.path,
            "references": int(ref.reader.shape[0]),
            "k": k,
            "self_excluded": self_in,
            "lone_queries": int((R == 0).sum()),
        },
        "classifier": None,
    }
    names = (*METRICS, "nmi", "ami", *(f"{m}@{K}" for K in cutoffs for m in ("mprec", "recall")))
    return [{**base, "metric": m, "value": values[m]} for m in names]


def write_records(path: str, records: list[dict]) -> None:
    """Write ``records`` as JSON, whole or not at all (a temporary file in the same folder, renamed)."""
    try:
        with written_whole(path) as tmp, open(tmp, "w") as f:
            json.dump(records, f, indent=1)
    except OSError as e:
        raise InputError(f"{path}: cannot write the metrics (--out): {e.strerror or e}") from None
