"""pytorch-metric-learning's AccuracyCalculator (v2.8, utils/accuracy_calculator.py) re-derived in plain
loops from its source, without torch: the reference the streaming kernels are tested against.

Neighbours are ranked by exact (float64) squared distance, ties by reference index, which is what
faiss's IndexFlatL2 returns on exactly tied distances (checked on integer-grid data, k from 1 to N).
"""

import numpy as np


def pml_accuracy(query, query_labels, reference=None, reference_labels=None, k=None, ref_includes_query=False) -> dict:
    """``AccuracyCalculator(k=k).get_accuracy(query, query_labels, reference, reference_labels,
    ref_includes_query)`` for precision_at_1, r_precision, mean_average_precision_at_r and
    mean_reciprocal_rank (PML's names mapped to metricpipe's). ``k``: None (every reference),
    "max_bin_count" or an int. With ``ref_includes_query`` query i is reference row i."""
    self_in = reference is None or ref_includes_query
    if reference is None:
        reference, reference_labels = query, query_labels
    query, reference = np.asarray(query, np.float64), np.asarray(reference, np.float64)
    counts = {c: int(np.sum(reference_labels == c)) for c in np.unique(query_labels)}
    lone = {c for c, n in counts.items() if n - int(self_in) <= 0}
    if k is None:
        k = len(reference) - int(self_in)
    elif k == "max_bin_count":
        k = max(counts.values()) - int(self_in)
    out = {"precision@1": [], "r_precision": [], "map@r": [], "mrr": []}
    for i, (q, y) in enumerate(zip(query, query_labels)):
        d = ((reference - q) ** 2).sum(1)
        order = list(np.lexsort((np.arange(len(reference)), d))[: k + int(self_in)])
        if self_in:  # FaissKNN searched k + 1: drop the query itself, else the last
            order.remove(i) if i in order else order.pop()
        if y in lone:
            continue
        labels = reference_labels[order]
        R = counts[y] - int(self_in)
        m = min(R, k)
        out["precision@1"].append(float(labels[0] == y))
        out["r_precision"].append(sum(labels[:m] == y) / m)
        hits, ap = 0, 0.0
        for j in range(m):
            if labels[j] == y:
                hits += 1
                ap += hits / (j + 1)
        out["map@r"].append(ap / R)
        first = [j for j in range(k) if labels[j] == y]
        out["mrr"].append(1.0 / (first[0] + 1) if first else 0.0)
    return {name: float(np.mean(v)) if v else float("nan") for name, v in out.items()}


def tied_case(seed: int, n_ref: int = 60, dim: int = 2, classes: int = 4, n_query: int | None = None):
    """Small integer-grid embeddings (many exactly tied distances, duplicates included) and labels;
    with ``n_query``, separate queries (with a label the reference lacks)."""
    rng = np.random.default_rng(seed)
    X = rng.integers(0, 3, (n_ref, dim)).astype(np.float32)
    y = rng.integers(0, classes, n_ref)
    if n_query is None:
        return X, y
    Q = rng.integers(0, 3, (n_query, dim)).astype(np.float32)
    yq = rng.integers(0, classes + 1, n_query)  # label `classes` is absent from the reference
    return X, y, Q, yq
