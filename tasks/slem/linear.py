"""Linear SLEM (Rezende et al., Sections 3 and 5): the exemplar classifier of Eq. 6 from the pool's
regularised covariance, factored once (Cholesky); codes A^-1 (x - mu), normalised."""

import numpy as np
import scipy.linalg as sla
from sklearn.utils.validation import check_is_fitted

from metricpipe.tasks import madds, moments
from metricpipe.tasks.base import NON_NEGATIVE, StrOptions
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.slem.pool import PoolLearner, check_negatives


def regularised_covariance(cov: np.ndarray, lam: float) -> np.ndarray:
    """A = (1/n) X X^T - mu mu^T + lambda Id from the (biased) covariance of the negatives."""
    A = np.array(cov, np.float64, copy=True)
    A[np.diag_indices_from(A)] += lam
    return A


def factor(A: np.ndarray, where: str = "SLEM") -> np.ndarray:
    """Lower Cholesky factor of A, or a one-line error when A is not positive definite."""
    try:
        return np.linalg.cholesky(A)
    except np.linalg.LinAlgError:
        raise InputError(
            f"{where}: the negatives' covariance plus the ridge (lam times their mean squared norm) "
            f"is not positive definite; "
            f"raise lam (lambda; features with no variance need lam > 0)"
        ) from None


def solve(Lc: np.ndarray, R: np.ndarray) -> np.ndarray:
    """A^-1 R for A = Lc Lc^T and a block of right-hand sides R (m, p) given as rows: (m, p)."""
    return sla.cho_solve((Lc, True), np.asarray(R, np.float64).T, check_finite=False).T


def exemplar(x0: np.ndarray, mu: np.ndarray, A: np.ndarray, theta: float) -> tuple[np.ndarray, float]:
    """(omega*, nu*) of Eq. 6 for one image (the Woodbury form), with nu* from Eq. 3."""
    delta = x0 - mu
    Ad = np.linalg.solve(A, delta)
    omega = 2 * theta / (theta * delta @ Ad + theta + 1) * Ad
    nu = (theta - 1) / (theta + 1) - (theta * x0 + mu) @ omega / (theta + 1)
    return omega, nu


def exemplar_direct(x0: np.ndarray, X: np.ndarray, lam: float, theta: float) -> tuple[np.ndarray, float]:
    """(omega*, nu*) of Eqs. 3-4 for negatives X (n, d), solving with U (reference, small cases)."""
    mu = X.mean(0)
    delta = x0 - mu
    U = X.T @ X / len(X) - np.outer(mu, mu) + theta / (theta + 1) * np.outer(delta, delta) + lam * np.eye(len(mu))
    omega = 2 * theta / (theta + 1) * np.linalg.solve(U, delta)
    nu = (theta - 1) / (theta + 1) - (theta * x0 + mu) @ omega / (theta + 1)
    return omega, nu


def unit_rows(W: np.ndarray) -> np.ndarray:
    return W / np.maximum(np.linalg.norm(W, axis=1, keepdims=True), 1e-30)


def inverse_from_cholesky(cholesky: np.ndarray) -> np.ndarray:
    """A^-1 (symmetric) from A's lower Cholesky factor."""
    Linv = np.linalg.inv(cholesky)
    return Linv.T @ Linv


