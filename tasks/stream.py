"""The order in which SGD learners see their training rows, in memory and out of core alike.

Rows stored sorted by class (the usual layout of feature dumps) must not give batches of few
classes. So the training rows get one seeded *layout*, a permutation ``pi``: position ``j`` of the
layout holds training row ``pi[j]``. The layout is cut into blocks of ``block_rows`` positions; each
block is a uniform random sample of the whole training set. An epoch visits the blocks in a seeded
order and each block's positions in a seeded order; a learner takes its batches from the block
in hand (a *pool*), so every batch mixes rows from across the data set.

The layout is a function of the rows' *content*, not of their positions: each row has a 64-bit key
hashed from its float32 bytes (:func:`row_keys`), and the layout sorts the rows by their keys mixed
with the seed. The same rows stored in any order therefore give the same pools, the same
validation rows (:func:`stratified_subset` with ``rank``) and the same model; only the statistics'
summation order, and with it the PCA start, moves by float rounding.

The pipeline writes the training rows in layout order once (a shuffled copy, one row-block per
layout block) and reads it block by block; :func:`pools` does the same on arrays in memory, so
``fit(X, y)`` and the pipeline see the same pools and learn the same model.
"""

import numpy as np

POOL_MB = 64  # a pool is one 64 MB float32 block, the pipeline's default row-block (data.chunk_mb)


