"""Square-loss exemplar machines (Rezende, Zepeda, Ponce, Bach, Perez), Sections 3-5.

Every image x_0 is encoded by the classifier (omega, nu) that separates it from a fixed pool of n
negatives X (Eq. 1). With the square loss the problem is a ridge regression whose solution (Eqs. 3-4)
simplifies by Woodbury (Eq. 6) to

    omega* = 2 theta / (theta delta^T A^-1 delta + theta + 1) * A^-1 delta,   delta = x_0 - mu,

with mu the negatives' mean and A = (1/n) X X^T - mu mu^T + lambda Id their regularised (biased)
covariance; the estimators read lambda for rows of unit RMS norm (:func:`pool_sq_norm`: the ridge is
lambda times the pool's mean squared norm). theta scales omega* but never turns it, so the code A^-1 (x_0 - mu) / ||.|| used for cosine
search does not depend on theta. A is factored once (Cholesky); a block of images is one triangular
solve pair with many right-hand sides.

Kernel SLEM (Section 4) works with a factor K = B B^T of the negatives' kernel matrix (complete
Cholesky with the eigenvalue shift of Section 5.1, KPCA at rank r, or incomplete Cholesky with greedy
pivots at rank r); an image joins by Lemma 1 (v = B^+ k_0, u = sqrt(k_00 - ||v||^2)), its exemplar
classifier in the factor's coordinates is beta = [u / lambda; A_B^-1 (v - mu_B)] (Eq. 6 with
A' = diag(lambda, A_B)), and two images compare by Eq. 16,

    s(h, h') = beta_hat^T beta_hat' + lambda^-2 (k(x_0, x_0') - v^T v'),

which, divided by the norms ||h|| = sqrt(||beta_hat||^2 + (u / lambda)^2), is the cosine of the two
classifiers. Like Eq. 16, the per-image scalar of Eq. 6 is left out: the cosine does not see it.

The ESVM baseline (Eq. 1 with the hinge loss) is solved for each image by SGD, many images at once.

The estimators: :class:`SLEM` (linear; fitted from the pool's moments, :meth:`SLEM.fit_moments` /
:meth:`SLEM.fit_blocks`), :class:`KernelSLEM` and :class:`ESVM` (both hold the pool,
:meth:`KernelSLEM.fit_pool` / :meth:`ESVM.fit_pool`). Their ``negatives`` parameter, ``{split, count,
seed}``, names the pool: the pipeline takes ``count`` seeded images of the split ``split`` (never
test); in memory ``fit(X)`` takes the same seeded sample of ``count`` rows of X itself
(:func:`pool_positions`), whatever ``split`` says.
"""
from numbers import Integral

import numpy as np
import scipy.linalg as sla

from sklearn.utils.validation import check_is_fitted

from metricpipe.tasks import moments
from metricpipe.tasks.base import COUNT, NON_NEGATIVE, POSITIVE, RANDOM_STATE, Interval, Learner, StrOptions, seed_of
from metricpipe.tasks.errors import InputError

KERNELS = ("linear", "gaussian", "poly")
DECOMPOSITIONS = ("cholesky", "kpca", "icd")
# the negative pool when ``negatives`` is None or leaves a key out: 15,000 seeded train images
NEGATIVES = {"split": "train", "count": 15000, "seed": 0}


# ---- the negative pool ---------------------------------------------------------------------------------

def check_negatives(negatives: dict | None) -> dict:
    """The pool settings ``{split, count, seed}`` with the defaults of :data:`NEGATIVES` filled in.

    ``split``: a split name other than test (the evaluation images: never negatives); ``count``: an
    int >= 2 or None (every image of the split); ``seed``: an int >= 0. Raises :class:`InputError`
    on anything else.
    """
    if negatives is not None and not isinstance(negatives, dict):
        raise InputError(f"negatives must be a mapping with keys among split, count, seed; got {negatives!r}")
    neg = {**NEGATIVES, **(negatives or {})}
    odd = sorted(set(neg) - set(NEGATIVES), key=str)
    if odd:
        raise InputError(f"negatives: keys among split, count, seed expected; got {', '.join(map(repr, odd))}; "
                         f"remove them")
    if not isinstance(neg["split"], str) or neg["split"] == "test":
        raise InputError(f"negatives.split must name the split of the negative images (never test: those are the "
                         f"queries); got {neg['split']!r}")
    c = neg["count"]
    if c is not None and (not isinstance(c, Integral) or isinstance(c, bool) or c < 2):
        raise InputError(f"negatives.count must be an integer >= 2 (images sampled) or None for all of them; "
                         f"got {c!r}")
    s = neg["seed"]
    if not isinstance(s, Integral) or isinstance(s, bool) or s < 0:
        raise InputError(f"negatives.seed must be an integer >= 0; got {s!r}")
    return neg


