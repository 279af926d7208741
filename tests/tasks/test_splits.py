"""The split codes: classes held out of a run (data.split.classes) get codes of their own."""

import numpy as np

from metricpipe.tasks import splits
from metricpipe.tasks.splits import NEGATIVES, TEST, TRAIN, UNSEEN_TEST, UNSEEN_TRAIN, VAL


def test_held_out_classes_test_rows_are_unseen_test_and_their_other_rows_unseen_train():
    split = np.array([TRAIN, TEST, VAL, NEGATIVES, TRAIN, TEST, VAL, TRAIN], np.int8)
    labels = np.array([0, 0, 0, 0, 1, 1, 1, 2])
    out = splits.hold_out(split, labels, [0, 2])
    assert out.tolist() == [UNSEEN_TRAIN, UNSEEN_TEST, UNSEEN_TRAIN, UNSEEN_TRAIN, TRAIN, TEST, VAL, UNSEEN_TRAIN]
    assert out.dtype == np.int8 and split[0] == TRAIN  # a copy
    assert splits.unseen_classes(out, labels).tolist() == [0, 2]
    assert splits.seen_classes(out, labels).tolist() == [1]
    assert splits.unseen_classes(split, labels).tolist() == []
    # the borrowed validation rows come from train rows only: none of a held-out class
    borrowed = splits.borrow(np.where(out == VAL, TRAIN, out).astype(np.int8), labels, np.arange(8, dtype=np.uint64), 0)
    assert not np.isin(labels[borrowed == VAL], [0, 2]).any()


def test_a_fraction_of_the_classes_is_a_seeded_draw_of_that_many():
    a = splits.draw_unseen(10, 0.2, 0)
    assert len(a) == 2 and a.tolist() == sorted(a.tolist()) and a.max() < 10
    assert a.tolist() == splits.draw_unseen(10, 0.2, 0).tolist()
    draws = {tuple(splits.draw_unseen(10, 0.2, s)) for s in range(20)}
    assert len(draws) > 5  # another seed, other classes
    assert len(splits.draw_unseen(1000, 0.2, 1)) == 200 and len(splits.draw_unseen(5, 0.5, 0)) == 3
