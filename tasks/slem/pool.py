"""The negative pool every exemplar learner is defined on (SLEM, kernel SLEM, ESVM): its settings
``{split, count, seed}``, the seeded draw of its rows, and the learners' shared entry points."""

from numbers import Integral

import numpy as np

from metricpipe.tasks.base import Learner
from metricpipe.tasks.errors import InputError

# the negative pool when ``negatives`` is None or leaves a key out: 15,000 seeded train images
NEGATIVES = {"split": "train", "count": 15000, "seed": 0}


def check_negatives(negatives: dict | None) -> dict:
    """The pool settings ``{split, count, seed}`` with the defaults of :data:`NEGATIVES` filled in.

    ``split``: a split name other than test (the evaluation images: never negatives); ``count``: an
    int >= 2 or None (every image of the split); ``seed``: an int >= 0. Raises :class:`InputError`
    on anything else.
    """
    if negatives is not None and not isinstance(negatives, dict):
        raise InputError(f"negatives must be a mapping with keys among split, count, seed; got {negatives!r}")
    neg = {**NEGATIVES, **(negatives or {})}
    odd = sorted(set(neg) - set(NEGATIVES), key=str)
    if odd:
        raise InputError(
            f"negatives: keys among split, count, seed expected; got {', '.join(map(repr, odd))}; remove them"
        )
    if not isinstance(neg["split"], str) or neg["split"] == "test":
        raise InputError(
            f"negatives.split must name the split of the negative images (never test: those are the "
            f"queries); got {neg['split']!r}"
        )
    c = neg["count"]
    if c is not None and (not isinstance(c, Integral) or isinstance(c, bool) or c < 2):
        raise InputError(f"negatives.count must be an integer >= 2 (images sampled) or None for all of them; got {c!r}")
    s = neg["seed"]
    if not isinstance(s, Integral) or isinstance(s, bool) or s < 0:
        raise InputError(f"negatives.seed must be an integer >= 0; got {s!r}")
    return neg


def pool_positions(n: int, negatives: dict | None, who: str = "SLEM") -> np.ndarray:
    """Sorted positions (in 0..n-1) of the negative pool among n candidate images: all of them, or
    a seeded sample of ``negatives.count`` (``np.random.default_rng([seed, 29])``) when there are
    more. The pipeline applies it to the rows of ``negatives.split``; ``fit(X)`` to the rows of X."""
    neg = check_negatives(negatives)
    if n < 2:
        raise InputError(f"{who} needs a pool of at least 2 negative images; got {n} sample(s); give more rows")
    if neg["count"] is not None and neg["count"] < n:
        rng = np.random.default_rng([neg["seed"], 29])
        return np.sort(rng.choice(n, int(neg["count"]), replace=False))
    return np.arange(n)


class PoolLearner(Learner):
    """A learner defined on a pool of negatives (SLEM, kernel SLEM, ESVM): ``fit`` samples the pool
    from X, ``fit_pool`` takes it as it is; both end in ``_fit_pool``."""

    feeds = "pool"

    def _pool_size(self) -> int:
        """Images of its pool as its parameters say: ``negatives.count`` (its default when unset; when
        None, every image of the split, which only the pipeline knows: the default count stands in)."""
        return int(check_negatives(self.negatives)["count"] or NEGATIVES["count"])

    def fit(self, X, y=None):
        """Fit on a seeded sample of ``negatives.count`` rows of X (all rows when there are fewer).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : ignored

        Returns
        -------
        self
        """
        self._validate_params()
        X = self._check_X(X, reset=True)
        return self._fit_pool(X[pool_positions(len(X), self.negatives, type(self).__name__)])

    def fit_pool(self, Xneg):
        """Fit on the pool itself, every row of it (the pipeline's entry point).

        Parameters
        ----------
        Xneg : array-like of shape (n, n_features)
            The negatives, n >= 2.

        Returns
        -------
        self
        """
        self._validate_params()
        check_negatives(self.negatives)
        return self._fit_pool(self._check_X(Xneg, reset=True))
