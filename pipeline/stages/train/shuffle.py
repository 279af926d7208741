"""The shuffled copy of the training rows that SGD learners stream (`metricpipe.tasks.stream`).

Position j of the copy holds training row ``pi[j]`` (``tasks.stream.layout`` of the rows' content
keys, ``row_key``, written at staging), one row-block per
layout block, so that reading the copy block by block gives pools that are uniform samples of the
whole training set, however the source was ordered. It is written out of core in two passes of
one read and one write each: every staged row-block sends each of its training rows to the piece
(source block, target block) of a 4-D scratch array (one chunk per piece, so no two tasks write the
same chunk), then every target block gathers its pieces and writes its rows in layout order. No
task holds more than one row-block of features.

The unit ``shuffled/KEY`` holds ``features`` (n_train, D) float32, ``label`` (n_train,) and ``row``
(n_train,), the global staged row of each position; its key is the staged data's and the seed's.
"""

import time

import numpy as np

from metricpipe import budget
from metricpipe.context import StageContext
from metricpipe.store import Unit, create_array, hash_key, open_array, read_attrs, row_chunk, save_arrays
from metricpipe.tasks import stream

TRAIN = 0


def _plan(data, seed: int):
    """(train rows, layout pi, destination position of each train row, block rows)."""
    train = data.rows(TRAIN)
    pi = stream.layout(open_array(f"{data.url}/row_key")[:][train], seed)
    dest = np.empty(len(train), np.int64)
    dest[pi] = np.arange(len(train))
    return train, pi, dest, data.chunk_rows


def _scatter(data_url: str, url: str, src: int, a: int, b: int, dest: np.ndarray, block_rows: int, written: np.ndarray):
    """Pass 1: the train rows of staged block ``src`` (rows a:b; ``dest`` the layout positions of its
    train rows, in order) go to the pieces (src, target block), each sorted by destination; only
    the target blocks in ``written`` (sorted) are made."""
    split = open_array(f"{data_url}/split")[a:b]
    X = open_array(f"{data_url}/features")[a:b][split == TRAIN]
    out = open_array(f"{url}/pieces", mode="r+")
    target = dest // block_rows
    for j in np.intersect1d(np.unique(target), written):
        mine = np.flatnonzero(target == j)
        mine = mine[np.argsort(dest[mine], kind="stable")]
        piece = np.full((out.shape[2], X.shape[1]), np.nan, np.float32)
        piece[: len(mine)] = X[mine]
        out[src, j] = piece
    return int(len(X))


def _gather_block(url: str, j: int, counts: np.ndarray, block_rows: int, n_train: int, dests: list):
    """Pass 2: target block j from its pieces; ``dests[i]`` are the sorted layout positions of piece (i, j)."""
    pieces = open_array(f"{url}/pieces")
    lo = j * block_rows
    hi = min(n_train, lo + block_rows)
    Y = np.empty((hi - lo, pieces.shape[3]), np.float32)
    for i in np.flatnonzero(counts):
        Y[dests[i] - lo] = pieces[i, j][: counts[i]]
    open_array(f"{url}/features", mode="r+")[lo:hi] = Y
    return hi - lo


def stored_bytes(rows: int, n_features: int, scratch: bool = False) -> list:
    """What a shuffled copy of ``rows`` rows writes at the most (the disk rule; LZ4 may store less);
    with ``scratch``, at its peak, while the pieces of the first pass are on disk beside it."""
    copy = 4.0 * rows * n_features
    return [
        (
            f"the shuffled copy of {rows:,} training rows{' and its scratch pieces' if scratch else ''}",
            copy * (2 if scratch else 1),
            "",
        )
    ]


def first_rows(n_train: int, block_rows: int, seed: int, rows: int | None) -> int:
    """Rows of the copy written for ``seed`` when SGD reads ``rows`` of them (None: every row): the
    blocks epoch 0 visits first until they hold that many (``stream.first_blocks``)."""
    return _rows_in(stream.first_blocks(n_train, block_rows, seed, rows), n_train, block_rows)


def _rows_in(blocks, n_train: int, block_rows: int) -> int:
    return int(sum(min(block_rows, n_train - j * block_rows) for j in blocks))


