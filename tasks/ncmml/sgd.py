"""MetricSGD: minibatch SGD on W with early stopping (Mensink et al., Section 5.1), and its back-off.

The sign convention of the ascent: W <- W + lr * grad of the log-likelihood (NCM/NCMC); W <- W - lr *
grad of the hinge loss (k-NN).
"""

import numpy as np

from metricpipe.tasks.errors import InputError
from metricpipe.tasks.ncmml.objectives import (
    dot_log_likelihood_and_gradient,
    log_likelihood_and_gradient,
    mixture_class_scores,
    ncm_scores,
)
from metricpipe.tasks.ncmml.triplets import knnml_step
from metricpipe.tasks.validate import beyond_float32


class Diverged(InputError):
    """SGD's W left float32's range: the rate is too large for these rows."""


# lr left unset: each divergence goes on from the best W validated so far at a tenth of the rate, at most
# BACK_OFFS times (a rate the user or a selection sets is theirs: its divergence is an error)
BACK_OFF, BACK_OFFS = 10, 3


class MetricSGD:
    """Minibatch SGD on W (d, D) with early stopping (Section 5.1): every ``validate_every`` steps
    the caller reports a validation error; the W with the lowest error is kept.

    objective: 'ncm' (Eqs. 9-10, with ``centroids``/``owner``: NCMC, Eqs. 21-25), 'dot' (Eq. 27,
    learned biases) or 'knn' (Eq. 35 with Algorithm 1's gradient).

    ``scale`` s (the rows' RMS norm, :func:`~metricpipe.tasks.moments.row_scale`): W starts at W0 / s
    and steps by lr / s^2 (biases by lr), which is SGD from W0 at rate lr on the rows x / s, with W
    kept in the rows' own units: ``lr`` means the same on raw and on l2-normalised rows."""

    def __init__(
        self,
        W0: np.ndarray,
        objective: str,
        lr: float,
        centroids: np.ndarray | None = None,
        owner: np.ndarray | None = None,
        n_classes: int | None = None,
        targets: str = "dynamic",
        k: int = 5,
        scale: float = 1.0,
        margin: float = 1.0,
    ):
        self.margin = float(margin)
        if objective not in ("ncm", "dot", "knn"):
            raise InputError(f"metric learning objective must be ncm, dot or knn. Got {objective!r} instead.")
        self.W = np.array(W0, np.float64) / scale
        self.objective, self.lr, self.targets, self.k = objective, float(lr), targets, int(k)
        self.step_W = self.lr / scale**2
        self.centroids = None if centroids is None else np.asarray(centroids, np.float64)
        self.owner = None if owner is None else np.asarray(owner, np.int64)
        self.n_classes = n_classes
        self.bias = None
        # dot form: validate with the implied biases -||W mu||^2 / 2 (what a model trained on a class
        # subset classifies with) instead of the learned ones
        self.implied_bias = False
        self.patience, self.stale = 5, 0  # validations without a lower error before record() says stop
        if objective == "dot":  # one mean and one bias per trained class, in the order of ``owner``
            self.bias = np.zeros(len(self.owner))
            self._position = np.full(n_classes, -1)
            self._position[self.owner] = np.arange(len(self.owner))
        self.steps = 0
        self.best = (np.inf, self.W.copy(), None if self.bias is None else self.bias.copy(), 0)
        self.history = []

    def step(self, X: np.ndarray, y: np.ndarray, is_pos: np.ndarray | None = None, fixed=None) -> float:
        """One update from the batch; returns the batch's log-likelihood (ncm/dot) or the number of
        violating triplets (knn)."""
        X = np.asarray(X, np.float64)
        if self.objective == "ncm":
            value, G = log_likelihood_and_gradient(self.W, X, y, self.centroids, self.owner, self.n_classes)
            self.W += self.step_W * G
        elif self.objective == "dot":
            value, G, gb = dot_log_likelihood_and_gradient(self.W, self.bias, X, self._position[y], self.centroids)
            self.W += self.step_W * G
            self.bias += self.lr * gb
        else:
            G, value = knnml_step(self.W, X, is_pos, self.k, self.targets, fixed, self.margin)
            self.W -= self.step_W * G
        if beyond_float32(self.W):
            raise Diverged(
                f"metric learning diverged after {self.steps + 1} steps (W is not finite in float32); "
                f"lower 'lr' (now {self.lr})"
            )
        self.steps += 1
        return float(value)

    def back_off(self) -> None:
        """After a divergence: go on from the best W validated so far at a BACK_OFF-th of the rate."""
        _, W, bias, _ = self.best
        self.W = W.copy()
        self.bias = None if bias is None else bias.copy()
        self.lr /= BACK_OFF
        self.step_W /= BACK_OFF
        self.stale = 0
        self.history.append({"iter": self.steps, "lr": self.lr})

    def classify(self, X: np.ndarray) -> np.ndarray:
        """Class (as given in ``owner``) of each row under the current W: nearest class mean (Eq. 5),
        the mixture of Eq. 22, or the dot form of Eq. 27."""
        Y, Mp = np.asarray(X, np.float64) @ self.W.T, self.centroids @ self.W.T
        if self.bias is not None:  # scored as the model will classify: learned biases, or the implied ones
            bias = -0.5 * (Mp * Mp).sum(1) if self.implied_bias else self.bias
            return self.owner[np.argmax(ncm_scores(Y, Mp, bias), axis=1)]
        return np.argmax(mixture_class_scores(Y, Mp, self.owner, self.n_classes), axis=1)

    def record(self, val_error: float, train_value: float | None) -> bool:
        """Report the validation error of the current W (early stopping keeps the best); True when
        PATIENCE validations in a row have not improved on the best (time to stop)."""
        self.history.append(
            {
                "iter": self.steps,
                "val_error": float(val_error),
                "batch": None if train_value is None else float(train_value),
            }
        )
        if val_error < self.best[0]:
            self.best = (val_error, self.W.copy(), None if self.bias is None else self.bias.copy(), self.steps)
            self.stale = 0
        else:
            self.stale += 1
        return self.stale >= self.patience
