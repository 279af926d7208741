"""The estimators SLNE and SLDE (Wang et al.): the input space from the statistics, the bilinear
similarity, its factored codes; SL-DE's members are fitted by :func:`~metricpipe.tasks.slne.ensemble.fit_member`."""

from numbers import Integral

import numpy as np
from sklearn.utils.validation import check_is_fitted

from metricpipe.tasks.base import (
    COUNT,
    DIM_OR_NONE,
    NON_NEGATIVE,
    POSITIVE,
    RANDOM_STATE,
    Interval,
    Learner,
    StrOptions,
    seed_of,
)
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.knn import block_topk
from metricpipe.tasks.moments import pca_statistics
from metricpipe.tasks.normalize import preprocess
from metricpipe.tasks.slne.ensemble import (
    check_subspaces,
    ensemble_matrix,
    factor,
    fit_member,
    member_seed,
    project,
    refine,
    subspace,
    subspaces,
)
from metricpipe.tasks.slne.solver import knn_graph, learn_similarity, softvote_validator

# Bytes an SL-NE task holds per neighbour-graph entry (n x k): the graph, its symmetrised CSR form and
# the solver's per-edge arrays; fit_space's peak (tracemalloc) at n = 20,000, k = 10 and 50 was 66-68
# bytes per entry, plus the graph itself (8) and the reading of its rows.
SLNE_BYTES_PER_EDGE = 80

SOLVER_PARAMS = ("margin", "step", "epochs", "batch", "sampling", "normalize")
# The fewest PCA directions an SL-DE member gets from the rule for members (SLDE.n_members).
MIN_BLOCK = 16

_SOLVER_CONSTRAINTS = {
    "margin": NON_NEGATIVE,
    "step": NON_NEGATIVE,
    "epochs": [Interval(Integral, 0, None, closed="left")],
    "batch": COUNT,
    "sampling": [StrOptions({"violating", "uniform"})],
    "normalize": POSITIVE + [None],
    "n_neighbors": COUNT,
    "random_state": RANDOM_STATE,
}


class _Bilinear(Learner):
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

    def code_dim(self, n_features: int, n_classes: int) -> int:
        """``dim``, else the input space's width (``input_dim``, default every feature; an upper bound:
        the positive part of M may be narrower)."""
        return min(self.dim, n_features) if isinstance(self.dim, int) else self._input_dim(n_features)

    def view_dim(self, n_features: int, n_classes: int) -> int:
        return max(self.code_dim(n_features, n_classes), self._input_dim(n_features))  # the exact view

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
        graph = _check_graph(neighbors, len(Z))
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


def _check_graph(neighbors, n: int) -> np.ndarray:
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


