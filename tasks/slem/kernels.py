"""Kernel SLEM (Rezende et al., Section 4): the kernels (Eqs. 17-18), the factorisations of the pool's
kernel matrix (complete Cholesky with the shift of Section 5.1, KPCA, incomplete Cholesky), Lemma 1,
and the similarity of Eq. 16 its codes are compared by."""

from numbers import Integral

import numpy as np
import scipy.linalg as sla
from sklearn.utils.validation import check_is_fitted

from metricpipe.tasks import madds
from metricpipe.tasks.base import NON_NEGATIVE, POSITIVE, Interval, StrOptions
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.slem.linear import factor, inverse_from_cholesky, regularised_covariance, solve
from metricpipe.tasks.slem.pool import PoolLearner

KERNELS = ("linear", "gaussian", "poly")
DECOMPOSITIONS = ("cholesky", "kpca", "icd")


def pool_kernel_sq_norm(Xneg: np.ndarray, kind: str, gamma: float) -> float:
    """Mean k(x, x) over the pool (tr K / n): linear SLEM's s^2 for the kernel's feature map (1 for
    the Gaussian kernel; ||x||^2 + gamma ||x||^4 averaged for the polynomial one)."""
    m = float(np.mean(kernel_diag(Xneg, kind, gamma)))
    return m if m > 0 else 1.0


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
        spread = 2.0 * float(X.var(0).sum())  # mean ||a - b||^2 over pairs of pool rows
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
    return B[:, : len(pivots)], np.array(pivots, np.int64)


def decompose(Xneg: np.ndarray, kind: str, gamma: float, method: str, rank: int | None) -> tuple[np.ndarray, dict]:
    """The factor B of the negatives' kernel matrix by ``method``; rank None = full (n)."""
    n = len(Xneg)
    if method == "icd":
        r = n if rank is None else min(rank, n)
        B, piv = incomplete_cholesky(
            kernel_diag(Xneg, kind, gamma), lambda j: kernel(Xneg, Xneg[j : j + 1], kind, gamma)[:, 0], r
        )
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