class SLEM(PoolLearner):
    """Linear SLEM: each image's code is the direction of its square-loss exemplar classifier
    against a pool of negatives, A^-1 (x - mu) / ||A^-1 (x - mu)|| (Eq. 6; unit rows, so Euclidean
    ranking is cosine ranking).

    Parameters
    ----------
    lam : float >= 0, default 0.1
        lambda of Eqs. 1 and 6, the ridge added to the negatives' covariance (Python reserves the
        word lambda), read for rows of unit RMS norm: the ridge is lam s^2 with s^2 the pool's mean
        squared norm (1 on l2-normalised rows; the codes do not change when the features are
        scaled). 0 needs a positive definite covariance.
    kernel : {"linear"}, default "linear"
        Only "linear" for this class (kept so that config entries read the same;
        :class:`KernelSLEM` is SLEM with the gaussian or poly kernel).
    negatives : dict or None, default None
        The pool ``{split, count, seed}`` (:func:`check_negatives`; None or a missing key:
        :data:`NEGATIVES`). In memory the pool is a seeded sample of ``count`` rows of X.

    Attributes
    ----------
    mean_ : ndarray of shape (n_features,)
        mu, the pool's mean: codes are the unit rows of A^-1 (x - mu), compared by Euclidean
        distance.
    cholesky_ : ndarray of shape (n_features, n_features)
        Lower Cholesky factor of A = cov + ``ridge_`` Id (cov the pool's biased covariance).
    ridge_ : float
        The ridge added, lam s^2 (s^2 the pool's mean squared norm).
    n_negatives_ : int
        Images in the pool.

    Notes
    -----
    The out-of-core pipeline never gathers the pool: it calls :meth:`fit_moments` with the
    statistics stage's moments when the pool is the whole train split, else :meth:`fit_blocks` on
    the pool's rows streamed block by block. ``fit(X)`` is ``fit_blocks([X[pool]])``.
    """

    # the ridge of Eq. 11, a decade apart (the paper picks it by validation)
    search_space = {"lam": [0.1, 0.0001, 0.001, 0.01, 1.0, 10.0, 100.0, 1000.0]}
    selection_metric = "map"

    method = "slem"
    fitted_attributes = ("cholesky_", "mean_", "n_negatives_", "ridge_")
    code_metric = "euclidean"
    needs_dense_covariance = True
    reads_statistics = ("mean", "covariance", "n_samples")  # when the pool is every train row
    dense_alternative = "a kernel SLEM does without"
    _parameter_constraints = {"lam": NON_NEGATIVE, "kernel": [StrOptions({"linear"})], "negatives": [dict, None]}

    def code_dim(self, n_features: int, n_classes: int) -> int:
        return n_features

    def portable(self) -> tuple[str, dict, dict]:
        """``slem``: codes = unit_rows((X - mean) @ A_inv) (Eq. 6)."""
        check_is_fitted(self)
        return "slem", {"mean": self.mean_, "A_inv": inverse_from_cholesky(self.cholesky_)}, {}

    def __init__(self, lam=0.1, kernel="linear", negatives=None):
        self.lam = lam
        self.kernel = kernel
        self.negatives = negatives

    def _validate_params(self):
        if self.kernel in ("gaussian", "poly"):  # a config's {method: slem, kernel: gaussian} is KernelSLEM
            raise InputError(
                f"SLEM is the linear form; for kernel {self.kernel!r} use KernelSLEM(kernel="
                f"{self.kernel!r}) (in a config, {{method: slem, kernel: {self.kernel}}} picks it)"
            )
        super()._validate_params()

    def _fit_pool(self, Xneg):  # the pool in memory is one block of the streamed moments
        return self._fit_blocks([Xneg])

    def fit_cost(self, n_rows, n_features, n_classes, k=0, n_val=0) -> madds.FitCost:
        """The pool's mean and covariance (a D x D GEMM over its ``n_rows`` rows; none when the pool is
        every row of its split, whose moments the statistics stage has), A of Eq. 6 and its Cholesky
        factor."""
        D = n_features
        moments_cost = 0.0 if (self.negatives or {}).get("count") is None else madds.gemm(D, D, n_rows)
        factor = madds.cholesky(D) + madds.passes(D * D, 6)
        return madds.FitCost(madds.FIT + moments_cost + madds.passes(n_rows * D, 2) + factor)

    def transform_cost(self, n_rows, n_features, n_classes):
        """Two triangular solves per row (A^-1 (x - mu)) and the rows read."""
        return madds.gemm(n_rows, n_features, n_features) + madds.passes(n_rows * n_features, 6)

    def fit_blocks(self, blocks):
        """Fit on the pool given as row blocks, folded one at a time (tasks.moments partial ->
        combine, Chan et al.): only one D x D scatter is held, never the pool.

        Parameters
        ----------
        blocks : iterable of arrays of shape (m_i, n_features)
            The pool's rows, in any grouping (the pipeline's Zarr row-blocks).

        Returns
        -------
        self
        """
        self._validate_params()
        check_negatives(self.negatives)
        self.__dict__.pop("feature_names_in_", None)
        return self._fit_blocks(blocks)

    def _fit_blocks(self, blocks):
        m = None
        for B in blocks:
            B = np.asarray(B)
            if B.ndim != 2:
                raise InputError(f"SLEM.fit_blocks: blocks of shape (rows, n_features) expected; got shape {B.shape}")
            part = moments.partial_moments(B, np.zeros(len(B), np.int64), 1)
            m = part if m is None else moments.combine_moments(m, part)
        n = 0 if m is None else m.n
        if n < 2:
            raise InputError(f"SLEM needs a pool of at least 2 negative images; got {n} sample(s); give more rows")
        return self._fit_moments(m.mean, m.m2 / n, n, 0)  # the biased covariance of Eq. 4

    def fit_moments(self, mean, covariance, n_samples: int, ddof: int = 0):
        """Fit from the pool's moments: the pipeline's entry point with the statistics stage's
        mean and covariance (``ddof=1``).

        Parameters
        ----------
        mean : array-like of shape (n_features,)
            mu, the pool's mean.
        covariance : array-like of shape (n_features, n_features)
            The pool's covariance sum_i (x_i - mu)(x_i - mu)^T / (n_samples - ddof).
        n_samples : int
            n, the images in the pool (>= 2).
        ddof : int, default 0
            0 for the biased covariance of Eq. 4, 1 for the unbiased one (the statistics stage's).

        Returns
        -------
        self
        """
        self._validate_params()
        check_negatives(self.negatives)
        self.__dict__.pop("feature_names_in_", None)
        return self._fit_moments(mean, covariance, n_samples, ddof)

    def _fit_moments(self, mean, covariance, n_samples, ddof):
        mu = np.asarray(mean, np.float64)
        cov = np.asarray(covariance, np.float64)
        if mu.ndim != 1 or cov.shape != (len(mu), len(mu)):
            raise InputError(
                f"SLEM.fit_moments: mean (D,) and covariance (D, D) expected; got shapes {mu.shape} and {cov.shape}"
            )
        if not (np.all(np.isfinite(mu)) and np.all(np.isfinite(cov))):
            raise InputError("SLEM.fit_moments: the moments hold NaN or infinity; check the features")
        n = int(n_samples)
        if n < 2 or not 0 <= ddof < n:
            raise InputError(
                f"SLEM needs a pool of at least 2 negative images and 0 <= ddof < n; got n = {n}, ddof = {ddof}"
            )
        cov = cov * ((n - ddof) / n)
        self.ridge_ = float(self.lam) * pool_sq_norm(mu, cov)
        A = regularised_covariance(cov, self.ridge_)  # Eq. 6: A = (1/n) X X^T - mu mu^T + lam s^2 Id
        self.cholesky_ = factor(A, type(self).__name__)
        self.mean_ = mu
        self.n_negatives_ = n
        self.n_features_in_ = len(mu)
        return self

    def _transform(self, X):
        return unit_rows(solve(self.cholesky_, X - self.mean_))  # A^-1 (x - mu), normalised (Eq. 6)

    @property
    def _n_features_out(self):
        return len(self.mean_)

    def cost(self) -> dict:
        """Stored values (the triangular factor and mu), bytes, multiply-adds per image (two
        triangular solves)."""
        D = len(self.mean_)
        return {
            "nnz": D * (D + 1) // 2 + D,
            "storage_bytes": int(self.cholesky_.nbytes + self.mean_.nbytes),
            "flops_per_image": 2 * D * D,
        }


def pool_sq_norm(mean: np.ndarray, covariance: np.ndarray) -> float:
    """s^2, the pool's mean squared row norm, from its mean and biased covariance (tr Cov + ||mu||^2;
    1 on l2-normalised rows, and for a pool of zero rows). Linear SLEM and ESVM read ``lam`` for rows
    of unit RMS norm, as the SGD learners read their ``lr`` (:func:`metricpipe.tasks.moments.row_scale`):
    the ridge added is lam s^2, which on x gives the codes that lam gives on x / s, so one default and
    one search grid suit raw and l2-normalised features alike."""
    return moments.row_scale({"mean_sq_norm": float(np.trace(covariance)) + float(np.dot(mean, mean))}) ** 2
