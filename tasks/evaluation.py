"""Evaluation kernels: retrieval scores and classification errors of query codes against a
database, on arrays handed to them. The evaluate stage reads the rows and calls these; a user can
call them on codes in memory.
"""

import numpy as np

from metricpipe.tasks import knn, metrics, ncmml
from metricpipe.tasks.slem import similarity

#: The classifiers over class means: NCM (Eq. 5 of Mensink et al.) and its mixture over k centroids (Eq. 22).
#: (A classifier's name; an NCMC model's own classifier is NCMC.)
NCM, NCMC = "ncm", "ncmc"


def scores(Q: np.ndarray, X: np.ndarray, score: str, x_sq: np.ndarray | None = None) -> np.ndarray:
    """Distances to rank by (ascending): squared Euclidean, minus the inner product, or minus kernel
    SLEM's similarity (Eq. 16, score "slem:..."); ``x_sq``: X's squared row norms, if known."""
    if score.startswith("slem:"):
        return -similarity(Q, X, score).astype(np.float32)
    return metrics.sq_distances(Q, X, x_sq) if score == "euclidean" else -(np.asarray(Q, np.float32) @ X.T)


def retrieval(
    Q: np.ndarray,
    q_idx: np.ndarray,
    db_idx: np.ndarray,
    db_rows,
    rel_key: np.ndarray,
    ks: tuple,
    ukb: bool,
    score: str,
    chunk_rows: int,
    group: int,
    accuracy_k: int | None = None,
    centroids: np.ndarray | None = None,
) -> dict:
    """Per-query retrieval scores (``ap``, ``prec`` and ``recall`` at each k, ``ukb4``) of the queries
    Q (rows ``q_idx``) against the database rows ``db_idx`` (sorted), ``group`` queries at a time;
    relevance is equal ``rel_key``; a query that is in the database is not its own hit.

    db_rows : callable giving the database rows db_idx[a:b] for (a, b), or the whole database array.
    accuracy_k : when given, also the AccuracyCalculator's per-query ``map@r``, ``r_precision``,
        ``precision@1`` and ``mrr`` from each query's first ``accuracy_k`` neighbours in ``score``'s
        order, ties by database row.
    centroids : when given, ``cluster``: the nearest centroid of each query (for NMI/AMI).
    """
    n_db = len(db_idx)
    X = db_rows if isinstance(db_rows, np.ndarray) else None
    x_sq = np.einsum("ij,ij->i", X, X) if X is not None and score == "euclidean" else None
    dist = np.empty((min(group, len(q_idx)), n_db), np.float32)
    work = np.empty_like(dist)  # buffers reused by every group
    parts = []
    for s in range(0, len(q_idx), group):
        q = q_idx[s : s + group]
        d = dist[: len(q)]
        for a in range(0, n_db, chunk_rows):  # in row-blocks: the score tiles stay small
            if X is None:
                d[:, a : a + chunk_rows] = scores(Q[s : s + group], db_rows(a, min(n_db, a + chunk_rows)), score)
            else:
                d[:, a : a + chunk_rows] = scores(
                    Q[s : s + group], X[a : a + chunk_rows], score, None if x_sq is None else x_sq[a : a + chunk_rows]
                )
        out = ranked(d, q, db_idx, rel_key, ks, ukb, accuracy_k, work)
        if centroids is not None:
            out["cluster"] = nearest_centroid(Q[s : s + group], centroids)
        parts.append(out)
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def ranked(
    d: np.ndarray,
    q: np.ndarray,
    db_idx: np.ndarray,
    rel_key: np.ndarray,
    ks: tuple,
    ukb: bool = False,
    accuracy_k: int | None = None,
    work: np.ndarray | None = None,
) -> dict:
    """Per-query retrieval scores of the queries ``q`` (global rows) from their distances ``d``
    (len(q), len(db_idx)) to the database rows ``db_idx`` (sorted), lower nearer, however they were
    computed (:func:`retrieval`'s codes, or a compressed index's asymmetric distances): ``ap``,
    ``prec`` and ``recall`` at each K of ``ks``, ``ukb4``, and with ``accuracy_k`` the
    AccuracyCalculator's ``map@r``, ``r_precision``, ``precision@1`` and ``mrr``. A query that is in
    the database is not its own hit (``d`` is changed in place there); relevance is equal ``rel_key``.
    ``work``: a buffer of at least d's shape for the sorted distances (reused across calls)."""
    n_db = len(db_idx)
    work = np.empty_like(d) if work is None else work
    pos = np.minimum(np.searchsorted(db_idx, q), n_db - 1)
    own = np.flatnonzero(db_idx[pos] == q)
    d[own, pos[own]] = np.inf
    relevant = rel_key[q][:, None] == rel_key[db_idx][None, :]
    relevant[own, pos[own]] = False
    out = metrics.retrieval_scores(d, relevant, ks, work=work)
    if ukb:
        out["ukb4"] = metrics.ukb_score(d, relevant)
    if accuracy_k:
        # the k-th distance is read off the sorted rows retrieval_scores left in ``work``
        top = knn.distance_topk(d, np.arange(n_db), accuracy_k, work[: len(q), min(accuracy_k, n_db) - 1])[1]
        same = np.take_along_axis(relevant, np.maximum(top, 0), 1) & (top >= 0)
        # MRR reads the first relevant place of the queries with none among their first accuracy_k
        # only (usually none: a pass over the group's distances saved)
        miss = np.flatnonzero(~same.any(1) & (out["n_relevant"] > 0))
        first = np.zeros(len(q), np.int64)
        if len(miss):
            first[miss] = first_relevant_rank(d[miss], relevant[miss])
        out.update(metrics.knn_accuracy(same, out["n_relevant"], first))
    return out


