"""Square-loss exemplar machines (Rezende, Zepeda, Ponce, Bach, Perez), Sections 3-5.

Every image x_0 is encoded by the classifier (omega, nu) that separates it from a fixed pool of n
negatives X (Eq. 1). With the square loss the problem is a ridge regression whose solution (Eqs. 3-4)
simplifies by Woodbury (Eq. 6) to

    omega* = 2 theta / (theta delta^T A^-1 delta + theta + 1) * A^-1 delta,   delta = x_0 - mu,

with mu the negatives' mean and A = (1/n) X X^T - mu mu^T + lambda Id their regularised (biased)
covariance. theta scales omega* but never turns it, so the code A^-1 (x_0 - mu) / ||.|| used for cosine
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
"""
import numpy as np
import scipy.linalg as sla

from metricpipe.tasks.errors import InputError

KERNELS = ("linear", "gaussian", "poly")
DECOMPOSITIONS = ("cholesky", "kpca", "icd")


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
        raise InputError(f"{where}: the negatives' covariance plus lambda * Id is not positive definite; "
                         f"raise lambda (features with no variance need lambda > 0)") from None


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


class LinearSLEM:
    """The linear SLEM encoder: code = A^-1 (x - mu) / ||A^-1 (x - mu)|| (unit rows: Euclidean ranking is
    cosine ranking). Same interface as LinearModel."""
    score = "euclidean"
    M = None
    kind = "slem-linear"

    def __init__(self, mu: np.ndarray, chol: np.ndarray, meta: dict | None = None):
        self.mu, self.chol, self.meta = np.asarray(mu, np.float64), np.asarray(chol, np.float64), meta or {}

    def transform(self, X: np.ndarray) -> np.ndarray:
        return unit_rows(solve(self.chol, np.asarray(X, np.float64) - self.mu)).astype(np.float32)

    def n_components(self, n_features: int) -> int:
        return len(self.mu)

    def arrays(self) -> dict:
        return {"mu": self.mu, "chol": self.chol}

    def attrs(self) -> dict:
        return {}

    @classmethod
    def from_arrays(cls, arrays: dict, attrs: dict) -> "LinearSLEM":
        return cls(arrays["mu"], arrays["chol"], attrs.get("fit_meta", {}))

    def cost(self, n_features: int) -> dict:
        D = len(self.mu)
        return {"storage_bytes": int(self.chol.nbytes + self.mu.nbytes), "flops_per_image": 2 * D * D}


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
    jitter = 1e-10 * float(np.trace(K)) / len(K)
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
        return B, {"shift": eps}
    if method == "kpca":
        B = kpca(K, n if rank is None else min(rank, n))
        return B, {"residual": float(1.0 - (B * B).sum() / np.trace(K))}
    raise ValueError(f"unknown decomposition {method!r}; one of {DECOMPOSITIONS}")


# ---- kernel SLEM ---------------------------------------------------------------------------------------

