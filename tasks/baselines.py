"""Baseline projections users compare against: identity, PCA, PCA-whitening, LDA, random.

Each is a :class:`~metricpipe.tasks.base.Learner` that never needs the N x D data: ``fit(X, y)``
computes the statistics in memory (:func:`metricpipe.tasks.moments.statistics`) and hands them to
``fit_statistics``, which is also what the pipeline calls with the statistics stage's result (the
same moments, streamed over row-blocks). Codes are centred: ``code = (x - mean) @ components_``.
"""

import warnings

import numpy as np

from metricpipe.tasks import madds, moments
from metricpipe.tasks.base import DIM_OR_NONE, NON_NEGATIVE, RANDOM_STATE, Learner, seed_of
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.models import LinearModel


class LinearCodes:
    """Codes ``X @ components_ + offset_`` (``components_`` (D, d), dense or scipy sparse; None
    means the codes are X itself)."""

    def _encoder(self) -> LinearModel:
        return LinearModel(getattr(self, "components_", None), getattr(self, "offset_", None), score=self.code_metric)

    def _transform(self, X):
        return self._encoder().transform(X)

    @property
    def _n_features_out(self):
        W = getattr(self, "components_", None)
        return self.n_features_in_ if W is None else W.shape[1]

    def cost(self) -> dict:
        return self._encoder().cost(self.n_features_in_)

    def keeps_distances(self) -> bool:
        return self._encoder().keeps_distances(self.n_features_in_)


class _StatisticsLearner(LinearCodes, Learner):
    """A learner defined by the data's moments (mean, covariance, class scatters, PCA basis)."""

    needs_labels = False
    fitted_attributes = ("fit_meta_",)  # components_ and offset_: the learners that project

    def fit(self, X, y=None):
        """Fit on rows X: their statistics (mean, covariance, PCA, class scatters), computed in memory.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training rows.
        y : array-like of shape (n_samples,) or None, default=None
            Class labels (read by LDA only).

        Returns
        -------
        self
            The fitted estimator.
        """
        self._validate_params()
        if self.needs_labels:
            X, codes = self._check_Xy(X, y)
        else:
            X, codes = self._check_X(X, reset=True, ensure_min_samples=2), None
        return self.fit_statistics(moments.statistics(X, codes), _validated=True)

    def fit_statistics(self, stats: dict, _validated: bool = False):
        """Fit from the statistics of :func:`metricpipe.tasks.moments.finalize_statistics`: the
        pipeline's entry point (``stats``: ``mean`` (D,), ``pca_components`` (k, D), ``pca_variances``
        (k,), scatters, class counts); returns self."""
        if not _validated:
            self._validate_params()
            self.n_features_in_ = int(len(stats["mean"]))
        W, meta = self._projection(stats)
        if W is not None:
            W = np.ascontiguousarray(W, np.float32)
            self.components_ = W
            self.offset_ = (-np.asarray(stats["mean"], np.float64) @ W).astype(np.float32)
        self.fit_meta_ = meta
        return self

    def fit_cost(self, n_rows, n_features, n_classes, k=0, n_val=0) -> madds.FitCost:
        """The statistics stage computed the moments and the PCA: what is left is the projection's
        own work (:meth:`_projection_cost`) on the D x D statistics, whatever the rows."""
        return madds.FitCost(madds.FIT + self._projection_cost(n_features, n_classes))

    def _projection_cost(self, n_features: int, n_classes: int) -> float:
        """Multiply-adds of :meth:`_projection` and of storing W (D, d) as float32 with its offset."""
        return madds.passes(n_features * self.code_dim(n_features, n_classes), 2)

    def _check_dim(self, limit: int, why: str) -> int:
        if self.dim is not None and self.dim > limit:
            raise InputError(
                f"The 'dim' parameter of {type(self).__name__} must be <= {limit} ({why}). Got {self.dim} instead."
            )
        return self.resolved_dim(limit)


class Identity(_StatisticsLearner):
    """The raw features: no projection (the baseline every learner must beat).

    Attributes
    ----------
    n_features_in_ : int
        Features of the rows seen by ``fit``; the codes are the rows themselves, as float32.
    fit_meta_ : dict
        ``{"dim": n_features}``.
    """

    method = "identity"
    _parameter_constraints = {}

    def __init__(self):
        pass

    def _projection(self, stats):
        return None, {"dim": int(len(stats["mean"]))}

    def _projection_cost(self, n_features, n_classes):
        return 0.0


