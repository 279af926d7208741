"""The NCM, NCMC and dot-product likelihoods of Mensink et al. and their gradients (Eqs. 5-10, 21-27).

W (d, D) defines d_W(x, y) = ||W x - W y||^2; distances are taken in the projected space (Table 1's
cheapest option): the m images and the C means are projected once per step.
"""

import numpy as np


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax of ``logits`` (m, C), shifted by each row's maximum."""
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def sqdist(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Squared Euclidean distances (m, n) between the rows of A (m, d) and B (n, d), clipped at 0."""
    d = (A * A).sum(1)[:, None] - 2.0 * (A @ B.T) + (B * B).sum(1)[None, :]
    return np.maximum(d, 0.0)


def mixture_posteriors(Y: np.ndarray, Mp: np.ndarray, owner: np.ndarray, n_classes: int):
    """p(m_cj|x) (Eq. 21) for projected rows Y (m, d) and projected centroids Mp (K, d) whose classes
    are ``owner`` (K,); returns (p_centroid (m, K), p_class (m, C)) (Eq. 22)."""
    pc = softmax(-0.5 * sqdist(Y, Mp))
    pclass = np.zeros((len(Y), n_classes))
    np.add.at(pclass.T, owner, pc.T)
    return pc, pclass


def log_likelihood_and_gradient(
    W: np.ndarray,
    X: np.ndarray,
    y: np.ndarray,
    centroids: np.ndarray,
    owner: np.ndarray,
    n_classes: int,
    gradient: bool = True,
):
    """Mean log-likelihood (Eq. 9) of labels y (m,) under the NCMC posterior (NCM when each class
    has one centroid), and its gradient with respect to W (Eqs. 10 / 24-25)."""
    Y, Mp = X @ W.T, centroids @ W.T
    pc, pclass = mixture_posteriors(Y, Mp, owner, n_classes)
    m = len(X)
    py = np.maximum(pclass[np.arange(m), y], 1e-300)
    L = float(np.log(py).mean())
    if not gradient:
        return L, None
    mine = owner[None, :] == y[:, None]  # centroids of the true class
    alpha = pc - np.where(mine, pc / py[:, None], 0.0)  # Eq. 25 (Eq. 10 when k = 1)
    # sum_ij alpha_ij (Mp_j - Y_i)(mu_j - x_i)^T = A mu + B x: one GEMM over the centroids' D columns
    # and one over the rows', their factors A (d, K) and B (d, m) formed in the projected space first.
    # (Four D-wide GEMMs, one of them alpha^T X (K x m x D), did 2.5x the multiply-adds at NCMC's
    # 10,000 centroids.)
    A = Mp.T * alpha.sum(0) - Y.T @ alpha
    B = Y.T * alpha.sum(1) - (alpha @ Mp).T
    return L, (A @ centroids + B @ X) / m


def dot_log_likelihood_and_gradient(
    W: np.ndarray, bias: np.ndarray, X: np.ndarray, y: np.ndarray, means: np.ndarray, gradient: bool = True
):
    """Eq. 27: logits x^T W^T W mu_c + s_c, as the projected rows against the projected means (the
    means projected once per step: the rows' double projection W^T W x compared in the input space
    took two more m x C x D products)."""
    m = len(X)
    Y, Mp = X @ W.T, means @ W.T
    P = softmax(Y @ Mp.T + bias)
    L = float(np.log(np.maximum(P[np.arange(m), y], 1e-300)).mean())
    if not gradient:
        return L, None, None
    R = -P
    R[np.arange(m), y] += 1.0  # [c = y] - p(c|x)
    # d/dW x^T W^T W mu = W (x mu^T + mu x^T): sum_i,c R_ic (y_i mu_c^T + Mp_c x_i^T)
    G = (np.linalg.multi_dot([Y.T, R, means]) + (R @ Mp).T @ X) / m
    return L, G, R.mean(0)


def ncm_scores(Y: np.ndarray, Mp: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """Class scores of projected rows against projected means: -d/2 (Eq. 5) or the dot form (Eq. 27)."""
    if bias is None:
        return -0.5 * sqdist(Y, Mp)
    return Y @ Mp.T + bias


def mixture_class_scores(Y: np.ndarray, Mp: np.ndarray, owner: np.ndarray, n_classes: int) -> np.ndarray:
    """log p(c|x) of the NCMC mixture (Eq. 22), -inf for classes without centroids."""
    _, pclass = mixture_posteriors(Y, Mp, owner, n_classes)
    with np.errstate(divide="ignore"):
        return np.log(pclass)


def implied_bias(W: np.ndarray, means: np.ndarray) -> np.ndarray:
    """s_c = -||W mu_c||^2 / 2: the bias a class added after training takes in the dot form."""
    Mp = means @ W.T
    return -0.5 * (Mp * Mp).sum(1)


def metrics_nearest(Y: np.ndarray, M: np.ndarray) -> np.ndarray:
    """Index of the nearest row of M for every row of Y (squared Euclidean)."""
    d = (Y * Y).sum(1)[:, None] - 2 * Y @ M.T + (M * M).sum(1)[None, :]
    return np.argmin(d, axis=1)
