"""The evaluate stage's protocol and metric records on codes: which test rows query (every one, or a
seeded sample), the rows k-means is fitted on for NMI/AMI, retrieval's K, and a view's records from
the kernels' results (:mod:`metricpipe.tasks.evaluation`). The stage applies them to the blocks it
reads on the workers; :func:`evaluate_embeddings` to arrays in memory, without Dask.
"""

import warnings

import numpy as np

from metricpipe.tasks import evaluation, metrics, moments
from metricpipe.tasks.errors import InputError

#: evaluate.retrieval.k and evaluate.classification.classifiers left unset.
DEFAULT_RETRIEVAL_K = (1, 10, 100)
DEFAULT_CLASSIFIERS = ("knn1", "knn10", "ncm")
#: Retrieval ranks the whole test split for each query (the full-ranking mAP): past this many test
#: rows a seeded sample of this many queries does it, unless the caller gives a number.
RETRIEVAL_QUERIES = 10_000
#: k-means for NMI/AMI is fitted on at most this many query rows per class (faiss's default cap, which
#: pytorch-metric-learning's AccuracyCalculator uses).
KMEANS_ROWS_PER_CLASS = 256
#: pytorch-metric-learning's AccuracyCalculator metrics (``metrics.knn_accuracy``).
ACCURACY_METRICS = ("map@r", "r_precision", "precision@1", "mrr")
#: Bytes of the distance tiles :func:`evaluate_embeddings` holds for a group of queries.
GROUP_BYTES = 1e8


def retrieval_queries(test: np.ndarray, n_queries: int | None, seed) -> np.ndarray:
    """The rows of ``test`` (sorted) that query: a seeded sample of ``n_queries``, or (None) every
    one up to RETRIEVAL_QUERIES and a sample of that many past it."""
    if n_queries is None and len(test) > RETRIEVAL_QUERIES:
        n_queries = RETRIEVAL_QUERIES
    if n_queries is not None and n_queries < len(test):
        return np.sort(np.random.default_rng([seed, 31]).choice(test, n_queries, replace=False))
    return test


def kmeans_rows(queries: np.ndarray, n_clusters: int, seed) -> np.ndarray:
    """The query rows (sorted) k-means is fitted on: at most KMEANS_ROWS_PER_CLASS per cluster."""
    size = min(len(queries), KMEANS_ROWS_PER_CLASS * n_clusters)
    return np.sort(np.random.default_rng([seed, 32]).choice(queries, size, replace=False))


def retrieval_ks(ks: tuple, n_test: int) -> tuple:
    """Retrieval's K below the test rows' count (K = 1 always)."""
    return tuple(k for k in ks if k < n_test) or (1,)


def view_metrics(
    ks: tuple,
    classifiers: tuple,
    test_labels: np.ndarray,
    ret_res: list,
    cls_res: list,
    trained_on: list | None = None,
    query_labels: np.ndarray | None = None,
    knn_note: dict | None = None,
) -> list[dict]:
    """The metrics ({classifier, metric, value}) of one view from its retrieval results ``ret_res``
    (:func:`evaluation.retrieval`'s dicts, one per query block) and classification results ``cls_res``
    ({classifier: (top-1, top-5 errors per query)} per block): mAP, mprec@K and recall@K at ``ks``, the
    AccuracyCalculator metrics, NMI and AMI, each classifier's top-1 and top-5 errors (and on the
    classes outside ``trained_on``). ``test_labels``: the classified rows' class codes;
    ``query_labels``: the retrieval queries' (default ``test_labels``); ``knn_note``: how kNN found
    its neighbours (``knn_search``, ``knn_recall``), recorded beside each kNN classifier."""
    query_labels = test_labels if query_labels is None else query_labels
    with warnings.catch_warnings():  # no query with a relevant image: NaN, which the run's start noted
        warnings.simplefilter("ignore", RuntimeWarning)
        out = _retrieval_metrics(ks, ret_res, query_labels) if ret_res else []
        if cls_res:
            out += _classifier_metrics(classifiers, test_labels, cls_res, trained_on, knn_note)
    return out


def _retrieval_metrics(ks: tuple, ret_res: list, query_labels: np.ndarray) -> list[dict]:
    cat = {k: np.concatenate([r[k] for r in ret_res]) for k in ret_res[0]}

    def rec(metric, value):
        return {"classifier": None, "metric": metric, "value": value}

    out = [rec("map", float(np.nanmean(cat["ap"])))]
    for j, k in enumerate(ks):
        out.append(rec(f"mprec@{k}", float(metrics.class_average(cat["prec"][:, j], query_labels))))
        out.append(rec(f"recall@{k}", float(np.nanmean(cat["recall"][:, j]))))
    if "ukb4" in cat:
        out.append(rec("ukb4", float(cat["ukb4"].mean())))
    if "map@r" in cat:
        acc = evaluation.mean_accuracy({m: cat[m] for m in ACCURACY_METRICS})
        out += [rec(m, acc[m]) for m in ACCURACY_METRICS]
    if "cluster" in cat:
        acc = metrics.clustering_scores(query_labels, cat["cluster"])
        out += [rec(m, acc[m]) for m in ("nmi", "ami")]
    return out


