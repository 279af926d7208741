"""PairSGD: mini-batch SGD (or Adam) on the pair hinge of NML (Eq. 9) or the linear baseline (Eq. 3).

Each step averages the subgradients of the batch's pairs, which is Algorithm 1's update when the
batch holds one pair.
"""

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from metricpipe.tasks.errors import InputError
from metricpipe.tasks.nml.kernels import chi2_embed, linear_loss_and_gradient, nml_loss_and_gradient
from metricpipe.tasks.validate import beyond_float32


class PairSGD:
    """Mini-batch SGD for NML (kind 'nml') or the linear baseline (kind 'linear').

    ``optimizer`` 'sgd' is Algorithm 1's update, L -= lr * gradient (averaged over the batch); 'adam'
    (Kingma and Ba, beta = 0.9, 0.999) scales each entry's step by its running gradient size. Both descend
    the same objective (Eq. 9 or 3); Adam matters for NML on l1-normalised inputs, whose kernel gradient
    2 x^2 / (|x| + |l|)^2 is ~1e-4 for l drawn from (-0.5, 0.5), so plain SGD barely moves L."""

    def __init__(
        self,
        L0: np.ndarray,
        kind: str,
        lr: float,
        bias: float,
        margin: float,
        learn_bias: bool = False,
        optimizer: str = "sgd",
        threads: int = 1,
        scale: float = 1.0,
    ):
        if optimizer not in ("sgd", "adam"):
            raise ValueError(f"optimizer must be 'sgd' or 'adam', got {optimizer!r}")
        # the linear kind with the rows' RMS norm s: L starts at L0 / s and steps by lr / s^2 (Adam's
        # step, blind to the gradient's size: lr / s), i.e. SGD from L0 on the rows x / s; NML's kernel
        # reads l1-normalised rows and keeps s = 1
        scale = float(scale) if kind == "linear" else 1.0
        self.L = np.array(L0, np.float64) / scale
        self.kind, self.lr, self.bias, self.margin, self.learn_bias = (
            kind,
            float(lr),
            float(bias),
            float(margin),
            learn_bias,
        )
        self.step_L = self.lr / (scale if optimizer == "adam" else scale**2)
        self.optimizer = optimizer
        self.pairs_seen = self.steps = 0
        self.work = None  # NML's reused (d, 2 x batch, D) temporary
        self.moments = None
        self.threads = threads if kind == "nml" else 1
        self.pool = None  # the kernel's threads, started by a step and stopped by close()

    def _direction(self, G: np.ndarray, gb: float):
        """The step for L and b from their gradients."""
        if self.optimizer == "sgd":
            return G, gb
        if self.moments is None:
            self.moments = [np.zeros_like(self.L), np.zeros_like(self.L), 0.0, 0.0]
        m1, m2, b1, b2 = self.moments
        t = self.steps
        m1 *= 0.9
        m1 += 0.1 * G
        m2 *= 0.999
        m2 += 0.001 * G * G
        b1, b2 = 0.9 * b1 + 0.1 * gb, 0.999 * b2 + 0.001 * gb * gb
        self.moments[2:] = b1, b2
        c1, c2 = 1 - 0.9**t, 1 - 0.999**t
        return (m1 / c1) / (np.sqrt(m2 / c2) + 1e-12), (b1 / c1) / (np.sqrt(b2 / c2) + 1e-12)

    def step(self, Xi, Xj, y) -> float:
        if len(y) == 0:
            return 0.0
        if self.kind == "nml":
            if self.pool is None and self.threads > 1:
                self.pool = ThreadPoolExecutor(self.threads)
            if self.work is None or self.work.size < 2 * len(y) * self.L.size:
                self.work = np.empty(2 * len(y) * self.L.size, np.float32)
            loss, G, gb = nml_loss_and_gradient(self.L, Xi, Xj, y, self.bias, self.margin, self.work, self.pool)
        else:
            with np.errstate(over="ignore", invalid="ignore"):  # a diverging L is caught below
                loss, G, gb = linear_loss_and_gradient(self.L, Xi, Xj, y, self.bias, self.margin)
        self.steps += 1
        dL, db = self._direction(G, gb)
        with np.errstate(over="ignore", invalid="ignore"):
            self.L -= self.step_L * dL
        if beyond_float32(self.L):
            raise InputError(
                f"{'NML' if self.kind == 'nml' else 'LinearML'} diverged after {self.steps} steps "
                f"(L is not finite in float32); lower 'lr' (now {self.lr})"
            )
        if self.learn_bias:
            self.bias -= self.lr * db
        self.pairs_seen += len(y)
        return loss

    def embed(self, X: np.ndarray) -> np.ndarray:
        if self.kind == "nml":
            return chi2_embed(self.L, X)
        return X @ self.L.T

    def close(self) -> None:
        """Stop the kernel's threads (when ``threads`` > 1)."""
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None
