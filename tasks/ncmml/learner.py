"""What NCMML, NCMC and KNNML share (Mensink et al., Section 5.1): W from the PCA directions, the rows
each fit reads (:meth:`MetricLearner.fit_rows`), the SGD loop over the pools of
:mod:`metricpipe.tasks.stream` with early stopping on validation rows, and :meth:`MetricLearner.partial_fit`,
which takes the same steps one pool at a time."""

from numbers import Integral, Real

import numpy as np

from metricpipe.tasks import madds, moments, stream
from metricpipe.tasks.base import (
    COUNT,
    DIM_OR_NONE,
    POSITIVE,
    RANDOM_STATE,
    Interval,
    Learner,
    one_blas_thread,
    seed_of,
)
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.ncmml.sgd import BACK_OFFS, Diverged, MetricSGD
from metricpipe.tasks.rows import ArrayRows, TrainingRows
from metricpipe.tasks.validate import class_codes

IDLE_POOLS = 100  # pools in a row without a batch before SGD gives up (instead of looping forever)
PATIENCE = 0.5  # SGD stops after this share of its validations (iters / validate_every) in a row
# without a lower error, at least 5 (the best W is kept). k-NN ML's error often rises
# for a few hundred steps before it falls below the start, so half, not a fixed 5.

SGD_CONSTRAINTS = {
    "dim": DIM_OR_NONE,
    "batch": [Interval(Integral, 2, None, closed="left")],
    "lr": [*POSITIVE, None],
    "iters": [Interval(Integral, 0, None, closed="left")],
    "validate_every": COUNT,
    "validation": [Interval(Integral, 10, None, closed="left")],
    "early_stopping": ["boolean"],
    "classes": ["array-like", None],
    "random_state": RANDOM_STATE,
}


