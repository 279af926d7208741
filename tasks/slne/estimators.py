"""The estimators SLNE and SLDE (Wang et al.): the input space from the statistics, the bilinear
similarity, its factored codes; SL-DE's members are fitted by :func:`~metricpipe.tasks.slne.ensemble.fit_member`."""

from numbers import Integral

import numpy as np

from metricpipe.tasks import madds
from metricpipe.tasks.base import (
    COUNT,
    DIM_OR_NONE,
    StrOptions,
    seed_of,
)
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.moments import pca_statistics
from metricpipe.tasks.normalize import preprocess
from metricpipe.tasks.slne.bilinear import SOLVER_CONSTRAINTS, SOLVER_PARAMS, Bilinear, check_graph
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
from metricpipe.tasks.slne.solver import learn_similarity, softvote_validator

# The fewest PCA directions an SL-DE member gets from the rule for members (SLDE.n_members).
MIN_BLOCK = 16


class SLNE(Bilinear):
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
    mean_ : ndarray of shape (n_features,), float32
        The training rows' mean.
    basis_ : ndarray of shape (n_features, p), float32
        The PCA directions of the input space: z = l2normalize((x - ``mean_``) @ ``basis_``).
    M_ : ndarray of shape (p, p), float32
        The similarity s(x, y) = z_x^T M z_y (Eq. 2).
    factor_ : ndarray of shape (p, dim), float32
        The codes are z @ ``factor_``, whose inner products approximate s (the PSD part of M).
    history_ : list of dict
        ``{"epoch", "violations", "hinge"}`` per epoch (and ``"val_error"`` with validation rows).
    classes_ : ndarray of shape (n_classes,)
        The class labels.
    n_features_in_ : int
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

    _parameter_constraints = {"dim": DIM_OR_NONE, "input_dim": DIM_OR_NONE, **SOLVER_CONSTRAINTS}

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
        X_val : array-like of shape (n_val, n_features) or None, default=None
            Validation rows: M is then the epoch's (or the start's) with the lowest soft-vote error
            on them (early stopping; ``history_`` has "val_error").
        y_val : array-like of shape (n_val,) or None, default=None
            Their labels.

        Returns
        -------
        self
            The fitted estimator.
        """
        self._validate_params()
        X, y = self._fit_data(X, y)
        mean, components = pca_statistics(X)
        Z = self.input_rows(X, mean, components)
        val = self._memory_validation(X, X_val, y_val, lambda A: self.input_rows(A, mean, components))
        return self._fit_space(Z, y, check_graph(self._graph(X, neighbors), len(X)), mean, components, val)

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


class SLDE(Bilinear):
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
    member_epochs : list of int or None, default None
        Each member's epochs in member order, in place of ``epochs`` (a refit repeats the epoch each
        member kept on validation: :meth:`refit_params`); None: ``epochs`` for every member.
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
    mean_, basis_, classes_ : as :class:`SLNE`'s
    M_ : ndarray of shape (p, p), float32
        The ensemble's similarity M_E of Eq. 8 in the input space.
    factor_ : ndarray of shape (p, dim), float32
        Each member's factor mapped back to the input space, concatenated: the codes are
        z @ ``factor_``, compared by inner product.
    member_matrices_ : ndarray of shape (members, d, d), float32
        Each member's M_n in its subspace.
    history_ : list of dict
        ``{"member", "history"}``, one per member.
    n_features_in_ : int
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
        self._check_member_epochs(p)

    def _check_member_epochs(self, p: int) -> None:
        given = self.member_epochs
        if given is not None and (
            len(given) != self.n_members(p) or not all(isinstance(e, Integral) and e >= 0 for e in given)
        ):
            raise InputError(
                f"The 'member_epochs' parameter of slde must list {self.n_members(p)} epoch counts >= 0, one "
                f"per member. Got {list(given)} instead; list one per member or use None (epochs for all)."
            )

    _parameter_constraints = {
        "members": [*COUNT, None],
        "member_dim": [*COUNT, None],
        "input_dim": DIM_OR_NONE,
        "subspace": [StrOptions({"pca-blocks", "random"})],
        "refine": ["boolean"],
        "dim": DIM_OR_NONE,
        "member_epochs": ["array-like", None],
        **SOLVER_CONSTRAINTS,
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
        member_epochs=None,
    ):
        self.member_epochs = member_epochs
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
    def fit_cost(self, n_rows, n_features, n_classes, k=0, n_val=0):
        """Each member's Algorithm 1 in its ``member_dim`` dimensions (the members' fits add up,
        wherever they run), then the ensemble assembled: M_E = sum P_n^T M_n P_n and each member's
        factor."""
        p = self._input_dim(n_features)
        d, members = self.member_size(p), self.n_members(p)
        k = k or int(self.n_neighbors)
        each = self.solver_cost(n_rows, d, k, min(n_val, 2000)) + madds.eigh(d)
        assemble = members * (madds.gemm(p, d, d) + madds.gemm(p, p, d))
        refine = members * self.solver_cost(n_rows, d, k, 0) if self.refine else 0.0
        return madds.FitCost(madds.FIT + members * each + assemble + refine)

    def member_params(self, n: int | None = None) -> dict:
        """The SL-NE solver parameters member ``n`` uses (the ``params`` of :func:`fit_member`): its
        ``member_epochs`` entry where given (None: the parameters every member shares)."""
        params = {k: getattr(self, k) for k in SOLVER_PARAMS}
        if n is not None and self.member_epochs is not None:
            params["epochs"] = int(self.member_epochs[n])
        return params

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

    def members_map(self, mean, components):
        """Every member's :meth:`member_map` as one function of X, returning their rows in member
        order: X is preprocessed once, then projected into each subspace (the same values)."""
        mean32, P = self.input_space(mean, components)
        Ps = self.projections(P.shape[1], P.shape[0])
        return lambda X: [project(Z, Pn) for Z in (preprocess(X, mean32, P),) for Pn in Ps]

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
        X_val : array-like of shape (n_val, n_features) or None, default=None
            Validation rows: each member keeps its epoch with the lowest soft-vote error on them, in
            its subspace (early stopping, as :meth:`SLNE.fit`).
        y_val : array-like of shape (n_val,) or None, default=None
            Their labels.

        Returns
        -------
        self
            The fitted estimator.
        """
        self._validate_params()
        X, y = self._fit_data(X, y)
        mean, components = pca_statistics(X)
        self.member_ranks(self.input_space(mean, components)[1].shape[1])
        self._check_member_epochs(self.input_space(mean, components)[1].shape[1])
        Z = self.input_rows(X, mean, components)
        graph = check_graph(self._graph(X, neighbors), len(X))
        val = self._memory_validation(X, X_val, y_val, lambda A: self.input_rows(A, mean, components))
        members = [
            fit_member(
                self.member_params(n),
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
        """``member_epochs`` = the epoch each member kept on validation (0: its start), so that the
        refit repeats every member's own schedule (one median epoch for all members gave digits a
        soft-vote error of 0.0528 where the validated fit had 0.0361; this rule gives 0.0361); {} when
        no member validated."""
        kept = [
            min((h["val_error"], h["epoch"]) for h in m["history"] if "val_error" in h)[1]
            if any("val_error" in h for h in m["history"])
            else None
            for m in self.history_
        ]
        if all(e is None for e in kept):
            return {}
        epochs = self.member_epochs or [self.epochs] * len(kept)
        return {"member_epochs": [int(e if e is not None else epochs[i]) for i, e in enumerate(kept)]}

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