class SLNE(_Bilinear):
    """Similarity learning with neighbourhood embedding (Wang et al., Algorithm 1).

    Learns a bilinear similarity s(x, y) = z_x^T M z_y (Eq. 2) in a centred, l2-normalised PCA space
    z = l2normalize((x - mean) P), and codes z L with L L^T the PSD part of M, so that the inner
    product of two codes approximates s.

    Parameters
    ----------
    dim : int or None, default None
        Output code dimension: eigen-directions of M kept when factoring it into codes (the largest
        positive ones; None = all positive, so the width depends on the data; an int is always the
        codes' width, zero columns standing for missing positive eigenvalues).
    input_dim : int or None, default None
        PCA directions of the input space (p); None = all.
    margin : float, default 0.02
        b of Eq. 6.
    step : float, default 0.2
        rho0 of Algorithm 1.
    epochs : int, default 3
        Passes over the training rows.
    batch : int, default 64
        Samples whose updates are computed with the same M (1 = Algorithm 1 exactly).
    sampling : {'violating', 'uniform'}, default 'violating'
        The most violating target/impostor pair (Eq. 7) or a uniformly drawn one.
    normalize : float or None, default None
        After each batch rescale M to this Frobenius norm (None: no normalisation).
    n_neighbors : int, default 50
        k of the exact kNN graph ``fit`` computes when none is given (clipped to n - 1).
    random_state : int, RandomState or None, default None
        Seed of the SGD's permutations (None: 0).

    Attributes
    ----------
    mean_ : (D,) float32; basis_ : (D, p) float32; M_ : (p, p) float32; factor_ : (p, r) float32;
    history_ : list of {"epoch", "violations", "hinge"}; classes_; n_features_in_.
    """

    # step sizes a decade apart and between: a step that suits pixels overshoots on other data
    search_space = {"step": [0.2, 0.05, 0.02, 0.005]}
    selection_metric = "softvote10"

    method = "slne"

    def n_members(self, p: int) -> int:
        """0: one task fits the whole model (SL-DE trains members as tasks of their own)."""
        return 0

    def check_data_shape(self, n_features: int, n_classes: int) -> None:
        super().check_data_shape(n_features, n_classes)
        p = self.input_dim or n_features
        if self.dim is not None and self.dim > p:
            raise InputError(
                f"The 'dim' parameter of SLNE must be <= {p}, the input space's dimension (input_dim, "
                f"default the data's {n_features} features). Got {self.dim} instead."
            )

    _parameter_constraints = {"dim": DIM_OR_NONE, "input_dim": DIM_OR_NONE, **_SOLVER_CONSTRAINTS}

    def __init__(
        self,
        dim=None,
        input_dim=None,
        margin=0.02,
        step=0.2,
        epochs=3,
        batch=64,
        sampling="violating",
        normalize=None,
        n_neighbors=50,
        random_state=None,
    ):
        self.dim = dim
        self.input_dim = input_dim
        self.margin = margin
        self.step = step
        self.epochs = epochs
        self.batch = batch
        self.sampling = sampling
        self.normalize = normalize
        self.n_neighbors = n_neighbors
        self.random_state = random_state

    def fit(self, X, y, neighbors=None, X_val=None, y_val=None):
        """Learn M from rows X with labels y.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
        neighbors : int array of shape (n_samples, k) or None
            Each row's neighbours as row indices of X (-1 = none); None: the exact kNN graph of X
            (``n_neighbors``, self excluded).
        X_val, y_val : optional validation rows and labels: M is then the epoch's (or the start's)
            with the lowest soft-vote error on them (early stopping; ``history_`` has "val_error").
        """
        self._validate_params()
        X, y = self._fit_data(X, y)
        mean, components = pca_statistics(X)
        Z = self.input_rows(X, mean, components)
        val = self._memory_validation(X, X_val, y_val, lambda A: self.input_rows(A, mean, components))
        return self._fit_space(Z, y, _check_graph(self._graph(X, neighbors), len(X)), mean, components, val)

    def fit_space(self, Z, y, neighbors, mean, components, Z_val=None, y_val=None, val_neighbors=None):
        """The pipeline's entry point: learn M from training rows already in the input space.

        Parameters
        ----------
        Z : (n, p) float32, the training rows as :meth:`input_rows` (X, mean, components) gives them.
        y : (n,) labels. neighbors : (n, k) int, local row indices into Z (-1 = none).
        mean : (D,) the training rows' mean; components : (k, D) their PCA directions (rows), as
            the statistics stage stores them (``mean``, ``pca_components``).
        Z_val, y_val, val_neighbors : optional validation rows in the input space, their labels and
            their neighbourhoods among the training rows (local indices into Z, -1 none): early
            stopping on the soft-vote error, as in :meth:`fit`.
        """
        self._validate_params()
        Z, y, graph = self._space_data(Z, y, neighbors, mean, components)
        val = (
            None
            if Z_val is None
            else (np.asarray(Z_val, np.float32), np.asarray(y_val), np.asarray(val_neighbors, np.int64))
        )
        return self._fit_space(Z, y, graph, mean, components, val)

    def solver_params(self) -> dict:
        """The keyword arguments of :func:`learn_similarity` this estimator uses (without the seed)."""
        return {k: getattr(self, k) for k in SOLVER_PARAMS}

    def _fit_space(self, Z, y, graph, mean, components, val=None):
        mean32, P = self.input_space(mean, components)
        if self.dim is not None and self.dim > P.shape[1]:  # (fewer PCA directions than features: randomized PCA)
            raise InputError(
                f"The 'dim' parameter of SLNE must be <= {P.shape[1]}, the input space's dimension "
                f"(the PCA directions the statistics kept). Got {self.dim} instead."
            )
        validate = None if val is None else softvote_validator(*val, Z, y)
        M, history = learn_similarity(
            Z, y, graph, **self.solver_params(), seed=seed_of(self.random_state), validate=validate
        )
        self._set_model(mean32, P, M, factor(M, self.dim), history)
        return self


