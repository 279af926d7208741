"""Retrieval and classification metrics on blocks of queries.

Retrieval: every query ranks the whole database by ascending distance (ties handled order-free).
  AP      = (1/R) sum over relevant ranks r of precision@r (non-interpolated average precision).
  prec@K  = |relevant in top K| / K; mprec@K averages it per class, then over classes (NML paper).
  recall@K = |relevant in top K| / R.
  ukb4    = the UKB score: number of the query's group of four (itself included) in its top 4.
Retrieval from each query's first k neighbours, as pytorch-metric-learning's AccuracyCalculator
defines them (R = the query's relevant references, k its neighbour lists' length):
  precision@1 = 1 if the nearest reference is relevant.
  r_precision = |relevant in the first min(R, k)| / min(R, k).
  map@r       = (1/R) sum over relevant ranks r <= min(R, k) of precision@r (MAP@R, Musgrave et al.).
  mrr         = 1 / rank of the first relevant reference (among all references, as PML's default
                k = every reference has it).
  nmi, ami    = scikit-learn's normalised / adjusted mutual information of the labels and a k-means
                clustering with one cluster per class.
Classification: classes are ranked per query and top-1/top-5 error is the fraction of queries whose
true class is not among the first 1/5.
"""

import numpy as np


def sq_distances(Q: np.ndarray, X: np.ndarray, x_sq: np.ndarray | None = None) -> np.ndarray:
    """Squared Euclidean distances (n, m) in float32, clipped at 0; ``x_sq``: the rows' squared
    norms when the caller has them (a database scored against many query groups)."""
    Q = np.asarray(Q, np.float32)
    X = np.asarray(X, np.float32)
    d = Q @ X.T
    d *= -2.0
    d += np.einsum("ij,ij->i", Q, Q)[:, None]
    d += (np.einsum("ij,ij->i", X, X) if x_sq is None else x_sq)[None, :]
    return np.maximum(d, 0.0, out=d)


def retrieval_scores(dist: np.ndarray, relevant: np.ndarray, ks: tuple, work: np.ndarray | None = None) -> dict:
    """Per-query retrieval scores from a full query x database distance matrix.

    Ties are handled without choosing an order, so the scores do not depend on how the database was
    laid out: each relevant item j contributes precision hits(d <= d_j) / count(d <= d_j) to AP
    (scikit-learn's ``average_precision_score`` convention), and at a cut-off K that splits a group of
    tied items, the group counts in proportion (the expected value under random tie-breaking).

    Parameters
    ----------
    dist : (n, m) distances; the query itself must already be excluded (e.g. set to +inf and
        masked out of ``relevant``).
    relevant : (n, m) bool, True where the database item is relevant to the query.
    ks : cut-offs K.
    work : optional float buffer of at least (n, m) for the sorted distances, reused across calls
        (a fresh one page-faults on every call where large allocations are returned to the system).

    Returns
    -------
    dict with ``ap`` (n,), ``n_relevant`` (n,), ``prec`` (n, len(ks)), ``recall`` (n, len(ks)).
    Queries with no relevant item get ap = nan and recall = nan.
    """
    dist = np.asarray(dist)
    n_rel = relevant.sum(axis=1)
    if work is None:
        sorted_all = np.sort(dist, axis=1)  # a value sort is far cheaper than an argsort
    else:
        sorted_all = work[: dist.shape[0], : dist.shape[1]]
        np.copyto(sorted_all, dist)
        sorted_all.sort(axis=1)
    ap = np.full(len(dist), np.nan)
    hits_k = np.zeros((len(dist), len(ks)))
    kk = np.minimum(np.asarray(ks, np.int64), dist.shape[1])
    for q in range(len(dist)):
        r = np.sort(dist[q][relevant[q]])  # only the relevant distances: R << m values to sort
        if n_rel[q]:
            ranks = np.searchsorted(sorted_all[q], r, side="right")
            hits = np.searchsorted(r, r, side="right")
            ap[q] = np.mean(hits / ranks)
        # hits among the first k (as hits_at counts them), from the sorted rows: no pass over the distances
        t = sorted_all[q][kk - 1]
        n_below, n_le = np.searchsorted(sorted_all[q], t, "left"), np.searchsorted(sorted_all[q], t, "right")
        r_below, r_le = np.searchsorted(r, t, "left"), np.searchsorted(r, t, "right")
        hits_k[q] = _split_ties(r_below, r_le - r_below, kk, n_below, n_le - n_below)
    with np.errstate(invalid="ignore", divide="ignore"):
        recall = hits_k / n_rel[:, None]
    return {"ap": ap, "n_relevant": n_rel, "prec": hits_k / np.asarray(ks, float)[None, :], "recall": recall}