class KernelSLEM(PoolLearner):
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
        features' units (about 1 on l2-normalised rows); polynomial 1 / mean ``|a^T b|``, so the
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
        Lower Cholesky factor of A_B = (1/n) B^T B - mu_B mu_B^T + ``ridge_`` Id.
    ridge_ : float
        The ridge lam times the pool's mean k(x, x) (what Eq. 16 divides by; models stored before
        0.3.8 load with ``ridge_`` = lam, as they were fitted).
    gamma_ : float
        The kernel's gamma (``gamma``, or the one "scale" set from the pool).
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
    fitted_attributes = (
        "cholesky_",
        "pool_",
        "projector_",
        "factor_mean_",
        "factor_info_",
        "gamma_",
        "rank_",
        "ridge_",
    )
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
        if self.decomposition == "cholesky" and self.rank != "full":  # a Cholesky factor is always full rank
            raise InputError(
                f"decomposition cholesky is full rank, but rank is {self.rank}; use decomposition kpca "
                f"or icd for a low rank, or rank full"
            )

    def serves(self, classifier: str) -> str | None:
        if classifier.startswith("knn"):
            return None
        return f"kernel SLEM ({self.kernel}) compares images by Eq. 16 only; {classifier} needs codes in a vector space"

    def code_dim(self, n_features: int, n_classes: int) -> int:
        """Eq. 16's parts per image (``_n_features_out``): v = P k and its solve (r each), the image's
        self-similarity and its features; r the rank its pool of ``negatives.count`` images allows (an
        upper bound: a split with fewer images makes a smaller pool)."""
        return 2 * self._rank(self._pool_size()) + 1 + n_features

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
        return (
            f"kernel SLEM's {shape} kernel matrices ({copies} copies, float64)",
            need,
            "lower its negatives.count, use decomposition: icd with a rank",
        )

    def portable(self) -> tuple[str, dict, dict]:
        """``kernel_slem``: v = k(X, pool) @ projector.T, u = sqrt(max(k(x, x) - |v|^2, 0)),
        codes = [(v - factor_mean) @ A_inv, v, u, X] (Lemma 1 and Eq. 6), compared by Eq. 16."""
        check_is_fitted(self)
        return (
            "kernel_slem",
            {
                "pool": self.pool_,
                "projector": self.projector_,
                "factor_mean": self.factor_mean_,
                "A_inv": inverse_from_cholesky(self.cholesky_),
            },
            {"kernel": self.kernel, "gamma": float(self.gamma_)},
        )

    def __init__(
        self, lam=0.1, kernel="gaussian", gamma="scale", rank="full", decomposition="cholesky", negatives=None
    ):
        self.lam = lam
        self.kernel = kernel
        self.gamma = gamma
        self.rank = rank
        self.decomposition = decomposition
        self.negatives = negatives

    def _rank(self, n: int) -> int:
        return n if self.rank == "full" else min(int(self.rank), n)

    def fit_cost(self, n_rows, n_features, n_classes, k=0, n_val=0) -> madds.FitCost:
        """On a pool of n = ``n_rows`` images: the n x n kernel matrix and its factor (Cholesky and the
        triangular inverse, or KPCA's r leading eigenvectors: a tridiagonal reduction of n^3), or ICD's
        r kernel columns; then A_B = B^T B / n (r x r) and its Cholesky factor."""
        n, D, r = n_rows, n_features, self._rank(n_rows)
        if self.decomposition == "icd":
            factor = r * (madds.passes(n * D, 2) + madds.gemm(n, 1, r) + madds.passes(n, 8))
        else:
            kernel = madds.gemm(n, n, D) + madds.passes(n * n, 4)
            if self.decomposition == "cholesky":
                factor = kernel + 2 * madds.cholesky(n)
            else:
                factor = kernel + 2.5 * n**3 + madds.gemm(r, n, 1)
        solve = madds.gemm(r, r, n) + madds.cholesky(r) + madds.passes(r * r, 6)
        return madds.FitCost(madds.FIT + madds.passes(n * D, 6) + factor + solve)

    def transform_cost(self, n_rows, n_features, n_classes):
        """Per row its kernel with the pool (or ICD's pivots), v = P k and the two triangular solves."""
        n = self._pool_size()
        r = self._rank(n)
        kept = r if self.decomposition == "icd" else n
        return (
            madds.gemm(n_rows, kept, n_features)
            + madds.passes(n_rows * kept, 4)
            + madds.gemm(n_rows, r, kept)
            + madds.gemm(n_rows, r, r)
            + madds.passes(n_rows * n_features, 4)
        )

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
        if self.decomposition == "cholesky":  # v = B^+ k_0 = B^-1 k_0 (Lemma 1)
            P = sla.solve_triangular(B, np.eye(len(B)), lower=True)
        elif self.decomposition == "kpca":  # B^T B = diag(eigenvalues): B^+ = diag^-1 B^T
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
        A_B = regularised_covariance(B.T @ B / n - np.outer(mu_B, mu_B), self.ridge_)  # A of Eq. 6 in B's coordinates
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

    def _code_distances(self, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        """Minus Eq. 16's cosine of the rows of A and B, row by row."""
        return -np.array([similarity(A[i : i + 1], B[i : i + 1], self.code_metric)[0, 0] for i in range(len(A))])

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
        beta_hat = solve(self.cholesky_, v - self.factor_mean_)  # A_B^-1 (v - mu_B), Eq. 6
        return np.concatenate([beta_hat, v, u[:, None], X], axis=1)

    @property
    def _n_features_out(self):
        return 2 * self.rank_ + 1 + self.pool_.shape[1]

    def cost(self) -> dict:
        """Stored values, bytes and multiply-adds per image (k(X, x_0), v = P k, the solve pair)."""
        arrays = (self.pool_, self.projector_, self.factor_mean_, self.cholesky_)
        n, D = self.pool_.shape
        r = self.rank_
        return {
            "nnz": int(sum(a.size for a in arrays)),
            "storage_bytes": int(sum(a.nbytes for a in arrays)),
            "flops_per_image": 2 * n * D + 2 * r * n + 2 * r * r,
        }


def parse_score(score: str) -> tuple[str, float, float, int]:
    _, kind, gamma, lam, r = score.split(":")
    return kind, float(gamma), float(lam), int(r)


def similarity(Q: np.ndarray, X: np.ndarray, score: str) -> np.ndarray:
    """Cosine of the kernel SLEM classifiers of the rows of Q and X (codes from KernelSLEM.transform):
    Eq. 16 divided by ||h|| ||h'||."""
    kind, gamma, lam, r = parse_score(score)
    Q, X = np.asarray(Q, np.float64), np.asarray(X, np.float64)

    def parts(C):
        bh, v, u, x0 = C[:, :r], C[:, r : 2 * r], C[:, 2 * r], C[:, 2 * r + 1 :]
        return bh, v, x0, np.sqrt((bh * bh).sum(1) + (u / lam) ** 2)

    bq, vq, xq, nq = parts(Q)
    bx, vx, xx, nx = parts(X)
    s = bq @ bx.T + (kernel(xq, xx, kind, gamma) - vq @ vx.T) / lam**2
    return s / np.maximum(nq[:, None] * nx[None, :], 1e-300)
