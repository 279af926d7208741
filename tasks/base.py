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
from sklearn.utils._param_validation import (  # noqa: F401 (re-exported)
    Interval,
    InvalidParameterError,
    Options,
    StrOptions,
    validate_parameter_constraints,
)
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from metricpipe.tasks.code_metric import CodeComparison
from metricpipe.tasks.costs import StatedCost
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.state import StoredState
from metricpipe.tasks.validate import assume_finite, check_finite_float32

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


class Learner(
    StoredState, CodeComparison, StatedCost, ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator
):
    """Base of every learner: a scikit-learn transformer the pipeline can feed, store and rebuild.

    Subclasses declare ``_parameter_constraints`` and implement ``fit`` and ``_transform(X)`` (the
    codes of checked rows, shape (n_samples, n_codes)); the class attributes below say what the
    pipeline feeds them and how their codes are used. A fitted learner also has ``n_features_in_``
    and the property ``_n_features_out`` (the code dimension; scikit-learn's
    ``get_feature_names_out`` uses it).

    Attributes
    ----------
    method : str
        The name in configs (``methods: [{method: ncmml}]``).
    feeds : {'statistics', 'stream', 'pairs', 'neighbours', 'subset', 'pool'}
        What the pipeline hands its fit (the train stage has one feeder per kind): the statistics
        stage's moments, pools of the shuffled training rows, the same pools or user pairs, the rows
        and their neighbour graph, a bounded stratified sample of the rows, a pool of negatives.
    code_metric : {'euclidean', 'inner'} or str
        How two codes are compared: Euclidean distance or inner product (SL-NE/SL-DE, sparse
        projectors); a property where it depends on the fit (kernel SLEM's Eq. 16 score).
        :meth:`code_distance`, :meth:`get_metric`, :meth:`pair_distance` and :meth:`knn_params`
        apply it (metric-learn's names), e.g. for scikit-learn's neighbour estimators.
    search_space : dict of str to list
        The parameters chosen on a validation split when a config leaves them unset, each with its
        candidate values (the default first); read by the pipeline's selection and by
        :func:`metricpipe.tasks.evaluation.validation_score` (a Python user passes them to
        ``GridSearchCV``).
    selection_metric : str
        What ranks the candidates, in the evaluate stage's words (``knnK``, ``softvoteK``, ``ncm``,
        ``ncmc``, ``map``).
    own_classifier : str or None
        The classifier the learner is (``ncm`` for NCMML, ``ncmc`` for NCMC; None for a learner
        that only encodes): the evaluate stage scores a model with it whatever
        ``evaluate.classification.classifiers`` lists.
    requires_nonnegative : bool
        Whether its input must be non-negative (NML's chi2 kernel): the pipeline checks the staged
        features.
    reads_statistics : tuple of str
        The statistics its fit reads (names of the arrays of
        :func:`~metricpipe.tasks.moments.finalize_statistics`).
    fitted_attributes : tuple of str
        The fitted attributes the class adds to its bases' (:meth:`declared_state`): the only ones
        :meth:`from_state` sets.
    DEFAULT_DIM : int or None
        The code dimension ``dim: None`` stands for, capped at what the data offers (None: every one).
    dim_within_features : bool
        Whether ``dim`` starts from the PCA directions (so it cannot exceed the number of features).
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
        """The search space for an entry with these parameters (a subclass drops what they make moot).

        Parameters
        ----------
        params : dict
            The parameters a config entry sets.

        Returns
        -------
        dict of str to list
            Each searched parameter and its candidate values, the default first.
        """
        return next((space for (k, v), space in cls.search_space_when.items() if params.get(k) == v), cls.search_space)

    #: the code dimension ``dim: None`` stands for, capped at what the data offers (None: every one)
    DEFAULT_DIM: int | None = None

    def resolved_dim(self, available: int) -> int:
        """The code dimension: ``dim``, or for ``dim`` None ``DEFAULT_DIM`` capped at ``available``.

        Parameters
        ----------
        available : int
            The directions a learner starts from (its PCA components: at most n_features).

        Returns
        -------
        int
        """
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
            self._no_boolean(key, value)

    @classmethod
    def _no_boolean(cls, key: str, value) -> None:
        allowed = cls._parameter_constraints.get(key, ["boolean"])
        if isinstance(value, (bool, np.bool_)) and "boolean" not in allowed and bool not in allowed:
            raise InvalidParameterError(
                f"The {key!r} parameter of {cls.__name__} must be a number, not a boolean. Got {value!r} instead."
            )

    @classmethod
    def check_parameter(cls, key: str, value) -> None:
        """The checks of one parameter on its own (its declared constraints, no boolean for a number),
        whatever the others: what a config's checks run per value, so that every bad value of an entry
        is told at once (the checks across parameters run in ``fit``, and on the whole entry after).

        Parameters
        ----------
        key : str
            The parameter's name.
        value : object
            Its value.

        Raises
        ------
        InvalidParameterError
            In scikit-learn's wording ("The 'dim' parameter of PCA must be ... Got 0 instead.").
        """
        if key in cls._parameter_constraints:
            validate_parameter_constraints({key: cls._parameter_constraints[key]}, {key: value}, cls.__name__)
        cls._no_boolean(key, value)

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
        check_finite_float32(out if y is None else out[0], f"{type(self).__name__}: {where}")
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
        X : array-like of shape (n_samples, n_features)
            Rows of the features the learner was fitted on.

        Returns
        -------
        codes : ndarray of shape (n_samples, n_codes), float32
            Compared as :attr:`code_metric` says (distance or inner product).
        """
        check_is_fitted(self)
        X = self._check_X(X, reset=False)
        with np.errstate(over="ignore", invalid="ignore"):
            codes = np.asarray(self._transform(X), np.float32)
        # (the pipeline sets assume_finite: staging refused such values and it checks codes itself)
        if not assume_finite() and not np.isfinite(codes).all():
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

    #: whether ``dim`` starts from the PCA directions (so it cannot exceed the number of features)
    dim_within_features = False
    #: whether the pipeline fits it from the D x D covariance (LDA, linear SLEM), which the statistics
    #: stage keeps only up to ``statistics.max_dense_dim`` features
    needs_dense_covariance = False
    #: what a user can do instead when the covariance is too large to keep (said in that refusal)
    dense_alternative = ""

    def check_data_shape(self, n_features: int, n_classes: int) -> None:
        """Refuse parameters the data's shape rules out, before any work.

        The pipeline calls it after reading the source's header: ``dim`` above the features a PCA
        start has is refused. Subclasses with other limits extend it (the class labels NCMML's
        ``classes`` names: :meth:`trained_classes`).

        Parameters
        ----------
        n_features : int
            Features of the data.
        n_classes : int
            Classes of its labels.

        Raises
        ------
        InputError
            One line naming the parameter, the limit and the value.
        """
        for name in ("dim", "input_dim") if self.dim_within_features else ("input_dim",):
            v = getattr(self, name, None)
            if isinstance(v, Integral) and v > n_features:
                raise InputError(
                    f"The '{name}' parameter of {type(self).__name__} must be <= {n_features}, the "
                    f"data's features. Got {v} instead."
                )

    def shape_notes(self, n_features: int, n_classes: int) -> list[str]:
        """What the data's shape changes in the parameters without ruling them out.

        Parameters
        ----------
        n_features, n_classes : int
            The data's shape, as for :meth:`check_data_shape`.

        Returns
        -------
        list of str
            One line each (e.g. a value rounded to the nearest feasible one): the pipeline prints
            them before any work.
        """
        return []

    # -- what the pipeline asks of a learner before any work ------------------------------------------
    def trained_classes(self, labels) -> np.ndarray:
        """The class codes whose rows train it: every class (NCMML's ``classes`` names a subset).

        Parameters
        ----------
        labels : ndarray of shape (n_classes,)
            The class labels in code order.

        Returns
        -------
        ndarray of shape (n_trained,), int
            Positions in ``labels``.
        """
        return np.arange(len(labels))

    def code_dim(self, n_features: int, n_classes: int) -> int:
        """The width of its codes on data of this shape, as its parameters give it before any fit.

        Parameters
        ----------
        n_features, n_classes : int
            The data's shape.

        Returns
        -------
        int
            ``dim``, else the rule ``dim: None`` stands for (``DEFAULT_DIM``, capped at the features).
        """
        if isinstance(getattr(self, "dim", None), Integral):
            return min(int(self.dim), n_features)
        return n_features if self.DEFAULT_DIM is None else min(self.DEFAULT_DIM, n_features)

    def view_dim(self, n_features: int, n_classes: int) -> int:
        """The widest view of a row the evaluation classifies in (the codes; SL-NE's exact view too).

        Parameters
        ----------
        n_features, n_classes : int
            The data's shape.

        Returns
        -------
        int
        """
        return self.code_dim(n_features, n_classes)

    def stored_width(self, n_features: int, n_classes: int) -> int:
        """Floats per row the pipeline's encode stage writes for it (the disk rule): its codes.

        Parameters
        ----------
        n_features, n_classes : int
            The data's shape.

        Returns
        -------
        int
            :meth:`code_dim`; a bilinear learner adds its two exact views.
        """
        return self.code_dim(n_features, n_classes)

    def largest_task(self, n_rows: int, n_features: int, n_classes: int, k: int = 0, anchors: int | None = None):
        """The largest task its fit holds beyond a row-block (the pipeline's memory rule).

        Parameters
        ----------
        n_rows : int
            Rows it is fed (its pool, its training rows).
        n_features, n_classes : int
            The data's shape.
        k : int, default=0
            Neighbours of each anchor row.
        anchors : int or None, default=None
            Rows with a neighbourhood (None: every row).

        Returns
        -------
        tuple of (str, int, str) or None
            (what, bytes, the parameter to change); None when it holds no more than the row-blocks
            it reads.
        """
        return None

    def pool_rows(self, n_classes: int) -> int | None:
        """Rows of the shuffled training rows its fit reads at most.

        Parameters
        ----------
        n_classes : int
            Classes of the data.

        Returns
        -------
        int or None
            A bound for a streamed learner that stops after a number of steps, so that the pipeline
            writes only the blocks visited first; None: every row.
        """
        return None

    def serves(self, classifier: str) -> str | None:
        """Why its codes cannot serve a classifier.

        Parameters
        ----------
        classifier : str
            ``knnK``, ``softvoteK``, ``ncm`` or ``ncmc``.

        Returns
        -------
        str or None
            The reason, in words; None: they can.
        """
        return None

    def portable(self) -> tuple[str, dict, dict]:
        """The fitted model for ``metricpipe export --npz``, applied with numpy alone.

        Returns
        -------
        kind : str
            ``affine`` (codes = X @ W + b; no W: X; no b: no offset), ``sphere``, ``chi2``, ``slem``
            or ``kernel_slem`` (each learner's docstring).
        arrays : dict of str to ndarray
            E.g. ``W`` of shape (n_features, n_codes) and ``b`` of shape (n_codes,).
        scalars : dict of str to float
        """
        check_is_fitted(self)
        W, b = getattr(self, "components_", None), getattr(self, "offset_", None)
        arrays = {} if W is None else {"W": W.toarray() if scipy.sparse.issparse(W) else np.asarray(W)}
        if b is not None:
            arrays["b"] = np.asarray(b)
        return "affine", arrays, {}

    def fit_facts(self) -> dict:
        """Facts of the fit a run records with the model.

        Returns
        -------
        dict
            Kept steps, validation scores; ``samples``: the rows or pairs it processed, from which the
            run reports a rate. {} by default.
        """
        return {}

    # -- validation and refit: what the pipeline asks before and after a fit -------------------------
    def validates(self) -> bool:
        """Whether ``fit`` reads validation rows (early stopping).

        Returns
        -------
        bool
            True: the pipeline hands it the validation rows it borrowed from the train split, and
            refits the model on every train row afterwards (:meth:`refit_params`).
        """
        return False

    def refit_params(self) -> dict | None:
        """On a fitted learner: the parameters of the refit on every training row.

        Returns
        -------
        dict or None
            The parameters with which a fit on every training row, the validation rows included,
            repeats this fit's schedule without validation rows (NCMML: the steps it kept, early
            stopping off). {} when the fit read no validation rows; None when a refit would see no
            more rows than this fit did (a training subset capped below the rows offered): the
            pipeline then keeps this fit, whose kept state validation chose, as the final model.
        """
        return {}

    def refits(self, n_rows: int) -> bool:
        """Before any fit: whether a validated fit is followed by a refit on every training row.

        Parameters
        ----------
        n_rows : int
            The rows the validated fit is given.

        Returns
        -------
        bool
            True (:meth:`refit_params` will not be None), unless its fit uses fewer rows than
            ``n_rows`` anyway.
        """
        return True

    def keeps_distances(self) -> bool:
        """On a fitted learner: whether its codes keep the input's Euclidean distances.

        Returns
        -------
        bool
            True for the identity or a full-rank rotation: a kNN graph of the features is then one
            of the codes. False by default.
        """
        return False