def block_rows_for(n_features: int, mb: float = POOL_MB) -> int:
    """Rows per pool so that a pool of float32 rows is about ``mb`` MB (as the staged row-blocks)."""
    return max(1, int(mb * 1e6 // (n_features * 4)))


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = np.asarray(z, np.uint64) + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def row_keys(X: np.ndarray, rows: int = 4096) -> np.ndarray:
    """A 64-bit key per row of X (n, D), a hash of the row's float32 bytes: equal rows get equal
    keys wherever they are stored. The staging stage stores them (``row_key``) for the pipeline."""
    U = np.ascontiguousarray(X, np.float32).view(np.uint32)
    mult = np.random.default_rng(20261123).integers(1, 2**63, U.shape[1], dtype=np.uint64) | np.uint64(1)
    out = np.empty(len(U), np.uint64)
    # one slab buffer for every slab: under Dask's MALLOC_TRIM_THRESHOLD_ each fresh 8 MB temporary
    # is page-faulted in again (98 ms a 65,536 x 256 block against 37 ms, measured)
    buf = np.empty((min(rows, len(U)), U.shape[1]), np.uint64)
    with np.errstate(over="ignore"):
        for a in range(0, len(U), rows):
            b = buf[: len(U[a : a + rows])]
            np.copyto(b, U[a : a + rows])
            np.multiply(b, mult, out=b)
            b.sum(axis=1, dtype=np.uint64, out=out[a : a + rows])
    return _mix(out)


def order_keys(keys: np.ndarray, seed, purpose: int = 0) -> np.ndarray:
    """The keys mixed with the seed (and a purpose, so that the validation rows, the k-means sample
    and the layout are independent draws)."""
    s = np.random.default_rng([int(seed), 53, int(purpose)]).integers(0, 2**63, dtype=np.uint64)
    return _mix(np.asarray(keys, np.uint64) ^ s)


def layout(keys: np.ndarray, seed) -> np.ndarray:
    """The permutation ``pi`` of the training rows with these :func:`row_keys`: layout position j
    holds row pi[j] (rows with equal keys, i.e. equal content, keep their relative order)."""
    return np.argsort(order_keys(keys, seed), kind="stable")


def rank(keys: np.ndarray, seed, purpose: int) -> np.ndarray:
    """Each row's place in a seeded random order of the rows that depends on their content only."""
    r = np.empty(len(keys), np.int64)
    r[np.argsort(order_keys(keys, seed, purpose), kind="stable")] = np.arange(len(keys))
    return r


def _epoch_rng(seed: int, epoch: int):
    return np.random.default_rng([seed, 59, epoch])


def block_order(n: int, block_rows: int, epoch: int, seed: int) -> np.ndarray:
    """The blocks in the order :func:`epoch_order` visits them."""
    return _epoch_rng(seed, epoch).permutation(-(-n // block_rows))


def first_blocks(n: int, block_rows: int, seed: int, rows: int | None) -> np.ndarray:
    """The blocks whose pools give at least ``rows`` rows, visited first in epoch 0 (sorted): all of
    them when ``rows`` is None or an epoch is not enough."""
    order = block_order(n, block_rows, 0, seed)
    if rows is None or rows >= n:
        return np.sort(order)
    sizes = np.minimum(block_rows, n - order * block_rows)
    return np.sort(order[: int(np.searchsorted(np.cumsum(sizes), rows)) + 1])


def epoch_order(n: int, block_rows: int, epoch: int, seed: int, keep: np.ndarray | None = None):
    """The pools of one epoch: a list of (block, layout positions) in visiting order.

    keep : optional (n,) bool over layout positions; positions set False (validation rows) are
    never visited.
    """
    rng = _epoch_rng(seed, epoch)
    out = []
    for b in rng.permutation(-(-n // block_rows)):
        pos = np.arange(b * block_rows, min(n, (b + 1) * block_rows))
        if keep is not None:
            pos = pos[keep[pos]]
        if len(pos):
            out.append((int(b), rng.permutation(pos)))
    return out


def pools(
    X: np.ndarray, y: np.ndarray, keep: np.ndarray | None, block_rows: int, seed: int, keys: np.ndarray | None = None
):
    """In memory: endless pools (X_pool, y_pool) of the training rows X (n, D), y (n,) in the
    order the pipeline streams them from its shuffled copy. ``keep`` (n,) bool marks the rows SGD
    may see (by row, not by layout position); ``keys``: X's :func:`row_keys`, if known."""
    n = len(X)
    pi = layout(row_keys(X) if keys is None else keys, seed)
    keep_pos = None if keep is None else np.asarray(keep, bool)[pi]
    epoch = 0
    while True:
        for _, pos in epoch_order(n, block_rows, epoch, seed, keep_pos):
            rows = pi[pos]
            yield X[rows], y[rows]
        epoch += 1


def stratified_subset(labels: np.ndarray, size: int, rank: np.ndarray, leave: int = 0, at_least: int = 1) -> np.ndarray:
    """Sorted positions of ``size`` rows, the same share of every class (at least ``at_least`` rows
    each, all of a class with fewer): in each class the rows first in ``rank`` (a seeded random
    order, :func:`rank`), so the subset depends on the rows' content and the seed, not on where they
    are stored; every position when size >= len(labels). ``leave``: rows of every class never taken
    (a held-out set leaves training rows)."""
    labels = np.asarray(labels)
    if size >= len(labels) and not leave:
        return np.arange(len(labels))
    _, inv, counts = np.unique(labels, return_inverse=True, return_counts=True)
    take = np.clip(
        np.maximum(at_least, np.rint(size * counts / max(1, len(labels)))).astype(np.int64),
        0,
        np.maximum(counts - leave, 0),
    )
    return _first_in_rank(inv, counts, take, rank)


def _first_in_rank(inv: np.ndarray, counts: np.ndarray, take: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Sorted positions of the ``take[c]`` rows of each class c (``inv``: each row's class index,
    ``counts``: rows per class) that come first in ``rank``."""
    picked = [
        rows[np.argsort(rank[rows], kind="stable")[:t]]
        for rows, t in zip(np.split(np.argsort(inv, kind="stable"), np.cumsum(counts)[:-1]), take)
        if t
    ]
    return np.sort(np.concatenate(picked)) if picked else np.zeros(0, np.int64)  # no rows: none picked


def held_out(labels: np.ndarray, size: int, rank: np.ndarray, leave: int) -> np.ndarray:
    """Sorted positions of about ``size`` rows to hold out of training, stratified: each class its
    share of ``size`` rounded (its rows first in ``rank``; the roundings may pass ``size`` by a row a
    class), ``leave`` of its rows always left. A class whose share is under one row (fewer rows than
    len(labels) / size: few-shot data) gives one row while the total is under ``size``, the classes
    in the order of their first row in ``rank``; the others give none. (Taking one row of every class
    regardless held out half of a data set of two images per class, a third of one of three.) Where
    every class's share is at least one row, this is :func:`stratified_subset`."""
    labels = np.asarray(labels)
    if not len(labels) or size <= 0:
        return np.zeros(0, np.int64)
    classes, inv, counts = np.unique(labels, return_inverse=True, return_counts=True)
    share = size * counts / len(labels)
    # a share under one row gives none here (rounding 0.6 up took one row of every class of 3), then
    # the top-up below; a share of a row or more is rounded, as stratified_subset does
    take = np.clip(np.where(share >= 1, np.rint(share), 0).astype(np.int64), 0, np.maximum(counts - leave, 0))
    first = np.full(len(classes), np.iinfo(np.int64).max)
    np.minimum.at(first, inv, rank)
    short = int(size) - int(take.sum())
    for c in np.argsort(first, kind="stable"):  # few-shot classes, one row each, in seeded order
        if short <= 0:
            break
        if take[c] == 0 and counts[c] > leave:
            take[c], short = 1, short - 1
    return _first_in_rank(inv, counts, take, rank)


VALIDATION, KMEANS, REFERENCE = 1, 2, 3  # purposes of :func:`rank` (4: the rows a selection borrows)
SUBSET, QUERIES, EVALUATED = 5, 6, 7  # a sparse projector's subset; sampled graph queries; classified test rows
QUANTISER = 8  # the rows a product quantiser (encode.pq) trains on


def sample(labels: np.ndarray, size: int, keys: np.ndarray | None, seed, purpose: int = 0) -> np.ndarray:
    """Sorted positions of about ``size`` rows, the same share of every class, by :func:`stratified_subset`
    in the seeded order of the rows' content ``keys`` (None, for rows without keys such as a user's
    embeddings: a seeded permutation of their positions)."""
    order = (
        rank(keys, seed, purpose)
        if keys is not None
        else np.random.default_rng([int(seed), 53, int(purpose)]).permutation(len(labels))
    )
    return stratified_subset(labels, size, order)


def seeded_sample(rows: np.ndarray, size: int, seed) -> np.ndarray:
    """At most ``size`` of ``rows``, a seeded sample kept in order (the val split's rows a learner
    validates on; the other classes' rows an NCMML with ``classes`` monitors, in memory and in the
    pipeline alike)."""
    return rows[np.sort(np.random.default_rng([seed, 7]).permutation(len(rows))[:size])]


def validation_split(labels: np.ndarray, size: int, keys: np.ndarray, seed) -> np.ndarray:
    """Positions held out of SGD for early stopping: a stratified sample (:func:`held_out`) of about
    a fifth of the rows at most and ``size`` at most (to within each class's rounding; SGD keeps at
    least one row of every class; a class too small for a row of its share may have none held out);
    ``keys``: the rows' :func:`row_keys`."""
    return held_out(labels, min(size, max(1, len(labels) // 5)), rank(keys, seed, VALIDATION), leave=1)
