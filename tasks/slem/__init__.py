"""Square-loss exemplar machines (Rezende, Zepeda, Ponce, Bach, Perez), Sections 3-5.

Every image x_0 is encoded by the classifier (omega, nu) that separates it from a fixed pool of n
negatives X (Eq. 1). With the square loss the problem is a ridge regression whose solution (Eqs. 3-4)
simplifies by Woodbury (Eq. 6) to

    omega* = 2 theta / (theta delta^T A^-1 delta + theta + 1) * A^-1 delta,   delta = x_0 - mu,

with mu the negatives' mean and A = (1/n) X X^T - mu mu^T + lambda Id their regularised (biased)
covariance; the estimators read lambda for rows of unit RMS norm (:func:`pool_sq_norm`: the ridge is
lambda times the pool's mean squared norm). theta scales omega* but never turns it, so the code
A^-1 (x_0 - mu) / ||.|| used for cosine search does not depend on theta. A is factored once
(Cholesky); a block of images is one triangular solve pair with many right-hand sides.

Kernel SLEM (Section 4) works with a factor K = B B^T of the negatives' kernel matrix (complete
Cholesky with the eigenvalue shift of Section 5.1, KPCA at rank r, or incomplete Cholesky with greedy
pivots at rank r); an image joins by Lemma 1 (v = B^+ k_0, u = sqrt(k_00 - ||v||^2)), its exemplar
classifier in the factor's coordinates is beta = [u / lambda; A_B^-1 (v - mu_B)] (Eq. 6 with
A' = diag(lambda, A_B)), and two images compare by Eq. 16,

    s(h, h') = beta_hat^T beta_hat' + lambda^-2 (k(x_0, x_0') - v^T v'),

which, divided by the norms ||h|| = sqrt(||beta_hat||^2 + (u / lambda)^2), is the cosine of the two
classifiers. Like Eq. 16, the per-image scalar of Eq. 6 is left out: the cosine does not see it.

The ESVM baseline (Eq. 1 with the hinge loss) is solved for each image by SGD, many images at once.

The estimators: :class:`SLEM` (linear; fitted from the pool's moments, :meth:`SLEM.fit_moments` /
:meth:`SLEM.fit_blocks`), :class:`KernelSLEM` and :class:`ESVM` (both hold the pool,
:meth:`KernelSLEM.fit_pool` / :meth:`ESVM.fit_pool`). Their ``negatives`` parameter, ``{split, count,
seed}``, names the pool: the pipeline takes ``count`` seeded images of the split ``split`` (never
test); in memory ``fit(X)`` takes the same seeded sample of ``count`` rows of X itself
(:func:`pool_positions`), whatever ``split`` says.

Modules: ``pool`` (the negative pool and the entry points every exemplar learner shares), ``linear``
(linear SLEM), ``kernels`` (the kernels, the factorisations, kernel SLEM and Eq. 16) and
``exemplar_svm`` (the ESVM baseline).
"""

from metricpipe.tasks.slem.exemplar_svm import ESVM, esvm
from metricpipe.tasks.slem.kernels import (
    DECOMPOSITIONS,
    KERNELS,
    KernelSLEM,
    complete_cholesky,
    decompose,
    incomplete_cholesky,
    kernel,
    kernel_diag,
    kpca,
    parse_score,
    pool_kernel_sq_norm,
    scaled_gamma,
    similarity,
)
from metricpipe.tasks.slem.linear import (
    SLEM,
    exemplar,
    exemplar_direct,
    factor,
    inverse_from_cholesky,
    pool_sq_norm,
    regularised_covariance,
    solve,
    unit_rows,
)
from metricpipe.tasks.slem.pool import NEGATIVES, PoolLearner, check_negatives, pool_positions

__all__ = [
    "DECOMPOSITIONS",
    "ESVM",
    "KERNELS",
    "NEGATIVES",
    "SLEM",
    "KernelSLEM",
    "PoolLearner",
    "check_negatives",
    "complete_cholesky",
    "decompose",
    "esvm",
    "exemplar",
    "exemplar_direct",
    "factor",
    "incomplete_cholesky",
    "inverse_from_cholesky",
    "kernel",
    "kernel_diag",
    "kpca",
    "parse_score",
    "pool_kernel_sq_norm",
    "pool_positions",
    "pool_sq_norm",
    "regularised_covariance",
    "scaled_gamma",
    "similarity",
    "solve",
    "unit_rows",
]

for _cls in (SLEM, KernelSLEM, ESVM):
    _cls.__module__ = __name__  # their public path (reprs, pickles, docs), as numpy's set_module does