def pool_positions(n: int, negatives: dict | None, who: str = "SLEM") -> np.ndarray:
    """Sorted positions (in 0..n-1) of the negative pool among n candidate images: all of them, or
    a seeded sample of ``negatives.count`` (``np.random.default_rng([seed, 29])``) when there are
    more. The pipeline applies it to the rows of ``negatives.split``; ``fit(X)`` to the rows of X."""
    neg = check_negatives(negatives)
    if n < 2:
        raise InputError(f"{who} needs a pool of at least 2 negative images; got {n} sample(s); give more rows")
    if neg["count"] is not None and neg["count"] < n:
        rng = np.random.default_rng([neg["seed"], 29])
        return np.sort(rng.choice(n, int(neg["count"]), replace=False))
    return np.arange(n)


# ---- linear SLEM ---------------------------------------------------------------------------------------

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
        raise InputError(f"{where}: the negatives' covariance plus the ridge (lam times their mean squared norm) "
                         f"is not positive definite; "
                         f"raise lam (lambda; features with no variance need lam > 0)") from None


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


class _PoolLearner(Learner):
    """A learner defined on a pool of negatives (SLEM, kernel SLEM, ESVM): ``fit`` samples the pool
    from X, ``fit_pool`` takes it as it is; both end in ``_fit_pool``."""
    feeds = "pool"

    def fit(self, X, y=None):
        """Fit on a seeded sample of ``negatives.count`` rows of X (all rows when there are fewer).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : ignored

        Returns
        -------
        self
        """
        self._validate_params()
        X = self._check_X(X, reset=True)
        return self._fit_pool(X[pool_positions(len(X), self.negatives, type(self).__name__)])

    def fit_pool(self, Xneg):
        """Fit on the pool itself, every row of it (the pipeline's entry point).

        Parameters
        ----------
        Xneg : array-like of shape (n, n_features)
            The negatives, n >= 2.

        Returns
        -------
        self
        """
        self._validate_params()
        check_negatives(self.negatives)
        return self._fit_pool(self._check_X(Xneg, reset=True))