class KernelSLEM:
    """Kernel SLEM: offline B, P = B^+ (r, n), mu_B and the Cholesky factor of A_B; an image's code is
    [beta_hat (r), v (r), u, x_0 (D)], compared by Eq. 16 (:func:`similarity`)."""
    M = None
    kind = "slem-kernel"

    def __init__(self, Xneg, P, mu_B, chol_B, lam: float, kernel_kind: str, gamma: float, meta: dict | None = None):
        self.Xneg = np.asarray(Xneg, np.float64)
        self.P, self.mu_B, self.chol_B = np.asarray(P, np.float64), np.asarray(mu_B, np.float64), np.asarray(chol_B, np.float64)
        self.lam, self.kernel_kind, self.gamma = float(lam), kernel_kind, float(gamma)
        self.meta = meta or {}

    @classmethod
    def fit(cls, Xneg: np.ndarray, lam: float, kernel_kind: str, gamma: float, method: str, rank: int | None,
            meta: dict | None = None) -> "KernelSLEM":
        B, info = decompose(Xneg, kernel_kind, gamma, method, rank)
        piv = info.pop("pivots", None)
        if method == "cholesky":                                   # v = B^+ k_0 = B^-1 k_0 (Lemma 1)
            P = sla.solve_triangular(B, np.eye(len(B)), lower=True)
        elif method == "kpca":                                     # B^T B = diag(eigenvalues): B^+ = diag^-1 B^T
            P = B.T / (B * B).sum(0)[:, None]
        else:
            # ICD's own extension: the new row of the factor from the pivot columns, B[piv] v = k_0[piv]
            # (B[piv] is lower triangular). Equal to B^+ k_0 when K = B B^T exactly (full rank); at low rank
            # B^+ k_0 can overshoot ||v||^2 > k_00, while this is the Nystrom projection, ||v||^2 <= k_00.
            P = np.zeros((B.shape[1], len(B)))
            P[:, piv] = sla.solve_triangular(B[piv], np.eye(len(piv)), lower=True)
            info["pivots"] = len(piv)
        mu_B = B.mean(0)
        A_B = regularised_covariance(B.T @ B / len(B) - np.outer(mu_B, mu_B), lam)
        return cls(Xneg, P, mu_B, factor(A_B), lam, kernel_kind, gamma, {**(meta or {}), **info, "rank": B.shape[1]})

    @property
    def rank(self) -> int:
        return len(self.mu_B)

    @property
    def score(self) -> str:
        return f"slem:{self.kernel_kind}:{self.gamma!r}:{self.lam!r}:{self.rank}"

    def lemma1(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(v (m, r), u (m,)) of Lemma 1 for the rows of X."""
        X = np.asarray(X, np.float64)
        v = (self.P @ kernel(self.Xneg, X, self.kernel_kind, self.gamma)).T
        u = np.sqrt(np.maximum(kernel_diag(X, self.kernel_kind, self.gamma) - (v * v).sum(1), 0.0))
        return v, u

    def transform(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, np.float64)
        v, u = self.lemma1(X)
        beta_hat = solve(self.chol_B, v - self.mu_B)
        return np.concatenate([beta_hat, v, u[:, None], X], axis=1).astype(np.float32)

    def n_components(self, n_features: int) -> int:
        return 2 * self.rank + 1 + n_features

    def arrays(self) -> dict:
        return {"Xneg": self.Xneg, "P": self.P, "mu_B": self.mu_B, "chol_B": self.chol_B}

    def attrs(self) -> dict:
        return {"lambda": self.lam, "kernel": self.kernel_kind, "gamma": self.gamma}

    @classmethod
    def from_arrays(cls, arrays: dict, attrs: dict) -> "KernelSLEM":
        return cls(arrays["Xneg"], arrays["P"], arrays["mu_B"], arrays["chol_B"], attrs["lambda"],
                   attrs["kernel"], attrs["gamma"], attrs.get("fit_meta", {}))

    def cost(self, n_features: int) -> dict:
        n, r = len(self.Xneg), self.rank
        return {"storage_bytes": int(sum(a.nbytes for a in self.arrays().values())),
                "flops_per_image": 2 * n * n_features + 2 * r * n + 2 * r * r}


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
         rng: np.random.Generator, lr0: float = 1.0) -> np.ndarray:
    """Exemplar SVMs (Eq. 1, hinge loss) for every row of X0 against the negatives, by SGD.

    Each step takes the positive and ``batch`` negatives (the same draw for every image of the block,
    so a step is two GEMMs); the step size is lr0 / (1 + lambda lr0 t) (Bottou's schedule for the
    l2-regularised hinge). Returns omega (m, D) with unit rows (the code) ."""
    X0 = np.asarray(X0, np.float64)
    Xneg = np.asarray(Xneg, np.float64)
    m, D = X0.shape
    W = np.zeros((m, D))
    nu = np.zeros(m)
    steps = max(1, epochs * len(Xneg) // batch)
    for t in range(steps):
        lr = lr0 / (1.0 + lam * lr0 * t)
        N = Xneg[rng.integers(0, len(Xneg), batch)]
        pos = (W * X0).sum(1) + nu                              # omega^T x_0 + nu
        neg = W @ N.T + nu[:, None]                              # (m, batch)
        gp = np.where(pos < 1.0, -theta, 0.0)                   # d/d(score) of theta * max(0, 1 - score)
        gn = np.where(neg > -1.0, 1.0 / batch, 0.0)              # mean of max(0, 1 + score) over the batch
        gW = gp[:, None] * X0 + gn @ N + lam * W
        W -= lr * gW
        nu -= lr * (gp + gn.sum(1))
    return unit_rows(W)


class ESVMEncoder:
    """The ESVM baseline as an encoder: each image's code is its unit-norm exemplar SVM (:func:`esvm`),
    trained against the stored negatives with a seeded draw (the same for every block)."""
    score = "euclidean"
    M = None
    kind = "esvm"

    def __init__(self, Xneg, lam: float, theta: float, epochs: int, batch: int, seed: int, meta: dict | None = None):
        self.Xneg = np.asarray(Xneg, np.float64)
        self.lam, self.theta, self.epochs, self.batch, self.seed = float(lam), float(theta), int(epochs), int(batch), int(seed)
        self.meta = meta or {}

    def transform(self, X: np.ndarray) -> np.ndarray:
        rng = np.random.default_rng([self.seed, 23])
        return esvm(X, self.Xneg, self.lam, self.theta, self.epochs, self.batch, rng).astype(np.float32)

    def n_components(self, n_features: int) -> int:
        return n_features

    def arrays(self) -> dict:
        return {"Xneg": self.Xneg}

    def attrs(self) -> dict:
        return {"lambda": self.lam, "theta": self.theta, "epochs": self.epochs, "batch": self.batch, "seed": self.seed}

    @classmethod
    def from_arrays(cls, arrays: dict, attrs: dict) -> "ESVMEncoder":
        return cls(arrays["Xneg"], attrs["lambda"], attrs["theta"], attrs["epochs"], attrs["batch"], attrs["seed"],
                   attrs.get("fit_meta", {}))

    def cost(self, n_features: int) -> dict:
        steps = max(1, self.epochs * len(self.Xneg) // self.batch)
        return {"storage_bytes": int(self.Xneg.nbytes), "flops_per_image": 4 * steps * (self.batch + 1) * n_features}
