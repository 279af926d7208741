"""The sparse projectors' constraint set: M non-zeros per column (Eq. 17, M = (1 - tau) D, Eq. 19), unit
columns, and the golden-section search of the step (Eq. 15)."""

import numpy as np

GOLDEN = (np.sqrt(5.0) - 1.0) / 2.0


def golden_section(f, a: float, b: float, tol: float = 1e-6, max_iter: int = 60) -> float:
    """Minimiser of a unimodal f on [a, b] by golden-section search; stops when the bracket is
    ``tol`` times its initial width (relative: the step bracket can be far below 1)."""
    width = tol * abs(b - a)
    c, d = b - GOLDEN * (b - a), a + GOLDEN * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(max_iter):
        if abs(b - a) <= width:
            break
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - GOLDEN * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + GOLDEN * (b - a)
            fd = f(d)
    return c if fc <= fd else d


def project_l0(U: np.ndarray, m: int) -> np.ndarray:
    """Keep the m largest-magnitude entries of every column (Eq. 17); the rest become 0."""
    D = U.shape[0]
    if m >= D:
        return U
    keep = np.argpartition(-np.abs(U), m - 1, axis=0)[:m]
    out = np.zeros_like(U)
    cols = np.broadcast_to(np.arange(U.shape[1]), keep.shape)
    out[keep, cols] = U[keep, cols]
    return out


def unit_columns(U: np.ndarray) -> np.ndarray:
    """Rescale every projector to unit norm. The objective is not scale-invariant (U -> 0 drives every
    hinge to eps and the objective to ~eps^2 while the ranking is lost), so the scale is fixed."""
    norms = np.linalg.norm(U, axis=0, keepdims=True)
    norms[norms == 0] = 1.0
    return U / norms


def _rounded_nonzeros(D: int, sparsity: float) -> int:
    return int(round((1.0 - sparsity) * D))


def nonzeros_per_column(D: int, sparsity: float) -> int:
    """M of Eq. 19: tau = (D - M) / D (at least 1: see :func:`sparsity_note`)."""
    return max(1, _rounded_nonzeros(D, sparsity))


def sparsity_note(D: int, sparsity: float) -> str | None:
    """The note for a tau whose M rounds to 0 on D-d signatures (one non-zero is kept), else None."""
    if _rounded_nonzeros(D, sparsity) >= 1:
        return None
    return (
        f"sparsity {sparsity} leaves {(1.0 - sparsity) * D:.2g} non-zeros per column of the data's {D} "
        f"features; 1 is kept (sparsity {1.0 - 1.0 / D:.6g})"
    )
