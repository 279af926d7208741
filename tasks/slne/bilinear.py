"""What SLNE and SLDE share: the input space from the statistics, the bilinear similarity and its
factored codes, validation on the soft vote, the memory of a task (:class:`Bilinear`)."""

from numbers import Integral

import numpy as np
from sklearn.utils.validation import check_is_fitted

from metricpipe.tasks import madds
from metricpipe.tasks.base import (
    COUNT,
    NON_NEGATIVE,
    POSITIVE,
    RANDOM_STATE,
    Interval,
    Learner,
    StrOptions,
)
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.knn import block_topk
from metricpipe.tasks.normalize import preprocess
from metricpipe.tasks.slne.solver import knn_graph

# Bytes an SL-NE task holds per neighbour-graph entry (n x k): the graph, its symmetrised CSR form and
# the solver's per-edge arrays; fit_space's peak (tracemalloc) at n = 20,000, k = 10 and 50 was 66-68
# bytes per entry, plus the graph itself (8) and the reading of its rows.
SLNE_BYTES_PER_EDGE = 80


SOLVER_PARAMS = ("margin", "step", "epochs", "batch", "sampling", "normalize")


SOLVER_CONSTRAINTS = {
    "margin": NON_NEGATIVE,
    "step": NON_NEGATIVE,
    "epochs": [Interval(Integral, 0, None, closed="left")],
    "batch": COUNT,
    "sampling": [StrOptions({"violating", "uniform"})],
    "normalize": POSITIVE + [None],
    "n_neighbors": COUNT,
    "random_state": RANDOM_STATE,
}


