"""A fold's training rows in the store, as a learner's ``fit_rows`` reads them
(:class:`metricpipe.tasks.rows.TrainingRows`): built on the worker that fits, from the staged data,
the fold's split and, for the SGD learners, the shuffled copy of the training rows."""

import numpy as np

from metricpipe.folds import Fold, fold_split
from metricpipe.stages.common import StagedRows
from metricpipe.stages.train.shuffle import stream_pools
from metricpipe.store import open_array
from metricpipe.tasks.splits import TRAIN, VAL


class StoreRows(StagedRows):
    """The stored train rows and the fold's validation rows (the user's val split, or the train rows a
    selection borrowed), in staged order: ``in_stats`` the stored train rows (what the statistics
    describe), ``fit`` the fold's train rows, ``val`` its validation rows (None: it has none)."""

    def __init__(
        self, data_url: str, fold: Fold, chunks: list, copy_url: str | None = None, block_rows: int | None = None
    ):
        stored = open_array(f"{data_url}/split")[:]
        split = fold_split(data_url, fold)
        rows = np.flatnonzero((stored == TRAIN) | (split == VAL))  # global staged rows
        super().__init__(data_url, chunks, rows)
        self._copy, self._block_rows = copy_url, block_rows
        self.in_stats = stored[rows] == TRAIN
        self.fit = split[rows] == TRAIN
        val = np.flatnonzero(split[rows] == VAL)
        self.val = val if len(val) else None

    def pools(self, keep, seed):
        """The pools of the shuffled copy (its rows are the stored train rows in layout order), the
        positions ``keep`` leaves out skipped."""
        train = self._rows[self.in_stats]
        layout_rows = open_array(f"{self._copy}/row")[:]
        keep_pos = keep[self.in_stats][np.searchsorted(train, layout_rows)]
        return stream_pools(self._copy, self._block_rows, seed, keep_pos)
