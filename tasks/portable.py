"""A fitted learner as plain arrays and the name of a formula (``metricpipe export --npz``), for users who
apply a model without metricpipe. The formulas, written with numpy alone, are in the README
("Models without metricpipe"); each kind is a few lines:

- ``affine``: ``codes = X @ W + b`` (no ``W``: the codes are X; no ``b``: no offset). Identity, PCA,
  PCA-whitening, LDA, random projections, NCMML, NCMC, k-NN ML, linear ML, sparse projectors (W dense).
- ``sphere``: ``Z = (X - mean) @ P``, rows of Z divided by their l2 norm (zero rows stay zero),
  ``codes = Z @ F``; the exact bilinear similarity is ``(Z_q @ M) . Z_x`` (SL-NE, SL-DE).
- ``chi2``: rows l1-normalised, ``codes[:, t] = sum_c 2 L[t, c] x_c / (|L[t, c]| + tiny + |x_c|)`` (NML, Eq. 7/11).
- ``slem``: ``codes = unit_rows((X - mean) @ A_inv)`` (linear SLEM, Eq. 6).
- ``kernel_slem``: ``v = k(X, pool) @ projector.T``, ``u = sqrt(max(k(x, x) - |v|^2, 0))``,
  ``codes = [ (v - factor_mean) @ A_inv, v, u, X ]`` (Lemma 1 and Eq. 6), compared by Eq. 16.

ESVM has no closed form (each image's classifier is trained by SGD against the pool) and is refused.
"""
import numpy as np

from metricpipe.tasks.errors import InputError


def _dense(W):
    return W.toarray() if hasattr(W, "toarray") else np.asarray(W)


def portable(est) -> tuple[str, dict, dict]:
    """(kind, arrays, scalars) of a fitted learner; see the module docstring for each kind's formula."""
    from metricpipe.tasks import nml, slem, slne, sparse
    if isinstance(est, (slne.SLNE, slne.SLDE)):
        return "sphere", {"mean": est.mean_, "P": est.basis_, "F": est.factor_, "M": est.M_}, {}
    if isinstance(est, nml.NML):
        return "chi2", {"L": est.L_}, {"tiny": float(nml.TINY)}
    if isinstance(est, nml.LinearML):
        return "affine", {"W": est.L_.T}, {}
    if isinstance(est, slem.KernelSLEM):
        return "kernel_slem", {"pool": est.pool_, "projector": est.projector_, "factor_mean": est.factor_mean_,
                               "A_inv": _inverse(est.cholesky_)}, {"kernel": est.kernel, "gamma": float(est.gamma_)}
    if isinstance(est, slem.SLEM):
        return "slem", {"mean": est.mean_, "A_inv": _inverse(est.cholesky_)}, {}
    if isinstance(est, slem.ESVM):
        raise InputError("ESVM codes have no closed form (each image's exemplar SVM is trained by SGD against "
                         "the pool); use 'metricpipe encode' to encode new images with it")
    if isinstance(est, sparse.SparseProjector):
        return "affine", {"W": _dense(est.projectors_), "b": est.bias_}, {}
    W, b = getattr(est, "components_", None), getattr(est, "offset_", None)
    arrays = {"W": _dense(W)} if W is not None else {}
    if b is not None:
        arrays["b"] = np.asarray(b)
    return "affine", arrays, {}


def _inverse(cholesky: np.ndarray) -> np.ndarray:
    """A^-1 from A's lower Cholesky factor (symmetric)."""
    Linv = np.linalg.inv(cholesky)
    return Linv.T @ Linv