def knn_neighbours(Q: np.ndarray, blocks, k: int, score: str) -> tuple[np.ndarray, np.ndarray]:
    """(distances, global rows) (n, k) of the k nearest database rows of each query, nearest first
    by (distance, row) (-1 where the database has fewer rows), over the database ``blocks``: an
    iterable of (global rows, their codes). Inner-product scores give distances -q.x."""
    metric = "l2" if score == "euclidean" else "ip"
    best = knn.empty_topk(len(Q), k)
    for rows, X in blocks:
        if score.startswith("slem:"):
            best = knn.merge_topk(best, knn.distance_topk(scores(Q, X, score), rows, k), k)
        else:
            best = knn.block_topk(Q, X, k, x_ids=rows, metric=metric, init=best)
    return best


def neighbour_labels(ids: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Labels of neighbour lists (global rows, -1 for none: label -1); ``labels`` by global row."""
    return np.where(ids >= 0, labels[np.maximum(ids, 0)], -1)


def knn_neighbour_labels(Q: np.ndarray, blocks, labels: np.ndarray, k: int, score: str) -> np.ndarray:
    """Labels (n, k) of the k nearest database rows of each query (:func:`knn_neighbours`), nearest
    first, -1 where the database has fewer rows; ``labels`` are indexed by global row."""
    return neighbour_labels(knn_neighbours(Q, blocks, k, score)[1], labels)


def knn_errors(Q: np.ndarray, y: np.ndarray, blocks, labels: np.ndarray, ks: list, score: str, n_classes: int) -> dict:
    """Top-1 and top-5 errors of kNN classifiers (each k in ``ks``) over the database ``blocks``, an
    iterable of (global rows, their codes); ``labels`` are indexed by global row."""
    return knn_errors_from(knn_neighbour_labels(Q, blocks, labels, max(ks), score), y, ks, n_classes)


def knn_errors_from(nb_labels: np.ndarray, y: np.ndarray, ks: list, n_classes: int) -> dict:
    """Top-1 and top-5 errors of the kNN classifiers ``ks`` from the labels (n, >= max(ks)) of each
    query's neighbours, nearest first (a stored graph's, an index's or :func:`knn_neighbour_labels`)."""
    out = {}
    for k in ks:
        errs = metrics.topk_errors(metrics.knn_class_ranking(nb_labels, n_classes, k), y)
        out[f"knn{k}"] = (errs[1], errs[5])
    return out


def knn_predict(Q: np.ndarray, blocks, labels: np.ndarray, k: int, score: str, n_classes: int) -> np.ndarray:
    """Class codes (n,) by majority vote of the k nearest database rows (ties: the class whose
    nearest member is closer, then the lower code; see :func:`metrics.knn_class_ranking`)."""
    return metrics.knn_class_ranking(knn_neighbour_labels(Q, blocks, labels, k, score), n_classes, k)[:, 0]


SOFTVOTE_GROUP_BYTES = 64 << 20


def softvote_errors(
    Q: np.ndarray,
    y: np.ndarray,
    nbr: np.ndarray,
    B: np.ndarray,
    flat: np.ndarray,
    labels: np.ndarray,
    soft: list,
    n_classes: int,
    score: str = "inner",
) -> dict:
    """Eq. 9 of SL-NE: the k members of each query's stored neighbourhood ``nbr`` (q, K) most similar
    under the model vote with the model's similarity (inner product of the query view Q and the base
    view B of rows ``flat``). Codes compared by distance (``score`` euclidean) have no similarity to
    weigh votes with: their k nearest members vote one each (before, the inner product of such
    codes chose and weighed the voters: large-norm rows won, not near ones)."""
    pos = np.searchsorted(flat, np.maximum(nbr, 0))
    sims = np.empty(nbr.shape, np.result_type(Q, B))
    # the gathered neighbours (q, K, d) in groups of at most SOFTVOTE_GROUP_BYTES: whole, they were
    # 2 x 0.64 GB at 4,096 queries, K = 50, d = 784
    g = max(1, int(SOFTVOTE_GROUP_BYTES // max(1, 2 * nbr.shape[1] * Q.shape[1] * Q.itemsize)))
    for a in range(0, len(Q), g):
        Bq = B[pos[a : a + g]]
        if score == "euclidean":
            diff = Bq - Q[a : a + g, None]
            sims[a : a + g] = -np.einsum("qkd,qkd->qk", diff, diff)
        else:
            sims[a : a + g] = np.einsum("qd,qkd->qk", Q[a : a + g], Bq)
    nb_labels = np.where(nbr >= 0, labels[np.maximum(nbr, 0)], -1)
    out = {}
    for k in soft:
        ranking = metrics.softvote_ranking(nb_labels, sims, n_classes, k, weighted=score != "euclidean")
        errs = metrics.topk_errors(ranking, y)
        out[f"softvote{k}"] = (errs[1], errs[5])
    return out


def ncm_errors(
    Q: np.ndarray, y: np.ndarray, means: np.ndarray, bias: np.ndarray | None = None, classes: np.ndarray | None = None
) -> tuple:
    """Nearest class mean of the codes (Eq. 5), or Eq. 27's dot form when class biases are given (a
    class without a learned bias takes the one the Euclidean form implies). ``classes``: the class
    codes that compete, those with a mean (default: every row of ``means``, (C, d))."""
    classes = np.arange(len(means)) if classes is None else np.asarray(classes, np.int64)
    means = np.asarray(means)[classes]
    if bias is not None:
        bias = np.asarray(bias)[classes]
        bias = np.where(np.isfinite(bias), bias, -0.5 * (means.astype(np.float64) ** 2).sum(1))
        ranking = np.argsort(
            -ncmml.ncm_scores(Q.astype(np.float64), means.astype(np.float64), bias), axis=1, kind="stable"
        )
    else:
        ranking = metrics.nearest_mean_ranking(Q, means)
    errs = metrics.topk_errors(classes[ranking], y)
    return errs[1], errs[5]


def ncmc_errors(Q: np.ndarray, y: np.ndarray, centroids: np.ndarray, owner: np.ndarray, n_classes: int) -> tuple:
    """The NCMC mixture (Eq. 22) over the model's centroids in code space."""
    s = ncmml.mixture_class_scores(Q.astype(np.float64), centroids, owner, n_classes)
    errs = metrics.topk_errors(np.argsort(-s, axis=1, kind="stable"), y)
    return errs[1], errs[5]


def is_classifier(name) -> bool:
    """Whether ``name`` names a classifier the evaluation scores: ``knnK`` or ``softvoteK`` (Eq. 9 of
    SL-NE) with K >= 1, ``ncm``, or ``ncmc`` (Eq. 22's mixture over class centroids)."""
    if not isinstance(name, str):
        return False
    for prefix in ("knn", "softvote"):
        if name.startswith(prefix):
            return name[len(prefix) :].isdigit() and int(name[len(prefix) :]) > 0
    return name in ("ncm", "ncmc")


def can_rank(keys, negatives: bool = False) -> bool:
    """Whether rows with relevance ``keys`` querying each other give any AP: some row has another of
    its key to find (and, with ``negatives``, some row of another key to rank below it)."""
    counts = np.unique(np.asarray(keys), return_counts=True)[1]
    return len(counts) > 0 and counts.max() >= 2 and (not negatives or len(counts) >= 2)


def validation_map(codes: np.ndarray, y: np.ndarray, score: str = "euclidean") -> float:
    """mAP of every validation row querying the others by their codes (the early-stopping criterion
    of the pair learners)."""
    Q = np.ascontiguousarray(codes, np.float32)
    idx = np.arange(len(Q))
    ap = retrieval(Q, idx, idx, Q, np.asarray(y), (1,), False, score, 4096, 512)["ap"]
    return float(np.mean(ap[np.isfinite(ap)])) if np.isfinite(ap).any() else float("nan")


def higher_is_better(metric: str) -> bool:
    """Whether a selection metric is a score (mAP) rather than an error."""
    return metric == "map"


def validation_score(
    est,
    metric: str,
    Xv: np.ndarray,
    yv: np.ndarray,
    Xr: np.ndarray,
    yr: np.ndarray,
    nbr: np.ndarray | None = None,
    group: int = 512,
) -> float:
    """The selection metric of a fitted estimator: validation rows (Xv, yv) against reference rows
    (Xr, yr), a sample of the train split, as the database; features as the estimator takes them.

    ``knnK``, ``softvoteK``, ``ncm``, ``ncmc``: top-1 error of that classifier on the validation
    rows (``ncm``/``ncmc`` is the estimator's own ``predict`` when it is an NCM classifier, else the
    nearest mean of the reference codes); ``map``: mean average precision of the validation rows
    querying the reference rows. ``nbr`` (V, k): positions in Xr of each validation row's Euclidean
    neighbours in the input space, the neighbourhood ``softvoteK`` votes over (Eq. 9 of SL-NE).
    Queries go ``group`` at a time, so the distance tiles stay small.
    """
    yv, yr = np.asarray(yv, np.int64), np.asarray(yr, np.int64)
    n_classes = int(max(yv.max(), yr.max())) + 1
    score = est.code_metric or "euclidean"
    if metric in ("ncm", "ncmc") and hasattr(est, "predict"):
        return float(np.mean(np.asarray(est.predict(Xv)) != yv))
    Qv, Cr = est.transform(Xv), est.transform(Xr)
    if metric == "map":
        R = len(Cr)
        rel = np.concatenate([yr, yv])
        out = retrieval(
            Qv,
            np.arange(R, R + len(Qv)),
            np.arange(R),
            np.ascontiguousarray(Cr, np.float32),
            rel,
            (1,),
            False,
            score,
            4096,
            group,
        )
        return float(np.nanmean(out["ap"]))
    if metric == "ncm":
        means = np.stack(
            [Cr[yr == c].mean(0) if (yr == c).any() else np.full(Cr.shape[1], np.inf) for c in range(n_classes)]
        )
        return float(ncm_errors(Qv, yv, means)[0].mean())
    if metric.startswith("knn"):
        k = int(metric[3:])
        errs = [
            knn_errors(Qv[s : s + group], yv[s : s + group], [(np.arange(len(Cr)), Cr)], yr, [k], score, n_classes)[
                metric
            ][0]
            for s in range(0, len(Qv), group)
        ]
        return float(np.concatenate(errs).mean())
    if metric.startswith("softvote"):
        if nbr is None:
            raise ValueError("softvote selection needs the validation rows' neighbourhoods (nbr)")
        k = int(metric[8:])
        errs = softvote_errors(Qv, yv, nbr, Cr, np.arange(len(Cr)), yr, [k], n_classes, score)[metric][0]
        return float(np.mean(errs))
    raise ValueError(f"unknown selection metric {metric!r}; use knnK, softvoteK, ncm, ncmc or map")


# ---- pytorch-metric-learning's AccuracyCalculator metrics (map@r, r_precision, precision@1, mrr, nmi, ami)


def relevant_counts(query_labels: np.ndarray, ref_labels: np.ndarray, self_in_ref: bool) -> np.ndarray:
    """R of every query: the references sharing its label, less the query itself when the queries
    are among the references (integer labels >= 0)."""
    counts = np.bincount(np.asarray(ref_labels, np.int64), minlength=int(np.max(query_labels)) + 1)
    return counts[np.asarray(query_labels, np.int64)] - int(self_in_ref)


def accuracy_k(n_relevant: np.ndarray) -> int:
    """The neighbours each query needs: the largest R over the queries' labels (the AccuracyCalculator's
    ``k="max_bin_count"``, less the query itself), so R-precision and MAP@R see all R places."""
    return max(1, int(np.max(n_relevant)))


def topk_same(idx: np.ndarray, query_labels: np.ndarray, ref_labels: np.ndarray) -> np.ndarray:
    """(n, k) True where the neighbour ``idx`` (reference rows, -1: none) shares the query's label."""
    nb = np.where(idx >= 0, np.asarray(ref_labels)[np.maximum(idx, 0)], -1)
    return (nb == np.asarray(query_labels)[:, None]) & (idx >= 0)


def neighbour_accuracy(
    Q: np.ndarray,
    blocks,
    query_labels: np.ndarray,
    ref_labels: np.ndarray,
    n_relevant: np.ndarray,
    k: int,
    q_ids: np.ndarray | None = None,
    exclude_self: bool = False,
    ks: tuple = (),
) -> dict:
    """Per-query map@r, r_precision, precision@1 and mrr of the queries Q against a streamed reference.

    blocks : a callable giving a fresh iterable of (ids, rows) over the reference (global ids, sorted);
        it is streamed once into a pooled top-k (``knn.pooled_topk``), and twice more for the few
        queries with no relevant reference among their k (their MRR needs the place of the first one:
        the nearest of their class, then the references before it).
    ref_labels : indexed by global id; n_relevant : R of every query; k : ``accuracy_k(R)``.
    ks : cut-offs K (at most k) for ``prec@K`` and ``recall@K`` from the same lists.
    """
    _, idx = knn.pooled_topk(Q, blocks(), k, q_ids=q_ids, exclude_self=exclude_self)
    same = topk_same(idx, query_labels, ref_labels)
    first = np.zeros(len(Q), np.int64)
    miss = np.flatnonzero((np.asarray(n_relevant) > 0) & ~same.any(1))
    if len(miss):
        qi = None if q_ids is None else np.asarray(q_ids)[miss]
        d, i = knn.nearest_of_class(Q[miss], blocks(), np.asarray(query_labels)[miss], ref_labels, qi, exclude_self)
        first[miss] = knn.rank_before(Q[miss], blocks(), d, i, qi, exclude_self) + 1
    return {**metrics.knn_accuracy(same, n_relevant, first), **metrics.topk_precision_recall(same, n_relevant, ks)}


def first_relevant_rank(d: np.ndarray, relevant: np.ndarray) -> np.ndarray:
    """Place (1-based) of each query's first relevant item in its (distance, column) order, from full
    distance rows (n, m); 0 for a query with none."""
    dm = np.where(relevant, d, np.inf)
    best = dm.min(1)
    col = np.argmax(relevant & (dm == best[:, None]), axis=1)
    cols = np.arange(d.shape[1])[None, :]
    before = (d < best[:, None]) | ((d == best[:, None]) & (cols < col[:, None]))
    return np.where(relevant.any(1), np.count_nonzero(before, axis=1) + 1, 0)


def kmeans_fit(X: np.ndarray, n_clusters: int, seed, iters: int = 20) -> np.ndarray:
    """Centroids (n_clusters, D) of rows held in memory: k-means++ seeds and up to ``iters`` Lloyd
    steps (the AccuracyCalculator runs faiss's k-means, 20 iterations, on at most 256 rows per
    centroid; the caller passes such a sample)."""
    X = np.asarray(X, np.float64)
    C = ncmml.kmeans_plus_plus(X, n_clusters, np.random.default_rng(seed))
    zeros, owner = np.zeros(len(X), np.int64), np.zeros(n_clusters, np.int64)
    for _ in range(iters):
        new = ncmml.lloyd_update(C, *ncmml.lloyd_partial(X, zeros, C, owner))
        if np.array_equal(new, C):
            break
        C = new
    return C


def nearest_centroid(X: np.ndarray, C: np.ndarray) -> np.ndarray:
    """The cluster of every row: its nearest centroid (ties to the lower index)."""
    return ncmml.assign(np.asarray(X, np.float64), C)


def mean_accuracy(per_query: dict) -> dict:
    """Averages over the queries whose label has references (nan rows are the lone queries)."""
    return {k: float(np.nanmean(v)) if np.isfinite(v).any() else float("nan") for k, v in per_query.items()}