class SLEM(_PoolLearner):
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
        mu, the pool's mean.
    cholesky_ : ndarray of shape (n_features, n_features)
        Lower Cholesky factor of A = cov + ridge_ Id (cov the pool's biased covariance).
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
    reads_statistics = ("mean", "covariance", "n_samples")   # when the pool is every train row
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
        if self.kernel in ("gaussian", "poly"):   # a config's {method: slem, kernel: gaussian} is KernelSLEM
            raise InputError(f"SLEM is the linear form; for kernel {self.kernel!r} use KernelSLEM(kernel="
                             f"{self.kernel!r}) (in a config, {{method: slem, kernel: {self.kernel}}} picks it)")
        super()._validate_params()

    def _fit_pool(self, Xneg):   # the pool in memory is one block of the streamed moments
        return self._fit_blocks([Xneg])

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
        return self._fit_moments(m.mean, m.m2 / n, n, 0)      # the biased covariance of Eq. 4

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
            raise InputError(f"SLEM.fit_moments: mean (D,) and covariance (D, D) expected; got shapes {mu.shape} "
                             f"and {cov.shape}")
        if not (np.all(np.isfinite(mu)) and np.all(np.isfinite(cov))):
            raise InputError("SLEM.fit_moments: the moments hold NaN or infinity; check the features")
        n = int(n_samples)
        if n < 2 or not 0 <= ddof < n:
            raise InputError(f"SLEM needs a pool of at least 2 negative images and 0 <= ddof < n; got n = {n}, "
                             f"ddof = {ddof}")
        cov = cov * ((n - ddof) / n)
        self.ridge_ = float(self.lam) * pool_sq_norm(mu, cov)
        A = regularised_covariance(cov, self.ridge_)   # Eq. 6: A = (1/n) X X^T - mu mu^T + lam s^2 Id
        self.cholesky_ = factor(A, type(self).__name__)
        self.mean_ = mu
        self.n_negatives_ = n
        self.n_features_in_ = len(mu)
        return self

    def _transform(self, X):
        return unit_rows(solve(self.cholesky_, X - self.mean_))    # A^-1 (x - mu), normalised (Eq. 6)

    @property
    def _n_features_out(self):
        return len(self.mean_)

    def cost(self) -> dict:
        """Stored values (the triangular factor and mu), bytes, multiply-adds per image (two
        triangular solves)."""
        D = len(self.mean_)
        return {"nnz": D * (D + 1) // 2 + D, "storage_bytes": int(self.cholesky_.nbytes + self.mean_.nbytes),
                "flops_per_image": 2 * D * D}


def pool_sq_norm(mean: np.ndarray, covariance: np.ndarray) -> float:
    """s^2, the pool's mean squared row norm, from its mean and biased covariance (tr Cov + ||mu||^2;
    1 on l2-normalised rows, and for a pool of zero rows). Linear SLEM and ESVM read ``lam`` for rows
    of unit RMS norm, as the SGD learners read their ``lr`` (:func:`metricpipe.tasks.moments.row_scale`):
    the ridge added is lam s^2, which on x gives the codes that lam gives on x / s, so one default and
    one search grid suit raw and l2-normalised features alike."""
    return moments.row_scale({"mean_sq_norm": float(np.trace(covariance)) + float(np.dot(mean, mean))}) ** 2


def pool_kernel_sq_norm(Xneg: np.ndarray, kind: str, gamma: float) -> float:
    """Mean k(x, x) over the pool (tr K / n): linear SLEM's s^2 for the kernel's feature map (1 for
    the Gaussian kernel; ||x||^2 + gamma ||x||^4 averaged for the polynomial one)."""
    m = float(np.mean(kernel_diag(Xneg, kind, gamma)))
    return m if m > 0 else 1.0


# ---- kernels and factorisations -------------------------------------------------------------------------

def kernel(A: np.ndarray, B: np.ndarray, kind: str, gamma: float) -> np.ndarray:
    """k(a, b) for all rows of A and B: linear a^T b, Gaussian exp(-gamma ||a - b||^2) (Eq. 17), or
    polynomial a^T b + gamma (a^T b)^2 (Eq. 18)."""
    G = np.asarray(A, np.float64) @ np.asarray(B, np.float64).T
    if kind == "linear":
        return G
    if kind == "poly":
        return G + gamma * G * G
    if kind == "gaussian":
        d2 = (A * A).sum(1)[:, None] + (B * B).sum(1)[None, :] - 2.0 * G
        return np.exp(-gamma * np.maximum(d2, 0.0))
    raise ValueError(f"unknown kernel {kind!r}; one of {KERNELS}")


def scaled_gamma(gamma, kind: str, Xneg: np.ndarray) -> float:
    """The kernel's gamma: a number as given, or "scale" from the pool (see :class:`KernelSLEM`)."""
    if gamma != "scale":
        return float(gamma)
    X = np.asarray(Xneg, np.float64)
    if kind == "gaussian":
        spread = 2.0 * float(X.var(0).sum())          # mean ||a - b||^2 over pairs of pool rows
        return 1.0 / spread if spread > 0 else 1.0
    sample = X[:2000]
    dots = float(np.abs(sample @ sample.T).mean())
    return 1.0 / dots if dots > 0 else 1.0


def kernel_diag(X: np.ndarray, kind: str, gamma: float) -> np.ndarray:
    """k(x, x) for every row."""
    if kind == "gaussian":
        return np.ones(len(X))
    s = (np.asarray(X, np.float64) ** 2).sum(1)
    return s + gamma * s * s if kind == "poly" else s


def complete_cholesky(K: np.ndarray) -> tuple[np.ndarray, float]:
    """(B lower, eps) with B B^T = K + eps Id: eps = 0 when K is positive definite, else
    max(0, -lambda_min(K)) plus a rounding margin (Section 5.1: the shift makes K positive definite)."""
    try:
        return np.linalg.cholesky(K), 0.0
    except np.linalg.LinAlgError:
        pass
    lam_min = float(sla.eigh(K, eigvals_only=True, subset_by_index=[0, 0])[0])
    eps = max(0.0, -lam_min)
    jitter = 1e-10 * max(float(np.trace(K)) / len(K), 1e-300)
    for _ in range(8):
        try:
            return np.linalg.cholesky(K + (eps + jitter) * np.eye(len(K))), eps + jitter
        except np.linalg.LinAlgError:
            jitter *= 10
    raise np.linalg.LinAlgError("kernel matrix stays indefinite after the eigenvalue shift")


def kpca(K: np.ndarray, rank: int) -> np.ndarray:
    """B (n, r): the top r eigenvectors scaled by the root eigenvalues (the best rank-r B B^T)."""
    n = len(K)
    w, V = sla.eigh(K, subset_by_index=[n - rank, n - 1])
    w, V = w[::-1], V[:, ::-1]
    keep = w > 1e-12 * max(w[0], 1e-300)
    return V[:, keep] * np.sqrt(w[keep])


def incomplete_cholesky(diag: np.ndarray, column, rank: int, tol: float = 1e-12) -> tuple[np.ndarray, np.ndarray]:
    """Pivoted incomplete Cholesky (greedy: the largest residual diagonal next), O(n r^2).

    ``column(j)`` returns column j of K; returns (B (n, r') with B B^T ~ K, pivots). Stops early when
    the residual trace falls below ``tol`` times the initial one."""
    n = len(diag)
    d = np.array(diag, np.float64)
    B = np.zeros((n, rank))
    pivots = []
    start = d.sum()
    for t in range(rank):
        j = int(np.argmax(d))
        if d[j] <= tol * max(start, 1e-300):
            break
        pivots.append(j)
        col = np.asarray(column(j), np.float64) - B[:, :t] @ B[j, :t]
        B[:, t] = col / np.sqrt(d[j])
        d -= B[:, t] ** 2
        d[j] = 0.0
        np.maximum(d, 0.0, out=d)
    return B[:, :len(pivots)], np.array(pivots, np.int64)


def decompose(Xneg: np.ndarray, kind: str, gamma: float, method: str, rank: int | None) -> tuple[np.ndarray, dict]:
    """The factor B of the negatives' kernel matrix by ``method``; rank None = full (n)."""
    n = len(Xneg)
    if method == "icd":
        r = n if rank is None else min(rank, n)
        B, piv = incomplete_cholesky(kernel_diag(Xneg, kind, gamma),
                                     lambda j: kernel(Xneg, Xneg[j:j + 1], kind, gamma)[:, 0], r)
        return B, {"pivots": piv}
    K = kernel(Xneg, Xneg, kind, gamma)
    if method == "cholesky":
        if rank is not None and rank < n:
            raise InputError(f"decomposition cholesky is full rank; rank {rank} needs kpca or icd")
        B, eps = complete_cholesky(K)
        return B, {"shift": float(eps)}
    if method == "kpca":
        B = kpca(K, n if rank is None else min(rank, n))
        return B, {"residual": float(1.0 - (B * B).sum() / max(float(np.trace(K)), 1e-300))}
    raise ValueError(f"unknown decomposition {method!r}; one of {DECOMPOSITIONS}")


# ---- kernel SLEM ---------------------------------------------------------------------------------------

class KernelSLEM(_PoolLearner):
    """Kernel SLEM (Section 4): each image's code is [beta_hat (r), v (r), u, x_0 (D)] (Lemma 1 and
    Eq. 6 in the coordinates of a factor K = B B^T of the pool's kernel matrix), compared by Eq. 16
    (:func:`similarity` with the score string :attr:`code_metric`), not by a vector-space metric.

    Parameters
    ----------
    lam : float > 0, default 0.1
        lambda of Eqs. 6 and 16 (Python reserves the word lambda), read as linear SLEM's: the ridge
        (fitted ``ridge_``, what Eq. 16 divides by) is lam times the pool's mean k(x, x), its mean
        squared norm in the kernel's feature space (1 for the Gaussian kernel), so the polynomial
        kernel with gamma 0 is linear SLEM at the same lam, and its codes do not change with the
        features' units.
    kernel : {"gaussian", "poly"}, default "gaussian"
        exp(-gamma ||a - b||^2) (Eq. 17) or a^T b + gamma (a^T b)^2 (Eq. 18).
    gamma : float >= 0 or "scale", default "scale"
        The kernel's gamma; "scale" sets it from the pool (fitted ``gamma_``): Gaussian
        1 / mean ||a - b||^2 = 1 / (2 tr Cov), so distances are on the kernel's scale whatever the
        features' units (about 1 on l2-normalised rows); polynomial 1 / mean |a^T b|, so the
        quadratic term is as large as the linear one.
    rank : "full" or int >= 1, default "full"
        r, the factor's rank (clipped to the pool size); "full": n.
    decomposition : {"cholesky", "kpca", "icd"}, default "cholesky"
        Complete Cholesky with the eigenvalue shift of Section 5.1 (full rank only), the top r
        eigenpairs, or pivoted incomplete Cholesky at rank r.
    negatives : dict or None, default None
        The pool ``{split, count, seed}`` (:func:`check_negatives`). In memory the pool is a seeded
        sample of ``count`` rows of X.

    Attributes
    ----------
    pool_ : ndarray of shape (n, n_features)
        The negatives Lemma 1 compares an image with, k(X, x_0): all n (Cholesky, KPCA), or ICD's r
        pivots only (r, n_features).
    projector_ : ndarray of shape (r, n) (ICD: (r, r))
        P with v = P k(X, x_0): B^+ (Cholesky, KPCA) or ICD's Nystrom extension from the pivots.
    factor_mean_ : ndarray of shape (r,)
        mu_B, the mean row of B.
    cholesky_ : ndarray of shape (r, r)
        Lower Cholesky factor of A_B = (1/n) B^T B - mu_B mu_B^T + ridge_ Id.
    ridge_ : float
        The ridge lam times the pool's mean k(x, x) (what Eq. 16 divides by; models stored before
        0.3.8 load with ridge_ = lam, as they were fitted).
    rank_ : int
        r, the factor's rank after clipping (KPCA and ICD drop null directions).
    factor_info_ : dict
        {"shift": eps} (Cholesky), {"residual": 1 - tr(B B^T) / tr(K)} (KPCA) or {"pivots": r} (ICD).

    Notes
    -----
    The pipeline gathers the pool (bounded: count <= its MAX_POOL, or for ICD pool and factor
    within its ICD_POOL_BYTES) and calls :meth:`fit_pool`;
    ``fit(X)`` is ``fit_pool(X[pool])``.
    """
    # the ridge read as linear SLEM's (relative to the mean kernel diagonal), a decade apart, as wide
    search_space = {"lam": [0.1, 0.01, 1.0, 10.0, 100.0, 1000.0]}
    selection_metric = "map"

    method = "slem"
    fitted_attributes = ("cholesky_", "pool_", "projector_", "factor_mean_", "factor_info_", "gamma_", "rank_",
                         "ridge_")
    _parameter_constraints = {
        "lam": POSITIVE,
        "kernel": [StrOptions({"gaussian", "poly"})],
        "gamma": [*NON_NEGATIVE, StrOptions({"scale"})],
        "rank": [StrOptions({"full"}), Interval(Integral, 1, None, closed="left")],
        "decomposition": [StrOptions(set(DECOMPOSITIONS))],
        "negatives": [dict, None],
    }

    def _validate_params(self):
        super()._validate_params()
        if self.decomposition == "cholesky" and self.rank != "full":   # a Cholesky factor is always full rank
            raise InputError(f"decomposition cholesky is full rank, but rank is {self.rank}; use decomposition kpca "
                             f"or icd for a low rank, or rank full")

    def serves(self, classifier: str) -> str | None:
        if classifier.startswith("knn"):
            return None
        return (f"kernel SLEM ({self.kernel}) compares images by Eq. 16 only; {classifier} needs codes in a "
                f"vector space")

    def code_dim(self, n_features: int, n_classes: int) -> int:
        return n_features   # an upper bound: its codes' width follows its pool (Lemma 1)

    def largest_task(self, n_rows: int, n_features: int, n_classes: int, k: int = 0, anchors: int | None = None):
        """Its pool of ``n_rows`` images: an n x n float64 kernel matrix and its factor (Cholesky, KPCA),
        or an n x r pivoted factor (ICD). Measured at n = 5,000 (fit_pool's peak RSS over n^2 x 8
        bytes): Cholesky 5.0, KPCA 3.8; ICD at r = 200, 1.6 x n r x 8 bytes."""
        n = n_rows
        if self.decomposition == "icd":
            r = n if self.rank == "full" else min(n, int(self.rank))
            need, shape, copies = 2 * 8.0 * n * r, f"{n:,} x {r}", 2
        else:
            need, shape, copies = 5 * 8.0 * n * n, f"{n:,} x {n:,}", 5
        return (f"kernel SLEM's {shape} kernel matrices ({copies} copies, float64)", need,
                "lower its negatives.count, use decomposition: icd with a rank")

    def portable(self) -> tuple[str, dict, dict]:
        """``kernel_slem``: v = k(X, pool) @ projector.T, u = sqrt(max(k(x, x) - |v|^2, 0)),
        codes = [(v - factor_mean) @ A_inv, v, u, X] (Lemma 1 and Eq. 6), compared by Eq. 16."""
        check_is_fitted(self)
        return ("kernel_slem", {"pool": self.pool_, "projector": self.projector_, "factor_mean": self.factor_mean_,
                                "A_inv": inverse_from_cholesky(self.cholesky_)},
                {"kernel": self.kernel, "gamma": float(self.gamma_)})

    def __init__(self, lam=0.1, kernel="gaussian", gamma="scale", rank="full", decomposition="cholesky",
                 negatives=None):
        self.lam = lam
        self.kernel = kernel
        self.gamma = gamma
        self.rank = rank
        self.decomposition = decomposition
        self.negatives = negatives

    def _fit_pool(self, Xneg):
        Xneg = np.asarray(Xneg, np.float64)
        n = len(Xneg)
        if n < 2:
            raise InputError(f"KernelSLEM needs a pool of at least 2 negative images; got {n} sample(s)")
        rank = None if self.rank == "full" else int(self.rank)
        lam, gamma = float(self.lam), scaled_gamma(self.gamma, self.kernel, Xneg)
        self.gamma_ = gamma
        Xfull = Xneg
        B, info = decompose(Xneg, self.kernel, gamma, self.decomposition, rank)
        if self.decomposition == "cholesky":                       # v = B^+ k_0 = B^-1 k_0 (Lemma 1)
            P = sla.solve_triangular(B, np.eye(len(B)), lower=True)
        elif self.decomposition == "kpca":                         # B^T B = diag(eigenvalues): B^+ = diag^-1 B^T
            P = B.T / (B * B).sum(0)[:, None]
        else:
            # ICD's own extension: the new row of the factor from the pivot columns, B[piv] v = k_0[piv]
            # (B[piv] is lower triangular). Equal to B^+ k_0 when K = B B^T exactly (full rank); at low rank
            # B^+ k_0 can overshoot ||v||^2 > k_00, while this is the Nystrom projection, ||v||^2 <= k_00.
            # Only the pivots' columns of P are non-zero, so an image needs k(x, pivot) alone: the
            # model keeps the r pivot rows, and encoding costs r kernel evaluations, not n (Fig. 3).
            piv = info.pop("pivots")
            P = sla.solve_triangular(B[piv], np.eye(len(piv)), lower=True)
            Xneg = Xneg[piv]
            info["pivots"] = int(len(piv))
        mu_B = B.mean(0)
        # lam read as linear SLEM's: times the pool's mean k(x, x) (its mean squared norm in feature space)
        self.ridge_ = lam * pool_kernel_sq_norm(Xfull, self.kernel, gamma)
        A_B = regularised_covariance(B.T @ B / n - np.outer(mu_B, mu_B), self.ridge_)   # A of Eq. 6 in B's coordinates
        self.cholesky_ = factor(A_B, type(self).__name__)
        self.pool_ = Xneg
        self.projector_ = P
        self.factor_mean_ = mu_B
        self.rank_ = int(B.shape[1])
        self.factor_info_ = info
        return self

    @property
    def code_metric(self) -> str:
        """The score string of :func:`similarity`: ``slem:kernel:gamma:ridge:rank``."""
        return f"slem:{self.kernel}:{float(self.gamma_)!r}:{float(self.ridge_)!r}:{self.rank_}"

    @classmethod
    def from_state(cls, params: dict, state: dict) -> "KernelSLEM":
        # models stored before the relative ridge: the ridge was lam itself
        return super().from_state(params, {"ridge_": float(params.get("lam", 0.1)), **state})

    def lemma1(self, X) -> tuple[np.ndarray, np.ndarray]:
        """(v (m, r), u (m,)) of Lemma 1 for the rows of X (m, n_features)."""
        X = np.asarray(X, np.float64)
        gamma = float(self.gamma_)
        v = (self.projector_ @ kernel(self.pool_, X, self.kernel, gamma)).T
        u = np.sqrt(np.maximum(kernel_diag(X, self.kernel, gamma) - (v * v).sum(1), 0.0))
        return v, u

    def _transform(self, X):
        v, u = self.lemma1(X)
        beta_hat = solve(self.cholesky_, v - self.factor_mean_)   # A_B^-1 (v - mu_B), Eq. 6
        return np.concatenate([beta_hat, v, u[:, None], X], axis=1)

    @property
    def _n_features_out(self):
        return 2 * self.rank_ + 1 + self.pool_.shape[1]

    def cost(self) -> dict:
        """Stored values, bytes and multiply-adds per image (k(X, x_0), v = P k, the solve pair)."""
        arrays = (self.pool_, self.projector_, self.factor_mean_, self.cholesky_)
        n, D = self.pool_.shape
        r = self.rank_
        return {"nnz": int(sum(a.size for a in arrays)), "storage_bytes": int(sum(a.nbytes for a in arrays)),
                "flops_per_image": 2 * n * D + 2 * r * n + 2 * r * r}


def parse_score(score: str) -> tuple[str, float, float, int]:
    _, kind, gamma, lam, r = score.split(":")
    return kind, float(gamma), float(lam), int(r)


def similarity(Q: np.ndarray, X: np.ndarray, score: str) -> np.ndarray:
    """Cosine of the kernel SLEM classifiers of the rows of Q and X (codes from KernelSLEM.transform):
    Eq. 16 divided by ||h|| ||h'||."""
    kind, gamma, lam, r = parse_score(score)
    Q, X = np.asarray(Q, np.float64), np.asarray(X, np.float64)

    def parts(C):
        bh, v, u, x0 = C[:, :r], C[:, r:2 * r], C[:, 2 * r], C[:, 2 * r + 1:]
        return bh, v, x0, np.sqrt((bh * bh).sum(1) + (u / lam) ** 2)

    bq, vq, xq, nq = parts(Q)
    bx, vx, xx, nx = parts(X)
    s = bq @ bx.T + (kernel(xq, xx, kind, gamma) - vq @ vx.T) / lam ** 2
    return s / np.maximum(nq[:, None] * nx[None, :], 1e-300)


# ---- the ESVM baseline ---------------------------------------------------------------------------------

def esvm(X0: np.ndarray, Xneg: np.ndarray, lam: float, theta: float, epochs: int, batch: int,
         rng: np.random.Generator, lr0: float = 1.0, scale: float = 1.0) -> np.ndarray:
    """Exemplar SVMs (Eq. 1, hinge loss) for every row of X0 against the negatives, by SGD, on the
    rows divided by ``scale`` (each batch of negatives divided as it is drawn: the pool is not copied).

    Each step takes the positive and ``batch`` negatives (the same draw for every image of the block,
    so a step is two GEMMs); the step size is lr0 / (1 + lambda lr0 t) (Bottou's schedule for the
    l2-regularised hinge). Returns omega (m, D) with unit rows (the code) ."""
    X0 = np.asarray(X0, np.float64) / scale
    Xneg = np.asarray(Xneg)
    m, D = X0.shape
    W = np.zeros((m, D))
    nu = np.zeros(m)
    steps = max(1, epochs * len(Xneg) // batch)
    for t in range(steps):
        lr = lr0 / (1.0 + lam * lr0 * t)
        N = Xneg[rng.integers(0, len(Xneg), batch)].astype(np.float64) / scale
        pos = (W * X0).sum(1) + nu                              # omega^T x_0 + nu
        neg = W @ N.T + nu[:, None]                              # (m, batch)
        gp = np.where(pos < 1.0, -theta, 0.0)                   # d/d(score) of theta * max(0, 1 - score)
        gn = np.where(neg > -1.0, 1.0 / batch, 0.0)              # mean of max(0, 1 + score) over the batch
        gW = gp[:, None] * X0 + gn @ N + lam * W
        W -= lr * gW
        nu -= lr * (gp + gn.sum(1))
    return unit_rows(W)


class ESVM(_PoolLearner):
    """The exemplar SVM baseline (Eq. 1 with the hinge loss): each image's code is its unit-norm
    exemplar SVM against the stored pool, trained by SGD when the image is transformed
    (:func:`esvm`, with a seeded draw of negatives that is the same for every image and block).

    Parameters
    ----------
    lam : float >= 0, default 0.1
        lambda of Eq. 1 (Python reserves the word lambda), read for rows of unit RMS norm as linear
        SLEM's: the SVMs are trained on the rows divided by the pool's RMS norm ``scale_`` (1 on
        l2-normalised rows), so the codes do not change when the features are scaled.
    theta : float >= 0, default 1.0
        The positive exemplar's weight in Eq. 1.
    epochs : int >= 1, default 2
        Passes over the pool per image (SGD steps = epochs * n // batch, at least 1).
    batch : int >= 1, default 64
        Negatives per SGD step.
    negatives : dict or None, default None
        The pool ``{split, count, seed}`` (:func:`check_negatives`). In memory the pool is a seeded
        sample of ``count`` rows of X.
    random_state : int, RandomState or None, default None
        Seed of the SGD draws (None: 0).

    Attributes
    ----------
    pool_ : ndarray of shape (n, n_features)
        The negatives.
    seed_ : int
        The seed of the SGD draws, resolved from ``random_state`` at fit.
    scale_ : float
        s, the pool's RMS norm sqrt(mean ||x||^2).

    Notes
    -----
    The pipeline gathers the pool (bounded by its MAX_POOL) and calls :meth:`fit_pool`; ``fit(X)``
    is ``fit_pool(X[pool])``. The training happens in ``transform``: every image is its own SVM.
    """
    search_space = {"lam": [0.1, 0.01, 1.0]}
    selection_metric = "map"

    method = "esvm"

    def portable(self) -> tuple[str, dict, dict]:
        raise InputError("ESVM codes have no closed form (each image's exemplar SVM is trained by SGD against "
                         "the pool); use 'metricpipe encode' to encode new images with it")
    fitted_attributes = ("pool_", "seed_", "scale_")
    code_metric = "euclidean"
    _parameter_constraints = {"lam": NON_NEGATIVE, "theta": NON_NEGATIVE, "epochs": COUNT, "batch": COUNT,
                              "negatives": [dict, None], "random_state": RANDOM_STATE}

    def __init__(self, lam=0.1, theta=1.0, epochs=2, batch=64, negatives=None, random_state=None):
        self.lam = lam
        self.theta = theta
        self.epochs = epochs
        self.batch = batch
        self.negatives = negatives
        self.random_state = random_state

    def _fit_pool(self, Xneg):
        if len(Xneg) < 2:
            raise InputError(f"ESVM needs a pool of at least 2 negative images; got {len(Xneg)} sample(s)")
        self.pool_ = np.array(Xneg, np.float64)
        self.seed_ = seed_of(self.random_state)
        self.scale_ = moments.row_scale({"mean_sq_norm": np.einsum("ij,ij->", self.pool_, self.pool_) / len(self.pool_)})
        return self

    @classmethod
    def from_state(cls, params: dict, state: dict) -> "ESVM":
        # models stored before 0.3.7 have no scale_: their SVMs were trained on the rows as they are
        return super().from_state(params, {"scale_": 1.0, **state})

    def _transform(self, X):
        rng = np.random.default_rng([self.seed_, 23])
        return esvm(X, self.pool_, float(self.lam), float(self.theta), int(self.epochs), int(self.batch), rng,
                    scale=self.scale_)

    @property
    def _n_features_out(self):
        return self.pool_.shape[1]

    def cost(self) -> dict:
        """Stored values (the pool), bytes and multiply-adds per image (the SGD steps)."""
        steps = max(1, int(self.epochs) * len(self.pool_) // int(self.batch))
        return {"nnz": int(self.pool_.size), "storage_bytes": int(self.pool_.nbytes),
                "flops_per_image": 4 * steps * (int(self.batch) + 1) * self.pool_.shape[1]}
