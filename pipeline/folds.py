"""Which rows a model is fitted on: the user's split, or the split with validation rows borrowed.

A :class:`Fold` travels with every train task. ``Fold()`` is the staged data's own split: a final
model (a baseline, a refit, a model without validation) fits every train row. ``Fold(borrow=s)``
is the split a parameter selection works on when the data has no ``val`` rows: a stratified share
of the train rows, drawn with seed ``s`` (:func:`metricpipe.tasks.splits.borrow`), is ``val`` for
the candidates, which neither train on it nor take it into their class means. The drivers read the
split through :func:`fold_split` on the worker, so no row list crosses the scheduler.
"""

from dataclasses import dataclass

import numpy as np

from metricpipe.store import array_names, open_array
from metricpipe.tasks import splits


@dataclass(frozen=True)
class Fold:
    borrow: int | None = None  # seed of the borrowed validation rows; None: the user's split

    def key(self) -> dict:
        """What a model unit's key adds for this fold ({} for the user's split: final models keep
        the key they would have without selection)."""
        return {} if self.borrow is None else {"fold": {"borrow": int(self.borrow)}}


def borrow_seed(split_seed: int, repeat: int) -> int:
    """The seed of repeat ``repeat``'s borrowed validation rows (repeat 0: ``data.split.seed``)."""
    return int(split_seed) + int(repeat)


def fold_split(data_url: str, fold: Fold) -> np.ndarray:
    """The split codes (n_rows,) a model of ``fold`` is fitted on, read from the staged data."""
    split = open_array(f"{data_url}/split")[:]
    if fold.borrow is None:
        return split
    labels = open_array(f"{data_url}/label")[:]
    keys = open_array(f"{data_url}/row_key")[:]
    keep = None
    if "pair_i" in array_names(data_url):  # rows the user's pairs join stay train
        keep = np.unique(np.concatenate([open_array(f"{data_url}/pair_i")[:], open_array(f"{data_url}/pair_j")[:]]))
    return splits.borrow(split, labels, keys, fold.borrow, keep)


def borrowing(split: np.ndarray, val_setting) -> bool:
    """Whether a run borrows validation rows: ``data.split.val: auto`` and no ``val`` rows of its own."""
    return val_setting == "auto" and not (np.asarray(split) == splits.VAL).any()
