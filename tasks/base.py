"""What every metricpipe learner shares: scikit-learn's estimator contract.

A learner's ``__init__`` only stores its parameters; ``fit`` checks them against the class's
``_parameter_constraints`` (scikit-learn's wording: "The 'dim' parameter of NCMML must be an int in
the range [1, inf). Got 0 instead.") and checks the data; fitted attributes end in ``_``;
``transform(X)`` gives the codes. ``get_params``/``set_params``/``clone`` come from
:class:`sklearn.base.BaseEstimator`, so a learner works in ``Pipeline`` and ``GridSearchCV``.

The out-of-core pipeline drives the *same* classes: it never trains a model itself, it hands a
learner what the learner's documented entry point takes (streamed statistics, a stream of
shuffled batches, a bounded set of rows) and stores the fitted attributes
(:meth:`Learner.fitted_state`), from which :meth:`Learner.from_state` rebuilds the estimator.
"""

from numbers import Integral, Real

import numpy as np
import scipy.sparse
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.utils._param_validation import Interval, InvalidParameterError, Options, StrOptions  # noqa: F401 (re-exported)
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from metricpipe.tasks import madds
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.madds import FitCost
from metricpipe.tasks.validate import check_float32_range

# constraints shared by many learners
DIM = [Interval(Integral, 1, None, closed="left")]
DIM_OR_NONE = [Interval(Integral, 1, None, closed="left"), None]
POSITIVE = [Interval(Real, 0, None, closed="neither")]
NON_NEGATIVE = [Interval(Real, 0, None, closed="left")]
COUNT = [Interval(Integral, 1, None, closed="left")]
RANDOM_STATE = ["random_state"]


def seed_of(random_state) -> int:
    """An int seed from ``random_state`` (None -> 0, so that a learner is deterministic by default).

    Learners draw from ``np.random.default_rng([seed, purpose])`` streams; a ``RandomState``
    instance contributes one draw.
    """
    if random_state is None:
        return 0
    if isinstance(random_state, (Integral, np.integer)):
        return int(random_state)
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(0, 2**31 - 1))
    raise InputError(f"random_state must be None, an int or a numpy RandomState. Got {random_state!r} instead.")


