"""What NML and linear ML share: SGD on the hinge of pairs, fed pair pools from labels or user pairs."""

from numbers import Integral, Real

import numpy as np

from metricpipe.tasks import madds, moments, stream
from metricpipe.tasks.base import (
    COUNT,
    DIM,
    NON_NEGATIVE,
    RANDOM_STATE,
    Interval,
    Learner,
    StrOptions,
    one_blas_thread,
    seed_of,
)
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.evaluation import can_rank, validation_map
from metricpipe.tasks.nml.kernels import check_nonnegative
from metricpipe.tasks.nml.pairs import pair_groups, sample_pairs
from metricpipe.tasks.nml.sgd import PairSGD
from metricpipe.tasks.rows import ArrayRows, TrainingRows
from metricpipe.tasks.validate import check_pair_indices

PAIR_CONSTRAINTS = {
    "dim": DIM,
    "pairs": [Interval(Integral, 2, None, closed="left")],
    "iters": [Interval(Integral, 0, None, closed="left")],
    "batch": COUNT,
    "learn_bias": ["boolean"],
    "bias": [Interval(Real, None, None, closed="neither")],
    "margin": NON_NEGATIVE,
    "optimizer": [StrOptions({"sgd", "adam"})],
    "lr": [*NON_NEGATIVE, None],
    "validation": [Interval(Integral, 0, None, closed="left")],
    "random_state": RANDOM_STATE,
}

# Early stopping: validation every ITERS // VALIDATIONS pairs; training stops after PATIENCE checks
# in a row without a better validation mAP, and keeps the best L.
VALIDATIONS, PATIENCE = 20, 10