class PCA(_StatisticsLearner):
    """Projection on the ``dim`` leading principal components (None: all).

    Parameters
    ----------
    dim : int or None, default=None
        Components kept (the code dimension), at most n_features; None: every one.

    Attributes
    ----------
    components_ : ndarray of shape (n_features, dim), float32
        The leading principal directions, as columns; codes are ``X @ components_ + offset_``.
    offset_ : ndarray of shape (dim,), float32
        ``-mean @ components_``: the codes of centred rows.
    fit_meta_ : dict
        ``{"explained_variance": float}``, the variance the kept components hold.
    n_features_in_ : int

    Examples
    --------
    >>> from sklearn.datasets import load_digits
    >>> from metricpipe import PCA
    >>> X, y = load_digits(return_X_y=True)
    >>> PCA(dim=16).fit(X).transform(X).shape
    (1797, 16)
    """

    method = "pca"
    fitted_attributes = ("components_", "offset_")
    dim_within_features = True
    _parameter_constraints = {"dim": DIM_OR_NONE}

    def __init__(self, dim=None):
        self.dim = dim

    def _projection(self, stats):
        comps = stats["pca_components"]
        d = self._check_dim(len(comps), "the number of principal components available")
        return comps[:d].T, {"explained_variance": float(stats["pca_variances"][:d].sum())}


class PCAWhitening(_StatisticsLearner):
    """PCA followed by whitening: component i scaled by 1/sqrt(lambda_i + eps * lambda_1).

    Parameters
    ----------
    dim : int or None, default=None
        Components kept; None: every one. Whitened, the smallest-variance directions (mostly noise
        on real descriptors) weigh as much as the largest: with all of them kept, kNN on the codes
        can do far worse than on the raw features (HOG of Fashion-MNIST: 1-NN accuracy 0.29 against
        0.74, a library trial), so set ``dim`` (or raise ``eps``) for retrieval.
    eps : float >= 0, default=1e-6
        Regularisation relative to the largest variance.

    Attributes
    ----------
    components_ : ndarray of shape (n_features, dim), float32
        The leading principal directions, each scaled by 1/sqrt(lambda_i + eps * lambda_1).
    offset_ : ndarray of shape (dim,), float32
        ``-mean @ components_``.
    fit_meta_ : dict
        ``{"eps": eps}``.
    n_features_in_ : int
    """

    method = "pcaw"
    fitted_attributes = ("components_", "offset_")
    dim_within_features = True
    _parameter_constraints = {"dim": DIM_OR_NONE, "eps": NON_NEGATIVE}

    def __init__(self, dim=None, eps=1e-6):
        self.dim = dim
        self.eps = eps

    def _projection(self, stats):
        comps, var = stats["pca_components"], stats["pca_variances"]
        d = self._check_dim(len(comps), "the number of principal components available")
        floor = var[:d] + self.eps * var[0]
        if not np.all(floor > 0):
            if not var[0] > 0:  # eps is relative to the top variance: no eps helps constant rows
                raise InputError(
                    "PCAWhitening: the training rows are all the same (every variance is 0), so there is "
                    "nothing to whiten; check X (every row identical?)"
                )
            raise InputError(
                f"PCAWhitening: component {int(np.argmin(floor))} has variance 0 and eps={self.eps}; "
                f"raise 'eps' above 0 (e.g. 1e-6, a share of the top variance) or lower 'dim'"
            )
        return comps[:d].T / np.sqrt(floor)[None, :], {"eps": self.eps}


