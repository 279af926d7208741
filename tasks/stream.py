"""The order in which SGD learners see their training rows, in memory and out of core alike.

Rows stored sorted by class (the usual layout of feature dumps) must not give batches of few
classes. So the training rows get one seeded *layout*, a permutation ``pi``: position ``j`` of the
layout holds training row ``pi[j]``. The layout is cut into blocks of ``block_rows`` positions; each
block is a uniform random sample of the whole training set. An epoch visits the blocks in a seeded
order and each block's positions in a seeded order; a learner takes its batches from the block
in hand (a *pool*), so every batch mixes rows from across the data set.

The pipeline writes the training rows in layout order once (a shuffled copy, one row-block per
layout block) and reads it block by block; :func:`pools` does the same on arrays in memory, so
``fit(X, y)`` and the pipeline see the same pools and learn the same model.
"""
import numpy as np

POOL_MB = 64  # a pool is one 64 MB float32 block, the pipeline's default row-block (data.chunk_mb)


def block_rows_for(n_features: int, mb: float = POOL_MB) -> int:
    """Rows per pool so that a pool of float32 rows is about ``mb`` MB (as the staged row-blocks)."""
    return max(1, int(mb * 1e6 // (n_features * 4)))


def layout(n: int, seed: int) -> np.ndarray:
    """The permutation ``pi`` of the n training rows: layout position j holds row pi[j]."""
    return np.random.default_rng([seed, 53]).permutation(n)


def epoch_order(n: int, block_rows: int, epoch: int, seed: int, keep: np.ndarray | None = None):
    """The pools of one epoch: a list of (block, layout positions) in visiting order.

    keep : optional (n,) bool over layout positions; positions set False (validation rows) are
    never visited.
    """
    n_blocks = -(-n // block_rows)
    rng = np.random.default_rng([seed, 59, epoch])
    out = []
    for b in rng.permutation(n_blocks):
        pos = np.arange(b * block_rows, min(n, (b + 1) * block_rows))
        if keep is not None:
            pos = pos[keep[pos]]
        if len(pos):
            out.append((int(b), rng.permutation(pos)))
    return out


def pools(X: np.ndarray, y: np.ndarray, keep: np.ndarray | None, block_rows: int, seed: int):
    """In memory: endless pools (X_pool, y_pool) of the training rows X (n, D), y (n,) in the
    order the pipeline streams them from its shuffled copy. ``keep`` (n,) bool marks the rows SGD
    may see (by row, not by layout position)."""
    n = len(X)
    pi = layout(n, seed)
    keep_pos = None if keep is None else np.asarray(keep, bool)[pi]
    epoch = 0
    while True:
        for _, pos in epoch_order(n, block_rows, epoch, seed, keep_pos):
            rows = pi[pos]
            yield X[rows], y[rows]
        epoch += 1


def stratified_subset(labels: np.ndarray, size: int, seed) -> np.ndarray:
    """Sorted positions of ``size`` rows, the same share of every class (at least one each), seeded;
    every position when size >= len(labels)."""
    labels = np.asarray(labels)
    if size >= len(labels):
        return np.arange(len(labels))
    rng = np.random.default_rng(seed)
    picked = []
    for c in np.unique(labels):
        rows = np.flatnonzero(labels == c)
        picked.append(rng.choice(rows, min(len(rows), max(1, int(round(size * len(rows) / len(labels))))),
                                 replace=False))
    return np.sort(np.concatenate(picked))


def validation_split(labels: np.ndarray, size: int, seed: int) -> np.ndarray:
    """Positions held out of SGD for early stopping: a stratified sample of at most a fifth of the
    rows (SGD keeps most of them), ``size`` at most."""
    return stratified_subset(labels, min(size, len(labels) // 5), seed + 1)