class MetricLearner(Learner):
    """Shared by NCMML, NCMC and KNNML: W (dim, D) starts from the PCA directions and learns by
    minibatch SGD over the pools of :mod:`metricpipe.tasks.stream`; the W with the lowest validation
    error (every ``validate_every`` steps, the PCA start included) is kept (Section 5.1).

    Codes are ``x @ components_`` with ``components_ = W.T`` (D, dim).
    """

    fitted_attributes = ("components_", "classes_", "history_", "lr_", "best_iter_", "val_error_")
    dim_within_features = True
    DEFAULT_DIM = 32  # dim None: this many PCA directions, or all of them when the data has fewer
    feeds = "stream"
    reads_statistics = ("mean", "pca_components", "class_means", "class_counts", "mean_sq_norm")

    def _validate_params(self):
        super()._validate_params()
        c = self.classes
        ok = c is None or (
            hasattr(c, "__len__")
            and not isinstance(c, str)
            and len(c) > 0
            and all(isinstance(v, (Real, np.generic, str)) for v in c)
        )
        if not ok:
            raise InputError(
                f"The 'classes' parameter of {type(self).__name__} must be a non-empty list of class "
                f"labels (as in y) or None. Got {c!r} instead."
            )

    def _transform(self, X):
        return np.asarray(X, np.float64) @ self.components_.astype(np.float64)

    @property
    def _n_features_out(self):
        return self.components_.shape[1]

    def cost(self) -> dict:
        W = self.components_
        return {"nnz": int(W.size), "storage_bytes": int(W.nbytes), "flops_per_image": 2 * int(W.size)}

    def trained_classes(self, labels) -> np.ndarray:
        """The class codes (positions in ``labels``, the class labels in code order: ``classes_``, a
        run's class names) whose images train W: those ``classes`` names (:func:`class_codes`),
        default all."""
        if self.classes is None:
            return np.arange(len(labels))
        return class_codes(self.classes, labels, f"The 'classes' parameter of {type(self).__name__}")

    def _fit_classes(self, statistics: dict, labels) -> tuple[np.ndarray, np.ndarray]:
        """(the class codes W trains on, the class codes with training rows): :meth:`trained_classes`
        less the classes the statistics hold no training row of. A class without one (a run's
        held-out class, ``data.split.classes``) neither trains W nor gets a mean: the model never
        sees it, and classifies it only once its mean is added (:meth:`add_centroids`)."""
        present = np.flatnonzero(np.asarray(statistics["class_counts"]) > 0)
        trained = self.trained_classes(self.classes_ if labels is None else labels)
        return trained[np.isin(trained, present)], present

    def pool_rows(self, n_classes: int) -> int | None:
        """Rows of the training set's pools that ``fit_rows`` reads at most, so that the pipeline
        writes only the blocks of its shuffled copy visited first. SGD cuts each pool into batches of
        at most ``batch`` rows, one step each, so pools holding ``iters`` x ``batch`` rows give every
        step; the rows taken out of the pools are added: the validation share held out of the train
        split, at most ``validation`` + ``n_classes`` (:func:`~metricpipe.tasks.stream.validation_split`
        rounds each class's share, which may pass ``validation`` by a row a class). None (every row) when
        ``classes`` leaves other classes' rows out of the pools too."""
        if self.classes is not None:
            return None
        held = int(self.validation) + int(n_classes) if self.early_stopping else 0
        return int(self.iters) * int(self.batch) + held

    # -- what a fit costs, before any work (Learner.fit_cost) ---------------------------------------------
    def fit_cost(self, n_rows, n_features, n_classes, k=0, n_val=0) -> madds.FitCost:
        """``iters`` SGD steps (:meth:`_step_cost` each: the batch taken from its pool, its products), the
        pools read (``iters`` x ``batch`` rows), a validation every ``validate_every`` steps
        (:meth:`_validation_cost`) and what the learner does once (:meth:`_setup_cost`); with early
        stopping an upper bound (it may stop sooner)."""
        D, C = n_features, n_classes
        d = self.code_dim(D, C)
        n_v = 0
        if self.early_stopping:  # the given validation rows, else a share of the training rows held out
            n_v = min(int(self.validation), n_val if n_val else n_rows // 5)
        fit_rows = n_rows - (0 if n_val else n_v)
        checks = int(self.iters) // int(self.validate_every) + 1 if n_v else 0
        pool = min(stream.block_rows_for(D), max(1, fit_rows))  # the rows of a pool
        total = (
            madds.FIT
            + self._setup_cost(fit_rows, D, C, d)
            + int(self.iters) * self._step_cost(int(self.batch), D, self._n_centroids(C), d, pool)
            + checks * self._validation_cost(n_v, D, self._n_centroids(C), d)
            + madds.passes(n_v * D, 2)  # the validation rows read
            + madds.read(int(self.iters) * int(self.batch) * D)  # the pools read (in the pipeline: decompressed)
        )
        return madds.FitCost(total, bool(self.early_stopping) and self.iters > 0)

    def _n_centroids(self, n_classes: int) -> int:
        """The centroids its gradient and validation compare with: a mean per class."""
        return n_classes

    def _step_cost(self, m: int, D: int, K: int, d: int, pool: int) -> float:
        """One SGD step on a batch of ``m`` rows (read from its ``pool``, float64) for the gradient of
        Eq. 10 (24-25) against K centroids: the projections of the rows and the centroids, their
        distances, the posteriors (summed per class by an unbuffered add), the gradient's two factors
        in the projected space and its two D-wide GEMMs."""
        gemms = 2 * madds.gemm(m, d, D) + 2 * madds.gemm(K, d, D) + 3 * madds.gemm(m, K, d)
        return madds.passes(m * D, 5) + madds.passes(m * K, 40) + gemms + 40 * madds.CALL

    def _validation_cost(self, n_val: int, D: int, K: int, d: int) -> float:
        """One early-stopping check: the validation rows projected and classified among K centroids."""
        return madds.passes(n_val * D, 1) + madds.gemm(n_val, d, D) + madds.passes(n_val * K, 4)

    def _setup_cost(self, n_rows: int, D: int, C: int, d: int) -> float:
        """What a fit does once besides its steps (none here: W starts from the statistics' PCA)."""
        return madds.passes(d * D, 2)

    def fit(self, X, y, X_val=None, y_val=None, block_rows=None):
        """Learn W from rows X with labels y by minibatch SGD, from the PCA directions of X.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training rows.
        y : array-like of shape (n_samples,)
            Their class labels.
        X_val : array-like of shape (n_val, n_features) or None, default=None
            Validation rows for early stopping; None: a stratified, seeded share of X (at most a
            fifth, ``validation`` rows at most) that SGD never sees.
        y_val : array-like of shape (n_val,) or None, default=None
            Their labels, among those of y.
        block_rows : int or None, default=None
            Rows per pool SGD takes its batches from, each pool a uniform sample of the training rows
            whatever their order (:func:`metricpipe.tasks.stream.pools`); None: 64 MB of float32
            rows, as the pipeline's row-blocks.

        Returns
        -------
        self
            The fitted estimator.
        """
        self._validate_params()
        X, codes = self._check_Xy(X, y)
        classes = self.classes_
        yv = None
        if X_val is not None:
            X_val, y_val = self._check_val(X_val, y_val)
            yv = np.searchsorted(classes, y_val)
            if np.any(yv >= len(classes)) or np.any(classes[np.minimum(yv, len(classes) - 1)] != y_val):
                raise InputError(f"{type(self).__name__}: y_val holds labels that are not in y")
        rows = ArrayRows(X, codes, X_val, yv, block_rows)
        self.fit_rows(rows, moments.statistics(X, codes), labels=classes)
        self.classes_ = classes
        return self

    def fit_rows(self, rows: TrainingRows, statistics: dict, labels=None):
        """Learn W from :class:`~metricpipe.tasks.rows.TrainingRows` and the statistics of its
        ``in_stats`` rows: ``fit`` and the pipeline both end here. Which rows validate (the given
        ones, else a stratified share held out of the fit rows), which stay out of the class means
        and the centroids (every row that scores: a mean holding its own validation rows makes their
        error optimistic; NCMC's was 0 on digits), what else the learner reads (NCMC's k-means,
        k-NN ML's reference rows, NCMML's other-class monitor): decided here. ``labels``: the class
        labels in code order, which ``classes`` names (default: the codes). Returns self."""
        self._validate_params()
        C = len(statistics["class_means"])
        seed = seed_of(self.random_state)
        trained = self.trained_classes(np.arange(C) if labels is None else labels)
        allowed = np.isin(rows.labels, trained) & rows.fit
        keep, means = allowed.copy(), rows.fit.copy()  # SGD's rows; the rows in the class means
        val = np.zeros(0, np.int64)
        if self.early_stopping and rows.val is not None and len(rows.val):
            val = stream.seeded_sample(rows.val[np.isin(rows.labels[rows.val], trained)], self.validation, seed)
        elif self.early_stopping:
            pos = np.flatnonzero(allowed)
            counts = np.bincount(rows.labels[pos], minlength=C)[trained]
            if counts.min() < 2:  # early stopping holds out a validation row of every class it trains on
                name = (
                    trained[int(np.argmin(counts))]
                    if labels is None
                    else np.asarray(labels)[trained][np.argmin(counts)]
                )
                raise InputError(
                    f"{type(self).__name__}: class {np.asarray(name).item()!r} has {int(counts.min())} "
                    f"sample(s); give every class at least 2, as the pipeline's stratified split requires "
                    f"(or pass X_val, y_val to fit)"
                )
            val = pos[stream.validation_split(rows.labels[pos], self.validation, rows.keys[pos], seed)]
            keep[val] = means[val] = False
        if not keep.any():
            raise InputError(f"{type(self).__name__}: no training rows left for SGD after the validation rows")
        extra = self._side_inputs(rows, keep, means, trained, C, seed)
        out = np.flatnonzero(rows.in_stats & ~means)  # (sorted, as the statistics' rows)
        if len(out):
            statistics = moments.without_rows(statistics, rows.take(out), rows.labels[out])
        Xv, yv = (rows.take(val), rows.labels[val]) if len(val) else (None, None)
        return self.fit_stream(statistics, rows.pools(keep, seed), Xv, yv, labels=labels, **extra)

    def fit_facts(self) -> dict:
        facts = {"best_iter": self.best_iter_, "val_error": self.val_error_}
        return {
            **facts,
            **{k: getattr(self, f"{k}_", None) for k in ("val_error_new_classes", "best_iter_new_classes")},
        }

    def _side_inputs(self, rows: TrainingRows, keep, means, trained, n_classes: int, seed: int) -> dict:
        """What :meth:`fit_stream` takes beyond the statistics and pools; ``keep``: SGD's rows, ``means``:
        the rows in the class means (a learner that holds rows out to score clears theirs)."""
        return {}

    # -- what each estimator defines: its SGD's start, its validation error, its batches, its model --------
    def _begin(self, statistics: dict, labels=None, **side) -> tuple[MetricSGD, dict]:
        """(the SGD at its start, what the model keeps beside W for :meth:`_end`) from the statistics
        and the side inputs (:meth:`_side_inputs`)."""
        raise NotImplementedError

    def _validation_error(self, side: dict):
        """error(sgd, X_val, y_val) that early stopping minimises: the classifier's (NCM, NCMC)."""
        return _class_error

    def _end(self, kept: dict, bias) -> None:
        """The fitted attributes beside W (NCMML's and NCMC's centroids_, ...) from ``_begin``'s ``kept``
        and the kept biases (Eq. 27's, or None)."""

    def _batches(self, X, y, rng) -> list:
        """NCM/NCMC batches: the pool's rows (already in random order) ``batch`` at a time, as
        (rows, None, None) (k-NN ML's are (rows, is_positive, fixed targets))."""
        return [(np.arange(s, min(len(y), s + self.batch)), None, None) for s in range(0, len(y), self.batch)]

    # -- the SGD over pools ----------------------------------------------------------------------------------
    def fit_stream(self, statistics: dict, pools, X_val=None, y_val=None, labels=None, **side):
        """SGD over ``pools`` from the statistics' start: :meth:`fit_rows` ends here.

        Parameters
        ----------
        statistics : dict
            The statistics of the training rows (:attr:`reads_statistics`, e.g.
            :func:`metricpipe.tasks.moments.statistics`): W starts from their PCA directions.
        pools : iterable of (X_pool (m, n_features), y_pool (m,) class codes 0..C-1)
            E.g. :func:`metricpipe.tasks.stream.pools`; each pool is cut into batches, one step each
            (:meth:`partial_fit` takes the same steps for one pool), until ``iters`` steps.
        X_val, y_val : validation rows and codes for early stopping (``early_stopping``).
        labels : the class labels in code order, which ``classes`` names (default: the codes).
        **side : what :meth:`_side_inputs` gives: NCMML's ``X_new``, ``y_new`` (the other classes' rows
            it monitors), NCMC's ``centroids`` (:meth:`NCMC.kmeans`'s answer), KNNML's ``reference``
            (the rows its validation queries search).

        Returns
        -------
        self
        """
        sgd, kept = self._begin(statistics, labels, **side)
        self._end(kept, self._run(sgd, pools, X_val, y_val, self._validation_error(side)))
        return self

    def partial_fit(self, X, y, classes=None, init=None):
        """SGD steps on one pool of rows: the steps :meth:`fit` takes for each of its pools.

        The SGD state (W, the biases, the rate after a back-off, the step count, the batch draws)
        carries over from call to call, so a loop of ``partial_fit`` over the pools of
        :func:`metricpipe.tasks.stream.pools` learns the W of ``fit`` with ``early_stopping=False``
        and as many ``iters`` as the loop took steps (in memory and in the pipeline). The caller owns
        the loop: ``iters``, ``validation`` and early stopping are ``fit``'s; every call takes every
        batch of its rows, and the model after a call is the last W. ``fit`` drops this state.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            A pool of training rows, in random order (SGD cuts it into batches as it comes).
        y : array-like of shape (n_samples,)
        classes : array-like or None
            Every class label the calls will see (scikit-learn's convention), on the first call; None:
            the labels of the first call's y. Later calls may repeat it.
        init : dict or None
            On the first call, the statistics of the training rows the start is built from
            (:attr:`reads_statistics`: :func:`metricpipe.tasks.moments.statistics` of X and its class
            codes, or the pipeline's statistics stage), the class codes being positions in ``classes``;
            NCMC also reads ``init["centroids"]``, :meth:`NCMC.kmeans`'s (centroids, classes). None: the
            statistics (and NCMC's k-means) of the first call's rows, so the start then sees only them.
            Later calls ignore it (dask-ml's ``Incremental`` passes it to every call).

        Returns
        -------
        self
        """
        state = getattr(self, "_partial", None)
        if state is None:
            X, codes = self._partial_rows(X, y, classes)
            labels = self.classes_
            statistics = self._init_statistics(init, X, codes)
            sgd, kept = self._begin(statistics, labels, **self._init_side(init, X, codes))
            state = self._partial = {
                "sgd": sgd,
                "kept": kept,
                "classes": labels,
                "rng": np.random.default_rng([seed_of(self.random_state), 5]),
            }
        else:
            X, codes = self._partial_rows(X, y, classes, state["classes"])
        self.classes_ = state["classes"]  # (the start set the codes)
        sgd = state["sgd"]
        with one_blas_thread():
            self._pool_steps(sgd, X, codes, self._batches(X, codes, state["rng"]), until_iters=False)
        self._end(state["kept"], self._keep(sgd, None))
        return self

    def _start(self, stats: dict):
        comps = stats["pca_components"]
        if self.dim is not None and self.dim > len(comps):
            raise InputError(
                f"The 'dim' parameter of {type(self).__name__} must be <= {len(comps)}, the PCA "
                f"directions W starts from (n_features = {len(stats['mean'])}). Got {self.dim} instead."
            )
        self._validate_params()
        self.n_features_in_ = int(len(stats["mean"]))
        self.classes_ = np.arange(len(stats["class_means"]))
        return comps[: self.resolved_dim(len(comps))]

    def validates(self) -> bool:
        return bool(self.early_stopping)

    def refit_params(self) -> dict:
        """``iters`` = the kept W's step, without early stopping: the fit on every training row takes
        the steps this one kept (the rate is constant, so fewer steps are the same schedule cut short)."""
        return {"iters": int(self.best_iter_), "early_stopping": False} if self.early_stopping else {}

    def _run(self, sgd: MetricSGD, pools, Xv, yv, error):
        """The SGD loop: batches from each pool until ``iters`` steps; early stopping on validation
        (``early_stopping``), else the W of the last step. Returns the kept biases."""
        self.__dict__.pop("_partial", None)  # a fit starts afresh: the SGD state of partial_fit calls is dropped
        if not self.early_stopping:
            error = None
        yv = np.asarray(yv if yv is not None else [], np.int64)
        if error is not None and not len(yv):
            raise InputError(
                f"{type(self).__name__}: no validation rows to stop early on (X_val in fit; the data's val rows)"
            )
        # a class with no validation row (few-shot data: its share is under one row) still competes as
        # every query's possible answer; the error is over the classes that have rows
        sgd.patience = max(5, int(PATIENCE * self.iters / self.validate_every))
        with one_blas_thread():
            self._steps(sgd, pools, Xv, yv, error)
        return self._keep(sgd, error)

    def _keep(self, sgd: MetricSGD, error):
        """W and the fitted attributes from the SGD: the best validated state (``error``), else the
        current one. Returns its biases."""
        if error is None:  # no validation: the last W
            err, W, bias, at = np.nan, sgd.W, None if sgd.bias is None else sgd.bias.copy(), sgd.steps
        else:
            err, W, bias, at = sgd.best
        self.components_ = np.ascontiguousarray(W.T, np.float32)
        self.history_ = list(sgd.history)
        self.lr_ = sgd.lr
        self.best_iter_ = int(at)
        self.val_error_ = None if error is None else float(err)
        return bias

    def _steps(self, sgd, pools, Xv, yv, error) -> None:
        if error is not None:
            sgd.record(error(sgd, Xv, yv), None)  # the PCA start is a candidate too
            self._watch(sgd)
        if self.iters == 0:
            return
        rng = np.random.default_rng([seed_of(self.random_state), 5])
        idle = 0  # pools in a row that gave no batch (k-NN ML needs a class with two rows in a pool)
        for X, y in pools:
            drawn = self._batches(X, y, rng)
            idle = 0 if drawn else idle + 1
            if idle >= IDLE_POOLS:
                raise InputError(
                    f"{type(self).__name__}: {IDLE_POOLS} pools in a row held no class with two "
                    f"training rows, so no batch could be drawn; give more images per class or "
                    f"lower 'validation' (now {self.validation})"
                )
            if self._pool_steps(sgd, X, y, drawn, error, Xv, yv):
                break

    def _pool_steps(self, sgd: MetricSGD, X, y, drawn, error=None, Xv=None, yv=None, until_iters=True) -> bool:
        """One pool's steps, a step per batch ``drawn`` from it (:meth:`_batches`), a validation every
        ``validate_every`` steps (``error``; else a history entry); ``until_iters``: stop at ``iters``
        steps. An unset ``lr`` backs off after a divergence (:meth:`MetricSGD.back_off`). Returns
        whether to stop (``iters`` steps, or early stopping)."""
        stop = False
        for sel, is_pos, fixed in drawn:
            try:
                with np.errstate(over="ignore", invalid="ignore"):
                    value = sgd.step(X[sel], y[sel], is_pos, fixed)
            except Diverged:
                if self.lr is not None or sum("lr" in h for h in sgd.history) >= BACK_OFFS:
                    raise
                sgd.back_off()
                continue
            stop = False
            if error is None:
                if sgd.steps % self.validate_every == 0 or sgd.steps == self.iters:
                    sgd.history.append({"iter": sgd.steps, "batch": float(value)})
            elif sgd.steps % self.validate_every == 0 or sgd.steps == self.iters:
                stop = sgd.record(error(sgd, Xv, yv), value)
                self._watch(sgd)
            if (until_iters and sgd.steps >= self.iters) or stop:
                break
        return (until_iters and sgd.steps >= self.iters) or stop

    def _watch(self, sgd) -> None:
        """Record the new classes' validation error beside the last validation (NCMML's monitor)."""
        monitor = getattr(self, "_monitor", None)
        if monitor is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                sgd.history[-1]["val_error_new_classes"] = monitor(sgd)

    # -- partial_fit's first call ---------------------------------------------------------------------------
    def _init_statistics(self, init, X, codes) -> dict:
        """partial_fit's statistics: ``init`` (checked against the rows and classes), else those of X."""
        C = len(self.classes_)
        if init is None:
            return moments.finalize_statistics(moments.partial_moments(X, codes, C))
        name = f"{type(self).__name__}.partial_fit: init"
        if not isinstance(init, dict):
            raise InputError(
                f"{name} must be a dict of statistics ({', '.join(self.reads_statistics)}), e.g. "
                f"metricpipe.tasks.moments.statistics(X, codes); got {type(init).__name__}"
            )
        missing = [k for k in self.reads_statistics if k not in init]
        if missing:
            raise InputError(
                f"{name} lacks {', '.join(missing)}; give the statistics of "
                f"metricpipe.tasks.moments.statistics(X, codes)"
            )
        if len(init["mean"]) != X.shape[1] or len(init["class_means"]) != C:
            raise InputError(
                f"{name} describes {len(init['mean'])} features and {len(init['class_means'])} "
                f"classes; the rows have {X.shape[1]} features and classes holds {C} labels (init's "
                f"class codes are positions in classes)"
            )
        return init

    def _init_side(self, init, X, codes) -> dict:
        """Side inputs of partial_fit's start (NCMC's centroids); none by default."""
        return {}


def _class_error(sgd: MetricSGD, Xv, yv) -> float:
    """Top-1 error of the classifier (NCM, NCMC, the dot form) under the current W."""
    return float((sgd.classify(np.asarray(Xv, np.float64)) != yv).mean())
