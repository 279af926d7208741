"""Non-linear metric learning by approximate kernelization (Sharma, Schiele), Sections 2.1 and 3.

The embedding of x is [k(l_1, x), ..., k(l_d, x)] (Eq. 7) with the shifted chi2 kernel
k(l, x) = sum_c 2 l_c x_c / (|l_c| + |x_c|) (Eq. 11), on l1-normalised non-negative x; pairs
(i, j, y = +-1) train L (d, D) with the hinge max(0, m - y (b - d^2)) (Eq. 9), d^2 the squared
distance of the embeddings (Eq. 8), by SGD with the subgradient of Eq. 10 and the kernel gradient
of Eq. 12, dk/dl_c = 2 x_c |x_c| / (|x_c| + |l_c|)^2. 0/0 (l_c = x_c = 0) counts as 0 in both.

The linear baseline (Eq. 3 with a margin m) is the same hinge on d^2 = ||L x_i - L x_j||^2.

SGD runs on mini-batches of pairs: each step averages the subgradients of the batch's pairs, which
is Algorithm 1's update when the batch holds one pair. Only non-zero input coordinates contribute
to the kernel and its gradient, so the kernel is evaluated on the union of the batch's non-zero
columns.

The estimators :class:`NML` and :class:`LinearML` take their pairs from *pair pools*, a set of rows
in hand with pairs of indices into it:

- from labels (``fit(X, y)``, the pipeline's ``fit_rows``): the pools of
  :mod:`metricpipe.tasks.stream`, each a uniform random sample of the training rows whatever their
  stored order; pairs are drawn inside each pool (:func:`sample_pairs`), so every batch mixes
  classes from across the data set;
- from pairs the user gives (``fit_pairs``, the pipeline's ``fit_pair_blocks``): the pairs are
  grouped by the layout blocks of their two rows (:func:`pair_groups`), and SGD visits the groups
  in a seeded order holding at most two blocks.

Modules: ``kernels`` (the chi2 embedding, the hinges and their gradients), ``pairs`` (pair sampling
and the visiting order of user pairs), ``sgd`` (PairSGD), ``learner`` (what the two estimators share:
the entry points and the SGD loop) and ``estimators`` (NML, LinearML).
"""

from metricpipe.tasks.nml.estimators import NML, LinearML
from metricpipe.tasks.nml.kernels import (
    TINY,
    check_nonnegative,
    chi2_embed,
    chi2_kernel,
    hinge,
    linear_loss_and_gradient,
    nml_loss_and_gradient,
)
from metricpipe.tasks.nml.learner import PATIENCE, VALIDATIONS, PairLearner
from metricpipe.tasks.nml.pairs import pair_groups, sample_pairs
from metricpipe.tasks.nml.sgd import PairSGD
from metricpipe.tasks.validate import check_pair_indices

__all__ = [
    "NML",
    "PATIENCE",
    "TINY",
    "VALIDATIONS",
    "LinearML",
    "PairLearner",
    "PairSGD",
    "check_nonnegative",
    "check_pair_indices",
    "chi2_embed",
    "chi2_kernel",
    "hinge",
    "linear_loss_and_gradient",
    "nml_loss_and_gradient",
    "pair_groups",
    "sample_pairs",
]

for _cls in (NML, LinearML):
    _cls.__module__ = __name__  # their public path (reprs, pickles, docs), as numpy's set_module does
