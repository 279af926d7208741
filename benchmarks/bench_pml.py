"""metricpipe's AccuracyCalculator metrics against pytorch-metric-learning's own, on random cases
with ties (needs the `pml` extra: pip install -e ".[pml]").

    python benchmarks/bench_pml.py [--cases 200]

Each case: integer-grid embeddings (many exactly tied distances and duplicates) or continuous ones,
either the query set as the reference (PML's reference=None) or separate queries holding a label the
reference lacks. Compared: precision_at_1, r_precision, mean_average_precision_at_r and
mean_reciprocal_rank against PML's default k (every reference), and the first three also against
k="max_bin_count" (metricpipe's neighbour lists are that long; MRR of a query with no relevant
reference among them comes from two more passes, so it follows the default k); NMI and AMI on PML's
own (faiss) clustering, through metricpipe.tasks.metrics.clustering_scores. Prints the largest
absolute differences, and the number of cases where MRR under k="max_bin_count" would differ.
"""

import argparse
import logging

import numpy as np
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

from metricpipe.tasks import evaluation, metrics

logging.getLogger("PML").setLevel(logging.ERROR)
NAMES = {
    "precision@1": "precision_at_1",
    "r_precision": "r_precision",
    "map@r": "mean_average_precision_at_r",
    "mrr": "mean_reciprocal_rank",
}


def ours(Q, yq, X, y, self_in):
    R = evaluation.relevant_counts(yq, y, self_in)
    k = evaluation.accuracy_k(R)
    blocks = [(np.arange(a, min(a + 64, len(X))), X[a : a + 64]) for a in range(0, len(X), 64)]
    return evaluation.mean_accuracy(
        evaluation.neighbour_accuracy(Q, lambda: iter(blocks), yq, y, R, k, np.arange(len(Q)), self_in)
    )


def case(rng):
    n = int(rng.integers(20, 400))
    dim = int(rng.integers(1, 6))
    classes = int(rng.integers(2, 8))
    tied = rng.random() < 0.7
    draw = (
        (lambda m: rng.integers(0, 3, (m, dim)).astype(np.float32))
        if tied
        else (lambda m: rng.normal(size=(m, dim)).astype(np.float32))
    )
    X, y = draw(n), rng.integers(0, classes, n)
    if rng.random() < 0.5:
        return X, y, None, None, tied
    m = int(rng.integers(5, 100))
    return draw(m), rng.integers(0, classes + 1, m), X, y, tied  # label `classes`: absent from X


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    calc_all = AccuracyCalculator(include=tuple(NAMES.values()) + ("NMI", "AMI"), device=None)
    calc_max = AccuracyCalculator(include=tuple(NAMES.values()), k="max_bin_count")
    worst = {name: 0.0 for name in [*NAMES, "nmi", "ami"]}
    n_tied, mrr_beyond = 0, 0
    for _ in range(args.cases):
        Q, yq, X, y, tied = case(rng)
        n_tied += tied
        self_in = X is None
        if self_in:
            X, y = Q, yq
        if not (evaluation.relevant_counts(yq, y, self_in) > 0).any():
            continue
        got = ours(Q, yq, X, y, self_in)
        kw = {} if self_in else {"reference": X, "reference_labels": y}
        full = calc_all.get_accuracy(Q, yq, **kw)
        mx = calc_max.get_accuracy(Q, yq, **kw)
        for name, pml in NAMES.items():
            worst[name] = max(worst[name], abs(got[name] - full[pml]))
            if name != "mrr":
                worst[name] = max(worst[name], abs(got[name] - mx[pml]))
        mrr_beyond += abs(mx["mean_reciprocal_rank"] - full["mean_reciprocal_rank"]) > 1e-6
        import torch

        clusters = calc_all.get_cluster_labels(torch.tensor(Q), torch.tensor(yq, dtype=torch.float)).numpy()
        cs = metrics.clustering_scores(yq, clusters)
        worst["nmi"] = max(
            worst["nmi"], abs(cs["nmi"] - calc_all.calculate_NMI(torch.tensor(yq), torch.tensor(clusters)))
        )
        worst["ami"] = max(
            worst["ami"], abs(cs["ami"] - calc_all.calculate_AMI(torch.tensor(yq), torch.tensor(clusters)))
        )
    print(f"{args.cases} cases ({n_tied} with tied integer-grid embeddings); max |metricpipe - PML|:")
    for name, v in worst.items():
        print(f"  {name:<22} {v:.3g}")
    print(f"  cases where PML's own MRR differs between k=None and k='max_bin_count': {mrr_beyond}")


if __name__ == "__main__":
    main()
