"""The estimators NCMML and NCMC (Mensink et al.): W from the PCA directions, minibatch SGD
(:class:`~metricpipe.tasks.ncmml.sgd.MetricSGD`) over the pools of :mod:`metricpipe.tasks.stream`, in
memory from arrays and in the pipeline from the shuffled copy of the train rows."""

from numbers import Integral

import numpy as np
from sklearn.base import ClassifierMixin
from sklearn.utils.validation import check_is_fitted

from metricpipe.tasks import madds, moments, stream
from metricpipe.tasks.base import COUNT, Options, StrOptions, seed_of
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.ncmml.kmeans import class_kmeans
from metricpipe.tasks.ncmml.learner import SGD_CONSTRAINTS, MetricLearner
from metricpipe.tasks.ncmml.objectives import implied_bias, metrics_nearest, mixture_class_scores, ncm_scores
from metricpipe.tasks.ncmml.sgd import MetricSGD
from metricpipe.tasks.rows import ArrayRows, TrainingRows

KMEANS_SAMPLE = 2000  # rows per class NCMC's k-means++ seeds from, at most ...
KMEANS_BYTES = 2.5e8  # ... and at most this many bytes of float32 rows over all classes (>= k per class)


class _NCMClassifier(ClassifierMixin):
    """predict / predict_proba of the nearest-class-mean rule (Eq. 5), its mixture (Eq. 22) or its
    dot form with class biases (Eq. 27), over ``centroids_`` (input space) and their classes."""

    fitted_attributes = ("centroids_", "centroid_classes_", "class_bias_")

    def _class_scores(self, X):
        check_is_fitted(self)
        X = self._check_X(X, reset=False).astype(np.float64)
        W = self.components_.astype(np.float64)
        Y, Mp = X @ W, self.centroids_.astype(np.float64) @ W
        C = len(self.classes_)
        if self.class_bias_ is not None:
            scores = np.full((len(X), C), -np.inf)
            scores[:, self.centroid_classes_] = ncm_scores(Y, Mp, self.class_bias_[self.centroid_classes_])
            return scores
        return mixture_class_scores(Y, Mp, self.centroid_classes_, C)

    def add_centroids(self, centroids, classes):
        """Extend the fitted classifier with new classes without touching W (Sections 3.6 and 5.4).

        In the dot form (Eq. 27) every class then takes the bias the Euclidean form implies,
        -||W mu_c||^2 / 2: a learned bias and an implied one are not on one scale, and Section 3.4
        finds the implied one as good for the trained classes.

        Parameters
        ----------
        centroids : array-like of shape (m, n_features)
            The new classes' means in the input space (NCMC: k-means centroids, several per class).
        classes : array-like of shape (m,)
            Each centroid's class label, of the kind ``classes_`` holds and not one of them; they
            follow the known classes in order of first appearance, and ``predict`` returns them.

        Returns
        -------
        self
            The extended classifier.
        """
        check_is_fitted(self)
        centroids = np.asarray(centroids, np.float32)
        labels = np.asarray(classes)
        if centroids.ndim != 2 or centroids.shape[1] != self.n_features_in_:
            raise InputError(f"centroids must be (m, {self.n_features_in_}); got shape {centroids.shape}")
        if labels.shape != (len(centroids),):
            raise InputError(f"classes must hold one label per centroid ({len(centroids)}); got shape {labels.shape}")
        if not np.isfinite(centroids).all():
            raise InputError("centroids hold NaN or inf; give finite class means")
        text_old, text_new = self.classes_.dtype.kind in "USO", labels.dtype.kind in "USO"
        if len(labels) and text_old != text_new:
            raise InputError(
                f"the new classes' labels must be of the kind of the model's classes ("
                f"{'text' if text_old else 'numbers'}); got {labels[:3].tolist()}"
            )
        new = list(dict.fromkeys(labels.tolist()))
        taken = [c for c in new if np.isin(c, self.classes_)]
        if taken:
            raise InputError(
                f"class {taken[0]!r} is already one of the model's classes; add_centroids adds new classes only"
            )
        position = {c: len(self.classes_) + i for i, c in enumerate(new)}
        codes = np.array([position[c] for c in labels.tolist()], np.int32)
        self.centroids_ = np.concatenate([self.centroids_, centroids])
        self.centroid_classes_ = np.concatenate([self.centroid_classes_, codes]).astype(np.int32)
        self.classes_ = np.concatenate([self.classes_, np.asarray(new, dtype=labels.dtype)])
        if self.class_bias_ is not None:  # one mean per class (Eq. 27): every class by its norm
            self.class_bias_ = self._implied_biases()
        return self

    def _implied_biases(self) -> np.ndarray:
        bias = np.full(len(self.classes_), np.nan, np.float32)
        bias[self.centroid_classes_] = implied_bias(
            self.components_.T.astype(np.float64), self.centroids_.astype(np.float64)
        )
        return bias

    def predict_proba(self, X):
        """The posterior p(c|x) of every class.

        Eq. 5 (Eq. 27 in the dot form, Eq. 22's mixture for NCMC).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
            Columns in the order of ``classes_``; each row sums to 1.
        """
        s = self._class_scores(X)
        s = s - s.max(axis=1, keepdims=True)
        e = np.exp(s)
        return e / e.sum(axis=1, keepdims=True)

    def predict(self, X):
        """The most probable class of every row.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,)
            Labels from ``classes_``.
        """
        scores = self._class_scores(X)
        return self.classes_[np.argmax(scores, axis=1)]


