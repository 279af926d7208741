"""The evaluate stage's worker-side functions: each reads the rows it is given (a block of queries,
one row-block of the database at a time) and calls a `metricpipe.tasks.evaluation` kernel."""

import numpy as np

from metricpipe.stages.common import TRAIN, StagedRows, cached_estimator
from metricpipe.stages.evaluate.protocol import RETRIEVAL_DB_BYTES
from metricpipe.store import open_array, read_rows
from metricpipe.tasks import evaluation, scoring


def retrieval_block(
    q_url: str,
    db_url: str,
    score: str,
    q_idx: np.ndarray,
    db_idx: np.ndarray,
    rel_key: np.ndarray,
    ks: tuple,
    ukb: bool,
    chunk_rows: int,
    group: int,
    accuracy_k: int | None = None,
    centroids: np.ndarray | None = None,
    db_max: float | None = None,
) -> dict:
    """Queries ``q_idx`` against database ``db_idx`` (global rows, sorted). The database is read once
    per task when it fits in ``db_max`` bytes (the workers' share, pipeline/budget.py; default
    RETRIEVAL_DB_BYTES) (the test rows are spread over every row-block, so a read is a pass over the
    whole array), else streamed again for every group of queries (a pass over the array per group:
    the memory rule refuses a run where that would happen)."""
    Q = read_rows(q_url, q_idx)
    fits = len(db_idx) * open_array(db_url).shape[1] * 4 <= (RETRIEVAL_DB_BYTES if db_max is None else db_max)
    db = read_rows(db_url, db_idx) if fits else (lambda a, b: read_rows(db_url, db_idx[a:b]))
    return evaluation.retrieval(Q, q_idx, db_idx, db, rel_key, ks, ukb, score, chunk_rows, group, accuracy_k, centroids)


def query_centroids(q_url: str, rows: np.ndarray, n_clusters: int, seed) -> np.ndarray:
    return evaluation.kmeans_fit(read_rows(q_url, rows), n_clusters, seed)


def train_blocks(db_url: str, data_url: str, chunks: list, code: int = TRAIN):
    """(global train rows (split ``code``), their rows of ``db_url``) of each row-block with such rows,
    one at a time."""
    split, db = open_array(f"{data_url}/split"), open_array(db_url)
    for a, b in chunks:
        rows = np.flatnonzero(split[a:b] == code) + a
        if len(rows):
            yield rows, db[a:b][rows - a]


def exact_knn(q_url: str, db_url: str, data_url: str, chunks: list, q_idx: np.ndarray, k: int, score: str):
    """(distances, global rows) of the k nearest train codes of the queries ``q_idx``, streaming the
    database one row-block at a time (the task holds the queries and one block)."""
    return evaluation.knn_neighbours(read_rows(q_url, q_idx), train_blocks(db_url, data_url, chunks), k, score)


def classify_block(
    q_url: str,
    db_url: str,
    score: str,
    q_idx: np.ndarray,
    data_url: str,
    chunks: list,
    labels: np.ndarray,
    classifiers: tuple,
    means,
    graph_url: str | None,
    ncm_model: dict | None = None,
    knn_ids=None,
    train: int = TRAIN,
) -> dict:
    """Errors of ``classifiers`` on the queries ``q_idx``. kNN votes over ``knn_ids`` (the queries'
    neighbour lists from the stored graph or an index) when given, else over an exact search of the
    rows of split code ``train``; ``means``: (class means, the classes that have one)."""
    Q = read_rows(q_url, q_idx)
    y = labels[q_idx]
    n_classes = int(labels.max()) + 1
    out = {}
    ks = [int(c[3:]) for c in classifiers if c.startswith("knn")]
    if ks:
        if knn_ids is None:
            knn_ids = evaluation.knn_neighbours(Q, train_blocks(db_url, data_url, chunks, train), max(ks), score)[1]
        elif isinstance(knn_ids, tuple):  # an index's (distances, rows)
            knn_ids = knn_ids[1]
        elif isinstance(knn_ids, str):  # the stored graph's rows
            knn_ids = read_rows(knn_ids, q_idx)[:, : max(ks)].astype(np.int64)
        out.update(evaluation.knn_errors_from(evaluation.neighbour_labels(knn_ids, labels), y, ks, n_classes))
    soft = [int(c[8:]) for c in classifiers if c.startswith("softvote")]
    if soft:
        nbr = read_rows(f"{graph_url}/neighbours", q_idx).astype(np.int64)
        flat = np.unique(nbr[nbr >= 0])
        out.update(evaluation.softvote_errors(Q, y, nbr, read_rows(db_url, flat), flat, labels, soft, n_classes, score))
    if evaluation.NCM in classifiers:
        out[evaluation.NCM] = evaluation.ncm_errors(
            Q, y, means[0], ncm_model.get("bias") if ncm_model else None, means[1]
        )
    if evaluation.NCMC in classifiers and ncm_model and ncm_model.get("centroids") is not None:
        out[evaluation.NCMC] = evaluation.ncmc_errors(Q, y, ncm_model["centroids"], ncm_model["owner"], n_classes)
    return out


def keeps_distances(model_url: str) -> bool:
    """Whether a model's codes keep the staged features' Euclidean distances (identity, a full-rank
    rotation): the neighbours stage's graph is then their kNN graph."""
    return cached_estimator(model_url).keeps_distances()


def read_ncm_model(model_url: str) -> dict | None:
    """What the ncm / ncmc classifiers need from an NCMML/NCMC model: class biases (dot form) and
    the centroids in code space with their classes (only when some class has more than one)."""
    est = cached_estimator(model_url)
    if getattr(est, "centroids_", None) is None:
        return None
    owner = np.asarray(est.centroid_classes_, np.int64)
    out = {"bias": est.class_bias_, "centroids": None, "owner": owner}
    if np.bincount(owner).max() > 1:
        out["centroids"] = est.transform(est.centroids_).astype(np.float64)
    return out


def class_means(m) -> tuple[np.ndarray, np.ndarray]:
    """(class means (C, d), the class codes with rows): only those compete (the classes a run holds
    out have no train row, the seen ones no held-out row)."""
    return scoring.ncm_means(m)


def unseen_ncm_model(model_url: str, data_url: str, chunks: list, code: int) -> dict | None:
    """An NCMC model's mixture over the held-out classes: k centroids per class by k-means over their
    train rows (split ``code``) in the input space, as ``metricpipe add-classes`` makes them, in code
    space (only when some class has more than one; else NCMC is NCM)."""
    est = cached_estimator(model_url)
    labels = open_array(f"{data_url}/label")[:]
    rows = StagedRows(data_url, chunks, np.flatnonzero(open_array(f"{data_url}/split")[:] == code))
    cents, owner = est.class_centroids(rows, rows.fit, int(labels.max()) + 1)
    owner = np.asarray(owner, np.int64)
    if np.bincount(owner).max() <= 1:
        return None
    return {"bias": None, "centroids": est.transform(cents).astype(np.float64), "owner": owner}
