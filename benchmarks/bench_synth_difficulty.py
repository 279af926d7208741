"""How hard `metricpipe synth`'s data is at a shape: raw features, PCA and LDA, in memory, one process.

    python benchmarks/bench_synth_difficulty.py --shape 128x100 --shape 4096x1000 --fit-rows-per-class 500
        [--set nuisance=2 --set overlap=1] [--nonnegative] [--samples 20000] [--threads 2] [--raw-only]

Rows are `SyntheticSpec.rows` (what `metricpipe synth` writes) of a spec of as many rows as the larger of
``--samples`` and the fit rows, l2-normalised as a run stages them with ``normalize: l2``, with a seeded
20 % test split. Retrieval on the first ``--samples`` rows, as the evaluate stage scores it: up to 2,000
of their test rows queried against the rest of their test rows, mAP by squared Euclidean distance. NCM
(top-1 and top-5 error of those test rows), PCA and LDA (to min(512, D // 4, C - 1) dimensions; codes
not normalised again, as a run encodes staged rows) come from the train rows among the first
``--fit-rows`` rows (``--fit-rows-per-class``: that many times C; default: the sample), streamed 20,000
at a time, as a run of that many rows computes them: NCM's error depends on the rows per class (the
class means' own error), so compare shapes at equal rows per class. LDA is scikit-learn's
``solver="eigen"`` projection (equal to its default solver's at 128 dimensions up to round-off), from one
D x D Gram matrix rather than one covariance per class. BLAS limited to ``--threads``.
"""

import argparse
import time

import numpy as np
import scipy.linalg
import scipy.sparse
from threadpoolctl import threadpool_limits

from metricpipe.tasks.synthetic import SyntheticSpec

PIECE = 20_000  # rows generated at once when streaming the class means


def l2(X: np.ndarray) -> np.ndarray:
    return X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12)


def class_sums(X: np.ndarray, y: np.ndarray, n_classes: int) -> np.ndarray:
    """(C, D) float64 sums of the rows of each class."""
    onehot = scipy.sparse.csr_matrix((np.ones(len(y)), (y, np.arange(len(y)))), shape=(n_classes, len(y)))
    return np.asarray(onehot @ X.astype(np.float64))


