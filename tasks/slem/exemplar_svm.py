"""The exemplar SVM baseline (Eq. 1 with the hinge loss), solved for each image by SGD, many images at once."""

import numpy as np

from metricpipe.tasks import madds, moments
from metricpipe.tasks.base import COUNT, NON_NEGATIVE, RANDOM_STATE, seed_of
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.slem.linear import unit_rows
from metricpipe.tasks.slem.pool import PoolLearner


def esvm(
    X0: np.ndarray,
    Xneg: np.ndarray,
    lam: float,
    theta: float,
    epochs: int,
    batch: int,
    rng: np.random.Generator,
    lr0: float = 1.0,
    scale: float = 1.0,
) -> np.ndarray:
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
        pos = (W * X0).sum(1) + nu  # omega^T x_0 + nu
        neg = W @ N.T + nu[:, None]  # (m, batch)
        gp = np.where(pos < 1.0, -theta, 0.0)  # d/d(score) of theta * max(0, 1 - score)
        gn = np.where(neg > -1.0, 1.0 / batch, 0.0)  # mean of max(0, 1 + score) over the batch
        gW = gp[:, None] * X0 + gn @ N + lam * W
        W -= lr * gW
        nu -= lr * (gp + gn.sum(1))
    return unit_rows(W)


class ESVM(PoolLearner):
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
        raise InputError(
            "ESVM codes have no closed form (each image's exemplar SVM is trained by SGD against "
            "the pool); use 'metricpipe encode' to encode new images with it"
        )

    fitted_attributes = ("pool_", "seed_", "scale_")
    code_metric = "euclidean"
    _parameter_constraints = {
        "lam": NON_NEGATIVE,
        "theta": NON_NEGATIVE,
        "epochs": COUNT,
        "batch": COUNT,
        "negatives": [dict, None],
        "random_state": RANDOM_STATE,
    }

    def __init__(self, lam=0.1, theta=1.0, epochs=2, batch=64, negatives=None, random_state=None):
        self.lam = lam
        self.theta = theta
        self.epochs = epochs
        self.batch = batch
        self.negatives = negatives
        self.random_state = random_state

    def fit_cost(self, n_rows, n_features, n_classes, k=0, n_val=0) -> madds.FitCost:
        """The fit keeps the pool (a copy, its scale): the SVMs are trained per image as it is encoded."""
        return madds.FitCost(madds.FIT + madds.passes(n_rows * n_features, 6))

    def transform_cost(self, n_rows, n_features, n_classes):
        """An SVM per row: ``epochs`` x pool / ``batch`` SGD steps, each two (rows, batch, D) GEMMs."""
        n = self._pool_size()
        steps = max(1, int(self.epochs) * n // int(self.batch))
        b, D = int(self.batch), n_features
        return steps * (2 * madds.gemm(n_rows, b, D) + madds.passes(n_rows * D, 6) + madds.passes(b * D, 2))

    def _fit_pool(self, Xneg):
        if len(Xneg) < 2:
            raise InputError(f"ESVM needs a pool of at least 2 negative images; got {len(Xneg)} sample(s)")
        self.pool_ = np.array(Xneg, np.float64)
        self.seed_ = seed_of(self.random_state)
        self.scale_ = moments.row_scale(
            {"mean_sq_norm": np.einsum("ij,ij->", self.pool_, self.pool_) / len(self.pool_)}
        )
        return self

    @classmethod
    def from_state(cls, params: dict, state: dict) -> "ESVM":
        # models stored before 0.3.7 have no scale_: their SVMs were trained on the rows as they are
        return super().from_state(params, {"scale_": 1.0, **state})

    def _transform(self, X):
        rng = np.random.default_rng([self.seed_, 23])
        return esvm(
            X, self.pool_, float(self.lam), float(self.theta), int(self.epochs), int(self.batch), rng, scale=self.scale_
        )

    @property
    def _n_features_out(self):
        return self.pool_.shape[1]

    def cost(self) -> dict:
        """Stored values (the pool), bytes and multiply-adds per image (the SGD steps)."""
        steps = max(1, int(self.epochs) * len(self.pool_) // int(self.batch))
        return {
            "nnz": int(self.pool_.size),
            "storage_bytes": int(self.pool_.nbytes),
            "flops_per_image": 4 * steps * (int(self.batch) + 1) * self.pool_.shape[1],
        }