class LDA(_StatisticsLearner):
    """Fisher's linear discriminant analysis, from the streamed moments instead of the rows.

    As scikit-learn's ``LinearDiscriminantAnalysis(solver="svd")`` computes it: the pooled
    within-class covariance (scatter over the rows) of the features scaled to unit within-class
    deviation is whitened on its directions of singular value above ``tol`` (the others, e.g. pixels
    that never change, are dropped), then the class means weighted by their priors are rotated onto
    their principal axes, which keep ``tol`` times the largest singular value at least. The codes
    equal scikit-learn's transform up to the sign of each column (and a shift): kNN and
    nearest-class-mean classifiers give the same answers on them.

    Parameters
    ----------
    dim : int or None, default=None
        At most (number of classes - 1), the rank of the between-class scatter; None takes that many
        (fewer when the data's within-class rank leaves fewer).
    tol : float >= 0, default=1e-4
        As scikit-learn's: the singular values (of the scaled within-class rows, then of the
        weighted class means relative to the largest) below it are dropped.

    Attributes
    ----------
    components_ : ndarray of shape (n_features, dim), float32
        The discriminant directions, as columns.
    offset_ : ndarray of shape (dim,), float32
        ``-mean @ components_``.
    classes_ : ndarray of shape (n_classes,)
        The class labels of y.
    fit_meta_ : dict
        ``{"tol": tol, "singular_values": [...]}`` of the kept directions.
    n_features_in_ : int
    """

    method = "lda"
    fitted_attributes = ("components_", "offset_", "classes_")
    needs_labels = True
    needs_dense_covariance = True
    _parameter_constraints = {"dim": DIM_OR_NONE, "tol": NON_NEGATIVE}

    def __init__(self, dim=None, tol=1e-4):
        self.dim = dim
        self.tol = tol

    def code_dim(self, n_features: int, n_classes: int) -> int:
        return min(self.dim or n_classes - 1, n_classes - 1, n_features)

    def check_data_shape(self, n_features: int, n_classes: int) -> None:
        if self.dim is not None and self.dim > min(n_classes - 1, n_features):
            raise InputError(
                f"The 'dim' parameter of LDA must be <= {min(n_classes - 1, n_features)} (LDA has at "
                f"most min(n_classes - 1, n_features) directions; the data has {n_classes} classes). "
                f"Got {self.dim} instead."
            )

    def _projection_cost(self, n_features, n_classes):
        """The within-class scatter's eigendecomposition (D x D) and the passes that scale it."""
        return madds.eigh(n_features) + madds.passes(n_features**2, 6) + madds.gemm(n_classes, n_features, n_features)

    def _projection(self, stats):
        counts = np.asarray(stats["class_counts"], np.float64)
        present = counts > 0
        n_classes = int(present.sum())
        if n_classes < 2:
            raise InputError(f"LDA needs at least 2 classes; got {n_classes}")
        n = float(counts.sum())
        D = stats["within_scatter"].shape[0]
        d = self._check_dim(min(n_classes - 1, D), "LDA has at most min(n_classes - 1, n_features) directions")
        sw = np.asarray(stats["within_scatter"], np.float64)
        std = np.sqrt(np.maximum(np.diag(sw), 0) / n)  # the class-centred rows' deviation (ddof 0)
        std[std == 0] = 1.0
        fac = 1.0 / n
        # the scaled within-class rows' singular values and right vectors, from their Gram matrix
        lam, V = np.linalg.eigh(fac * sw / np.outer(std, std))
        lam, V = lam[::-1], V[:, ::-1]
        S = np.sqrt(np.maximum(lam, 0))
        rank = int((S > self.tol).sum())
        if rank == 0:  # no feature varies within the classes: nothing to separate, one code for all
            return np.zeros((D, d)), {"tol": self.tol, "singular_values": [0.0] * d}
        scalings = (V[:, :rank] / std[:, None]) / S[:rank]
        means = np.asarray(stats["class_means"], np.float64)[present]
        priors = counts[present] / n
        xbar = priors @ means
        Xb = (np.sqrt(n * priors * fac)[:, None] * (means - xbar)) @ scalings
        _, S2, Vt = np.linalg.svd(Xb, full_matrices=False)
        rank2 = int((S2 > self.tol * S2[0]).sum())
        W = scalings @ Vt.T[:, :rank2]
        if self.dim is None:
            d = min(d, W.shape[1])
        if W.shape[1] < d:
            raise InputError(
                f"The 'dim' parameter of LDA must be <= {W.shape[1]}, the discriminant directions the "
                f"data's within-class rank leaves. Got {d} instead."
            )
        return W[:, :d], {"tol": self.tol, "singular_values": S2[:d].tolist()}


class RandomProjection(_StatisticsLearner):
    """Gaussian random projection, entries N(0, 1/dim), seeded.

    Parameters
    ----------
    dim : int or None, default=None
        The code dimension; None: n_features (more adds no information, with a warning).
    random_state : int, RandomState or None, default=None
        Seed of the Gaussian matrix (None: seed 0, so a fit is reproducible).

    Attributes
    ----------
    components_ : ndarray of shape (n_features, dim), float32
        The Gaussian matrix.
    offset_ : ndarray of shape (dim,), float32
        ``-mean @ components_``: the codes of centred rows.
    fit_meta_ : dict
        ``{"seed": int}``.
    n_features_in_ : int
    """

    method = "random"
    fitted_attributes = ("components_", "offset_")
    _parameter_constraints = {"dim": DIM_OR_NONE, "random_state": RANDOM_STATE}

    def __init__(self, dim=None, random_state=None):
        self.dim = dim
        self.random_state = random_state

    def shape_notes(self, n_features: int, n_classes: int) -> list[str]:
        if self.dim is not None and self.dim > n_features:
            return [
                f"dim {self.dim} > the {n_features} features: a random projection to more dimensions adds no "
                f"information (its codes are the features, mixed)"
            ]
        return []

    def _projection_cost(self, n_features, n_classes):
        """A normal draw per entry of W (D, d), then the passes that scale and store it."""
        d = self.resolved_dim(n_features)
        return madds.draws(n_features * d) + madds.passes(n_features * d, 3)

    def _projection(self, stats):
        D = len(stats["mean"])
        d = self.resolved_dim(D)
        if d > D:
            warnings.warn(f"random projection to dim={d} > n_features={D} adds no information", stacklevel=3)
        W = np.random.default_rng(seed_of(self.random_state)).standard_normal((D, d)) / np.sqrt(d)
        return W, {"seed": seed_of(self.random_state)}