def mean_ap(Z: np.ndarray, y: np.ndarray, queries: np.ndarray) -> float:
    """Mean average precision of rows ``queries`` of Z against every other row of Z."""
    Z = Z.astype(np.float32)
    sq = (Z * Z).sum(1)
    aps = []
    for block in np.array_split(queries, max(1, len(queries) // 250)):
        d = sq[block, None] + sq[None, :] - 2 * Z[block] @ Z.T
        d[np.arange(len(block)), block] = np.inf  # the query itself is not in its database
        rel = (y[np.argsort(d, axis=1, kind="stable")] == y[block, None])[:, :-1]
        prec = np.cumsum(rel, axis=1) / np.arange(1, rel.shape[1] + 1)
        aps.extend((prec * rel).sum(1) / np.maximum(rel.sum(1), 1))
    return float(np.mean(aps))


def ncm_errors(means: np.ndarray, Z: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(top-1, top-5) error of the nearest of the class ``means`` (C, d) for the rows Z."""
    d = (means * means).sum(1)[None, :] - 2 * Z.astype(np.float64) @ means.T
    top5 = np.argsort(d, axis=1)[:, :5]
    return float(np.mean(top5[:, 0] != y)), float(np.mean((top5 != y[:, None]).all(1)))


def projections(stats: dict, n_classes: int, k: int) -> dict:
    """{"pca": V, "lda": W} (D x k each): the covariance's leading eigenvectors, and the leading generalised
    eigenvectors of the between- and within-class covariances (within-class whitened), from the train
    rows' Gram matrix, sum and class sums."""
    n, counts = stats["counts"].sum(), stats["counts"]
    mean = stats["sums"].sum(0) / n
    total = stats["gram"] / n - np.outer(mean, mean)
    centred = stats["sums"] / np.maximum(counts, 1)[:, None] - mean
    between = (centred * (counts / n)[:, None]).T @ centred
    top = (len(mean) - k, len(mean) - 1)
    _, V = scipy.linalg.eigh(total, subset_by_index=top)
    _, W = scipy.linalg.eigh(between, total - between, subset_by_index=top)
    return {"pca": V[:, ::-1], "lda": W[:, ::-1]}


def train_statistics(spec: SyntheticSpec, test: np.ndarray, n_rows: int, sample: np.ndarray, gram: bool) -> dict:
    """Class sums and counts (and the Gram matrix, if ``gram``) of the train rows among the first
    ``n_rows``, streamed ``PIECE`` rows at a time (``sample``: the first rows, already made)."""
    y, C, D = spec.labels(), spec.n_classes, spec.n_features
    stats = {"sums": np.zeros((C, D)), "counts": np.zeros(C), "gram": np.zeros((D, D)) if gram else None}
    for a in range(0, n_rows, PIECE):
        b = min(a + PIECE, n_rows)
        keep = a + np.flatnonzero(~test[a:b])
        rows = sample[keep] if b <= len(sample) else l2(spec.rows(a, b, y))[keep - a]
        stats["sums"] += class_sums(rows, y[keep], C)
        stats["counts"] += np.bincount(y[keep], minlength=C)
        if gram:
            stats["gram"] += rows.T @ rows
    return stats


def measure(spec: SyntheticSpec, n_sample: int, n_fit: int, raw_only: bool = False, n_queries: int = 2000) -> dict:
    """{model: (mAP, NCM top-1 error, NCM top-5 error)} for raw features, PCA and LDA."""
    C, y = spec.n_classes, spec.labels()
    test = np.random.default_rng([spec.seed, 1]).random(spec.n_samples) < 0.2
    X = l2(spec.rows(0, n_sample, y))
    te = np.flatnonzero(test[:n_sample])
    queries = np.sort(np.random.default_rng([spec.seed, 2]).choice(len(te), min(n_queries, len(te)), replace=False))
    stats = train_statistics(spec, test, n_fit, X, gram=not raw_only)
    means = stats["sums"] / np.maximum(stats["counts"], 1)[:, None]
    out = {"raw": (mean_ap(X[te], y[te], queries), *ncm_errors(means, X[te], y[te]))}
    if not raw_only:
        k = max(1, min(512, spec.n_features // 4, C - 1))
        for name, P in projections(stats, C, k).items():
            Z = X[te] @ P.astype(np.float32)
            out[f"{name.upper()}-{k}"] = (mean_ap(Z, y[te], queries), *ncm_errors(means @ P, Z, y[te]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", action="append", help="DxC, repeatable (default: 128x100 and 4096x1000)")
    ap.add_argument("--samples", type=int, default=20_000, help="rows of the sample (its test rows are scored)")
    ap.add_argument("--fit-rows", type=int, default=None, help="rows whose train share gives the means, PCA, LDA")
    ap.add_argument("--fit-rows-per-class", type=int, default=None, help="--fit-rows as so many times C")
    ap.add_argument("--set", action="append", default=[], help="a SyntheticSpec setting, e.g. overlap=0.5")
    ap.add_argument("--nonnegative", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--raw-only", action="store_true", help="raw features only (no PCA, LDA)")
    a = ap.parse_args()
    settings = {k: (int(v) if k in ("modes", "rank") else float(v)) for k, v in (s.split("=") for s in a.set)}
    if a.nonnegative:
        settings["nonnegative"] = True
    said = ", ".join(f"{k}={v}" for k, v in settings.items()) or "defaults"
    fit = f"{a.fit_rows_per_class} x C" if a.fit_rows_per_class else f"{a.fit_rows or a.samples:,}"
    print(f"sample {a.samples:,} rows; class means, PCA and LDA from the train rows of the first {fit} rows")
    print("| shape | settings | model | mAP | NCM top-1 | NCM top-5 |")
    print("| --- | --- | --- | --- | --- | --- |")
    with threadpool_limits(a.threads):
        for shape in a.shape or ["128x100", "4096x1000"]:
            D, C = (int(v) for v in shape.lower().split("x"))
            n_fit = a.fit_rows_per_class * C if a.fit_rows_per_class else a.fit_rows or a.samples
            t = time.perf_counter()
            spec = SyntheticSpec(max(a.samples, n_fit), D, C, seed=a.seed, **settings)
            for model, (m, e1, e5) in measure(spec, a.samples, n_fit, a.raw_only).items():
                print(f"| {D} x {C} | {said} | {model} | {m:.3f} | {e1:.3f} | {e5:.3f} |", flush=True)
            print(f"({shape}: {time.perf_counter() - t:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
