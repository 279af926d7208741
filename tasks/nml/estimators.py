"""The estimators NML (the chi2 kernel embedding) and LinearML (the linear baseline) of Sharma & Schiele."""

import numpy as np
from sklearn.utils.validation import check_is_fitted

from metricpipe.tasks import madds, moments
from metricpipe.tasks.base import COUNT, DIM_OR_NONE
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.nml.kernels import TINY, check_nonnegative, chi2_embed
from metricpipe.tasks.nml.learner import PAIR_CONSTRAINTS, PairLearner
from metricpipe.tasks.normalize import normalize_rows


class NML(PairLearner):
    """Non-linear metric learning (Sharma & Schiele): codes [k(l_1, x), ..., k(l_d, x)] (Eq. 7) of
    the l1-normalised row x with the chi2 kernel of Eq. 11, L learned by SGD on the pair hinge of
    Eq. 9 (Algorithm 1, in mini-batches). Input must be non-negative (e.g. CNN activations after
    ReLU); rows are l1-normalised inside, in ``fit`` and ``transform``.

    Parameters
    ----------
    dim : int, default=64
        Output dimension d (rows of L).
    pairs : int >= 2, default=500000
        Pairs drawn from the labels per pass over the training rows (see below; ignored for user pairs).
    iters : int, default=1000000
        Pairs seen by SGD.
    batch : int, default=64
        Pairs per SGD step.
    learn_bias : bool, default=False
        Learn the threshold b too (Eq. 10's derivative in b).
    bias : float, default=0.1
        The threshold b of Eq. 9 (its start when ``learn_bias``).
    margin : float >= 0, default=0.02
        The margin m of Eq. 9.
    optimizer : {"adam", "sgd"}, default="adam"
        "sgd" is Algorithm 1's update (needs lr ~300 on l1-normalised 784-d input); Adam scales each
        entry's step by its running gradient size.
    threads : int, default=1
        Threads splitting the kernel's passes over L's rows (the model is the same bit for bit).
    lr : float >= 0 or None, default=None
        None: 0.001 with Adam, 10 with Algorithm 1's SGD (the first value of each optimizer's
        selection grid).
    validation : int >= 0, default=2000
        Validation rows for early stopping (0: off; see below).
    random_state : int, RandomState or None, default=None (seed 0)
        Seeds the layout of the rows, the pools' order, the pairs and the start of L.

    Attributes
    ----------
    L_ : ndarray of shape (dim, n_features), float32
        The landmarks l_t of Eq. 7: code t of a row x is k(l_t, x), x l1-normalised.
    bias_ : float
        The threshold b (learned when ``learn_bias``).
    classes_ : ndarray of shape (n_classes,)
        The class labels (``fit(X, y)`` only).
    history_ : list of dict
        ``{"iter": pairs seen, "hinge": mean hinge since the previous entry}``, about 50 entries,
        and ``{"iter", "val_map"}`` at each validation.
    best_iter_ : int or None
        Pairs seen by the kept L (None without validation).
    val_map_ : float or None
        Its validation mAP (None without validation).
    pairs_seen_, n_steps_ : int
        Pairs SGD saw, and its steps.
    n_pairs_ : int
        Pairs drawn from the labels or given.
    pair_source_ : {'labels', 'user'}
    n_features_in_ : int

    Notes
    -----
    Entry points: ``fit(X, y)`` (pairs from labels), ``partial_fit(X, y, classes, init)`` (one pool of
    a stream at a time), ``fit_pairs(pairs, y, X=None)`` (user pairs, metric-learn's convention) and,
    for the pipeline, ``fit_rows`` and ``fit_pair_blocks``.
    """

    requires_nonnegative = True  # the chi2 kernel; the pipeline checks the staged features for it
    search_space = {"lr": [0.001, 0.0001, 0.01]}
    selection_metric = "map"
    # Algorithm 1's plain SGD: its step grows with D (the chi2 gradient at l1-normalised rows is small);
    # validation mAP was highest at 1 on digits (64-d), 10 on Fashion 14 x 14 (196-d), 100 on HOG (324-d)
    search_space_when = {("optimizer", "sgd"): {"lr": [10.0, 1.0, 100.0, 1000.0]}}

    method = "nml"

    def _step_cost(self, b, D, d):
        """The chi2 embedding of the batch's 2b rows with its gradient: memory-bound passes over a
        (d, 2b, D) float32 array (|l| + |x|, the division, the product, the square, the reduction),
        Adam's update of L (d, D), and the step's calls."""
        update = madds.passes(d * D, 10 if self.optimizer == "adam" else 3)
        return madds.passes(d * 2 * b * D, 1.6) + update + 100 * madds.CALL

    def _embed_cost(self, n, D, d):
        return madds.passes(d * n * D, 0.8)

    def transform_cost(self, n_rows, n_features, n_classes):
        return self._embed_cost(n_rows, n_features, int(self.dim)) + madds.passes(n_rows * n_features, 4)

    def code_dim(self, n_features: int, n_classes: int) -> int:
        return int(self.dim)  # L's rows: any number, whatever the features

    def portable(self) -> tuple[str, dict, dict]:
        """``chi2``: rows l1-normalised, codes[:, t] = sum_c 2 L[t, c] x_c / (|L[t, c]| + tiny + |x_c|)
        (Eqs. 7 and 11)."""
        check_is_fitted(self)
        return "chi2", {"L": self.L_}, {"tiny": float(TINY)}

    _kind = "nml"
    _parameter_constraints = {**PAIR_CONSTRAINTS, "threads": COUNT}

    def __init__(
        self,
        dim=64,
        pairs=500000,
        iters=1000000,
        batch=64,
        learn_bias=False,
        bias=0.1,
        margin=0.02,
        optimizer="adam",
        threads=1,
        lr=None,
        validation=2000,
        random_state=None,
    ):
        self.dim = dim
        self.pairs = pairs
        self.iters = iters
        self.batch = batch
        self.learn_bias = learn_bias
        self.bias = bias
        self.margin = margin
        self.optimizer = optimizer
        self.threads = threads
        self.lr = lr
        self.validation = validation
        self.random_state = random_state

    def _default_init(self, n_features: int, seed: int) -> np.ndarray:
        return np.random.default_rng([seed, 19]).uniform(-0.5, 0.5, (self.dim, n_features))  # Algorithm 1

    def _prepare(self, X, where: str) -> np.ndarray:
        X = np.asarray(X, np.float32)
        check_nonnegative(X, where)
        return normalize_rows(X, "l1")

    def _transform(self, X):
        X = np.asarray(X, np.float32)
        check_nonnegative(X, f"{type(self).__name__}.transform")
        out = np.empty((len(X), len(self.L_)), np.float32)
        for a in range(0, len(X), 256):  # bounded (d, rows, D) temporaries
            out[a : a + 256] = chi2_embed(self.L_, normalize_rows(X[a : a + 256], "l1"))  # Eq. 7
        return out

    def cost(self) -> dict:
        L = self.L_
        return {"nnz": int(L.size), "storage_bytes": int(L.nbytes), "flops_per_image": 4 * int(L.size)}

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.positive_only = True
        return tags