def hits_at(dist: np.ndarray, relevant: np.ndarray, sorted_all: np.ndarray, k: int) -> np.ndarray:
    """Expected number of relevant items among the first k (tie groups split proportionally)."""
    k = min(k, dist.shape[1])
    t = sorted_all[:, k - 1][:, None]
    below, tied = dist < t, dist == t
    n_below = below.sum(1)
    rel_below = (below & relevant).sum(1)
    return _split_ties(rel_below, (tied & relevant).sum(1), k, n_below, tied.sum(1))


def _split_ties(rel_below, rel_tied, k, n_below, n_tied):
    """Relevant items among the first k: those below the k-th value, plus the tie group at it in
    proportion to the places left (the expected count under a random order of the ties)."""
    return rel_below + rel_tied * (k - n_below) / np.maximum(n_tied, 1)


def ukb_score(dist: np.ndarray, relevant: np.ndarray) -> np.ndarray:
    """UKB score per query: 1 (the query itself) + relevant items among the 3 nearest others."""
    k = min(3, dist.shape[1])
    return 1.0 + hits_at(dist, relevant, np.partition(dist, k - 1, axis=1), 3)  # reads the k-th value only


def class_average(values: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Mean of ``values`` (n, ...) per class, then over classes (ignores nan rows)."""
    classes = np.unique(labels)
    return np.mean([np.nanmean(values[labels == c], axis=0) for c in classes], axis=0)


def knn_class_ranking(neighbour_labels: np.ndarray, n_classes: int, k: int) -> np.ndarray:
    """Rank classes for each query from its nearest neighbours' labels (nearest first).

    Majority vote among the first ``k`` labels; ties between classes go to the class whose nearest
    member is closer, then to the lower class code. Returns (n, n_classes) class codes, best first;
    the classes without a vote are not ranked (-1 after the voted ones): ordering them by class code
    would hand the low codes a top-5 place (the top-5 of knn1 would be its class and classes 0-3).
    """
    lab = neighbour_labels[:, :k]
    n = len(lab)
    rows = np.repeat(np.arange(n), lab.shape[1])
    valid = lab.reshape(-1) >= 0
    counts = np.zeros((n, n_classes), np.int64)
    np.add.at(counts, (rows[valid], lab.reshape(-1)[valid]), 1)
    first = np.full((n, n_classes), k, np.int64)
    pos = np.tile(np.arange(lab.shape[1]), n)
    np.minimum.at(first, (rows[valid], lab.reshape(-1)[valid]), pos[valid])
    key = counts * (k + 1) + (k - first)  # more votes first, then nearer first member
    return _voted_only(np.argsort(-key, axis=1, kind="stable"), counts)


def _voted_only(order: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``order`` with the classes that got no vote replaced by -1 (a code no label has)."""
    return np.where(np.take_along_axis(counts, order, 1) > 0, order, -1)


def softvote_ranking(
    neighbour_labels: np.ndarray, scores: np.ndarray, n_classes: int, k: int, weighted: bool = True
) -> np.ndarray:
    """Eq. 9 of SL-NE: classes ranked by the summed similarity of the k most similar members of each
    query's neighbourhood (``weighted=False``: one vote each). neighbour_labels, scores : (n, K) with
    -1 labels for missing neighbours. Classes without a voter are not ranked (-1, as in
    :func:`knn_class_ranking`)."""
    scores = np.where(neighbour_labels >= 0, scores, -np.inf)
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    lab = np.take_along_axis(neighbour_labels, top, 1)
    sc = np.take_along_axis(scores, top, 1) if weighted else np.ones(top.shape)
    votes = np.zeros((len(lab), n_classes))
    ok = lab >= 0
    rows = np.repeat(np.arange(len(lab)), lab.shape[1]).reshape(lab.shape)
    counts = np.zeros((len(lab), n_classes), np.int64)
    np.add.at(votes, (rows[ok], lab[ok]), sc[ok])
    np.add.at(counts, (rows[ok], lab[ok]), 1)
    votes[counts == 0] = -np.inf  # classes with no voter rank last, after any (even negative) sum
    return _voted_only(np.argsort(-votes, axis=1, kind="stable"), counts)


def nearest_mean_ranking(Q: np.ndarray, means: np.ndarray) -> np.ndarray:
    """Rank classes by distance of each query to the class means; (n, C) class codes, best first."""
    return np.argsort(sq_distances(Q, means), axis=1, kind="stable")


def topk_errors(ranking: np.ndarray, y: np.ndarray, ks=(1, 5)) -> dict:
    """Per-query 0/1 errors: true class not among the first k of ``ranking`` for each k."""
    return {k: ~(ranking[:, :k] == y[:, None]).any(axis=1) for k in ks}


def knn_accuracy(same: np.ndarray, n_relevant: np.ndarray, first_rank: np.ndarray | None = None) -> dict:
    """Per-query precision@1, r_precision, map@r and mrr (pytorch-metric-learning's definitions).

    Parameters
    ----------
    same : (n, k) bool, True where the query's j-th nearest reference shares its label (the query
        itself already left out when it is among the references).
    n_relevant : (n,) R, the number of references sharing the query's label (itself not counted).
    first_rank : (n,) optional place (1-based) of each query's first relevant reference in the whole
        reference, used for the MRR of queries with none among their k (0: unknown, counts 0).

    Returns
    -------
    dict of (n,) float64 arrays; a query with R = 0 (its label absent from the reference) gets nan,
    and is left out of the averages as the AccuracyCalculator leaves such "lone" queries out.
    """
    same = np.asarray(same, bool)
    n, k = same.shape
    R = np.asarray(n_relevant, np.int64)
    lone = R == 0
    ranks = np.arange(1, k + 1)
    within_r = ranks[None, :] <= np.minimum(R, k)[:, None]  # the first min(R, k) places
    hit = same & within_r
    with np.errstate(invalid="ignore", divide="ignore"):
        r_prec = hit.sum(1) / np.minimum(R, k)
        map_r = (np.cumsum(hit, 1) * hit / ranks).sum(1) / R  # divided by R, not min(R, k), as PML does
    first = np.where(same.any(1), same.argmax(1) + 1, 0 if first_rank is None else first_rank)
    mrr = np.divide(1.0, first, out=np.zeros(n), where=first > 0)
    out = {
        "precision@1": same[:, 0].astype(np.float64) if k else np.zeros(n),
        "r_precision": r_prec,
        "map@r": map_r,
        "mrr": mrr,
    }
    return {name: np.where(lone, np.nan, v) for name, v in out.items()}


def topk_precision_recall(same: np.ndarray, n_relevant: np.ndarray, ks) -> dict:
    """Per-query ``prec@K`` (relevant among the first K, over K) and ``recall@K`` (over R) for each K
    no larger than the lists' length (beyond it the places are unknown); nan for lone queries (R = 0).
    The pipeline's evaluate stage averages prec@K per class then over classes (``mprec@K``)."""
    same = np.asarray(same, bool)
    R = np.asarray(n_relevant, np.float64)
    out = {}
    for K in ks:
        if K > same.shape[1]:
            continue
        hits = same[:, :K].sum(1).astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[f"prec@{K}"] = np.where(R > 0, hits / K, np.nan)
            out[f"recall@{K}"] = np.where(R > 0, hits / R, np.nan)
    return out


def clustering_scores(labels: np.ndarray, clusters: np.ndarray) -> dict:
    """NMI and AMI (arithmetic normalisation) of ``clusters`` against ``labels``: scikit-learn's
    ``normalized_mutual_info_score`` and ``adjusted_mutual_info_score``, as the AccuracyCalculator
    calls them."""
    from sklearn.metrics import adjusted_mutual_info_score, normalized_mutual_info_score

    return {
        "nmi": float(normalized_mutual_info_score(labels, clusters)),
        "ami": float(adjusted_mutual_info_score(labels, clusters)),
    }