def _classifier_metrics(
    classifiers: tuple, test_labels: np.ndarray, cls_res: list, trained_on, knn_note: dict | None
) -> list[dict]:
    # a model trained on some classes only is also scored on the test images of the others
    new = None if not trained_on else ~np.isin(test_labels, trained_on)
    out = []
    for c in classifiers:
        if c not in cls_res[0]:  # e.g. ncmc for a model without centroids
            continue
        top1 = np.concatenate([r[c][0] for r in cls_res])
        top5 = np.concatenate([r[c][1] for r in cls_res])
        out.append({"classifier": c, "metric": "top1_error", "value": float(top1.mean())})
        out.append({"classifier": c, "metric": "top5_error", "value": float(top5.mean())})
        if c.startswith("knn") and knn_note:
            out.append(
                {
                    "classifier": c,
                    "metric": "knn_recall",
                    "value": knn_note.get("knn_recall"),
                    "search": knn_note["knn_search"],
                }
            )
        if new is not None and new.any():
            out.append({"classifier": c, "metric": "top1_error_new_classes", "value": float(top1[new].mean())})
            out.append({"classifier": c, "metric": "top5_error_new_classes", "value": float(top5[new].mean())})
    return out


def ncm_means(m: moments.Moments) -> tuple[np.ndarray, np.ndarray]:
    """(class means (C, d) in float32, the class codes that have rows) from train rows' moments: only
    those classes compete in NCM."""
    stats = moments.finalize_statistics(m)
    return stats["class_means"].astype(np.float32), np.flatnonzero(stats["class_counts"] > 0)


def evaluate_embeddings(
    X,
    y,
    X_train=None,
    y_train=None,
    *,
    k: tuple = DEFAULT_RETRIEVAL_K,
    classifiers: tuple | None = None,
    metric: str = "euclidean",
    queries: int | None = None,
    seed: int = 0,
) -> list[dict]:
    """The evaluate stage's metrics of codes held in memory, in NumPy (no Dask, no store).

    Retrieval: each row of ``X`` queries the other rows (relevant: same label in ``y``), giving mAP,
    mprec@K and recall@K at each K of ``k`` (below the rows' count), pytorch-metric-learning's map@r,
    r_precision, precision@1 and mrr, and NMI / AMI of k-means clusters of the queries. With
    ``X_train`` and ``y_train``, classification of the rows of ``X``: each classifier's top-1 and
    top-5 error, kNN (``knnK``) over the train rows and NCM (``ncm``) over their class means.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_dims)
        Codes of the test rows (a learner's ``transform``).
    y : array-like of shape (n_samples,)
        Their labels (any kind numpy sorts: ints, strings).
    X_train : array-like of shape (n_train, n_dims), optional
        Codes of the train rows: the kNN database and the class means.
    y_train : array-like of shape (n_train,), optional
    k : tuple of int
        Retrieval's K; ``()`` leaves retrieval out.
    classifiers : tuple of str, optional
        ``knnK`` and ``ncm``; default ``("knn1", "knn10", "ncm")`` when train rows are given.
    metric : {"euclidean", "inner"}
        How codes are compared: squared Euclidean distance, or the inner product (higher is nearer),
        as the learner's ``code_metric`` says (``None`` is Euclidean).
    queries : int, optional
        A seeded sample of this many rows queries (default: every row up to 10,000, 10,000 past).
    seed : int
        The seed of the query sample and of k-means: a run's ``seed`` gives the run's figures.

    Returns
    -------
    list of dict
        One record per metric, as a run's ``report/metrics.json`` holds them: ``method``
        ("embeddings"), ``dim``, ``params``, ``classifier`` (None for retrieval), ``metric``, ``value``.
        ``{(r["metric"], r["classifier"]): r["value"] for r in records}`` indexes them.
    """
    X, yq, X_train, yt, n_classes = _checked(X, y, X_train, y_train, metric)
    classifiers = (DEFAULT_CLASSIFIERS if X_train is not None else ()) if classifiers is None else tuple(classifiers)
    _check_classifiers(classifiers, X_train is not None)
    test = np.arange(len(X))
    ret, ks, q = [], (), test
    if k:
        ks = retrieval_ks(tuple(int(v) for v in k), len(X))
        q = retrieval_queries(test, queries, seed)
        ret = [_retrieval(X, yq, q, ks, metric, seed)]
    cls = [_classify(X, yq, X_train, yt, classifiers, metric, n_classes)] if classifiers else []
    base = {
        "method": "embeddings",
        "dim": int(X.shape[1]),
        "params": {} if metric == "euclidean" else {"score": metric},
    }
    return [{**base, **m} for m in view_metrics(ks, classifiers, yq, ret, cls, query_labels=yq[q])]