class LinearML(PairLearner):
    """Linear metric learning, the baseline of Sharma & Schiele (Eq. 3 with a margin m): codes L x,
    L learned by SGD on the pair hinge max(0, m - y (b - ||L x_i - L x_j||^2)), from the PCA basis.

    Parameters
    ----------
    dim : int or None, default=None
        Output dimension (rows of L); at most the number of PCA components (n_features in memory).
        None: 64, or every component when the data has fewer features.
    pairs, iters, batch, learn_bias, validation, random_state : as in :class:`NML`
    bias : float, default=1.0
        The threshold b of the hinge (its start when ``learn_bias``): a squared distance between
        rows of unit RMS norm under L.
    margin : float >= 0, default=0.2
        The margin m of the hinge.
    optimizer : {"sgd", "adam"}, default="sgd"
        Plain SGD, or Adam (each entry's step scaled by its running gradient size).
    lr : float >= 0 or None, default=None
        The step for rows of unit RMS norm, as ``bias`` and ``margin`` are distances between such
        rows: L starts at the PCA components over the training rows' RMS norm s and steps by lr / s^2
        (Adam: lr / s), the same run as on the rows x / s (nothing changes on l2-normalised rows).
        None: 0.1 with SGD, 0.01 with Adam (the first value of each optimizer's selection grid).

    Attributes
    ----------
    L_ : ndarray of shape (dim, n_features), float32
        Codes are ``X @ L_.T``, compared by Euclidean distance.
    bias_ : float
        The threshold b (learned when ``learn_bias``).
    classes_ : ndarray of shape (n_classes,)
        The class labels (``fit(X, y)`` only).
    history_ : list of dict
        ``{"iter": pairs seen, "hinge": mean hinge since the previous entry}``, about 50 entries,
        and ``{"iter", "val_map"}`` at each validation.
    best_iter_ : int or None
        Pairs seen by the kept L (None without validation).
    val_map_ : float or None
        Its validation mAP (None without validation).
    pairs_seen_, n_steps_ : int
        Pairs SGD saw, and its steps.
    n_pairs_ : int
        Pairs drawn from the labels or given.
    pair_source_ : {'labels', 'user'}
    n_features_in_ : int

    Notes
    -----
    L starts from the ``dim`` leading PCA components: in memory those of X
    (:func:`metricpipe.tasks.moments.statistics`), in the pipeline the statistics stage's (``init``).
    Entry points: ``fit(X, y)`` (pairs from labels), ``partial_fit(X, y, classes, init)`` (one pool of
    a stream at a time), ``fit_pairs(pairs, y, X=None)`` (user pairs, metric-learn's convention) and,
    for the pipeline, ``fit_rows`` and ``fit_pair_blocks``.
    """

    # lr for rows of unit RMS norm: the validation mAP was highest at 1 on digits, Fashion 14 x 14,
    # HOG and Fashion-MNIST, and lowest at 0.0001 and 0.001 on the first three (benchmarks/README.md)
    search_space = {"lr": [0.1, 0.01, 1.0, 10.0]}
    selection_metric = "map"
    # Adam's step is per entry (lr / s): validation mAP was highest at 0.01 on digits, Fashion 14 x 14, HOG
    search_space_when = {("optimizer", "adam"): {"lr": [0.01, 0.001, 0.1]}}

    method = "linear-ml"
    reads_statistics = ("pca_components", "mean_sq_norm")  # L's start, and the rows' scale lr is read by

    def start(self, statistics: dict) -> tuple:
        """The leading PCA components (``dim`` rows; fewer when the statistics kept fewer, which the fit
        refuses) and :func:`~metricpipe.tasks.moments.row_scale`."""
        comps = statistics["pca_components"]
        return comps[: self.resolved_dim(len(comps))], moments.row_scale(statistics)

    def portable(self) -> tuple[str, dict, dict]:
        """``affine``: codes = X @ L.T."""
        check_is_fitted(self)
        return "affine", {"W": self.L_.T}, {}

    _kind = "linear"

    def _step_cost(self, b, D, d):
        """The batch's differences projected, the gradient's GEMM and the update of L (d, D)."""
        return madds.passes(b * D, 4) + 2 * madds.gemm(b, d, D) + madds.passes(d * D, 3) + 60 * madds.CALL

    def _embed_cost(self, n, D, d):
        return madds.gemm(n, d, D)

    _parameter_constraints = {**PAIR_CONSTRAINTS, "dim": DIM_OR_NONE}
    dim_within_features = True
    DEFAULT_DIM = 64

    def __init__(
        self,
        dim=None,
        pairs=500000,
        iters=1000000,
        batch=64,
        learn_bias=False,
        bias=1.0,
        margin=0.2,
        optimizer="sgd",
        lr=None,
        validation=2000,
        random_state=None,
    ):
        self.dim = dim
        self.pairs = pairs
        self.iters = iters
        self.batch = batch
        self.learn_bias = learn_bias
        self.bias = bias
        self.margin = margin
        self.optimizer = optimizer
        self.lr = lr
        self.validation = validation
        self.random_state = random_state

    def _default_init(self, n_features: int, seed: int) -> np.ndarray:
        raise InputError(
            "LinearML starts from the PCA basis: pass init = the PCA components (k, n_features), "
            "e.g. the statistics stage's pca_components"
        )

    def _transform(self, X):
        return np.asarray(X, np.float32) @ self.L_.T

    def cost(self) -> dict:
        L = self.L_
        return {"nnz": int(L.size), "storage_bytes": int(L.nbytes), "flops_per_image": 2 * int(L.size)}


_doc = PairLearner.__doc__
_PAIRS_NOTES = _doc[_doc.index("    Pairs from labels") : _doc.index("    Fitted attributes")]
NML.__doc__ += "\n" + _PAIRS_NOTES
LinearML.__doc__ += "\n" + _PAIRS_NOTES
