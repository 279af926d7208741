"""What each row is for: the split codes and the validation rows borrowed from the train split.

The staged data stores the user's split, one int8 code per row (:data:`SPLIT_NAMES`, code =
position): ``train`` is every row the user called train, and everything a run finally makes from
"train" uses all of it (statistics, baselines, class means, the kNN database, exports, the final
models). When the data has no ``val`` rows, ``data.split.val: auto`` *borrows* a stratified share
of the train rows (:func:`borrow`) to choose parameters and stop training early; the chosen
candidate is then refitted on every train row. The borrowed rows are a function of the rows'
content keys and a seed, never of where the rows are stored, so the same rows stored in another
order borrow the same rows, and a repeat (another seed) borrows others.

``data.split.classes`` holds whole classes out (:func:`hold_out`): their rows are recoded
``unseen_train`` (train, val and negatives rows: the means and the kNN database of the unseen-class
evaluation) and ``unseen_test`` (their test rows, scored). No stage that reads ``train``, ``val``
or ``test`` rows sees them: statistics, neighbours, the shuffled copy, every learner, the borrowed
validation rows and the seen-class evaluation. A user's split column names :data:`USER_SPLITS` only.
"""

import numpy as np

from metricpipe.tasks import stream
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.validate import check_pair_indices

SPLIT_NAMES = (
    "train",
    "test",
    "val",
    "negatives",  # code = position; stored as int8 with flag_meanings
    "unseen_train",
    "unseen_test",
)
TRAIN, TEST, VAL, NEGATIVES, UNSEEN_TRAIN, UNSEEN_TEST = range(len(SPLIT_NAMES))
USER_SPLITS = SPLIT_NAMES[:4]  # what a split column (and negatives.split) may name; the others are made here

BORROW = 4  # purpose of :func:`metricpipe.tasks.stream.rank` for the borrowed validation rows


def auto_val_size(n_train: int) -> int:
    """Validation rows borrowed from a train split of ``n_train`` rows (``data.split.val: auto``): a
    tenth, at least 500 (or a fifth of a small train split), at most 10,000: enough to rank
    parameter candidates (a standard error of about 0.3 points on an error rate at 10,000 rows)."""
    return int(min(10_000, max(0.1 * n_train, min(500, 0.2 * n_train))))


def borrow(
    split: np.ndarray, labels: np.ndarray, keys: np.ndarray, seed: int, keep: np.ndarray | None = None
) -> np.ndarray:
    """The split a parameter selection works on: ``split`` with a stratified share of its train rows
    (:func:`auto_val_size`, :func:`~metricpipe.tasks.stream.held_out`) recoded ``val``; every class
    keeps at least two train rows, and a few-shot class may give none. A split that has ``val`` rows
    of its own is returned as it is (the user's val rows choose).

    Parameters
    ----------
    split : ndarray of shape (n_rows,), int8 codes of :data:`SPLIT_NAMES`
    labels : ndarray of shape (n_rows,), the rows' class codes
    keys : ndarray of shape (n_rows,), the rows' content keys (:func:`~metricpipe.tasks.stream.row_keys`)
    seed : int, the draw (a repeat borrows with its own seed)
    keep : optional ndarray of row indices that stay train (the rows the user's pairs join)

    Returns
    -------
    ndarray of shape (n_rows,), int8
    """
    split = np.asarray(split)
    if (split == VAL).any():
        return split
    free = split == TRAIN
    if keep is not None and len(keep):
        keep = np.asarray(keep, np.int64)
        free[keep[(keep >= 0) & (keep < len(split))]] = False
    train = np.flatnonzero(free)
    rank = stream.rank(np.asarray(keys)[train], seed, BORROW)
    pos = stream.held_out(np.asarray(labels)[train], auto_val_size(len(train)), rank, leave=2)
    out = split.astype(np.int8, copy=True)
    out[train[pos]] = VAL
    return out


UNSEEN = 7  # purpose of the seeded draw of held-out classes (``data.split.classes`` as a fraction)


def draw_unseen(n_classes: int, fraction: float, seed: int) -> np.ndarray:
    """Sorted class codes of the ``fraction * n_classes`` classes (rounded half up) a seeded draw holds out."""
    n = int(np.floor(fraction * n_classes + 0.5))
    return np.sort(np.random.default_rng([int(seed), UNSEEN]).choice(n_classes, n, replace=False))


def hold_out(split: np.ndarray, labels: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """``split`` with the rows of the class codes ``classes`` recoded: test rows ``unseen_test``, every
    other row (train, val, negatives) ``unseen_train``.

    Parameters
    ----------
    split : ndarray of shape (n_rows,), int8 codes of :data:`USER_SPLITS`
    labels : ndarray of shape (n_rows,), the rows' class codes
    classes : the held-out class codes

    Returns
    -------
    ndarray of shape (n_rows,), int8
    """
    out = np.asarray(split).astype(np.int8, copy=True)
    held = np.isin(labels, classes)
    out[held] = np.where(out[held] == TEST, UNSEEN_TEST, UNSEEN_TRAIN)
    return out


def unseen_classes(split: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Sorted class codes held out of the run (rows ``unseen_train`` or ``unseen_test``); empty when none."""
    split = np.asarray(split)
    return np.unique(np.asarray(labels)[(split == UNSEEN_TRAIN) | (split == UNSEEN_TEST)])


def seen_classes(split: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Sorted class codes with train rows: the classes a run's learners may see."""
    return np.unique(np.asarray(labels)[np.asarray(split) == TRAIN])


def check_pairs(i, j, y, split, where: str, random_split: bool = True):
    """User pairs (data.pairs): integer indices of training rows, y in {-1, +1} (``random_split``:
    the split was drawn by data.split.test, not read from the data's split column)."""
    check_pair_indices(i, j, y, len(split), where)
    for a in (np.asarray(i), np.asarray(j)):
        if (split[a] != TRAIN).any():
            k = int(np.flatnonzero(split[a] != TRAIN)[0])
            part = SPLIT_NAMES[int(split[a[k]])] if 0 <= int(split[a[k]]) < len(SPLIT_NAMES) else "another"
            how = (
                " (data.split.test draws the test rows at random: give the data a split column to choose "
                "the training rows)"
                if part == "test" and random_split
                else ""
            )
            raise InputError(
                f"{where}: pair {k} uses row {int(a[k])}, which is in the {part} split, not train; "
                f"pairs must only join training images{how}"
            )
