import math

import numpy as np
import pytest
from scipy import stats

from metricpipe.tasks.compare import paired_interval


def test_paired_interval_is_scipy_s_paired_t_interval():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0.5, 0.01, 5), rng.normal(0.49, 0.01, 5)
    mean, lo, hi = paired_interval(a, b)
    ci = stats.ttest_rel(a, b).confidence_interval(0.95)
    assert mean == pytest.approx(np.mean(a - b)) and (lo, hi) == (pytest.approx(ci.low), pytest.approx(ci.high))


def test_a_model_better_on_one_seed_of_five_has_an_interval_around_zero():
    base = np.full(5, 0.50)  # a baseline without seed: one value in every repeat
    mean, lo, hi = paired_interval([0.60, 0.49, 0.50, 0.495, 0.50], base)
    assert mean > 0 and lo < 0 < hi
    mean, lo, hi = paired_interval([0.52, 0.53, 0.51, 0.52, 0.525], base)
    assert 0 < lo < mean < hi


def test_one_repeat_measures_no_spread_and_equal_differences_none_either():
    mean, lo, hi = paired_interval([0.6], [0.5])
    assert mean == pytest.approx(0.1) and math.isnan(lo) and math.isnan(hi)
    assert paired_interval([0.6, 0.7], [0.5, 0.6]) == pytest.approx((0.1, 0.1, 0.1))
    with pytest.raises(ValueError, match="same, non-zero length"):
        paired_interval([], [])