def _retrieval(X: np.ndarray, y: np.ndarray, q: np.ndarray, ks: tuple, score: str, seed) -> dict:
    """Retrieval of the rows ``q`` among all rows, as the stage's retrieval tasks score it."""
    test = np.arange(len(X))
    acc_k = evaluation.accuracy_k(evaluation.relevant_counts(y[q], y, True))
    n_clusters = len(np.unique(y[q]))
    centroids = evaluation.kmeans_fit(X[kmeans_rows(q, n_clusters, seed)], n_clusters, [seed, 33])
    group = int(max(1, GROUP_BYTES // max(1, len(X) * 36)))
    return evaluation.retrieval(X[q], q, test, X, y, ks, False, score, 4096, group, acc_k, centroids)


def _classify(X, y, X_train, y_train, classifiers: tuple, score: str, n_classes: int) -> dict:
    """{classifier: (top-1, top-5 errors per row)} of the rows X against the train rows."""
    out = {}
    ks = [int(c[3:]) for c in classifiers if c.startswith("knn")]
    if ks:
        ids = evaluation.knn_neighbours(X, [(np.arange(len(X_train)), X_train)], max(ks), score)[1]
        out.update(evaluation.knn_errors_from(evaluation.neighbour_labels(ids, y_train), y, ks, n_classes))
    if evaluation.NCM in classifiers:
        means, classes = ncm_means(moments.partial_moments(X_train, y_train, n_classes, second=False))
        out[evaluation.NCM] = evaluation.ncm_errors(X, y, means, None, classes)
    return out


def _checked(X, y, X_train, y_train, metric: str):
    """float32 codes, class codes (0..C-1 over both sets' labels) and C; InputError on bad input."""
    if metric not in ("euclidean", "inner"):
        raise InputError(f"metric: got {metric!r}; use 'euclidean' or 'inner' (a learner's code_metric)")
    if (X_train is None) != (y_train is None):
        raise InputError("X_train and y_train: give both (the classifiers' train rows) or neither")
    X = _codes(X, "X")
    y = _labels(y, len(X), "y")
    if X_train is None:
        classes, codes = np.unique(y, return_inverse=True)
        return X, codes.astype(np.int64), None, None, len(classes)
    X_train = _codes(X_train, "X_train")
    if X_train.shape[1] != X.shape[1]:
        raise InputError(f"X_train: {X_train.shape[1]} dimensions, X {X.shape[1]}; give codes of one model")
    y_train = _labels(y_train, len(X_train), "y_train")
    try:
        classes, codes = np.unique(np.concatenate([y, y_train]), return_inverse=True)
    except TypeError:
        raise InputError("y and y_train: labels of different kinds (e.g. numbers and strings); give one kind") from None
    codes = codes.astype(np.int64)
    return X, codes[: len(y)], X_train, codes[len(y) :], len(classes)


def _codes(X, name: str) -> np.ndarray:
    X = np.asarray(X)
    if X.ndim != 2 or X.shape[0] < 2 or X.shape[1] < 1 or X.dtype.kind not in "biuf":
        raise InputError(f"{name}: got an array of shape {X.shape} ({X.dtype}); give numbers (n_samples >= 2, n_dims)")
    X = np.ascontiguousarray(X, np.float32)
    if not np.isfinite(X).all():
        rows = np.flatnonzero(~np.isfinite(X).all(1))
        raise InputError(f"{name}: {len(rows)} row(s) hold NaN or inf (first: row {rows[0]}); give finite codes")
    return X


def _labels(y, n: int, name: str) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim != 1 or len(y) != n:
        raise InputError(f"{name}: labels of shape {y.shape} for {n} rows; give one label per row")
    if y.dtype.kind == "f" and not np.isfinite(y).all():
        raise InputError(f"{name}: labels hold NaN or inf; give every row a class")
    return y


def _check_classifiers(classifiers: tuple, have_train: bool) -> None:
    for c in classifiers:
        if not (c == evaluation.NCM or (evaluation.is_classifier(c) and c.startswith("knn"))):
            raise InputError(
                f"classifiers: {c!r} is not one evaluate_embeddings scores; use knnK (e.g. knn1, knn10) or ncm "
                f"(softvote and ncmc need a model's neighbourhoods or centroids: run the pipeline)"
            )
    if classifiers and not have_train:
        raise InputError(
            f"classifiers {', '.join(classifiers)}: need the train rows they classify against; give "
            f"X_train and y_train, or classifiers=()"
        )
