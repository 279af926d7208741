"""Rank-optimised sparse projectors (Negrel, Picard, Gosselin), Section IV and Algorithm 1.

The similarity is d_U(x, y) = x^T U U^T y (Eq. 2), U (D, R). For each query q, with positives P_q,
negatives N_q and a pivot p_q (the negative scored highest by the initial U, Section IV-1), the
constraints of Eq. 6 ask s(q, i) > s(q, p_q) for i in P_q and s(q, p_q) >= s(q, j) for j in N_q.
The paper writes Eqs. 7-15 as if d_U were a distance (smaller = closer); with d_U a similarity the
same objective reads

    f_q(U) = alpha_q sum_i [eps + s(q, p) - s(q, i)]_+^2 + beta_q sum_j [s(q, j) - s(q, p)]_+^2   (Eq. 7)

with alpha_q, beta_q one over the number of violated positive / negative constraints (Eqs. 8-9,
held constant in the gradient as in Eq. 14), minimised by U <- U - mu grad (Eq. 15 with the sign of
a descent). The gradient of one query is rank two: sum_k c_k (x_q y_k^T + x_k y_q^T) with y = U^T x,
so a batch of queries costs three GEMMs, never a loop over triplets. After each step every column
keeps its M largest magnitudes (Eq. 17), M = (1 - tau) D (Eq. 19), and is rescaled to unit norm:
the objective is not scale-invariant (U -> 0 sends it to ~eps^2, the paper's stopping value, while
the ranking is lost), so the scale of each projector is held at its initial (PCA) value. The step
mu is found by golden-section search on the objective after projection and rescaling.

Continuation (``anneal``): projecting the dense PCA start straight onto M non-zeros discards most of
it and the support then barely moves (on Fashion-MNIST, R = 64, tau = 0.9: 89% of the dense
projector's test mAP). Shrinking M geometrically from D to its target over the first half of the
iterations lets the gradient choose the support, and reaches the dense projector's mAP (101%).
With anneal = 0 the learner is Algorithm 1 as printed.

Early stopping (``validation``): the paper runs a fixed number of iterations. The objective averages
each query's violated constraints (Eqs. 8-9), so it can keep falling while the ranking gets worse
(it lowers the pivot's score): on scikit-learn's raw digits (1,150 training rows, R = 16, dense)
train mAP rises from 0.674 to 0.759 and validation mAP from 0.694 to 0.755 over the first 16 steps,
then both drift down (0.732 and 0.692 at step 112) while the objective keeps falling. The
validation mAP is checked along the way and the best state kept; the PCA start is a candidate for
dense projectors, and sparse states only once their support has its final size.

:class:`SparseProjector` is the estimator. ``fit(X, y)`` draws a stratified subset of ``train_size``
rows (:func:`metricpipe.tasks.stream.sample`, drawn by the rows' content), starts from the PCA of all
of X and learns on the subset; the pipeline draws the same subset of the train split, reads only those
rows and fits them with the statistics stage's mean and PCA basis.

Modules: ``projection`` (the constraint set and the step search), ``ranking`` (Algorithm 1) and
``estimator`` (SparseProjector).
"""

from metricpipe.tasks.sparse.estimator import SparseProjector
from metricpipe.tasks.sparse.projection import (
    GOLDEN,
    golden_section,
    nonzeros_per_column,
    project_l0,
    sparsity_note,
    unit_columns,
)
from metricpipe.tasks.sparse.ranking import (
    TOL,
    GroundTruth,
    ValidationCheck,
    check_rank_inputs,
    checked_iterations,
    descent_step,
    final_state,
    history_entry,
    objective_and_gradient,
    pivots,
    query_terms,
    rank_projectors,
    select_queries,
    start_pivots,
    support_size,
    train_map,
)

__all__ = [
    "GOLDEN",
    "GroundTruth",
    "SparseProjector",
    "TOL",
    "ValidationCheck",
    "check_rank_inputs",
    "checked_iterations",
    "descent_step",
    "final_state",
    "golden_section",
    "history_entry",
    "nonzeros_per_column",
    "objective_and_gradient",
    "pivots",
    "project_l0",
    "query_terms",
    "rank_projectors",
    "select_queries",
    "sparsity_note",
    "start_pivots",
    "support_size",
    "train_map",
    "unit_columns",
]

SparseProjector.__module__ = __name__  # its public path (reprs, pickles, docs), as numpy's set_module does