class Bilinear(Learner):
    """What SL-NE and SL-DE share: the input space, the bilinear similarity, its factored codes.

    Fitted attributes: ``mean_`` (D,) and ``basis_`` (D, p) float32 (the input space: Z =
    l2normalize((X - mean_) @ basis_)); ``M_`` (p, p) float32, s(x, y) = z_x^T M_ z_y (Eq. 2 / Eq. 8);
    ``factor_`` (p, r) float32, the codes Z @ factor_ whose inner products approximate s (the PSD
    part of M_, :func:`factor`); ``classes_``; ``history_`` (JSON-able list).
    """

    code_metric = "inner"
    feeds = "neighbours"
    reads_statistics = ("mean", "pca_components")
    fitted_attributes = ("mean_", "basis_", "M_", "factor_", "classes_", "history_")

    def _input_dim(self, n_features: int) -> int:
        return min(self.input_dim or n_features, n_features)

    def solver_cost(self, n_rows: int, p: int, k: int, n_val: int) -> float:
        """Multiply-adds of Algorithm 1 (:func:`~metricpipe.tasks.slne.solver.learn_similarity`) on
        ``n_rows`` rows of ``p`` dimensions with ``k`` neighbours each: the symmetrised neighbourhoods
        (a sort of their 2 n k edges), then per epoch a batch of ``batch`` rows at a time: x^T M for the
        batch, its edges' scores and the most violating pair of each row (a sort of its edges), the
        rank-``batch`` update of M and its symmetrisation (passes over p x p); per epoch with
        ``n_val`` validation rows, their soft vote."""
        b, E = int(self.batch), int(self.epochs)
        edges = 1.5 * k * b  # a row's symmetrised neighbourhood: its k and those listing it
        batch = (
            2 * madds.gemm(b, p, p, float32=True)
            + madds.passes(p * p, 4)
            + madds.passes(edges * p, 2)
            + madds.passes(edges, 100)  # Eq. 7: two lexsorts of the edges by (row, score)
            + 150 * madds.CALL
        )
        graph = madds.sort(2 * n_rows * k) + madds.passes(2 * n_rows * k, 10)
        validation = madds.gemm(n_val, p, p, float32=True) + madds.passes(n_val * k * p, 2) if n_val else 0.0
        return graph + E * (-(-n_rows // b) * batch + validation) + validation

    def fit_cost(self, n_rows, n_features, n_classes, k=0, n_val=0) -> madds.FitCost:
        """Algorithm 1 on the training rows in the input space (:meth:`solver_cost`) and the factor
        of M (an eigendecomposition); the epochs are all taken (validation picks one afterwards)."""
        p = self._input_dim(n_features)
        k = k or int(self.n_neighbors)
        n_val = min(n_val, 2000)  # (the pipeline's VALIDATION_ROWS at most)
        return madds.FitCost(madds.FIT + self.solver_cost(n_rows, p, k, n_val) + madds.eigh(p))

    def code_dim(self, n_features: int, n_classes: int) -> int:
        """``dim``, else the input space's width (``input_dim``, default every feature; an upper bound:
        the positive part of M may be narrower)."""
        return min(self.dim, n_features) if isinstance(self.dim, int) else self._input_dim(n_features)

    def view_dim(self, n_features: int, n_classes: int) -> int:
        return max(self.code_dim(n_features, n_classes), self._input_dim(n_features))  # the exact view

    def stored_width(self, n_features: int, n_classes: int) -> int:
        """The codes and the two exact views (query and base, each of the input space's width)."""
        return self.code_dim(n_features, n_classes) + 2 * self._input_dim(n_features)

    def _task_rows(self, n_features: int) -> tuple[int, str, str]:
        """(the width its task holds rows in, what the task is, the parameters that shrink it)."""
        return self._input_dim(n_features), "an SL-NE task", "input_dim"

    def largest_task(self, n_rows: int, n_features: int, n_classes: int, k: int = 0, anchors: int | None = None):
        """Its training rows in its input space (twice while they are gathered block by block) and the
        neighbour graph among them (``anchors`` rows with a list of ``k``): SLNE_BYTES_PER_EDGE bytes per
        entry of the graph and its symmetrised form (an empty list still costs ~32 B an entry)."""
        p, what, fix = self._task_rows(n_features)
        anchors = n_rows if anchors is None else anchors
        need = n_rows * (2 * 4.0 * p + 32.0 * k) + anchors * (SLNE_BYTES_PER_EDGE - 32.0) * k + 4 * 8.0 * p * p
        return (
            f"{what}: its {n_rows:,} training rows in {p} dimensions and their {k}-neighbour graph",
            need,
            f"lower {fix}",
        )

    def portable(self) -> tuple[str, dict, dict]:
        """``sphere``: Z = (X - mean) @ P, rows of Z divided by their l2 norm (zero rows stay zero),
        codes = Z @ F; the exact bilinear similarity is (Z_q @ M) . Z_x."""
        check_is_fitted(self)
        return "sphere", {"mean": self.mean_, "P": self.basis_, "F": self.factor_, "M": self.M_}, {}

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.required = True
        return tags

    # -- the input space from the statistics --------------------------------------------------------------
    def input_space(self, mean, components) -> tuple[np.ndarray, np.ndarray]:
        """The SL-NE input space from the statistics: (mean (D,), P (D, p)) float32, P the first
        ``input_dim`` PCA directions (all when None).

        Parameters
        ----------
        mean : (D,) the training rows' mean. components : (k, D) their PCA directions as rows,
            decreasing variance (the statistics' ``pca_components``).
        """
        comps = np.asarray(components)
        if comps.ndim != 2 or comps.shape[1] != len(mean):
            raise InputError(
                f"{type(self).__name__}: components must be (k, D) PCA directions as rows of the "
                f"D = {len(mean)} features of the mean. Got shape {comps.shape} instead."
            )
        if self.input_dim is not None and self.input_dim > len(comps):
            raise InputError(
                f"The 'input_dim' parameter of {self.method} must be <= {len(comps)}, the PCA "
                f"directions available (X has {comps.shape[1]} feature(s)). Got {self.input_dim} "
                f"instead."
            )
        p = len(comps) if self.input_dim is None else self.input_dim
        return np.asarray(mean, np.float32), np.ascontiguousarray(comps[:p].T, dtype=np.float32)

    def input_rows(self, X, mean, components) -> np.ndarray:
        """Rows X (n, D) in the input space given the statistics (see :meth:`input_space`): (n, p)
        float32, what :meth:`SLNE.fit_space` and :meth:`SLDE.assemble` take as Z."""
        return self.input_map(mean, components)(X)

    def input_map(self, mean, components):
        """:meth:`input_rows` as a function of X alone, the space built once (for many row-blocks)."""
        mean32, P = self.input_space(mean, components)
        return lambda X: preprocess(X, mean32, P)

    # -- data checks -----------------------------------------------------------------------------------
    def _fit_data(self, X, y):
        """Validated (X, y codes) for ``fit``; SL-NE needs targets and impostors, so two classes."""
        if y is None:
            raise ValueError(f"{type(self).__name__} requires y to be passed, but the target y is None.")
        X, y = self._check_Xy(X, y, min_classes=1)
        self._check_classes(len(self.classes_))
        return X, y

    def _check_classes(self, n_classes: int) -> None:
        if n_classes < 2:
            raise InputError(
                f"{type(self).__name__} needs at least 2 classes (targets and impostors); got "
                f"{n_classes} class. Pass labels of several classes."
            )

    def _space_data(self, Z, y, neighbors, mean, components):
        """Checks of the pipeline entry points' arrays; sets n_features_in_ and classes_."""
        Z = np.ascontiguousarray(Z, np.float32)
        y = np.asarray(y)
        _, P = self.input_space(mean, components)
        if Z.ndim != 2 or Z.shape[1] != P.shape[1] or len(y) != len(Z):
            raise InputError(
                f"{type(self).__name__}: Z must be the training rows in the input space, shape "
                f"(n, {P.shape[1]}) with one label each. Got Z {Z.shape} and {len(y)} labels; "
                f"build Z with input_rows(X, mean, components)."
            )
        graph = check_graph(neighbors, len(Z))
        self.classes_ = np.unique(y)
        self._check_classes(len(self.classes_))
        self.n_features_in_ = int(len(mean))
        self.__dict__.pop("feature_names_in_", None)
        return Z, y, graph

    def _graph(self, X, neighbors):
        return knn_graph(X, self.n_neighbors) if neighbors is None else neighbors

    def _memory_validation(self, X, X_val, y_val, to_space):
        """(Z_val, y_val, neighbourhoods among X) for ``fit``'s X_val, y_val, or None."""
        if X_val is None:
            return None
        X_val, y_val = self._check_val(X_val, y_val)
        nbr = block_topk(np.asarray(X_val, np.float32), np.asarray(X, np.float32), min(self.n_neighbors, len(X)))[1]
        return to_space(X_val), y_val, nbr

    def validates(self) -> bool:
        return True  # when validation rows are given (the pipeline's val split): the best epoch is kept

    def refit_params(self) -> dict:
        """``epochs`` = the kept epoch (0: the start): the step of Algorithm 1 decays with the samples
        seen, not with ``epochs``, so fewer epochs are the same schedule cut short."""
        best = self.best_epoch()
        return {} if best is None else {"epochs": int(best)}

    def best_epoch(self) -> int | None:
        """The epoch whose M was kept (0: the start), when training was validated."""
        hist = self.history_ if self.history_ and "member" not in self.history_[0] else []
        errs = [(h["val_error"], h["epoch"]) for h in hist if "val_error" in h]
        return min(errs)[1] if errs else None

    # -- fitted model ---------------------------------------------------------------------------------
    @property
    def _n_features_out(self) -> int:
        return int(self.factor_.shape[1])

    def _transform(self, X):
        return preprocess(X, self.mean_, self.basis_) @ self.factor_

    def exact_views(self, X) -> tuple[np.ndarray, np.ndarray]:
        """(query view Z M_, base view Z), each (n, p) float32: the inner product of a query's query
        view and a database row's base view is the exact similarity s_M (Eq. 2), which the codes only
        approximate when M_ is not PSD or ``dim`` cuts its rank.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features_in_)
        """
        check_is_fitted(self)
        X = self._check_X(X, reset=False)
        Z = preprocess(X, self.mean_, self.basis_)
        return Z @ self.M_, Z

    def cost(self) -> dict:
        """The encoder's projection (D, p) and factor (p, r), dense: non-zeros, bytes, multiply-adds."""
        check_is_fitted(self)
        nnz = int(self.basis_.size + self.factor_.size)
        stored = int(self.basis_.nbytes + self.factor_.nbytes + self.mean_.nbytes)
        return {"nnz": nnz, "storage_bytes": stored, "flops_per_image": 2 * nnz}

    def _set_model(self, mean, P, M, L, history) -> None:
        self.mean_ = np.ascontiguousarray(mean, np.float32)
        self.basis_ = np.ascontiguousarray(P, np.float32)
        self.M_ = np.ascontiguousarray(M, np.float32)
        self.factor_ = np.ascontiguousarray(L, np.float32)
        self.history_ = history


def check_graph(neighbors, n: int) -> np.ndarray:
    g = np.asarray(neighbors)
    if g.ndim != 2 or g.shape[0] != n or not np.issubdtype(g.dtype, np.integer):
        raise InputError(
            f"neighbors must be an integer array of shape ({n}, k), one row per training sample. "
            f"Got {g.dtype} {g.shape} instead; pass local row indices, -1 for none."
        )
    if g.size and (g.min() < -1 or g.max() >= n):
        raise InputError(
            f"neighbors must hold row indices in [0, {n}) or -1 for none. Got values in [{g.min()}, {g.max()}] instead."
        )
    if n > 1 and not (g >= 0).any():
        raise InputError(
            "neighbors lists no neighbour at all (every entry is -1): SL-NE learns from each "
            "sample's neighbours; pass the graph's row indices, or neighbors=None for the exact kNN "
            "graph of X."
        )
    return g.astype(np.int64, copy=False)
