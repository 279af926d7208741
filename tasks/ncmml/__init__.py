"""Nearest-class-mean metric learning (Mensink, Verbeek, Perronnin, Csurka), Sections 3-4.

W (d, D) defines d_W(x, y) = ||W x - W y||^2. Every learner here is plain minibatch SGD on rows
handed to it. The estimators NCMML, NCMC and KNNML run the SGD over the pools of
`metricpipe.tasks.stream`: in memory from arrays, in the pipeline from the shuffled copy of the train rows.

- NCMML: p(c|x) = softmax_c(-d_W(x, mu_c) / 2) (Eq. 5), maximise the mean log-likelihood (Eq. 9),
  gradient sum_ic alpha_ic W z_ic z_ic^T with alpha_ic = p(c|x_i) - [c = y_i], z_ic = mu_c - x_i
  (Eq. 10). Distances are taken in the projected space (Table 1's cheapest option): the m images and
  the C means are projected once per step.
- NCMC: k centroids per class, p(c|x) = sum_j softmax_cj(-d_W(x, m_cj) / 2) (Eqs. 21-22), gradient
  with alpha_icj = p(m_cj|x) - [c = y] p(m_cj|x) / sum_j' p(m_cj'|x) (Eqs. 24-25). NCM is the
  case k = 1, and both share one gradient routine.
- The dot-product variant (Eq. 27): p(c|x) = softmax_c(x^T W^T W mu_c + s_c) with a learned bias
  per class; a class added later takes s_c = -||W mu_c||^2 / 2, the bias the Euclidean form implies.
- k-NN metric learning: the triplet hinge [1 + d_W(q, p) - d_W(q, n)]_+ (Eq. 35), triplets from m
  images per step (rho m from one class, Section 4.2), and the gradient 2 W X^T A X whose coefficients
  come from one sort per query (Algorithm 1, Eqs. 40-43), never a loop over triplets.

Modules: ``objectives`` (the likelihoods and their gradients, Eqs. 5-10, 21-27), ``kmeans`` (NCMC's
class k-means), ``triplets`` (k-NN ML's batches and Algorithm 1's gradient), ``sgd`` (MetricSGD and
its back-off), ``learner`` (what the three estimators share: the rows a fit reads, the SGD loop) and
``estimators`` (NCMML, NCMC) and ``knnml`` (KNNML).
"""

from metricpipe.tasks.ncmml.estimators import KMEANS_BYTES, KMEANS_SAMPLE, NCMC, NCMML
from metricpipe.tasks.ncmml.kmeans import assign, class_kmeans, kmeans_plus_plus, lloyd_partial, lloyd_update
from metricpipe.tasks.ncmml.knnml import KNNML
from metricpipe.tasks.ncmml.learner import IDLE_POOLS, PATIENCE, MetricLearner
from metricpipe.tasks.ncmml.objectives import (
    dot_log_likelihood_and_gradient,
    implied_bias,
    log_likelihood_and_gradient,
    metrics_nearest,
    mixture_class_scores,
    mixture_posteriors,
    ncm_scores,
    softmax,
    sqdist,
)
from metricpipe.tasks.ncmml.sgd import BACK_OFF, BACK_OFFS, Diverged, MetricSGD
from metricpipe.tasks.ncmml.triplets import (
    choose_targets,
    knnml_step,
    l2_targets,
    sample_fixed_batch,
    sample_triplet_batch,
    triplet_counts,
    triplet_gradient,
    triplet_loss_loop,
)

__all__ = [
    "BACK_OFF",
    "BACK_OFFS",
    "IDLE_POOLS",
    "KMEANS_BYTES",
    "KMEANS_SAMPLE",
    "KNNML",
    "NCMC",
    "NCMML",
    "PATIENCE",
    "Diverged",
    "MetricLearner",
    "MetricSGD",
    "assign",
    "choose_targets",
    "class_kmeans",
    "dot_log_likelihood_and_gradient",
    "implied_bias",
    "kmeans_plus_plus",
    "knnml_step",
    "l2_targets",
    "lloyd_partial",
    "lloyd_update",
    "log_likelihood_and_gradient",
    "metrics_nearest",
    "mixture_class_scores",
    "mixture_posteriors",
    "ncm_scores",
    "sample_fixed_batch",
    "sample_triplet_batch",
    "softmax",
    "sqdist",
    "triplet_counts",
    "triplet_gradient",
    "triplet_loss_loop",
]

for _cls in (NCMML, NCMC, KNNML):
    _cls.__module__ = __name__  # their public path (reprs, pickles, docs), as numpy's set_module does