class NCMML(_NCMClassifier, MetricLearner):
    """Nearest-class-mean metric learning (Mensink et al., Sections 3.1-3.2).

    p(c|x) = softmax_c(-||W x - W mu_c||^2 / 2) (Eq. 5); the mean log-likelihood (Eq. 9) is maximised
    by minibatch SGD with the gradient of Eq. 10; ``objective='dot'`` is Eq. 27's
    softmax(x^T W^T W mu_c + s_c) with a learned bias per class.

    Parameters
    ----------
    dim : int or None, default=None
        Rows of W: the code dimension. None: 32, or every PCA direction when the data has fewer
        features (so the defaults run on 13-d data as on 4,096-d; a dim set above them is refused).
    objective : {'euclidean', 'dot'}, default='euclidean'
        The class posterior: the softmax of negative squared distances to the class means (Eq. 5),
        or of dot products with a learned bias per class (Eq. 27).
    batch : int, default=1000
        Images per SGD step.
    lr : float or None, default=None
        Fixed SGD step for rows of unit RMS norm: the learner divides it by the training rows' mean
        squared norm and starts W at the PCA directions over their RMS norm (the same run as on the
        rows scaled to unit RMS norm; nothing changes on l2-normalised rows). None: 30 for the
        Euclidean objective, 1 for the dot form (where 10 and more diverged), the first value each
        objective's selection grid tries; if W then diverges, SGD goes on from the best W validated
        so far at a tenth of the rate, at most 3 times (``lr_``: the rate it ended with). A rate you
        set is kept: its divergence is an error.
    iters : int, default=2000
        SGD steps.
    validate_every : int, default=100
        SGD steps between two checks of the validation error (early stopping).
    validation : int, default=5000
        Validation rows at most: held out of SGD when no X_val is given, else a seeded sample of X_val
        (the pipeline's validation rows) when it holds more.
    early_stopping : bool, default=True
        Keep the W with the lowest validation error (checked every ``validate_every`` steps, the start
        included; SGD stops after half of its checks in a row without a lower one). False: no
        validation rows, every training row trains and the W of step ``iters`` is kept (a run refits
        the chosen candidate so, with the steps it kept: ``refit_params``).
    classes : list of labels or None, default=None
        The labels (as y holds them) of the classes whose images train W; the others are new
        classes the classifier meets with their means only (Section 5.4).
    random_state : int, RandomState or None, default=None
        Seed of the validation share, the pools and the SGD batches (None: seed 0).

    Attributes
    ----------
    components_ : ndarray of shape (n_features, dim), float32
        W^T: codes are ``X @ components_``, compared by Euclidean distance.
    centroids_ : ndarray of shape (n_centroids, n_features)
        The class means in the input space (one per class with rows; more after
        :meth:`add_centroids`).
    centroid_classes_ : ndarray of shape (n_centroids,), int32
        Each centroid's class, as a position in ``classes_``.
    class_bias_ : ndarray of shape (n_classes,) or None
        The learned bias s_c of each class (dot objective only).
    classes_ : ndarray of shape (n_classes,)
        The class labels.
    history_ : list of dict
        The SGD's record: ``{"iter", "val_error", "batch"}`` at each check, ``{"iter", "lr"}`` at a
        back-off.
    best_iter_ : int
        The step of the kept W.
    val_error_ : float or None
        Its validation error (None without validation rows).
    lr_ : float
        The rate SGD ended with (lower than ``lr`` after a back-off).
    val_error_new_classes_, best_iter_new_classes_ : float or None, int or None
        With ``classes`` and rows of the other classes to validate on: their NCM error at the kept
        W, and the step where it was lowest (a diagnostic of Section 5.4's protocol: W is still
        chosen on the trained classes).
    n_features_in_ : int

    Examples
    --------
    >>> from sklearn.datasets import load_digits
    >>> from metricpipe import NCMML
    >>> X, y = load_digits(return_X_y=True)
    >>> ncm = NCMML(dim=16, iters=200, random_state=0).fit(X[:1500], y[:1500])
    >>> ncm.transform(X[1500:]).shape
    (297, 16)
    >>> bool(ncm.score(X[1500:], y[1500:]) > 0.8)
    True
    """

    # lr is read for rows of unit RMS norm, so one grid serves raw and l2 data: half a decade apart
    # around the default. With the old grid (0.001 ... 100) the validation error was lowest at 10, 30
    # or 100 on digits, Fashion 14 x 14 and HOG, and 0.001 to 0.1 never moved W off its start in 2,000
    # steps; with this one it was lowest at 3 to 300 on those and on Fashion-MNIST (benchmarks/README.md)
    search_space = {"lr": [30.0, 3.0, 10.0, 100.0, 300.0]}
    selection_metric = "ncm"
    own_classifier = "ncm"  # Eq. 5 (Eq. 27 in the dot form) over the class means
    # the dot form (Eq. 27) steps on scores, not squared distances: lr 10 and more diverged on digits,
    # Fashion 14 x 14 and HOG, whose validation error was lowest at 1, 3 and 3 (0.1 never left the start)
    search_space_when = {("objective", "dot"): {"lr": [1.0, 0.3, 3.0, 10.0, 0.1]}}

    method = "ncmml"
    fitted_attributes = ("val_error_new_classes_", "best_iter_new_classes_")

    _parameter_constraints = {**SGD_CONSTRAINTS, "objective": [StrOptions({"euclidean", "dot"})]}

    def _step_cost(self, m, D, K, d, pool):
        """The dot form (Eq. 27): the rows and the means projected, their products, and the gradient's
        two D-wide products (one a ``multi_dot``)."""
        if self.objective != "dot":
            return super()._step_cost(m, D, K, d, pool)
        gemms = 2 * madds.gemm(m, d, D) + madds.gemm(K, d, D) + 2 * madds.gemm(m, K, d) + madds.chain(d, m, K, D)
        return madds.passes(m * D, 6) + madds.passes(m * K, 8) + gemms + 40 * madds.CALL

    def __init__(
        self,
        dim=None,
        objective="euclidean",
        batch=1000,
        lr=None,
        iters=2000,
        validate_every=100,
        validation=5000,
        early_stopping=True,
        classes=None,
        random_state=None,
    ):
        self.dim = dim
        self.objective = objective
        self.batch = batch
        self.lr = lr
        self.iters = iters
        self.validate_every = validate_every
        self.validation = validation
        self.early_stopping = early_stopping
        self.classes = classes
        self.random_state = random_state

    def _side_inputs(self, rows, keep, means, trained, n_classes, seed) -> dict:
        """With ``classes`` set, the other classes' rows to monitor: their given validation rows, else a
        stratified share of their rows, as validation (then out of the class means), ``validation`` rows
        at most."""
        others = ~np.isin(rows.labels, trained)
        if self.classes is None or not self.early_stopping or not others.any():
            return {}
        new = np.zeros(0, np.int64) if rows.val is None else rows.val[others[rows.val]]
        carved = not len(new)
        if carved:
            pos = np.flatnonzero(others & rows.fit)
            new = pos[stream.validation_split(rows.labels[pos], self.validation, rows.keys[pos], seed)]
        new = stream.seeded_sample(new, self.validation, seed)
        if carved:
            means[new] = False
        return {"X_new": rows.take(new), "y_new": rows.labels[new]}

    def _begin(self, statistics: dict, labels=None, X_new=None, y_new=None):
        """W from the statistics' PCA directions, SGD with the class means of the trained classes
        (Eq. 10, or Eq. 27's dot form). With ``classes`` set, (X_new, y_new): validation rows of the
        other classes, whose NCM error over all class means is recorded at every validation
        (``history_``'s "val_error_new_classes") but never chooses W."""
        W0 = self._start(statistics)
        C = len(self.classes_)
        trained, present = self._fit_classes(statistics, labels)
        means = statistics["class_means"]
        sgd = MetricSGD(
            W0,
            "dot" if self.objective == "dot" else "ncm",
            self._searched("lr"),
            means[trained],
            trained,
            C,
            scale=moments.row_scale(statistics),
        )
        # with classes left out, the dot model classifies by implied biases (below): early stopping too
        sgd.implied_bias = self.objective == "dot" and len(trained) < len(present)
        self._monitor = None
        if X_new is not None and len(X_new):  # (the dot form with implied biases is this same rule)
            Xn, yn = np.asarray(X_new, np.float64), np.asarray(y_new, np.int64)
            M = np.asarray(means, np.float64)[present]
            self._monitor = lambda s: float((present[metrics_nearest(Xn @ s.W.T, M @ s.W.T)] != yn).mean())
        return sgd, {"means": np.asarray(means, np.float32)[present], "present": present, "trained": trained}

    def _end(self, kept: dict, bias) -> None:
        hist = [h for h in self.history_ if "val_error_new_classes" in h]
        self.val_error_new_classes_ = next(
            (h["val_error_new_classes"] for h in hist if h["iter"] == self.best_iter_), None
        )
        self.best_iter_new_classes_ = min(hist, key=lambda h: h["val_error_new_classes"])["iter"] if hist else None
        self.__dict__.pop("_monitor", None)
        trained, present = kept["trained"], kept["present"]
        self.centroids_ = kept["means"]
        self.centroid_classes_ = present.astype(np.int32)
        self.class_bias_ = None
        if self.objective == "dot":
            # the learned biases (Eq. 27) when every class with a mean was trained; with classes left out,
            # every class takes the implied one: the learned ones (from 0) and the implied ones
            # (-||W mu||^2 / 2) are on different scales, so the left-out classes would never win
            # (Section 3.4: as good)
            if len(trained) < len(present):
                self.class_bias_ = self._implied_biases()
            else:
                self.class_bias_ = np.full(len(self.classes_), np.nan, np.float32)
                self.class_bias_[trained] = bias


