"""Baseline projections users compare against: identity, PCA, PCA-whitening, LDA, random.

Each is a :class:`~metricpipe.tasks.base.Learner` that never needs the N x D data: ``fit(X, y)``
computes the statistics in memory (:func:`metricpipe.tasks.moments.statistics`) and hands them to
``fit_statistics``, which is also what the pipeline calls with the statistics stage's result (the
same moments, streamed over row-blocks). Codes are centred: ``code = (x - mean) @ components_``.
"""
import warnings

import numpy as np
import scipy.linalg

from metricpipe.tasks import moments
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


class _StatisticsLearner(LinearCodes, Learner):
    """A learner defined by the data's moments (mean, covariance, class scatters, PCA basis)."""
    needs_labels = False
    fitted_attributes = ("fit_meta_",)   # components_ and offset_: the learners that project

    def fit(self, X, y=None):
        """Fit on rows X (n_samples, n_features) with labels y (n_samples,) (used by LDA only).

        Returns
        -------
        self
        """
        self._validate_params()
        if self.needs_labels:
            X, codes = self._check_Xy(X, y)
        else:
            X, codes = self._check_X(X, reset=True, ensure_min_samples=2), None
        return self.fit_statistics(moments.statistics(X, codes), _validated=True)

    def fit_statistics(self, stats: dict, _validated: bool = False):
        """Fit from the statistics dict of :func:`metricpipe.tasks.moments.finalize_statistics`
        (``mean`` (D,), ``pca_components`` (k, D), ``pca_variances`` (k,), scatters, class counts):
        the pipeline's entry point."""
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

    def _check_dim(self, limit: int, why: str) -> int:
        if self.dim is not None and self.dim > limit:
            raise InputError(f"The 'dim' parameter of {type(self).__name__} must be <= {limit} ({why}). "
                             f"Got {self.dim} instead.")
        return self.resolved_dim(limit)


class Identity(_StatisticsLearner):
    """The raw features: no projection (the baseline every learner must beat)."""
    method = "identity"
    _parameter_constraints = {}

    def __init__(self):
        pass

    def _projection(self, stats):
        return None, {"dim": int(len(stats["mean"]))}


class PCA(_StatisticsLearner):
    """Projection on the ``dim`` leading principal components (None: all).

    Parameters
    ----------
    dim : int or None, default=None
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
            if not var[0] > 0:   # eps is relative to the top variance: no eps helps constant rows
                raise InputError("PCAWhitening: the training rows are all the same (every variance is 0), so there is "
                                 "nothing to whiten; check X (every row identical?)")
            raise InputError(f"PCAWhitening: component {int(np.argmin(floor))} has variance 0 and eps={self.eps}; "
                             f"raise 'eps' above 0 (e.g. 1e-6, a share of the top variance) or lower 'dim'")
        return comps[:d].T / np.sqrt(floor)[None, :], {"eps": self.eps}


class LDA(_StatisticsLearner):
    """Fisher LDA: generalised eigenvectors of (Sb, Sw + reg * trace(Sw)/D * I) for the within- and
    between-class covariances Sw and Sb (scatters over the number of rows), W^T Sw W = I: the codes
    have unit within-class variance along each direction, whatever the number of rows.

    Parameters
    ----------
    dim : int or None, default=None
        At most (number of classes - 1), the rank of Sb; None takes that many.
    reg : float >= 0, default=1e-4
        Ridge on Sw relative to its mean eigenvalue.
    """
    method = "lda"
    fitted_attributes = ("components_", "offset_", "classes_")
    needs_labels = True
    needs_dense_covariance = True
    _parameter_constraints = {"dim": DIM_OR_NONE, "reg": NON_NEGATIVE}

    def __init__(self, dim=None, reg=1e-4):
        self.dim = dim
        self.reg = reg

    def check_data_shape(self, n_features: int, n_classes: int) -> None:
        if self.dim is not None and self.dim > min(n_classes - 1, n_features):
            raise InputError(f"The 'dim' parameter of LDA must be <= {min(n_classes - 1, n_features)} (LDA has at "
                             f"most min(n_classes - 1, n_features) directions; the data has {n_classes} classes). "
                             f"Got {self.dim} instead.")

    def _projection(self, stats):
        n_classes = int((stats["class_counts"] > 0).sum())
        if n_classes < 2:
            raise InputError(f"LDA needs at least 2 classes; got {n_classes}")
        n = float(stats["class_counts"].sum())
        sw, sb = stats["within_scatter"] / n, stats["between_scatter"] / n
        D = sw.shape[0]
        d = self._check_dim(min(n_classes - 1, D), "LDA has at most min(n_classes - 1, n_features) directions")
        ridge = self.reg * np.trace(sw) / D
        if ridge <= 0:
            ridge = 1e-12 * max(1.0, float(np.abs(sb).max()))
        values, vectors = scipy.linalg.eigh(sb, sw + ridge * np.eye(D),
                                            subset_by_index=[D - d, D - 1])
        order = np.argsort(values)[::-1]
        return vectors[:, order], {"reg": self.reg, "eigenvalues": values[order].tolist()}


class RandomProjection(_StatisticsLearner):
    """Gaussian random projection, entries N(0, 1/dim), seeded.

    Parameters
    ----------
    dim : int or None, default=None (n_features)
    random_state : int, RandomState or None, default=None (seed 0)
    """
    method = "random"
    fitted_attributes = ("components_", "offset_")
    _parameter_constraints = {"dim": DIM_OR_NONE, "random_state": RANDOM_STATE}

    def __init__(self, dim=None, random_state=None):
        self.dim = dim
        self.random_state = random_state

    def shape_notes(self, n_features: int, n_classes: int) -> list[str]:
        if self.dim is not None and self.dim > n_features:
            return [f"dim {self.dim} > the {n_features} features: a random projection to more dimensions adds no "
                    f"information (its codes are the features, mixed)"]
        return []

    def _projection(self, stats):
        D = len(stats["mean"])
        d = self.resolved_dim(D)
        if d > D:
            warnings.warn(f"random projection to dim={d} > n_features={D} adds no information", stacklevel=3)
        W = np.random.default_rng(seed_of(self.random_state)).standard_normal((D, d)) / np.sqrt(d)
        return W, {"seed": seed_of(self.random_state)}
