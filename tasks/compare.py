"""Paired comparison of two models over repeats: the interval the report's verdict reads.

Repeat r of every learned model is trained with its own seed (and its own borrowed validation rows);
both models of a pair are scored on the same test rows in repeat r, so the per-repeat differences
are paired. A model without a seed has the same value in every repeat.
"""

import math

import numpy as np
from scipy import stats


def paired_interval(a, b, level: float = 0.95) -> tuple[float, float, float]:
    """Mean of ``a - b`` and its two-sided Student t confidence interval.

    Parameters
    ----------
    a, b : (n_repeats,) per-repeat values of two models (paired by repeat).
    level : the interval's confidence level.

    Returns
    -------
    (mean, low, high) : the mean difference and the interval ``mean -+ t_{n-1} sd / sqrt(n)``
        (``scipy.stats.ttest_rel(a, b).confidence_interval(level)``); with one repeat the interval
        is (nan, nan): nothing measures the spread.
    """
    d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    if d.ndim != 1 or not len(d):
        raise ValueError(f"paired_interval takes two 1-d arrays of the same, non-zero length; got shape {d.shape}")
    mean = float(d.mean())
    if len(d) < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.5 + level / 2, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d)))
    return mean, mean - half, mean + half