def shuffled(ctx: StageContext, data, seed: int) -> Unit:
    """The committed shuffled copy of the training rows for ``seed`` (written when missing): the
    blocks that epoch 0 visits first until they hold ``ctx.shuffle_rows[seed]`` rows, or all of
    them (its attribute ``blocks`` lists those written)."""
    n = int((data.split == TRAIN).sum())
    br = data.chunk_rows
    written = stream.first_blocks(n, br, seed, ctx.shuffle_rows.get(seed))
    n_out = -(-n // br)
    part = None if len(written) == n_out else len(written)
    key = {"stage": "shuffled", "version": 1, "data": data.unit.key, "seed": int(seed), "layout": "row-keys"}
    if part is not None:  # a full copy keeps the key it had before partial copies (stores keep theirs)
        key["blocks"] = part
    unit = ctx.store.unit("shuffled", hash_key(key))
    if ctx.reuse(unit, "train"):
        return unit
    rows = _rows_in(written, n, br)
    budget.check_disk(ctx.store, ctx.config, stored_bytes(rows, data.n_features, scratch=True), who="the train stage")
    t0 = time.perf_counter()
    unit.begin()
    train, pi, dest, br = _plan(data, seed)
    D = data.n_features
    blocks = [(a, b) for a, b in data.chunks]
    # train positions of each staged block, and its rows' target blocks: piece sizes
    starts = np.searchsorted(train, [a for a, _ in blocks])
    stops = np.searchsorted(train, [b for _, b in blocks])
    counts = np.zeros((len(blocks), n_out), np.int64)
    for i, (lo, hi) in enumerate(zip(starts, stops)):
        counts[i] = np.bincount(dest[lo:hi] // br, minlength=n_out)
    piece_rows = max(1, int(counts.max()))
    save_arrays(
        unit.url,
        {},
        {
            "seed": int(seed),
            "block_rows": int(br),
            "data": data.unit.key,  # the group
            "blocks": written.tolist(),
        },
    )
    create_array(
        f"{unit.url}/pieces", (len(blocks), n_out, piece_rows, D), (1, 1, piece_rows, D), np.float32, fill_value=np.nan
    )
    # one chunk per block, no larger than the rows (a pool read decoded 64 MB: 38 ms, 2,000 reads a model)
    create_array(f"{unit.url}/features", (n, D), (row_chunk(br, n), D), np.float32, rows=True)
    create_array(f"{unit.url}/label", (n,), (max(1, n),), np.int32)[:] = data.labels[train][pi]
    create_array(f"{unit.url}/row", (n,), (max(1, n),), np.int64)[:] = train[pi]
    futs = [
        ctx.submit(_scatter, data.url, unit.url, i, a, b, dest[lo:hi], br, written, name="shuffle-scatter")
        for i, ((a, b), lo, hi) in enumerate(zip(blocks, starts, stops))
        if hi > lo
    ]
    ctx.gather(
        futs, "train", [f"shuffling rows {a}..{b - 1}" for (a, b), lo, hi in zip(blocks, starts, stops) if hi > lo]
    )
    # each source block's destinations sorted once: its piece for target block j is one slice of them
    ends = np.cumsum(counts, axis=1)
    sorted_dest = [np.sort(dest[lo:hi]) for lo, hi in zip(starts, stops)]
    gathers = []
    for j in written:
        dests = [d[e[j] - c[j] : e[j]] for d, e, c in zip(sorted_dest, ends, counts)]
        gathers.append(ctx.submit(_gather_block, unit.url, j, counts[:, j], br, n, dests, name="shuffle-gather"))
    ctx.gather(gathers, "train", [f"shuffled block {j}" for j in written])
    unit.store.fs.rm(f"{unit.root}/pieces", recursive=True)  # scratch: only the layout-ordered copy stays
    ctx.commit(
        unit,
        {
            "n_train": int(n),
            "block_rows": int(br),
            "seed": int(seed),
            "blocks": len(written),
            "seconds": round(time.perf_counter() - t0, 3),
        },
    )
    ctx.log(
        f"  train: shuffled {rows} training rows"
        + (f" ({len(written)} of {n_out} blocks, what SGD reads)" if part else "")
        + f" for seed {seed} "
        f"({time.perf_counter() - t0:.1f} s)"
    )
    return unit


def read_pool(url: str, block: int, block_rows: int, positions: np.ndarray):
    """(X, y) of the layout ``positions`` (all in ``block``), read from that one block of the copy."""
    lo = block * block_rows
    X = open_array(f"{url}/features")[lo : lo + block_rows]
    y = open_array(f"{url}/label")[lo : lo + len(X)]
    return X[positions - lo], y[positions - lo].astype(np.int64)


def stream_pools(url: str, block_rows: int, seed: int, keep: np.ndarray | None = None):
    """On a worker: the endless pools of ``tasks.stream.epoch_order`` read from the shuffled copy,
    one block at a time; ``keep`` (n_train,) bool over layout positions (False: validation rows).
    Yields (X_pool, y_pool), exactly what ``tasks.stream.pools`` yields in memory."""
    n = open_array(f"{url}/label").shape[0]
    written = set(read_attrs(url).get("blocks", range(-(-n // block_rows))))
    # a copy of one block is read once: a pool per SGD step would decode it again at every step
    # (2,000 reads of 7 MB for a model on 9,000 x 196 rows), and the pool's rows are a copy anyway
    whole = read_pool(url, 0, block_rows, np.arange(n)) if n <= block_rows and written == {0} else None
    epoch = 0
    while True:
        for b, pos in stream.epoch_order(n, block_rows, epoch, seed, keep):
            if b not in written:  # the learner's pool_rows() was too low: a bug, never silent
                raise RuntimeError(
                    f"the shuffled copy {url} holds {len(written)} blocks and SGD asked for "
                    f"block {b} (epoch {epoch}); its pool_rows() undercounts what it reads"
                )
            yield read_pool(url, b, block_rows, pos) if whole is None else (whole[0][pos], whole[1][pos])
        epoch += 1