class PairLearner(Learner):
    """Shared by :class:`NML` and :class:`LinearML`: SGD on the hinge of pairs (Eqs. 3 and 9).

    The ways in share the SGD loop, one pair pool at a time:

    ``fit(X, y)``, and the pipeline's ``fit_rows(rows, statistics)``
        pairs from labels, drawn inside the pools of ``tasks.stream.pools`` (in the pipeline, of its
        shuffled copy) -> :meth:`fit_stream`.
    ``fit_stream(pools, n_samples, n_features, init)``
        pairs from labels, drawn inside the given pools (X_pool, y_pool).
    ``partial_fit(X, y, classes=None, init=None)``
        one pool's pairs and steps per call, the SGD state kept: a loop of it over the pools is
        ``fit_stream`` without early stopping (dask-ml's ``Incremental`` drives it).
    ``fit_pairs(pairs, y, X=None)``
        pairs given by the user, as metric-learn's pair learners take them -> :meth:`fit_pair_blocks`.
    ``fit_pair_blocks(pairs, y, read_block, n_rows, block_rows, n_features, init)``
        the pipeline's entry point for user pairs: layout positions and a reader of layout blocks.

    Pairs from labels: a pool of m rows (out of ``n_samples`` per pass over the rows) gets its share
    of ``pairs``, m * pairs / n_samples (rounded so that a pass draws exactly ``pairs``), drawn
    afresh on every pass (:func:`sample_pairs`); SGD takes them ``batch`` at a time (a pool's last
    batch may be shorter) until ``iters`` pairs are seen. So ``pairs`` is the number of pairs drawn
    per pass over the training rows (the paper's 500,000 sampled pairs seen over 1,000,000
    iterations become two passes of 500,000 fresh pairs each). Pairs from the user are all used,
    ``pairs`` is then ignored.

    Early stopping (pairs from labels): with ``validation`` > 0, the mAP of validation rows querying
    one another is measured at the start and every ``iters`` / 20 pairs; L is the best seen, and
    training stops after 10 checks (half of them) in a row without a better one. The validation rows are
    (X_val, y_val) when given, else a stratified, seeded share of the training rows (at most a fifth,
    ``validation`` at most) that SGD never sees; the pipeline gives its ``val`` split. When no
    validation row has another of its class (few-shot data), early stopping is off and every row trains.

    Fitted attributes: ``L_`` (dim, n_features) float32, ``bias_`` (the threshold b, learned when
    ``learn_bias``), ``history_`` (list of {"iter": pairs seen, "hinge": mean hinge since the
    previous entry}, about 50 entries, and {"iter", "val_map"} at each validation),
    ``pairs_seen_``, ``n_steps_``, ``n_pairs_`` (pairs drawn or given), ``pair_source_`` ("labels"
    or "user"), ``best_iter_`` and ``val_map_`` (the kept L's pairs seen and validation mAP; None
    without validation).
    """

    _kind = ""
    feeds = "pairs"
    fitted_attributes = (
        "L_",
        "bias_",
        "classes_",
        "history_",
        "best_iter_",
        "val_map_",
        "pairs_seen_",
        "n_pairs_",
        "n_steps_",
        "pair_source_",
    )

    def validates(self) -> bool:
        return self.validation > 0

    def fit_cost(self, n_rows, n_features, n_classes, k=0, n_val=0) -> madds.FitCost:
        """``iters`` / ``batch`` steps (:meth:`_step_cost` each), the pools read (``iters`` / ``pairs``
        passes over the rows), and with validation 22 checks (the rows embedded, each querying the
        others, fully ranked); with validation an upper bound (early stopping may stop sooner)."""
        D, d, b = n_features, self.code_dim(n_features, n_classes), int(self.batch)
        steps = -(-int(self.iters) // b)
        n_v = min(int(self.validation), n_val if n_val else n_rows // 5) if self.validates() else 0
        rows_read = int(self.iters) / int(self.pairs) * max(1, n_rows - (0 if n_val else n_v))
        checks = VALIDATIONS + 2 if n_v else 0
        ranking = madds.gemm(n_v, n_v, d, float32=True) + 2 * n_v * madds.sort(n_v) + madds.passes(n_v * n_v, 10)
        check = self._embed_cost(n_v, D, d) + ranking
        pools = madds.read(rows_read * D) + madds.passes(rows_read * D, 4)  # read (decompressed), checked, normalised
        total = madds.FIT + steps * self._step_cost(b, D, d) + pools + checks * check
        return madds.FitCost(total, n_v > 0 and self.iters > 0)

    def _step_cost(self, b: int, D: int, d: int) -> float:  # pragma: no cover - each learner says
        raise NotImplementedError

    def _embed_cost(self, n: int, D: int, d: int) -> float:  # pragma: no cover - each learner says
        raise NotImplementedError

    def start(self, statistics: dict) -> tuple:
        """(L's start rows or None for the seeded default, the rows' RMS norm ``lr`` is read by) from the
        statistics it reads (:attr:`reads_statistics`)."""
        return None, 1.0

    def refit_params(self) -> dict:
        """``iters`` = the pairs seen by the kept L, validation off (the rate does not decay, so fewer
        pairs are the same schedule cut short); {} when the fit did not validate (user pairs)."""
        best = getattr(self, "best_iter_", None)
        return {} if best is None else {"iters": int(best), "validation": 0}

    # -- in memory ---------------------------------------------------------------------------------------
    def fit(self, X, y, block_rows=None, X_val=None, y_val=None):
        """Learn from rows X with class labels y: pairs drawn from the labels.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
        block_rows : int or None
            Rows per pool (None: 64 MB of float32 rows, as the pipeline's row-blocks); the pipeline
            uses its row-block size, so ``fit(X, y, block_rows=data.chunk_rows)`` on the training
            rows learns the pipeline's model.
        X_val, y_val : optional validation rows for early stopping (see the class docstring).

        Returns
        -------
        self
        """
        self._validate_params()
        X, codes = self._check_Xy(X, y)
        if self.requires_nonnegative:  # named as given, before rows are held out for validation
            check_nonnegative(X, f"{type(self).__name__}.fit: X")
        yv = None
        if X_val is not None:
            X_val, y_val = self._check_val(X_val, y_val)
            if self.requires_nonnegative:
                check_nonnegative(X_val, f"{type(self).__name__}.fit: X_val")
            yv = np.searchsorted(self.classes_, y_val)
            if np.any(yv >= len(self.classes_)) or np.any(
                self.classes_[np.minimum(yv, len(self.classes_) - 1)] != y_val
            ):
                raise InputError(f"{type(self).__name__}: y_val holds labels that are not in y")
        statistics = moments.statistics(X) if self.reads_statistics else {}
        return self.fit_rows(ArrayRows(X, codes, X_val, yv, block_rows), statistics)

    def fit_facts(self) -> dict:
        return {
            "samples": self.pairs_seen_,
            "pairs": int(self.n_pairs_),
            "pair_source": self.pair_source_,
            "best_iter": self.best_iter_,
            "val_map": self.val_map_,
        }

    def fit_rows(self, rows: TrainingRows, statistics: dict, labels=None):
        """Learn from :class:`~metricpipe.tasks.rows.TrainingRows` (pairs drawn from the labels inside
        each pool) and the statistics it reads (:attr:`reads_statistics`): ``fit`` and the pipeline both
        end here. With ``validation`` > 0, early stopping reads the given validation rows, else a
        stratified share held out of the fit rows (none, and every row trains, when no held-out row has
        another of its class: few-shot data). Returns self."""
        self._validate_params()
        seed = seed_of(self.random_state)  # once: a RandomState random_state gives one draw per call
        keep, val = rows.fit.copy(), np.zeros(0, np.int64)
        if self.validates() and rows.val is not None and len(rows.val):
            val = stream.seeded_sample(rows.val, self.validation, seed)
        elif self.validates():
            pos = np.flatnonzero(keep)
            held = pos[stream.validation_split(rows.labels[pos], self.validation, rows.keys[pos], seed)]
            if can_rank(rows.labels[held]):
                keep[held] = False
                val = held
        init, scale = self.start(statistics)
        n = int((keep & rows.in_stats).sum())
        given = (rows.take(val), rows.labels[val]) if len(val) else None
        return self._fit_labels(rows.pools(keep, seed), n, rows.n_features, init, scale, seed, given)

    def fit_pairs(self, pairs, y, X=None, block_rows=None):
        """Learn from pairs given by the user (metric-learn's ``_PairsClassifierMixin`` convention).

        Parameters
        ----------
        pairs : array-like of shape (n_pairs, 2, n_features), or (n_pairs, 2) int when X is given
            The two images of each pair, or (with X, like metric-learn's ``preprocessor``) their row
            indices in X.
        y : array-like of shape (n_pairs,)
            +1 for a similar pair, -1 for a dissimilar one.
        X : array-like of shape (n_samples, n_features) or None
        block_rows : int or None
            Rows per layout block (None: 64 MB of float32 rows). The rows get the seeded layout of
            ``tasks.stream.layout``; pairs are visited by the blocks of their two rows
            (:func:`pair_groups`), as the pipeline visits them on its shuffled copy.

        Returns
        -------
        self
        """
        self._validate_params()
        name = type(self).__name__
        if X is None:
            P = np.asarray(pairs)
            if P.ndim != 3 or P.shape[1] != 2:
                raise InputError(
                    f"{name}.fit_pairs: pairs must be an array of shape (n_pairs, 2, n_features) when "
                    f"X is not given; got shape {P.shape}; pass X for pairs of row indices"
                )
            X = self._check_X(P.reshape(-1, P.shape[2]), reset=True)
            idx = np.arange(len(X)).reshape(-1, 2)
        else:
            X = self._check_X(X, reset=True)
            idx = np.asarray(pairs)
            if idx.ndim != 2 or idx.shape[1] != 2:
                raise InputError(
                    f"{name}.fit_pairs: with X, pairs must be an (n_pairs, 2) array of row indices; "
                    f"got shape {idx.shape}"
                )
        y = np.asarray(y).ravel()
        check_pair_indices(idx[:, 0], idx[:, 1], y, len(X), f"{name}.fit_pairs")
        n, seed = len(X), seed_of(self.random_state)
        br = block_rows or stream.block_rows_for(X.shape[1])
        pi = stream.layout(stream.row_keys(X), seed)
        pos = np.empty(n, np.int64)
        pos[pi] = np.arange(n)
        return self._fit_pairs(
            pos[idx],
            y,
            lambda b: X[pi[b * br : (b + 1) * br]],
            n,
            br,
            X.shape[1],
            *self.start(moments.statistics(X) if self.reads_statistics else {}),
            seed,
        )

    # -- entry points over pools and layout blocks -----------------------------------------------------------------
    def fit_stream(self, pools, n_samples: int, n_features: int, init=None, X_val=None, y_val=None, row_scale=1.0):
        """Learn from pools of labelled rows: pairs drawn inside each pool (see the class docstring).

        Parameters
        ----------
        pools : iterable of (X_pool (m, n_features), y_pool (m,) class codes)
            Endless (or long enough) stream of pools, e.g. ``tasks.stream.pools`` in memory or
            ``metricpipe.shuffle.stream_pools`` in the pipeline.
        n_samples : int
            Rows in one pass over the pools (the training rows).
        n_features : int
        init : ndarray of shape (k, n_features) or None
            The start of L: its first ``dim`` rows (LinearML: the PCA components, required; NML: None
            for Algorithm 1's seeded uniform(-0.5, 0.5)).
        X_val, y_val : optional validation rows and labels (early stopping; ignored when
            ``validation`` is 0).
        row_scale : float, default=1.0
            The training rows' RMS norm (:func:`metricpipe.tasks.moments.row_scale` of the
            statistics): LinearML reads ``lr`` and starts L for rows of unit RMS norm. NML ignores it.

        Returns
        -------
        self
        """
        self._validate_params()
        val = None if X_val is None else (np.asarray(X_val), np.asarray(y_val))
        return self._fit_labels(pools, n_samples, n_features, init, row_scale, seed_of(self.random_state), val)

    def fit_pair_blocks(
        self, pairs, y, read_block, n_rows: int, block_rows: int, n_features: int, init=None, row_scale=1.0
    ):
        """Learn from user pairs over rows in a block layout, holding at most two blocks at a time.

        Parameters
        ----------
        pairs : ndarray of shape (n_pairs, 2)
            Layout positions of the two rows of each pair (checked by the caller).
        y : ndarray of shape (n_pairs,), +-1
        read_block : callable
            ``read_block(b)`` -> rows ``b * block_rows`` up to ``(b + 1) * block_rows`` of the layout,
            an array (<= block_rows, n_features).
        n_rows, block_rows, n_features : int
        init, row_scale : as in :meth:`fit_stream`

        Returns
        -------
        self
        """
        self._validate_params()
        return self._fit_pairs(
            pairs, y, read_block, n_rows, block_rows, n_features, init, row_scale, seed_of(self.random_state)
        )

    # -- internals ---------------------------------------------------------------------------------------
    def _fit_labels(self, pools, n_samples, n_features, init, scale: float, seed: int, val=None):
        L0 = self._start(n_features, init, seed)
        rng = np.random.default_rng([seed, 17])
        if val is not None and (not self.validation or not can_rank(val[1])):
            val = None  # off, or no validation row has another of its class to find
        if val is not None:
            val = (self._prepare(val[0], f"{type(self).__name__}: validation rows"), val[1])
        with one_blas_thread():
            self._run(self._label_pair_pools(pools, int(n_samples), rng), L0, scale, val)
        self.pair_source_ = "labels"
        return self

    def _fit_pairs(self, pairs, y, read_block, n_rows, block_rows, n_features, init, scale: float, seed: int):
        pairs = np.asarray(pairs, np.int64)
        y = np.asarray(y, np.float32).ravel()
        L0 = self._start(n_features, init, seed)
        groups = pair_groups(pairs[:, 0], pairs[:, 1], int(n_rows), int(block_rows), seed)
        with one_blas_thread():
            self._run(self._block_pair_pools(groups, pairs, y, read_block, int(block_rows)), L0, scale)
        self.pair_source_ = "user"
        self.n_pairs_ = int(len(y))
        self.__dict__.pop("classes_", None)  # from an earlier fit(X, y)
        return self

    def _start(self, n_features: int, init, seed: int) -> np.ndarray:
        self.n_features_in_ = int(n_features)
        if init is None:
            return self._default_init(n_features, seed)
        init = np.asarray(init, np.float64)
        if init.ndim != 2 or init.shape[1] != n_features:
            raise InputError(
                f"{type(self).__name__}: init must be an array (k, n_features={n_features}); got shape {init.shape}"
            )
        if self.dim is not None and self.dim > len(init):
            raise InputError(
                f"The 'dim' parameter of {type(self).__name__} must be <= {len(init)}, the rows of init "
                f"(the PCA components L starts from; n_features = {n_features}). Got {self.dim} instead."
            )
        return init[: self.resolved_dim(len(init))]

    def _prepare(self, X, where: str) -> np.ndarray:
        """The rows SGD compares: float32 (NML: checked non-negative and l1-normalised)."""
        return np.asarray(X, np.float32)

    def _label_pair_pools(self, pools, n_samples: int, rng):
        """Pair pools (rows, i, j, s) from pools of labelled rows, until ``iters`` pairs are drawn."""
        rows = drawn = idle = self.n_pairs_ = 0
        if self.iters == 0:  # a refit of the start (refit_params of best_iter_ 0): no pair to draw
            return
        for X, y in pools:
            i, j, s = self._pool_pairs(y, rows, n_samples, rng, self.iters - drawn)
            rows += len(y)
            if len(s) == 0:
                idle += len(y)
                if idle > 2 * n_samples:
                    raise InputError(
                        f"{type(self).__name__}: two passes over the {n_samples} training rows gave no "
                        f"pair (pools of fewer than two rows?); raise 'pairs' or the rows per pool"
                    )
                continue
            idle = 0
            drawn += len(s)
            self.n_pairs_ = drawn
            yield self._prepare(X, f"{type(self).__name__}: training rows"), i, j, s
            if drawn >= self.iters:
                return

    def _pool_pairs(self, y, rows: int, n_samples: int, rng, room: int | None = None):
        """The pairs of a pool of labels y that follows ``rows`` rows: its share of ``pairs`` per
        ``n_samples`` rows (rounded so that a pass draws exactly ``pairs``), ``room`` at most."""
        count = self.pairs * (rows + len(y)) // n_samples - self.pairs * rows // n_samples
        return sample_pairs(y, count if room is None else min(count, room), rng)

    def _block_pair_pools(self, groups, pairs, y, read_block, block_rows: int):
        """Pair pools from the groups of :func:`pair_groups`: the group's one or two blocks, in hand."""
        held = {}
        for blocks, sel in groups:
            held = {
                b: held[b]
                if b in held
                else self._prepare(read_block(b), f"{type(self).__name__}: rows of layout block {b}")
                for b in blocks
            }
            X = np.concatenate([held[b] for b in blocks]) if len(blocks) > 1 else held[blocks[0]]
            local = []
            for col in (0, 1):
                p = pairs[sel, col]
                b = p // block_rows
                local.append(p - b * block_rows + np.where(b == blocks[0], 0, len(held[blocks[0]])))
            yield X, local[0], local[1], y[sel]

    def _run(self, pair_pools, L0, scale: float, val=None) -> None:
        """The SGD loop: ``batch`` pairs per step from each pair pool until ``iters`` pairs are seen
        (or, with validation rows ``val`` = (X_val prepared, y_val), until early stopping)."""
        self.__dict__.pop("_partial", None)  # a fit starts afresh: the SGD state of partial_fit calls is dropped
        run = _PairRun(self, L0, scale, val)
        run.stop = val is not None and run.validate()
        try:
            for X, i, j, s in pair_pools:
                if run.steps(X, i, j, s):
                    break
        finally:
            run.sgd.close()
        run.history, run.losses = run.hinges(), []
        checked = [h["iter"] for h in run.history if "val_map" in h]
        if val is not None and not run.stop and checked[-1] != run.sgd.pairs_seen:
            run.validate()  # the end of training is a candidate too
        self._keep(run)

    def _keep(self, run: "_PairRun") -> None:
        """L and the fitted attributes from a run: the best validated L, else the current one."""
        sgd, L, bias = run.sgd, run.sgd.L, run.sgd.bias
        self.best_iter_ = self.val_map_ = None
        if run.best is not None:
            self.val_map_, self.best_iter_, L, bias = run.best
        self.L_ = np.ascontiguousarray(L, np.float32)
        self.bias_ = float(bias)
        self.history_ = run.hinges()
        self.pairs_seen_ = int(sgd.pairs_seen)
        self.n_steps_ = int(sgd.steps)

    # -- partial_fit -------------------------------------------------------------------------------------
    def partial_fit(self, X, y, classes=None, init=None):
        """SGD on the pairs of one pool of labelled rows: the steps :meth:`fit` takes for each of its pools.

        The pool gets its share of ``pairs`` (``pairs`` per ``n_samples`` rows, see the class
        docstring), drawn inside it, SGD takes them ``batch`` at a time; the SGD state (L, b, Adam's
        moments, the pairs seen, the draws) carries over from call to call, so a loop of
        ``partial_fit`` over the pools of :func:`metricpipe.tasks.stream.pools` learns the L of ``fit``
        with ``validation=0`` and as many ``iters`` as the loop drew pairs. The caller owns the loop:
        ``iters`` and early stopping are ``fit``'s, and the model after a call is the last L. ``fit``
        drops this state.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            A pool of training rows (NML: non-negative).
        y : array-like of shape (n_samples,)
        classes : array-like or None
            Every class label the calls will see (scikit-learn's convention), on the first call; None:
            the labels of the first call's y.
        init : dict or None
            On the first call, the statistics of the training rows (:attr:`reads_statistics`, e.g.
            :func:`metricpipe.tasks.moments.statistics`; LinearML starts from their PCA components)
            and their ``n_samples``, the rows of one pass that ``pairs`` counts pairs for. None: the
            statistics of the first call's rows, and its row count for ``n_samples``. Later calls ignore
            it (dask-ml's ``Incremental`` passes it to every call).

        Returns
        -------
        self
        """
        state = getattr(self, "_partial", None)
        if state is None:
            X, codes = self._partial_rows(X, y, classes)
            state = self._partial = self._partial_start(X, init)
        else:
            X, codes = self._partial_rows(X, y, classes, state["classes"])
        i, j, s = self._pool_pairs(codes, state["rows"], state["n_samples"], state["rng"])
        state["rows"] += len(codes)
        state["drawn"] += len(s)
        run = state["run"]
        try:
            with one_blas_thread():
                run.steps(self._prepare(X, f"{type(self).__name__}.partial_fit: X"), i, j, s, until_iters=False)
        finally:
            run.sgd.close()
        self._keep(run)
        self.n_pairs_, self.pair_source_ = state["drawn"], "labels"
        return self

    def _partial_start(self, X, init) -> dict:
        """partial_fit's state after its first rows X: the SGD from ``init``'s start (else X's), the
        draws, the rows seen and ``n_samples``."""
        if init is not None and not isinstance(init, dict):
            raise InputError(
                f"{type(self).__name__}.partial_fit: init must be a dict of statistics (e.g. "
                f"metricpipe.tasks.moments.statistics(X)); got {type(init).__name__}"
            )
        statistics = init if init is not None else moments.statistics(X) if self.reads_statistics else {}
        missing = [k for k in self.reads_statistics if k not in statistics]
        if missing:
            raise InputError(
                f"{type(self).__name__}.partial_fit: init lacks {', '.join(missing)}; give the "
                f"statistics of metricpipe.tasks.moments.statistics(X)"
            )
        n_samples = int(statistics.get("n_samples", len(X)))
        if n_samples < 1:
            raise InputError(
                f"{type(self).__name__}.partial_fit: init's n_samples must be >= 1 (the rows of one "
                f"pass); got {n_samples}"
            )
        seed = seed_of(self.random_state)
        L_init, scale = self.start(statistics)
        run = _PairRun(self, self._start(X.shape[1], L_init, seed), scale)
        return {
            "run": run,
            "rng": np.random.default_rng([seed, 17]),
            "rows": 0,
            "drawn": 0,
            "n_samples": n_samples,
            "classes": self.classes_,
        }

    @property
    def _n_features_out(self):
        return len(self.L_)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.required = True
        return tags


class _PairRun:
    """One SGD run over pair pools: the :class:`PairSGD`, its ``history`` (the mean hinge every
    ``iters`` / 50 pairs, and the validations) and early stopping on validation rows ``val``
    (prepared rows, labels): a check every ``iters`` / VALIDATIONS pairs keeps the best L, and says
    stop after PATIENCE checks in a row without a better mAP."""

    def __init__(self, learner: PairLearner, L0, scale: float, val=None):
        self.sgd = PairSGD(
            L0,
            learner._kind,
            learner._searched("lr"),
            learner.bias,
            learner.margin,
            learner.learn_bias,
            learner.optimizer,
            getattr(learner, "threads", 1),
            scale,
        )
        self.batch, self.iters = learner.batch, learner.iters
        self.history, self.losses, self.every = [], [], max(1, self.iters // 50)
        self.check = max(self.batch, self.iters // VALIDATIONS)
        self.val, self.best, self.stale, self.stop = val, None, 0, False

    def validate(self) -> bool:
        sgd = self.sgd
        with np.errstate(over="ignore", invalid="ignore"):  # a diverging L is the step's error to raise
            v = validation_map(sgd.embed(self.val[0]), self.val[1])
        self.history.append({"iter": int(sgd.pairs_seen), "val_map": v})
        if self.best is None or v > self.best[0] or not np.isfinite(self.best[0]):
            self.best, self.stale = (v, int(sgd.pairs_seen), sgd.L.copy(), sgd.bias), 0
        else:
            self.stale += 1
        return self.stale >= PATIENCE

    def steps(self, X, i, j, s, until_iters: bool = True) -> bool:
        """SGD on one pair pool: ``batch`` pairs a step (the pool's last batch may be shorter;
        ``until_iters``: none past ``iters`` pairs). Returns whether to stop (``iters`` pairs, or early
        stopping)."""
        sgd = self.sgd
        for a in range(0, len(s), self.batch):
            b = min(a + self.batch, len(s))
            if until_iters:
                b = min(b, a + self.iters - sgd.pairs_seen)
            self.losses.append(sgd.step(X[i[a:b]], X[j[a:b]], s[a:b]))
            if sgd.pairs_seen // self.every != (sgd.pairs_seen - (b - a)) // self.every:
                self.history.append({"iter": int(sgd.pairs_seen), "hinge": float(np.mean(self.losses))})
                self.losses = []
            if self.val is not None and sgd.pairs_seen // self.check != (sgd.pairs_seen - (b - a)) // self.check:
                self.stop = self.validate()
            if (until_iters and sgd.pairs_seen >= self.iters) or self.stop:
                return True
        return False

    def hinges(self) -> list:
        """The history, with the mean hinge of the pairs since its last entry."""
        tail = [{"iter": int(self.sgd.pairs_seen), "hinge": float(np.mean(self.losses))}] if self.losses else []
        return self.history + tail