class NCMC(_NCMClassifier, MetricLearner):
    """Nearest class multiple centroids (Mensink et al., Section 3.3): k centroids per class from
    k-means in the input space, the mixture posterior of Eqs. 21-22 and its gradient (Eqs. 24-25).

    Parameters
    ----------
    centroids : int, default=10
        k, centroids per class; a class with fewer training images has one centroid on each.
    train_centroids : {1} or None, default=None
        1: NCMC-test, W learns with the class means and is used with the k centroids.
    kmeans_iters : int, default=10
        Lloyd passes over the data.
    dim, batch, lr, iters, validate_every, validation, early_stopping, classes, random_state : as :class:`NCMML`.

    Attributes
    ----------
    components_ : ndarray of shape (n_features, dim), float32
        W^T: codes are ``X @ components_``.
    centroids_ : ndarray of shape (n_centroids, n_features)
        The k-means centroids of every class in the input space.
    centroid_classes_ : ndarray of shape (n_centroids,), int32
        Each centroid's class, as a position in ``classes_``.
    class_bias_ : None
        (NCMC has no dot form.)
    classes_, history_, best_iter_, val_error_, lr_ : as :class:`NCMML`'s
    n_features_in_ : int
    """

    search_space = NCMML.search_space
    selection_metric = "ncmc"
    own_classifier = "ncmc"  # Eq. 22's mixture over the k centroids of every class

    method = "ncmc"
    _parameter_constraints = {
        **SGD_CONSTRAINTS,
        "centroids": COUNT,
        "train_centroids": [Options(Integral, {1}), None],
        "kmeans_iters": COUNT,
    }

    def __init__(
        self,
        dim=None,
        centroids=10,
        train_centroids=None,
        kmeans_iters=10,
        batch=1000,
        lr=None,
        iters=2000,
        validate_every=100,
        validation=5000,
        early_stopping=True,
        classes=None,
        random_state=None,
    ):
        self.dim = dim
        self.centroids = centroids
        self.train_centroids = train_centroids
        self.kmeans_iters = kmeans_iters
        self.batch = batch
        self.lr = lr
        self.iters = iters
        self.validate_every = validate_every
        self.validation = validation
        self.early_stopping = early_stopping
        self.classes = classes
        self.random_state = random_state

    @staticmethod
    def kmeans_sample(
        labels: np.ndarray, keys: np.ndarray, seed, per_class: int = KMEANS_SAMPLE, at_least: int = 0
    ) -> np.ndarray:
        """Positions (among the training rows, whose :func:`~metricpipe.tasks.stream.row_keys` are
        ``keys``) of the stratified sample k-means++ seeds from: each class's share of it, and at
        least ``at_least`` rows of each class (all of a class with fewer; its first in the same
        seeded order), since a class's share of a sample of unequal classes can fall below its k.
        In that seeded order, not the rows' stored one: k-means++ draws its seeds by position in the
        sample, so the same rows stored in another order get the same centroids."""
        labels = np.asarray(labels)
        rank = stream.rank(keys, seed, stream.KMEANS)
        pos = stream.stratified_subset(labels, per_class * len(np.unique(labels)), rank, at_least=max(1, at_least))
        return pos[np.argsort(rank[pos], kind="stable")]

    def _n_centroids(self, n_classes: int) -> int:
        return n_classes * (1 if self.train_centroids == 1 else int(self.centroids))

    def _setup_cost(self, n_rows, D, C, d):
        """k-means (Section 3.3): k-means++ seeds from each class's sample (k passes over it), then
        ``kmeans_iters`` Lloyd passes, each reading the rows and comparing them with their class's k."""
        k, sample = int(self.centroids), min(n_rows, C * self.kmeans_per_class(C, D))
        seeding = madds.passes(sample * D, 3 * k) + k * C * madds.draws(sample / max(C, 1))
        lloyd = madds.passes(n_rows * D, 15) + madds.gemm(n_rows, k, D) + 20 * C * madds.CALL
        lloyd *= int(self.kmeans_iters)
        return super()._setup_cost(n_rows, D, C, d) + seeding + lloyd

    def kmeans_per_class(self, n_classes: int, n_features: int) -> int:
        """Rows per class the k-means++ seeding sample holds: KMEANS_SAMPLE, fewer where the sample
        would pass KMEANS_BYTES (1,000 classes x 4,096 dimensions: 15 rows each, 246 MB), never
        fewer than the k centroids it seeds; the Lloyd passes that follow see every row."""
        fit = int(KMEANS_BYTES // (4 * max(1, n_classes) * max(1, n_features)))
        return max(self.centroids, min(KMEANS_SAMPLE, fit))

    def kmeans(self, X_sample, y_sample, blocks, n_classes: int, counts=None):
        """k centroids for every class (Section 3.3): k-means++ on the sample, then ``kmeans_iters``
        Lloyd passes over ``blocks()`` (a callable giving (X, y) row-blocks). A class with fewer
        training images than k (``counts``: each class's training images; default the sample's)
        has one centroid on each, as few-shot data and scikit-learn's checks' small classes need (the
        sample holds them all: :meth:`kmeans_sample`'s ``at_least``). Returns (centroids, their
        classes), k per class (fewer for such a class)."""
        in_sample = np.bincount(np.asarray(y_sample, np.int64), minlength=n_classes)
        counts = in_sample if counts is None else np.asarray(counts, np.int64)
        k = np.minimum(self.centroids, counts)
        need = np.where(counts > 0, np.maximum(k, 1), 0)  # a class with no training image has no centroid
        if (in_sample < need).any():
            c = int(np.argmax(in_sample < need))
            raise InputError(
                f"NCMC: class code {c} has {int(in_sample[c])} image(s) in the k-means sample for "
                f"{int(need[c])} centroid(s); give every class training images"
            )
        classes = np.flatnonzero(counts > 0)
        return class_kmeans(
            np.asarray(X_sample),
            np.asarray(y_sample),
            classes,
            k[classes],
            blocks,
            self.kmeans_iters,
            np.random.default_rng([seed_of(self.random_state), 11]),
        )

    def _side_inputs(self, rows, keep, means, trained, n_classes, seed) -> dict:
        """k-means over the rows in the class means (k-means sees no validation row)."""
        return {"centroids": self.class_centroids(rows, means, n_classes)}

    def class_centroids(self, rows: TrainingRows, mask: np.ndarray, n_classes: int):
        """k centroids per class of the rows where ``mask`` holds (:meth:`kmeans`): k-means++ on its
        seeding sample (:meth:`kmeans_sample`), one streamed pass over the rows per Lloyd step. Returns
        (centroids in the input space, their class codes)."""
        pos = np.flatnonzero(mask)
        sample = pos[
            self.kmeans_sample(
                rows.labels[pos],
                rows.keys[pos],
                seed_of(self.random_state),
                self.kmeans_per_class(n_classes, rows.n_features),
                self.centroids,
            )
        ]
        return self.kmeans(
            rows.take(sample),
            rows.labels[sample],
            lambda: rows.blocks(mask),
            n_classes,
            np.bincount(rows.labels[pos], minlength=n_classes),
        )

    def _init_side(self, init, X, codes) -> dict:
        """partial_fit's centroids: ``init["centroids"]``, else k-means on the first call's rows."""
        if init is not None and "centroids" in init:
            return {"centroids": init["centroids"]}
        return {"centroids": self.class_centroids(ArrayRows(X, codes), np.ones(len(X), bool), len(self.classes_))}

    def _begin(self, statistics: dict, labels=None, centroids=None):
        """W from the statistics' PCA directions, SGD with the k-means ``centroids`` (:meth:`kmeans`'s
        answer) of the trained classes (Eqs. 24-25), or with their means (``train_centroids`` 1)."""
        W0 = self._start(statistics)
        C = len(self.classes_)
        trained = self._fit_classes(statistics, labels)[0]
        cents, owner = centroids
        if self.train_centroids == 1:  # NCMC-test: the metric learns with one mean per class
            sgd = MetricSGD(
                W0,
                "ncm",
                self._searched("lr"),
                statistics["class_means"][trained],
                trained,
                C,
                scale=moments.row_scale(statistics),
            )
        else:
            mine = np.isin(owner, trained)
            sgd = MetricSGD(
                W0, "ncm", self._searched("lr"), cents[mine], owner[mine], C, scale=moments.row_scale(statistics)
            )
        return sgd, {"centroids": np.asarray(cents, np.float32), "owner": np.asarray(owner, np.int32)}

    def _end(self, kept: dict, bias) -> None:
        self.centroids_ = kept["centroids"]
        self.centroid_classes_ = kept["owner"]
        self.class_bias_ = None
