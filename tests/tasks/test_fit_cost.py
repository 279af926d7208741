"""What a fit costs, stated by each learner before any work (Learner.fit_cost, in multiply-adds of a
float64 GEMM: tasks/madds.py), and checked against the CPU time the fit takes."""

import numpy as np
import pytest

from metricpipe.tasks import madds, registry
from metricpipe.tasks.base import Learner
from metricpipe.tasks.madds import FitCost
from tests.tasks.test_estimator_checks import CHECKED

SHAPE = {"n_rows": 2000, "n_features": 64, "n_classes": 10, "k": 10, "n_val": 200}


@pytest.mark.parametrize("est", CHECKED, ids=lambda e: type(e).__name__)
def test_every_builtin_learner_states_its_fit_and_transform_cost(est):
    cost = est.fit_cost(**SHAPE)
    assert isinstance(cost, FitCost) and cost.madds > 0
    assert est.transform_cost(1000, 64, 10) > 0


def test_a_learner_that_does_not_say_is_unknown():
    class Plugin(Learner):  # a plugin's learner that overrides nothing about costs
        _parameter_constraints = {}

    assert Plugin().fit_cost(**SHAPE) is None


@pytest.mark.parametrize("spec", [{"method": "ncmml", "dim": 8}, {"method": "nml", "dim": 8}, {"method": "sparse"}])
def test_early_stopping_makes_the_cost_an_upper_bound(spec):
    stops = registry.make(spec)
    assert stops.validates() and stops.fit_cost(**SHAPE).at_most
    off = {"ncmml": {"early_stopping": False}, "nml": {"validation": 0}, "sparse": {"validation": 0}}
    assert not registry.make({**spec, **off[spec["method"]]}).fit_cost(**SHAPE).at_most


@pytest.mark.parametrize(
    "spec, key",
    [
        ({"method": "ncmml", "dim": 8, "early_stopping": False}, "iters"),
        ({"method": "knnml", "dim": 8, "early_stopping": False}, "iters"),
        ({"method": "nml", "dim": 8, "validation": 0}, "iters"),
        ({"method": "linear-ml", "dim": 8, "validation": 0}, "iters"),
        ({"method": "sparse", "validation": 0}, "max_iter"),
        ({"method": "slne"}, "epochs"),
    ],
)
def test_the_cost_grows_with_the_steps_the_algorithm_takes(spec, key):
    default = registry.make(spec).get_params()[key]
    one, two = (registry.make({**spec, key: n * default}).fit_cost(**SHAPE).madds for n in (1, 2))
    assert 1.6 * one < two < 2.1 * one  # the steps dominate; what is done once does not double


def test_ncmc_pays_for_its_kmeans_and_a_refit_of_fewer_rows_costs_less():
    ncmml, ncmc = (registry.make({"method": m, "dim": 8}) for m in ("ncmml", "ncmc"))
    assert ncmc.fit_cost(**SHAPE).madds > 1.2 * ncmml.fit_cost(**SHAPE).madds
    slne = registry.make({"method": "slne"})
    assert slne.fit_cost(**{**SHAPE, "n_rows": 1000}).madds < slne.fit_cost(**SHAPE).madds


def test_kernel_slem_costs_its_pool_cubed_unless_icd_avoids_the_matrix():
    full, icd = (
        registry.make({"method": "slem", "kernel": "gaussian", "decomposition": d, "rank": r})
        for d, r in (("cholesky", "full"), ("icd", 16))
    )
    small, large = (full.fit_cost(n, 64, 10).madds for n in (1000, 2000))
    assert 6 < large / small < 9  # n^3
    assert icd.fit_cost(2000, 64, 10).madds < large / 20


def test_the_units_add_up():
    assert madds.gemm(10, 20, 30) == 6000 + madds.CALL
    assert madds.gemm(10, 20, 30, float32=True) == 6000 * madds.GEMM32 + madds.CALL
    assert (FitCost(1.0) + FitCost(2.0, True)) == FitCost(3.0, True)
    assert FitCost(2.0, True).times(3) == FitCost(6.0, True)


def test_a_chain_of_products_is_priced_at_its_cheapest_order():
    """madds.chain prices ``np.linalg.multi_dot`` (which the triplet and ranking gradients call): the
    cheapest of every parenthesisation, enumerated here by brute force."""

    def every_order(dims):
        if len(dims) == 2:
            return [0.0]
        return [
            left + right + madds.gemm(dims[0], dims[-1], dims[k])
            for k in range(1, len(dims) - 1)
            for left in every_order(dims[: k + 1])
            for right in every_order(dims[k:])
        ]

    rng = np.random.default_rng(0)
    for n in range(2, 7):
        for _ in range(20):
            dims = tuple(int(v) for v in rng.integers(1, 5000, n + 1))
            assert madds.chain(*dims) == pytest.approx(min(every_order(dims)), rel=1e-12)
