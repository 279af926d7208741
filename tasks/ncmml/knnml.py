"""k-NN metric learning (Mensink et al., Section 4): the estimator KNNML, W from the PCA directions
and minibatch SGD on the triplet hinge of Eq. 35 over the pools of :mod:`metricpipe.tasks.stream`."""

from numbers import Integral

import numpy as np

from metricpipe.tasks import knn, madds, metrics, moments, stream
from metricpipe.tasks.base import COUNT, POSITIVE, Interval, StrOptions
from metricpipe.tasks.ncmml.learner import SGD_CONSTRAINTS, MetricLearner
from metricpipe.tasks.ncmml.sgd import MetricSGD
from metricpipe.tasks.ncmml.triplets import l2_targets, sample_fixed_batch, sample_triplet_batch


class KNNML(MetricLearner):
    """k-NN metric learning (Mensink et al., Section 4): the triplet hinge of Eq. 35 with targets
    fixed (l2 same-class neighbours within the pool), all same-class images, or dynamic (the k
    closest under the current W); batches of ``batch`` images, 2/3 from one class (Section 4.2);
    the gradient from one sort per query (Algorithm 1). Early stopping on the kNN error of the
    validation rows against ``validation`` reference rows of the training set.

    Parameters
    ----------
    targets : {'dynamic', 'all', 'fixed'}, default='dynamic'
        Each query's target neighbours: the k same-class rows closest under the current W, every
        same-class row of the batch, or the k l2 same-class neighbours within the pool, fixed.
    k : int, default=5
        Target neighbours per query (and the k of the kNN error early stopping reads).
    batch : int, default=300
        Images per SGD step (at least 3), 2/3 of them from one class.
    lr : float or None, default=None
        As :class:`NCMML`'s: the step for rows of unit RMS norm; None: 0.1 (the grid's first value),
        a tenth of it after each divergence, at most 3 times.
    margin : float > 0, default=0.1
        The hinge's margin (Eq. 35's 1), a squared distance between rows of unit RMS norm under W.
        Searched (0.1, 1, 0.01) with lr: at the PCA start such rows are about 0.5-0.7 apart (digits,
        Fashion-MNIST 14 x 14), so with Eq. 35's margin 1 nearly every triplet violates, the first
        step grows W about 13-fold and early stopping mostly keeps the start; a margin of m is the
        same run as the start W0 / sqrt(m) with margin 1. 0.1 is the margin validation chose on
        digits, Fashion-MNIST, Fashion 14 x 14 and HOG (benchmarks/README.md).
    dim, iters, validate_every, validation, early_stopping, classes, random_state : as :class:`NCMML`.

    Attributes
    ----------
    components_ : ndarray of shape (n_features, dim), float32
        W^T: codes are ``X @ components_``, compared by Euclidean distance.
    classes_, history_, best_iter_, val_error_, lr_ : as :class:`NCMML`'s
    n_features_in_ : int
    """

    search_space = {"lr": [0.1, 0.0001, 0.001, 0.01, 1.0], "margin": [0.1, 1.0, 0.01]}
    selection_metric = "knn5"

    method = "knnml"
    _parameter_constraints = {
        **SGD_CONSTRAINTS,
        "targets": [StrOptions({"dynamic", "all", "fixed"})],
        "k": COUNT,
        "batch": [Interval(Integral, 3, None, closed="left")],
        "margin": POSITIVE,
    }

    def pool_rows(self, n_classes: int) -> None:
        """Every row: a pool gives batches only from classes with two rows in it, so no row count
        bounds what ``iters`` steps read."""
        return None

    def __init__(
        self,
        dim=None,
        targets="dynamic",
        k=5,
        batch=300,
        lr=None,
        margin=0.1,
        iters=2000,
        validate_every=100,
        validation=5000,
        early_stopping=True,
        classes=None,
        random_state=None,
    ):
        self.dim = dim
        self.targets = targets
        self.k = k
        self.batch = batch
        self.lr = lr
        self.margin = margin
        self.iters = iters
        self.validate_every = validate_every
        self.validation = validation
        self.early_stopping = early_stopping
        self.classes = classes
        self.random_state = random_state

    @staticmethod
    def reference_rows(labels: np.ndarray, keep: np.ndarray, keys: np.ndarray, size: int, seed) -> np.ndarray:
        """Positions of the reference rows (among SGD's rows) the validation kNN error searches."""
        pos = np.flatnonzero(keep)
        return pos[stream.stratified_subset(labels[pos], size, stream.rank(keys[pos], seed, stream.REFERENCE))]

    def _side_inputs(self, rows, keep, means, trained, n_classes, seed) -> dict:
        """The reference rows (among SGD's) the validation queries search."""
        if not self.early_stopping:
            return {}
        ref = self.reference_rows(rows.labels, keep, rows.keys, self.validation, seed)
        return {"reference": (rows.take(ref), rows.labels[ref])}

    def _step_cost(self, m, D, K, d, pool):
        """A triplet step (Algorithm 1): the batch drawn from its pool (a pass over the pool's labels
        per class; fixed targets: each pool's same-class l2 neighbours, shared by its steps), the
        projections, one sort per query of its distances to the batch, and the gradient 2 W X^T A X
        (``multi_dot``'s order)."""
        queries = max(2, int(round(2.0 / 3.0 * m)))
        draw = madds.passes(pool, K + 2) + madds.sort(pool)
        if self.targets == "fixed":  # l2_targets: per class, its rows among its rows, once per pool
            per_pool = K * madds.gemm(pool / K, pool / K, D, float32=True) + madds.passes(pool * pool / K, 3)
            draw += per_pool / max(1, pool // m)
        gradient = madds.chain(d, D, m, m, D) + madds.passes(m * m, 16)
        ranking = madds.passes(queries * m, 50)  # lexsort of each query's distances, counts put back
        if self.targets == "dynamic":  # the k closest positives under W: their distances, sorted
            ranking += madds.passes(queries * queries, 30)
        return draw + madds.passes(m * D, 3) + madds.gemm(m, d, D) + ranking + gradient + 60 * madds.CALL

    def _validation_cost(self, n_val, D, K, d):
        """The validation rows and the reference rows projected, and a k-NN search among the latter."""
        n_ref = int(self.validation)
        return madds.gemm(n_val + n_ref, d, D) + madds.passes((n_val + n_ref) * D, 2) + knn.search_cost(n_val, n_ref, d)

    def _batches(self, X, y, rng):
        """Triplet batches of ``batch`` rows, 2/3 from one class (Section 4.2), as many as the pool holds."""
        tl2 = l2_targets(X, y, self.k) if self.targets == "fixed" else None
        out = []
        for _ in range(max(1, len(y) // self.batch)):
            drawn = (
                sample_fixed_batch(y, tl2, self.batch, 2.0 / 3.0, rng)
                if tl2 is not None
                else sample_triplet_batch(y, self.batch, 2.0 / 3.0, rng)
            )
            if drawn is not None:
                out.append(drawn)
        return out

    def _begin(self, statistics: dict, labels=None, reference=None):
        """W from the statistics' PCA directions, SGD on the triplet hinge (Eq. 35). ``reference`` =
        (X_ref, y_ref): the training rows the validation queries search (:meth:`reference_rows`; None
        without early stopping)."""
        W0 = self._start(statistics)
        C = len(self.classes_)
        self._fit_classes(statistics, labels)  # (checks ``classes`` against the labels)
        sgd = MetricSGD(
            W0,
            "knn",
            self._searched("lr"),
            n_classes=C,
            targets=self.targets,
            k=self.k,
            scale=moments.row_scale(statistics),
            margin=self.margin,
        )
        return sgd, {}

    def _validation_error(self, side: dict):
        """The kNN error of the validation rows among the reference rows."""
        if not self.early_stopping:
            return None
        Xr, yr = np.asarray(side["reference"][0], np.float64), np.asarray(side["reference"][1], np.int64)
        return lambda s, Xv, yv: _knn_error(s, Xv, yv, Xr, yr, self.k)


def _knn_error(sgd: MetricSGD, Xv, yv, Xr, yr, k: int) -> float:
    """Top-1 error of the kNN classifier (k neighbours among the reference rows) under the current W."""
    k = min(k, len(Xr))
    with np.errstate(over="ignore", invalid="ignore"):  # a W on its way to diverging: a poor error, not a crash
        _, nb = knn.block_topk(
            (np.asarray(Xv, np.float64) @ sgd.W.T).astype(np.float32), (Xr @ sgd.W.T).astype(np.float32), k
        )
    rank = metrics.knn_class_ranking(yr[nb], sgd.n_classes, k)
    return float((rank[:, 0] != yv).mean())