def one_blas_thread():
    """A context in which BLAS runs on one thread, for SGD loops: their many small products ran ~10x
    slower when BLAS threads contend for a loaded 2-core machine (NCMML on digits, 200 steps: 3.0 s
    with the default 2 threads, 0.33 s with one). The pipeline's workers are single-threaded already,
    so in-memory fits and the pipeline run the same way."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(1, user_api="blas")


def _assume_finite() -> bool:
    import sklearn

    return bool(sklearn.get_config()["assume_finite"])


def _within_float32(X, where: str = "X") -> None:
    """Finite, and within float32's range: codes are float32 and several learners compute in it, so a
    finite float64 value beyond its range would come out as inf or NaN codes (the command line
    refuses such files when it stages them). One line naming the first bad row and column."""
    X = np.asarray(X)
    if np.issubdtype(X.dtype, np.floating) and not _assume_finite():
        bad = ~np.isfinite(X)
        if bad.any():
            r, c = np.argwhere(bad)[0] if X.ndim == 2 else (np.flatnonzero(bad)[0], 0)
            raise InputError(
                f"{where}: Input contains {int(bad.sum())} non-finite value(s) (NaN or inf), first "
                f"{X[r, c] if X.ndim == 2 else X.flat[r]} at row {r}, column {c}; drop or impute those "
                f"rows (e.g. sklearn.impute.SimpleImputer in a Pipeline before this step)"
            )
        check_float32_range(X, 0, where, "metricpipe computes in float32: scale the features")


class Learner(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Base of every learner. Subclasses declare ``_parameter_constraints`` and implement
    ``fit`` and ``_transform``.

    Class attributes a subclass may override:

    ``code_metric``: how two codes are compared, ``"euclidean"`` (distance) or ``"inner"``
    (product; SL-NE/SL-DE); a property where it depends on the fit (kernel SLEM's Eq. 16 score).
    ``method``: the name in configs (``methods: [{method: ncmml}]``).
    ``search_space``: the parameters chosen on a validation split when a config leaves them unset,
    each with its candidate values (the default first); ``selection_metric``: what ranks the
    candidates, in the evaluate stage's words (``knnK``, ``softvoteK``, ``ncm``, ``ncmc``, ``map``).
    Both are read by :func:`metricpipe.tasks.evaluation.validation_score` and the pipeline's
    selection; a Python user passes them to GridSearchCV themselves.
    ``own_classifier``: the classifier the learner is, in the evaluate stage's words (``ncm`` for
    NCMML, ``ncmc`` for NCMC; None for a learner that only encodes): the evaluate stage scores a
    model with it whatever ``evaluate.classification.classifiers`` lists.

    A fitted learner also has ``n_features_in_`` and the property ``_n_features_out`` (the code
    dimension; scikit-learn's ``get_feature_names_out`` uses it).
    """

    method: str = ""
    #: what the pipeline feeds it (the train stage has one feeder per kind): "statistics" (the statistics
    #: stage's moments), "stream" (pools of the shuffled training rows), "pairs" (the same pools, or user
    #: pairs), "neighbours" (the rows in its input space and their neighbour graph), "subset" (a bounded
    #: stratified sample of the rows), "pool" (a pool of negatives, or its moments)
    feeds: str = "statistics"
    #: the statistics (names of :func:`~metricpipe.tasks.moments.finalize_statistics`'s arrays) its fit reads
    reads_statistics: tuple = ()
    code_metric: str = "euclidean"
    requires_nonnegative: bool = False  # NML: the pipeline refuses staged features with a negative value
    search_space: dict = {}
    # another space where a set parameter changes what the searched one means: {(name, value): space}
    search_space_when: dict = {}
    selection_metric: str = "knn1"
    own_classifier: str | None = None

    @classmethod
    def search_grid(cls, params: dict) -> dict:
        """The search space for an entry with these parameters (a subclass drops what they make moot)."""
        return next((space for (k, v), space in cls.search_space_when.items() if params.get(k) == v), cls.search_space)

    #: the code dimension ``dim: None`` stands for, capped at what the data offers (None: every one)
    DEFAULT_DIM: int | None = None

    def resolved_dim(self, available: int) -> int:
        """``dim``, or for ``dim`` None ``DEFAULT_DIM`` capped at the ``available`` directions (the PCA
        components a learner starts from: at most n_features)."""
        if self.dim is not None:
            return self.dim
        return available if self.DEFAULT_DIM is None else min(available, self.DEFAULT_DIM)

    def _searched(self, name: str):
        """A searched parameter's value; left None, the first value of the grid the other parameters
        select (where that grid depends on them, e.g. NCMML's lr: 30 for the Euclidean form, 1 for the
        dot form), which is the default a selection lists first."""
        value = getattr(self, name)
        return type(self).search_grid(self.get_params(deep=False))[name][0] if value is None else value

    # -- scikit-learn plumbing -------------------------------------------------------------------------
    def _validate_params(self):
        """scikit-learn's checks, and no booleans for numbers: ``True`` is an int to Python (and to
        scikit-learn's Interval), so ``dim: true`` in a config would train a 1-d model."""
        super()._validate_params()
        for key, value in self.get_params(deep=False).items():
            allowed = self._parameter_constraints.get(key, ["boolean"])
            if isinstance(value, (bool, np.bool_)) and "boolean" not in allowed and bool not in allowed:
                raise InvalidParameterError(
                    f"The {key!r} parameter of {type(self).__name__} must be a number, not "
                    f"a boolean. Got {value!r} instead."
                )

    def _check_X(self, X, reset: bool, y=None, where: str = "X", **kw):
        """``validate_data`` with float32/float64 input (other dtypes are cast to float64); ``where``
        names the argument in errors."""
        kw.setdefault("dtype", [np.float64, np.float32])
        kw.setdefault("ensure_all_finite", False)  # checked below, naming the first bad row and column
        if reset:  # fitting: moments need two rows
            kw.setdefault("ensure_min_samples", 2)
        try:
            out = (
                validate_data(self, X, reset=reset, **kw) if y is None else validate_data(self, X, y, reset=reset, **kw)
            )
        except ValueError as e:  # scikit-learn's 1-D message prints the whole array over many lines
            if "Reshape your data" not in str(e) or isinstance(e, InputError):
                raise
            raise InputError(
                f"{type(self).__name__}: {where}: expected a 2-D array (n_samples, n_features), got "
                f"{np.ndim(X)}-D of shape {np.shape(X)}; Reshape your data with {where}.reshape(-1, 1) "
                f"for a single feature or {where}.reshape(1, -1) for a single sample"
            ) from None
        _within_float32(out if y is None else out[0], f"{type(self).__name__}: {where}")
        return out

    def _check_val(self, X_val, y_val):
        """fit's validation rows: (X_val checked as X is, y_val as an array of one label per row)."""
        name = type(self).__name__
        if y_val is None:
            raise InputError(f"{name}.fit: X_val needs y_val, the validation labels")
        X_val = self._check_X(X_val, reset=False, where="X_val")
        y_val = np.asarray(y_val)
        if y_val.ndim != 1 or len(y_val) != len(X_val):
            raise InputError(
                f"{name}.fit: y_val must hold one label per row of X_val ({len(X_val)}); got shape {y_val.shape}"
            )
        return X_val, y_val

    def _check_Xy(self, X, y, min_classes: int = 2, min_per_class: int = 1):
        """Validate labelled training data: returns (X, y codes 0..C-1); sets ``classes_``."""
        if y is None:
            raise ValueError(f"{type(self).__name__} requires y to be passed, but the target y is None.")
        X, y = self._check_X(X, True, y=y)
        check_classification_targets(y)
        self.classes_, codes = np.unique(y, return_inverse=True)
        if len(self.classes_) < min_classes:
            raise ValueError(
                f"{type(self).__name__} needs at least {min_classes} classes in y; got {len(self.classes_)} class(es)."
            )
        if min_per_class > 1:
            counts = np.bincount(codes)
            if counts.min() < min_per_class:
                raise ValueError(
                    f"{type(self).__name__} needs at least {min_per_class} samples of every class; "
                    f"class {self.classes_[int(np.argmin(counts))]!r} has {int(counts.min())}."
                )
        return X, codes.astype(np.int64)

    def _partial_rows(self, X, y, classes, known=None):
        """partial_fit's rows (scikit-learn's convention): (X checked, y as class codes, positions in
        ``classes_``). The first call (``known`` None) checks the parameters, sets ``n_features_in_`` and
        ``classes_`` (``classes``, default the labels of its y); a later one restores ``classes_`` =
        ``known``, and its ``classes``, if given, must be the same."""
        name = f"{type(self).__name__}.partial_fit"
        if y is None:
            raise ValueError(f"{type(self).__name__} requires y to be passed, but the target y is None.")
        if known is None:
            self._validate_params()
        X, y = self._check_X(X, known is None, y=y)
        check_classification_targets(y)
        if known is None:
            known = np.unique(y) if classes is None else np.unique(np.asarray(classes))
        elif classes is not None and not np.array_equal(np.unique(np.asarray(classes)), known):
            raise InputError(
                f"{name}: classes differs from the first call's ({known.tolist()[:5]}...); give "
                f"the same classes to every call"
            )
        self.classes_ = known
        codes = np.searchsorted(known, y)
        bad = (codes >= len(known)) | (known[np.minimum(codes, len(known) - 1)] != y)
        if bad.any():
            raise InputError(
                f"{name}: y holds the label {y[bad][0].item()!r}, which is not in classes "
                f"{known.tolist()[:5]}; give every label on the first call (classes=...)"
            )
        return X, codes.astype(np.int64)

    def transform(self, X):
        """Codes of the rows of X.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features_in_)

        Returns
        -------
        codes : ndarray of shape (n_samples, n_codes), float32
        """
        check_is_fitted(self)
        X = self._check_X(X, reset=False)
        with np.errstate(over="ignore", invalid="ignore"):
            codes = np.asarray(self._transform(X), np.float32)
        # (the pipeline sets assume_finite: staging refused such values and it checks codes itself)
        if not _assume_finite() and not np.isfinite(codes).all():
            r, c = np.argwhere(~np.isfinite(codes))[0]
            raise InputError(
                f"{type(self).__name__}: the codes are not finite ({codes[r, c]} at row {r}, column {c}): "
                f"the input's values (max |x| = {float(np.abs(X).max()):.3g}) overflow float32 in the "
                f"model, or its parameters divide by zero; scale the features or change the parameters "
                f"(e.g. a larger eps)"
            )
        return codes

    def _transform(self, X):  # pragma: no cover - every subclass implements it
        raise NotImplementedError

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float32"]
        return tags

    # -- storage: the pipeline saves the fitted attributes and rebuilds the estimator from them --------
    #: the fitted attributes a class adds to its bases' (:meth:`declared_state` collects them): the
    #: only ones :meth:`from_state` sets, so an array added to a stored model (a store made by
    #: someone else) cannot change what the rebuilt estimator computes (Identity given components_)
    fitted_attributes: tuple = ("n_features_in_", "feature_names_in_")

    @classmethod
    def declared_state(cls) -> frozenset:
        """Every fitted attribute the class declares (its ``fitted_attributes`` and its bases')."""
        return frozenset(a for c in cls.__mro__ for a in vars(c).get("fitted_attributes", ()))

    def fitted_state(self) -> dict:
        """Every fitted attribute (public, ending in ``_``): arrays, scipy sparse arrays, numbers,
        strings and JSON-able lists/dicts. The pipeline stores arrays in Zarr and the rest as JSON."""
        check_is_fitted(self)
        return {k: v for k, v in vars(self).items() if k.endswith("_") and not k.startswith("_")}

    @classmethod
    def from_state(cls, params: dict, state: dict) -> "Learner":
        """The fitted estimator from its parameters and :meth:`fitted_state`; an attribute the class
        does not declare (:meth:`declared_state`) is not set."""
        est = cls(**params)
        declared = cls.declared_state()
        for k, v in state.items():
            if k in declared:
                setattr(est, k, v)
        return est

    #: whether ``dim`` starts from the PCA directions (so it cannot exceed the number of features)
    dim_within_features = False
    #: whether the pipeline fits it from the D x D covariance (LDA, linear SLEM), which the statistics
    #: stage keeps only up to ``statistics.max_dense_dim`` features
    needs_dense_covariance = False
    #: what a user can do instead when the covariance is too large to keep (said in that refusal)
    dense_alternative = ""

    def check_data_shape(self, n_features: int, n_classes: int) -> None:
        """Refuse parameters the data's shape rules out, before any work (the pipeline calls it
        after reading the source's header): ``dim`` above the features a PCA start has. Subclasses
        with other limits extend it (the class labels NCMML's ``classes`` names: ``trained_classes``)."""
        for name in ("dim", "input_dim") if self.dim_within_features else ("input_dim",):
            v = getattr(self, name, None)
            if isinstance(v, Integral) and v > n_features:
                raise InputError(
                    f"The '{name}' parameter of {type(self).__name__} must be <= {n_features}, the "
                    f"data's features. Got {v} instead."
                )

    def shape_notes(self, n_features: int, n_classes: int) -> list[str]:
        """What the data's shape changes in the parameters without ruling them out (e.g. a value
        rounded to the nearest feasible one): the pipeline prints each before any work."""
        return []

    # -- what the pipeline asks of a learner before any work ------------------------------------------
    def trained_classes(self, labels) -> np.ndarray:
        """The class codes (positions in ``labels``, the class labels in code order) whose rows train it:
        every class (NCMML's ``classes`` names a subset)."""
        return np.arange(len(labels))

    def code_dim(self, n_features: int, n_classes: int) -> int:
        """The width of its codes on data of this shape, as its parameters give it before any fit: ``dim``,
        else the rule ``dim: None`` stands for (``DEFAULT_DIM``, capped at the features)."""
        if isinstance(getattr(self, "dim", None), Integral):
            return min(int(self.dim), n_features)
        return n_features if self.DEFAULT_DIM is None else min(self.DEFAULT_DIM, n_features)

    def view_dim(self, n_features: int, n_classes: int) -> int:
        """The widest view of a row the evaluation classifies in (the codes; SL-NE's exact view too)."""
        return self.code_dim(n_features, n_classes)

    def largest_task(self, n_rows: int, n_features: int, n_classes: int, k: int = 0, anchors: int | None = None):
        """(what, bytes, the parameter to change) of the largest task its fit holds beyond a row-block,
        fed ``n_rows`` rows (its pool, its training rows) with ``k`` neighbours each for ``anchors`` of
        them; None when it holds no more than the row-blocks it reads (the memory rule's default)."""
        return None

    def pool_rows(self, n_classes: int) -> int | None:
        """Rows of the shuffled training rows its fit reads at most (a streamed learner that stops after
        a number of steps), so that the pipeline writes only the blocks visited first; None: every row."""
        return None

    def serves(self, classifier: str) -> str | None:
        """Why its codes cannot serve ``classifier`` (knnK, softvoteK, ncm, ncmc); None: they can."""
        return None

    def portable(self) -> tuple[str, dict, dict]:
        """(kind, arrays, scalars) of the fitted model for ``metricpipe export --npz``, applied with
        numpy alone by the README's ``apply_model``: ``affine`` (codes = X @ W + b; no W: X; no b: no
        offset), ``sphere``, ``chi2``, ``slem``, ``kernel_slem`` (each learner's docstring)."""
        check_is_fitted(self)
        W, b = getattr(self, "components_", None), getattr(self, "offset_", None)
        arrays = {} if W is None else {"W": W.toarray() if scipy.sparse.issparse(W) else np.asarray(W)}
        if b is not None:
            arrays["b"] = np.asarray(b)
        return "affine", arrays, {}

    def fit_cost(self, n_rows: int, n_features: int, n_classes: int, k: int = 0, n_val: int = 0) -> FitCost | None:
        """What fitting it costs on data of this shape, before any work: multiply-adds in the unit of
        :mod:`metricpipe.tasks.madds` (a float64 GEMM's), from its algorithm (the steps it takes, the
        products each makes, the factorisations), ``at_most`` where early stopping decides the steps.

        Parameters
        ----------
        n_rows : int
            The rows its fit is fed (its training rows, its pool of negatives).
        n_features, n_classes : int
            The data's dimension and classes.
        k : int
            Neighbours per row of the graph it is fed (SL-NE, SL-DE), else 0.
        n_val : int
            Validation rows it is given (its early stopping), 0 when it holds its own out.

        Returns
        -------
        FitCost or None
            None when the learner does not say (a plan shows "unknown").
        """
        return None

    def transform_cost(self, n_rows: int, n_features: int, n_classes: int) -> float:
        """Multiply-adds (:mod:`metricpipe.tasks.madds`'s unit) of encoding ``n_rows`` rows, before any
        fit: a projection to :meth:`code_dim` columns, and the rows read (decompressed) and checked, by
        default."""
        projection = madds.gemm(n_rows, self.code_dim(n_features, n_classes), n_features)
        return projection + madds.passes(n_rows * n_features, 4)

    def fit_facts(self) -> dict:
        """Facts of the fit a run records with the model (kept steps, validation scores; ``samples``:
        the rows or pairs it processed, from which the run reports a rate); {} by default."""
        return {}

    # -- validation and refit: what the pipeline asks before and after a fit -------------------------
    def validates(self) -> bool:
        """Whether ``fit`` reads validation rows (early stopping): the pipeline then hands it the
        validation rows it borrowed from the train split, and refits the model on every train row
        afterwards (:meth:`refit_params`)."""
        return False

    def refit_params(self) -> dict | None:
        """On a fitted learner: the parameters with which a fit on every training row, the validation
        rows included, repeats this fit's schedule without validation rows (NCMML: the steps it
        kept, early stopping off). {} when the fit read no validation rows; None when a refit would
        see no more rows than this fit did (a training subset capped below the rows offered): the
        pipeline then keeps this fit, whose kept state validation chose, as the final model."""
        return {}

    def refits(self, n_rows: int) -> bool:
        """Before any fit: whether a validated fit on ``n_rows`` rows is followed by a refit on every
        training row (:meth:`refit_params` not None): yes, unless its fit uses fewer rows than that
        anyway."""
        return True

    def keeps_distances(self) -> bool:
        """On a fitted learner: whether its codes keep the input's Euclidean distances (identity, a
        full-rank rotation), so that a kNN graph of the features is one of the codes. False by default."""
        return False

    def cost(self) -> dict:
        """Non-zeros, storage bytes and multiply-adds per image of the encoder (0 when it has no
        projection); subclasses with a projection override it."""
        return {"nnz": 0, "storage_bytes": 0, "flops_per_image": 0}
