"""Pairs for NML and linear ML: drawn from the labels inside a pool of rows (:func:`sample_pairs`), or
given by the user and visited by the layout blocks of their two rows (:func:`pair_groups`)."""

import numpy as np


def sample_pairs(y: np.ndarray, count: int, rng: np.random.Generator):
    """``count`` pairs of distinct rows of one pool with class codes ``y`` (m,), in random order:
    half similar (s = +1), half dissimilar (s = -1).

    A similar pair is a row drawn uniformly among the rows whose class has another row in the pool
    and a second row of its class; a dissimilar pair a row drawn uniformly and a row of another
    class. When the pool cannot give one kind (one class only; no class with two rows), all pairs
    are of the other kind; a pool of fewer than two rows gives none. The draws depend on the order
    of the class codes only, not on their values, so the codes of the staged data and those of
    ``np.unique`` give the same pairs.

    Returns
    -------
    i, j : ndarray of shape (n_pairs,), int64 rows of the pool; s : ndarray (n_pairs,), float32 +-1
    """
    y = np.asarray(y)
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32))
    if count <= 0 or len(y) < 2:
        return empty
    _, codes, counts = np.unique(y, return_inverse=True, return_counts=True)
    codes = codes.ravel()
    order = np.argsort(codes, kind="stable")  # rows grouped by class, in pool order inside each
    start = np.r_[0, np.cumsum(counts)[:-1]]
    rank = np.empty(len(y), np.int64)
    rank[order] = np.arange(len(y)) - start[codes[order]]  # place of each row inside its class
    can_pos, can_neg = bool((counts >= 2).any()), len(counts) >= 2
    n_pos = (count // 2 if can_neg else count) if can_pos else 0
    n_neg = count - n_pos if can_neg else 0
    # similar: i among the rows of classes with >= 2 rows, j another row of its class
    eligible = np.flatnonzero(counts[codes] >= 2)
    i_pos = eligible[rng.integers(0, len(eligible), n_pos)] if n_pos else np.zeros(0, np.int64)
    c = codes[i_pos]
    k = rng.integers(0, counts[c] - 1) if n_pos else np.zeros(0, np.int64)
    j_pos = order[start[c] + k + (k >= rank[i_pos])]  # skips i itself
    # dissimilar: i any row, j the k-th row outside its class
    i_neg = rng.integers(0, len(y), n_neg)
    c = codes[i_neg]
    k = rng.integers(0, len(y) - counts[c]) if n_neg else np.zeros(0, np.int64)
    j_neg = order[np.where(k < start[c], k, k + counts[c])]
    perm = rng.permutation(n_pos + n_neg)
    s = np.r_[np.ones(n_pos, np.float32), -np.ones(n_neg, np.float32)]
    return np.r_[i_pos, i_neg][perm].astype(np.int64), np.r_[j_pos, j_neg][perm].astype(np.int64), s[perm]


def pair_groups(pos_i: np.ndarray, pos_j: np.ndarray, n_rows: int, block_rows: int, seed: int):
    """Endless visiting order of user pairs over the layout of :mod:`metricpipe.tasks.stream`.

    The pairs are grouped by the (unordered) layout blocks of their two rows; every epoch visits
    the groups in a seeded order and each group's pairs in a seeded order. Since every layout block
    is a uniform sample of the rows, each group's pairs are a random subset of all pairs.

    Parameters
    ----------
    pos_i, pos_j : ndarray of shape (n_pairs,)
        Layout positions of the pairs' two rows.
    n_rows, block_rows : int
        Rows of the layout and rows per layout block.

    Yields
    ------
    blocks : tuple of one or two block numbers (ascending); sel : ndarray, pair indices in visiting order
    """
    n_blocks = -(-n_rows // block_rows)
    bi, bj = pos_i // block_rows, pos_j // block_rows
    lo, hi = np.minimum(bi, bj), np.maximum(bi, bj)
    key = lo * n_blocks + hi
    by = np.argsort(key, kind="stable")
    bounds = np.flatnonzero(np.r_[True, np.diff(key[by]) != 0, True])
    epoch = 0
    while True:
        rng = np.random.default_rng([seed, 23, epoch])
        for g in rng.permutation(len(bounds) - 1):
            sel = by[bounds[g] : bounds[g + 1]]
            b1, b2 = int(lo[sel[0]]), int(hi[sel[0]])
            yield ((b1,) if b1 == b2 else (b1, b2)), rng.permutation(sel)
        epoch += 1
