"""SL-NE: large-margin similarity learning with neighbourhood embedding (Wang et al., Algorithm 1).

Bilinear similarity s_M(x, y) = x^T M y (Eq. 2). Every training sample's neighbourhood comes from a
fixed kNN graph, symmetrised as in Eq. 4 (j is i's neighbour if j in N_i or i in N_j); targets are
same-label neighbours, impostors the others. SGD over permutations of the training set picks, for
each sample, its most violating target/impostor pair (Eq. 7) and applies the hinge update of Eq. 6:
M <- M + rho x_i (x_j - x_l)^T with rho = rho0 / sqrt((t - 1) / |S| + 1).

SL-DE (Section 3) trains one SL-NE per subspace P_n (consecutive PCA blocks or seeded Gaussian
projections) independently, so each member is its own task; the ensemble similarity is the sum of
the members' (Eq. 8), optionally refined by coordinate descent over members.

Inputs are the training features in a centred PCA space with rows l2-normalised, as in the paper's
experiments ("project to the PCA space and normalize their lengths"): with non-negative raw
features (pixels, ReLU activations) the summed updates otherwise build a rank-one "hub" term that
ranks database items by popularity rather than by the query.

The estimators :class:`SLNE` and :class:`SLDE` wrap these kernels. In memory, ``fit(X, y)`` computes
the PCA of X (:mod:`metricpipe.tasks.moments`) and the exact kNN graph of X (:mod:`metricpipe.tasks.knn`)
itself; the pipeline, which has both already (statistics and neighbours stages), calls
:meth:`SLNE.fit_space` with the preprocessed training rows, or maps :func:`fit_member` over SL-DE's
members and calls :meth:`SLDE.assemble`. ``fit`` goes through the same code. Given the same rows,
statistics, graph and seed the model is the same bit for bit; the pipeline maps its rows into the
input space one row-block at a time, and float32 products over other row counts may round the last
bit of Z differently (measured: 1e-7 in Z, 1e-8 in M, 1e-7 in the codes; tested with atol 1e-5).

Modules: ``solver`` (the neighbourhoods and Algorithm 1), ``ensemble`` (SL-DE's subspaces and members,
the factor of a similarity), ``bilinear`` (what SLNE and SLDE share) and ``estimators`` (SLNE, SLDE).
The input space's map (``preprocess``) is :func:`metricpipe.tasks.normalize.preprocess`, the in-memory
PCA :func:`metricpipe.tasks.moments.pca_statistics`.
"""

from metricpipe.tasks.moments import pca_statistics
from metricpipe.tasks.normalize import preprocess
from metricpipe.tasks.slne.bilinear import SLNE_BYTES_PER_EDGE, SOLVER_PARAMS
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
from metricpipe.tasks.slne.estimators import MIN_BLOCK, SLDE, SLNE
from metricpipe.tasks.slne.solver import (
    Neighbourhoods,
    edge_scores,
    hinge_objective,
    knn_graph,
    learn_similarity,
    most_violating,
    neighbourhoods,
    softvote_validator,
    training_graph,
    triplet_update,
)

__all__ = [
    "MIN_BLOCK",
    "SLDE",
    "SLNE",
    "SLNE_BYTES_PER_EDGE",
    "SOLVER_PARAMS",
    "Neighbourhoods",
    "check_subspaces",
    "edge_scores",
    "ensemble_matrix",
    "factor",
    "fit_member",
    "hinge_objective",
    "knn_graph",
    "learn_similarity",
    "member_seed",
    "most_violating",
    "neighbourhoods",
    "pca_statistics",
    "preprocess",
    "project",
    "refine",
    "softvote_validator",
    "subspace",
    "subspaces",
    "training_graph",
    "triplet_update",
]

for _cls in (SLNE, SLDE):
    _cls.__module__ = __name__  # their public path (reprs, pickles, docs), as numpy's set_module does