class SLDE(_Bilinear):
    """Similarity learning with diverse ensembles (Wang et al., Section 3): one SL-NE per subspace,
    trained independently, similarities summed (Eq. 8), optionally refined jointly (Section 3.1).

    Parameters
    ----------
    members : int or None, default None
        N_E, the number of subspaces; None: 8, or for pca-blocks as many blocks of at least 16 PCA
        directions as the p of the input space holds when that is fewer (p // 16: 4 on 64 features).
        Members of 8 dimensions did not learn (measured on digits, p = 64: each M_n shrank towards 0
        and early stopping kept M_n = I); the paper's members have 100 to 1,000.
    member_dim : int or None, default None
        d, the dimension of each member's subspace; None: min(64, p // N_E) for pca-blocks (the
        paper's 64 where the input has N_E x 64 PCA directions, else an even share of them),
        min(64, p) for random subspaces.
    input_dim : int or None, default None
        PCA directions of the input space (p); None = all.
    subspace : {'pca-blocks', 'random'}, default 'pca-blocks'
        Consecutive blocks of PCA coordinates (needs members x member_dim <= p) or seeded Gaussian
        projections N(0, 1/d).
    refine : bool, default False
        One round of coordinate descent over members, each re-trained with the others fixed.
    margin, step, epochs, batch, sampling, normalize : as :class:`SLNE`, for every member.
    dim : int or None, default None
        Output code dimension: the codes concatenate each member's factor (the eigen-directions of
        M_n, mapped back by P_n^T). None = every member's positive eigen-directions; an int is split
        evenly over members (the first dim % members members keep one more), that many per member
        (zero columns where M_n has fewer positive eigenvalues), so dim is the codes' width; dim
        must be >= members and <= members x member_dim.
    n_neighbors : int, default 50
        k of the exact kNN graph ``fit`` computes when none is given (clipped to n - 1).
    random_state : int, RandomState or None, default None
        Seed of the random subspaces and, through :func:`member_seed`, of each member's SGD.

    Attributes
    ----------
    mean_, basis_, M_ (the ensemble M_E of Eq. 8), factor_, classes_ : as :class:`SLNE`.
    member_matrices_ : (members, d, d) float32, each M_n.
    history_ : list of {"member", "history"}, one per member.
    """

    # step sizes a decade apart and between: a step that suits pixels overshoots on other data
    search_space = {"step": [0.2, 0.05, 0.02, 0.005]}
    selection_metric = "softvote10"

    method = "slde"
    fitted_attributes = ("member_matrices_",)

    def check_data_shape(self, n_features: int, n_classes: int) -> None:
        super().check_data_shape(n_features, n_classes)
        p = min(self.input_dim or n_features, n_features)
        check_subspaces(p, self.n_members(p), self.member_size(p), self.subspace)
        self.member_ranks(p)  # dim within [members, members x member_dim], before any unit is written

    _parameter_constraints = {
        "members": [*COUNT, None],
        "member_dim": [*COUNT, None],
        "input_dim": DIM_OR_NONE,
        "subspace": [StrOptions({"pca-blocks", "random"})],
        "refine": ["boolean"],
        "dim": DIM_OR_NONE,
        **_SOLVER_CONSTRAINTS,
    }

    def __init__(
        self,
        members=None,
        member_dim=None,
        input_dim=None,
        subspace="pca-blocks",
        refine=False,
        margin=0.02,
        step=0.2,
        epochs=3,
        batch=64,
        sampling="violating",
        normalize=None,
        dim=None,
        n_neighbors=50,
        random_state=None,
    ):
        self.members = members
        self.member_dim = member_dim
        self.input_dim = input_dim
        self.subspace = subspace
        self.refine = refine
        self.margin = margin
        self.step = step
        self.epochs = epochs
        self.batch = batch
        self.sampling = sampling
        self.normalize = normalize
        self.dim = dim
        self.n_neighbors = n_neighbors
        self.random_state = random_state

    # -- what the pipeline maps over its workers ----------------------------------------------------------
    def member_params(self) -> dict:
        """The SL-NE solver parameters every member uses (the ``params`` of :func:`fit_member`)."""
        return {k: getattr(self, k) for k in SOLVER_PARAMS}

    def member_seed(self, n: int) -> int:
        """Member n's SGD seed: depends on random_state and n only."""
        return member_seed(seed_of(self.random_state), n)

    def code_dim(self, n_features: int, n_classes: int) -> int:
        if isinstance(self.dim, int):
            return min(self.dim, n_features)
        p = self._input_dim(n_features)
        return self.n_members(p) * self.member_size(p) if self.members and self.member_dim else p

    def _task_rows(self, n_features: int) -> tuple[int, str, str]:
        p = self._input_dim(n_features)
        if self.refine:
            return p, "an SL-DE task (refine)", "input_dim or member_dim"
        d = self.member_size(p)
        return d, f"an SL-DE member ({d} dimensions)", "input_dim or member_dim"

    def n_members(self, p: int) -> int:
        """N_E for a p-dimensional input space: ``members``, or its rule when None."""
        if self.members is not None:
            return self.members
        return 8 if self.subspace == "random" else max(1, min(8, p // MIN_BLOCK))

    def member_size(self, p: int) -> int:
        """d for a p-dimensional input space: ``member_dim``, or its rule when None."""
        if self.member_dim is not None:
            return self.member_dim
        return max(1, min(64, p // self.n_members(p) if self.subspace == "pca-blocks" else p))

    def projections(self, p: int, n_features: int | None = None) -> list[np.ndarray]:
        """Every member's subspace P_n (member_dim, p) in the p-dimensional input space (``n_features``:
        D, named in the error when pca-blocks needs more than p directions)."""
        return subspaces(
            p, self.n_members(p), self.member_size(p), self.subspace, seed_of(self.random_state), n_features
        )

    def member_rows(self, X, mean, components, n: int) -> np.ndarray:
        """Rows X (n_rows, D) in member n's subspace: :meth:`input_rows` times P_n^T, (n_rows, member_dim)."""
        return self.member_map(mean, components, n)(X)

    def member_map(self, mean, components, n: int):
        """:meth:`member_rows` as a function of X alone, the spaces built once (for many row-blocks)."""
        mean32, P = self.input_space(mean, components)
        d = self.member_size(P.shape[1])
        check_subspaces(P.shape[1], self.n_members(P.shape[1]), d, self.subspace, P.shape[0])
        Pn = subspace(P.shape[1], n, d, self.subspace, seed_of(self.random_state))
        return lambda X: project(preprocess(X, mean32, P), Pn)

    def member_ranks(self, p: int) -> list:
        """The code dimension each member keeps (None: all its positive eigen-directions) for a
        p-dimensional input space."""
        members = self.n_members(p)
        if self.dim is None:
            return [None] * members
        if self.dim < members:
            raise InputError(
                f"The 'dim' parameter of slde must be >= members ({members}): every member "
                f"keeps at least one code direction. Got {self.dim} instead; raise dim or use None."
            )
        if self.dim > members * self.member_size(p):
            raise InputError(
                f"The 'dim' parameter of slde must be <= members x member_dim = {members} x "
                f"{self.member_size(p)} = {members * self.member_size(p)}, the ensemble's dimensions. "
                f"Got {self.dim} instead; lower dim, raise member_dim where the PCA directions allow "
                f"(members x member_dim <= {p}), or use subspace: random."
            )
        return [self.dim // members + (n < self.dim % members) for n in range(members)]

    # -- in memory ----------------------------------------------------------------------------------------
    def fit(self, X, y, neighbors=None, X_val=None, y_val=None):
        """Train every member on rows X with labels y, one after another, and assemble them.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
        neighbors : int array of shape (n_samples, k) or None
            Each row's neighbours as row indices of X (-1 = none); None: the exact kNN graph of X.
        X_val, y_val : optional validation rows: each member keeps its epoch with the lowest
            soft-vote error on them, in its subspace (early stopping, as :meth:`SLNE.fit`).
        """
        self._validate_params()
        X, y = self._fit_data(X, y)
        mean, components = pca_statistics(X)
        self.member_ranks(self.input_space(mean, components)[1].shape[1])
        Z = self.input_rows(X, mean, components)
        graph = _check_graph(self._graph(X, neighbors), len(X))
        params = self.member_params()
        val = self._memory_validation(X, X_val, y_val, lambda A: self.input_rows(A, mean, components))
        members = [
            fit_member(
                params,
                project(Z, Pn),
                y,
                graph,
                self.member_seed(n),
                validation=None if val is None else (project(val[0], Pn), val[1], val[2]),
            )
            for n, Pn in enumerate(self.projections(Z.shape[1], X.shape[1]))
        ]
        return self._assemble(members, mean, components, Z, y, graph)

    def assemble(self, members: list, mean, components, Z=None, y=None, neighbors=None):
        """The pipeline's entry point: the fitted ensemble from its trained members.

        Parameters
        ----------
        members : list of (M_n (member_dim, member_dim), meta), :func:`fit_member`'s results in
            member order (member n trained on :meth:`member_rows` (X, mean, components, n) with seed
            :meth:`member_seed` (n)).
        mean : (D,), components : (k, D): the statistics' mean and PCA directions.
        Z, y, neighbors : the training rows in the input space (:meth:`input_rows`), their labels and
            local kNN graph; only ``refine`` needs them.
        """
        self._validate_params()
        p = self.input_space(mean, components)[1].shape[1]
        if len(members) != self.n_members(p):
            raise InputError(
                f"SLDE.assemble: expected {self.n_members(p)} members (the 'members' parameter "
                f"or its rule). Got {len(members)} instead."
            )
        shapes = {np.shape(m) for m, _ in members}
        d = self.member_size(p)
        if shapes != {(d, d)}:
            raise InputError(
                f"SLDE.assemble: every member's M_n must be ({d}, {d}) "
                f"(member_dim). Got shapes {sorted(shapes)}; train members with member_rows."
            )
        if self.refine:
            if Z is None or y is None or neighbors is None:
                raise InputError(
                    "SLDE.assemble with refine=True needs Z, y and neighbors (the training rows). "
                    "Got None; pass them or set refine=False."
                )
            Z, y, neighbors = self._space_data(Z, y, neighbors, mean, components)
        else:
            self.n_features_in_ = int(len(mean))
            self.__dict__.pop("feature_names_in_", None)
            if y is not None:
                self.classes_ = np.unique(np.asarray(y))
        return self._assemble(members, mean, components, Z, y, neighbors)

    def refit_params(self) -> dict:
        """``epochs`` = the median of the members' kept epochs (each member keeps its own on
        validation; one number has to serve the refit of them all)."""
        best = [
            min((h["val_error"], h["epoch"]) for h in m["history"] if "val_error" in h)[1]
            for m in self.history_
            if any("val_error" in h for h in m["history"])
        ]
        return {"epochs": int(np.round(np.median(best)))} if best else {}

    def _assemble(self, members, mean, components, Z, y, graph):
        mean32, P = self.input_space(mean, components)
        ranks = self.member_ranks(P.shape[1])
        Ps = self.projections(*P.shape[::-1])
        Ms = [np.asarray(m, np.float32) for m, _ in members]
        if self.refine:
            Ms = refine(Ps, Ms, Z, y, graph, self.member_params(), seed_of(self.random_state))
        M = ensemble_matrix(Ps, Ms)  # Eq. 8
        # codes: concatenated members' factors, <code_x, code_y> = sum_n <L_n P_n z_x, L_n P_n z_y>
        L = np.concatenate([Pn.T @ factor(Mn, r) for Pn, Mn, r in zip(Ps, Ms, ranks)], axis=1)
        self._set_model(
            mean32, P, M, L, [{"member": n, "history": meta["history"]} for n, (_, meta) in enumerate(members)]
        )
        self.member_matrices_ = np.stack(Ms).astype(np.float32)
        return self
