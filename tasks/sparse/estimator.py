"""The estimator :class:`SparseProjector`: a stratified subset of the train rows, the PCA start, Algorithm 1."""

import warnings
from numbers import Integral, Real

import numpy as np
import scipy.sparse
from sklearn.utils.validation import check_array, check_is_fitted

from metricpipe.tasks import evaluation, madds, stream
from metricpipe.tasks.base import COUNT, DIM_OR_NONE, NON_NEGATIVE, RANDOM_STATE, Interval, Learner, StrOptions, seed_of
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.models import LinearModel
from metricpipe.tasks.moments import pca_statistics
from metricpipe.tasks.rows import ArrayRows, TrainingRows
from metricpipe.tasks.sparse.projection import sparsity_note
from metricpipe.tasks.sparse.ranking import rank_projectors


class SparseProjector(Learner):
    """Rank-optimised sparse projectors (Negrel, Picard, Gosselin): codes x U + b, U (D, R) with at
    most (1 - sparsity) D non-zeros per column, compared by inner product (Eq. 2).

    Parameters
    ----------
    dim : int or None, default None
        R, the number of projectors (the code dimension); None = ``DEFAULT_DIM`` (64, within the
        paper's R = 32 to 256), or every PCA direction when there are fewer.
    sparsity : float in [0, 1), default 0.9
        tau of Eq. 19 (0 = dense); M = round((1 - tau) D) non-zeros per column, at least 1 (a tau
        that rounds M to 0 keeps 1, with a warning; the pipeline prints it before staging).
    queries : int, default 100
        P, queries per iteration (half the highest f_q, half at random).
    train_size : int, default 2000
        Rows of the training set (a stratified, seeded subset of the rows given; each is a query
        against the others). Its cost grows with train_size squared.
    max_iter : int, default 200
        Iterations.
    anneal : float in [0, 1], default 0.5
        Share of max_iter over which M shrinks geometrically from D to its target (continuation;
        0 = Algorithm 1 as printed).
    epsilon : float, default 1e-6
        The margin of Eq. 7.
    pivot : {"original", "initial"}, default "original"
        Scores that choose each query's pivot: the original signatures (the paper) or the PCA start.
    validation : int >= 0, default 2000
        Early stopping (0 = off): the mAP of at most this many validation rows querying each other is
        checked at every history entry once the support has its final size, training stops after
        half the checks without a better one, and the best U is kept (for dense projectors the PCA
        start is a candidate). The rows are (X_val, y_val) when given, else a stratified, seeded share
        of the rows (at most a fifth) kept out of the training subset; the pipeline gives its ``val``
        split. Off when no validation row has both a positive and a negative (few-shot data: then
        every row trains).
    stop_iter : int >= 0 or None, default None
        Stop after this many iterations of the ``max_iter`` schedule (None: all of them); a run refits
        a validated projector on every training row with its kept iteration here, unless
        ``train_size`` capped its subset (then it keeps the validated fit; ``refit_params``).
    random_state : int, RandomState or None, default None
        Seed of the training subset and of the random half of the queries (None: 0).

    Attributes
    ----------
    projectors_ : ndarray or scipy CSC sparse array of shape (n_features, dim), float32
        U, sparse when ``sparsity`` > 0: codes are ``X @ projectors_ + bias_``, compared by inner
        product.
    bias_ : ndarray of shape (dim,), float32
        -mean U: the codes of centred rows.
    history_ : list of dict
        ``{"iter", "objective", "train_map"}`` (and ``"val_map"`` with validation) per entry.
    n_iter_ : int
        Iterations run (see :func:`rank_projectors`).
    best_iter_ : int or None
        The kept U's iteration (None without validation).
    val_map_ : float or None
        Its validation mAP (None without validation).
    subset_capped_ : bool
        Whether ``train_size`` capped the training subset (a refit on more rows would draw as many;
        :meth:`refit_params`).
    classes_ : ndarray of shape (n_keys,)
        The relevance keys of y.
    n_features_in_ : int
    """

    # how long the support shrinks from D to its final size; 0 is Algorithm 1 as printed (cut to M
    # non-zeros at once): in issue 18's table validation chose it on Fashion 14 x 14, and 0.25 / 0.9 /
    # 0.9 on digits, HOG and Fashion-MNIST (benchmarks/README.md)
    search_space = {"anneal": [0.5, 0.25, 0.9, 0.0]}
    selection_metric = "map"

    @classmethod
    def search_grid(cls, params: dict) -> dict:
        """Dense projectors (sparsity 0) have no support to shrink: nothing to search."""
        return {} if params.get("sparsity", 0.9) == 0 else cls.search_space

    method = "sparse"
    feeds = "subset"
    reads_statistics = ("mean", "pca_components")

    def portable(self) -> tuple[str, dict, dict]:
        """``affine``: codes = X @ W + b with W the projectors, dense."""
        check_is_fitted(self)
        W = self.projectors_
        return "affine", {"W": W.toarray() if scipy.sparse.issparse(W) else np.asarray(W), "b": self.bias_}, {}

    fitted_attributes = (
        "projectors_",
        "bias_",
        "classes_",
        "history_",
        "best_iter_",
        "val_map_",
        "n_iter_",
        "subset_capped_",
    )
    DEFAULT_DIM = 64  # compact codes, as the paper's R = 32 to 256: D projectors would not compress
    dim_within_features = True
    code_metric = "inner"
    _parameter_constraints = {
        "dim": DIM_OR_NONE,
        "sparsity": [Interval(Real, 0, 1, closed="left")],
        "queries": [Interval(Integral, 2, None, closed="left")],
        "train_size": [Interval(Integral, 4, None, closed="left")],
        "max_iter": COUNT,
        "anneal": [Interval(Real, 0, 1, closed="both")],
        "epsilon": NON_NEGATIVE,
        "pivot": [StrOptions({"original", "initial"})],
        "validation": [Interval(Integral, 0, None, closed="left")],
        "stop_iter": [Interval(Integral, 0, None, closed="left"), None],
        "random_state": RANDOM_STATE,
    }

    def shape_notes(self, n_features: int, n_classes: int) -> list[str]:
        note = sparsity_note(n_features, self.sparsity)
        return [note] if note else []

    def __init__(
        self,
        dim=None,
        sparsity=0.9,
        queries=100,
        train_size=2000,
        max_iter=200,
        anneal=0.5,
        epsilon=1e-6,
        pivot="original",
        validation=2000,
        stop_iter=None,
        random_state=None,
    ):
        self.dim = dim
        self.sparsity = sparsity
        self.queries = queries
        self.train_size = train_size
        self.max_iter = max_iter
        self.anneal = anneal
        self.epsilon = epsilon
        self.pivot = pivot
        self.validation = validation
        self.stop_iter = stop_iter
        self.random_state = random_state

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.required = True
        return tags

    def fit(self, X, y, X_val=None, y_val=None):
        """Learn the projectors on a stratified subset of ``train_size`` rows of X, from the PCA of X.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training rows.
        y : array-like of shape (n_samples,)
            Their relevance keys (same key = relevant): class labels, or instance groups.
        X_val : array-like of shape (n_val, n_features) or None, default=None
            Validation rows for early stopping (see ``validation``); None: a share of X is held out
            of the training subset.
        y_val : array-like of shape (n_val,) or None, default=None
            Their keys.

        Returns
        -------
        self
            The fitted estimator.
        """
        self._validate_params()
        if y is None:
            raise ValueError("SparseProjector requires y to be passed, but the target y is None.")
        X, y = self._check_Xy(X, y, min_classes=1)
        _check_keys(len(self.classes_))
        yv = None
        if X_val is not None:
            X_val, y_val = self._check_val(X_val, y_val)
            yv = np.searchsorted(self.classes_, y_val)  # (keys it never saw rank as no positive)
            yv = np.where(self.classes_[np.minimum(yv, len(self.classes_) - 1)] == y_val, yv, -1 - np.arange(len(yv)))
        for note in self.shape_notes(X.shape[1], len(self.classes_)):
            warnings.warn(note, UserWarning, stacklevel=2)
        mean, components = pca_statistics(X)
        return self.fit_rows(ArrayRows(X, y, X_val, yv), {"mean": mean, "pca_components": components})

    def fit_rows(self, rows: TrainingRows, statistics: dict, labels=None):
        """Learn on a stratified subset of ``train_size`` of the fit rows (the order-free sampler,
        :func:`~metricpipe.tasks.stream.sample`) from the statistics' mean and PCA basis: ``fit`` and the
        pipeline both end here. With ``validation`` > 0, early stopping reads the given validation rows,
        else a stratified share held out of the fit rows (none when no held-out row has a positive and
        a negative to rank: few-shot data). Relevance: ``rows.groups`` where given, else the labels."""
        self._validate_params()
        seed = seed_of(self.random_state)
        rel = rows.labels if rows.groups is None else rows.groups
        among, val = np.flatnonzero(rows.fit & rows.in_stats), None
        if self.validates() and rows.val is not None and len(rows.val):
            val = rows.val
        elif self.validates():
            held = among[stream.validation_split(rows.labels[among], self.validation, rows.keys[among], seed)]
            if evaluation.can_rank(rel[held], negatives=True):  # else (few-shot data) no early stopping
                among, val = np.setdiff1d(among, held), held
        subset = among[stream.sample(rows.labels[among], self.train_size, rows.keys[among], seed, stream.SUBSET)]
        self.subset_capped_ = bool(len(among) >= self.train_size)  # more rows would not enter the subset
        X, key = rows.take(subset), rel[subset]
        self.classes_ = np.unique(key)
        _check_keys(len(self.classes_))
        self.n_features_in_ = int(rows.n_features)
        given = None
        if val is not None:
            pick = val[stream.sample(rel[val], min(self.validation, len(val)), rows.keys[val], seed, stream.VALIDATION)]
            given = (rows.take(pick), rel[pick])
        return self._fit_subset(X, key, statistics["mean"], statistics["pca_components"], given)

    def fit_subset(self, X, key, mean, components, X_val=None, key_val=None):
        """The pipeline's entry point: learn on the training subset, starting from given statistics.

        Parameters
        ----------
        X : (n, D) the subset's rows (:func:`stratified_subset` of the train split with
            ``train_size`` and ``random_state``; bounded, so read in one task).
        key : (n,) their relevance keys (labels, or groups where the data has them).
        mean : (D,) the training rows' mean; components : (k, D) their PCA directions (rows).
        X_val, key_val : optional validation rows and keys (early stopping when ``validation`` > 0).
        """
        self._validate_params()
        X = check_array(X, dtype=[np.float64, np.float32])
        key = np.asarray(key)
        mean = np.asarray(mean, np.float64)
        if X.shape[1] != len(mean) or len(key) != len(X):
            raise InputError(
                f"SparseProjector.fit_subset: X must have {len(mean)} columns (the mean's length) and "
                f"one key per row. Got X {X.shape} and {len(key)} keys."
            )
        self.classes_ = np.unique(key)
        _check_keys(len(self.classes_))
        self.n_features_in_ = int(X.shape[1])
        self.__dict__.pop("feature_names_in_", None)
        val = None if X_val is None else (check_array(X_val, dtype=[np.float64, np.float32]), np.asarray(key_val))
        self.subset_capped_ = bool(len(X) >= self.train_size)  # a full subset: as if capped
        for note in self.shape_notes(X.shape[1], len(self.classes_)):
            warnings.warn(note, UserWarning, stacklevel=2)
        return self._fit_subset(X, key, mean, components, val)

    def _fit_subset(self, X, key, mean, components, val=None):
        comps = np.asarray(components)
        if self.dim is not None and self.dim > len(comps):
            raise InputError(
                f"The 'dim' parameter of sparse must be <= {len(comps)}, the PCA projectors "
                f"available to start from (X has {comps.shape[1]} feature(s)). Got {self.dim} "
                f"instead."
            )
        dim = self.resolved_dim(len(comps))
        mean = np.asarray(mean, np.float64)
        if val is not None and (not self.validation or not evaluation.can_rank(val[1], negatives=True)):
            val = None  # off, or no validation row has a positive and a negative to rank
        if val is not None:
            val = (np.asarray(val[0], np.float64) - mean, val[1])
        U, history, n_iter, *best = rank_projectors(
            np.asarray(X, np.float64) - mean,
            key,
            comps[:dim].T,
            sparsity=self.sparsity,
            queries=self.queries,
            epsilon=self.epsilon,
            max_iter=self.max_iter,
            anneal=self.anneal,
            seed=seed_of(self.random_state),
            record_every=max(1, self.max_iter // 50),
            pivot=self.pivot,
            validation=val,
            stop=self.stop_iter,
        )
        self.best_iter_, self.val_map_ = best[0] if best else (None, None)
        self.projectors_ = scipy.sparse.csc_array(U) if self.sparsity > 0 else U
        self.bias_ = (-mean.astype(np.float32) @ U).astype(np.float32)
        self.history_ = history
        self.n_iter_ = int(n_iter)
        return self

    def validates(self) -> bool:
        return self.validation > 0

    def refits(self, n_rows: int) -> bool:
        """No refit when ``train_size`` caps the subset of the ``n_rows`` fit rows (:meth:`refit_params`)."""
        return n_rows < int(self.train_size)

    def fit_cost(self, n_rows, n_features, n_classes, k=0, n_val=0) -> madds.FitCost:
        """Algorithm 1 on its subset of N = ``train_size`` rows: per iteration the objective over all N
        queries (an N x N score matrix), the gradient of ``queries`` of them and a golden-section
        search of up to 20 evaluations, each a projection of the subset; 50 history entries (the
        training mAP, each query ranking the others) and, with validation, as many checks of the
        validation rows' mAP. With validation an upper bound (it may stop sooner)."""
        D = n_features
        R = min(self.resolved_dim(D), D)
        n_v = min(int(self.validation), n_val if n_val else n_rows // 5) if self.validates() else 0
        N = max(2, min(int(self.train_size), n_rows - (0 if n_val else n_v)))
        P = min(int(self.queries), N)
        iters = int(self.max_iter) if self.stop_iter is None else min(int(self.max_iter), int(self.stop_iter))
        project = madds.gemm(N, R, D)
        objective = project + madds.gemm(N, N, R) + madds.passes(N * N, 30)
        gradient = project + madds.gemm(P, N, R) + madds.chain(D, P, N, R) + madds.chain(D, N, P, R)
        search = 20 * (project + madds.gemm(P, N, R) + madds.passes(P * N, 30) + R * madds.sort(D))
        iteration = objective + gradient + search + madds.passes(P * N, 30) + 200 * madds.CALL
        entries = min(iters, 50) + 1

        def ranked(n):  # every row querying the others, fully ranked (a few calls per query)
            scores = madds.gemm(n, R, D) + madds.gemm(n, n, R) + madds.passes(n * n, 20)
            return scores + n * (2 * madds.sort(n) + 20 * madds.CALL)

        start = madds.gemm(N, N, D) + madds.passes(N * N, 5) + madds.passes(N * D, 4)
        total = madds.FIT + start + iters * iteration + entries * (ranked(N) + (ranked(n_v) if n_v else 0.0))
        return madds.FitCost(total, n_v > 0 and iters > 0)

    def fit_facts(self) -> dict:
        return {"final": self.history_[-1], "best_iter": self.best_iter_, "val_map": self.val_map_}

    def refit_params(self) -> dict | None:
        """The kept U's iteration as ``stop_iter``, validation off: the refit shrinks its support on the
        same ``max_iter`` schedule and stops where the validated run's best state was. None (keep this
        fit) when ``train_size`` capped the subset: a refit would draw as many rows, and the state at
        that iteration of another subset's trajectory is not the validated one (issue 45 measured a
        refit 1 to 7.5 mAP points below the kept fit on Fashion 14 x 14)."""
        best = getattr(self, "best_iter_", None)
        if best is None:
            return {}
        return None if getattr(self, "subset_capped_", False) else {"stop_iter": int(best), "validation": 0}

    @property
    def _n_features_out(self) -> int:
        return int(self.projectors_.shape[1])

    def _model(self) -> LinearModel:
        # a fresh container per call: its cached compute form must not live on the estimator
        return LinearModel(self.projectors_, self.bias_, score="inner")

    def _transform(self, X):
        return self._model().transform(X)

    def cost(self) -> dict:
        """Non-zeros of U, its storage (CSC with small row indices when sparse) and multiply-adds."""
        check_is_fitted(self)
        return self._model().cost(self.n_features_in_)


def _check_keys(n_keys: int) -> None:
    if n_keys < 2:
        raise InputError(
            f"SparseProjector needs at least 2 relevance keys (positives and negatives); got "
            f"{n_keys} class. Pass labels of several classes."
        )
