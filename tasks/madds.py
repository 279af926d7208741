"""What a computation costs before it runs, in one unit: the multiply-adds of a large float64 matrix
product (GEMM) on one core. A learner states its fit's cost in this unit from its algorithm
(:meth:`metricpipe.tasks.base.Learner.fit_cost`); a plan divides it by the rate a timed GEMM reaches
on the machine to get seconds.

Work that is not a large GEMM is converted by the constants below: what one element, call or
factorisation costs relative to a GEMM multiply-add, measured once in CPU time on one core
(numpy 2 with OpenBLAS, x86-64 with AVX-512: 27-31 G multiply-adds/s): a large float32 GEMM 0.4, a
memory-bound elementwise pass 50-90 per element out of cache, a numpy call on small arrays 15,000-55,000, a
symmetric eigendecomposition 5 n^3, a Cholesky factorisation 0.6 n^3, a normal draw 300. They are
ratios, so a slower or busier machine moves them together with its GEMM rate.
"""

import math
from typing import NamedTuple

#: a multiply-add of a large float32 GEMM (BLAS runs twice the lanes)
GEMM32 = 0.5
#: one element of a memory-bound numpy pass (an add, a copy, a comparison) over float64 arrays
PASS = 40.0
#: the fixed cost of one numpy call from Python on small arrays (argument checks, allocation, dispatch)
CALL = 30_000.0
#: one element sorted or partitioned (argsort, argpartition, unique), per log2 of the length
SORT = 30.0
#: a normal or uniform draw
DRAW = 300.0
#: a stored float32 value read (the store's chunk decompressed and copied)
READ = 200.0
#: a fit's fixed cost: its parameter checks (scikit-learn's validation) and the fitted attributes
FIT = 15 * CALL


class FitCost(NamedTuple):
    """A fit's cost in multiply-adds (:mod:`metricpipe.tasks.madds`'s unit); ``at_most``: an upper
    bound, where early stopping decides how many steps are taken (the maximum is counted)."""

    madds: float
    at_most: bool = False

    def __add__(self, other):  # (NamedTuple's + would concatenate the tuples)
        return FitCost(self.madds + other.madds, self.at_most or other.at_most)

    def times(self, n: float) -> "FitCost":
        return FitCost(self.madds * n, self.at_most)


def gemm(m: float, n: float, k: float, float32: bool = False) -> float:
    """(m, k) @ (k, n): m n k multiply-adds, at float32's rate when ``float32``, and a call."""
    return m * n * k * (GEMM32 if float32 else 1.0) + CALL


def chain(*dims: float) -> float:
    """``np.linalg.multi_dot`` of matrices of shapes (dims[0], dims[1]), (dims[1], dims[2]), ...: the
    GEMMs of the cheapest order (the same dynamic programme multi_dot solves)."""
    n = len(dims) - 1
    best = {(i, i): 0.0 for i in range(n)}
    for span in range(1, n):
        for i in range(n - span):
            j = i + span
            best[i, j] = min(best[i, k] + best[k + 1, j] + gemm(dims[i], dims[j + 1], dims[k + 1]) for k in range(i, j))
    return best[0, n - 1]


def passes(elements: float, n: float = 1.0) -> float:
    """``n`` elementwise passes over ``elements`` elements (with their numpy calls)."""
    return n * (elements * PASS + CALL)


def read(elements: float) -> float:
    """``elements`` stored values read from the store."""
    return READ * elements + CALL


def eigh(n: float) -> float:
    """A symmetric n x n eigendecomposition (LAPACK syevd)."""
    return 5.0 * n**3 + CALL


def cholesky(n: float) -> float:
    """A Cholesky factorisation (or a triangular solve of n right-hand sides) of an n x n matrix."""
    return 0.6 * n**3 + CALL


def sort(elements: float) -> float:
    """Sorting ``elements`` values."""
    return SORT * elements * max(1.0, math.log2(max(elements, 2.0))) + CALL


def draws(n: float) -> float:
    """``n`` random draws."""
    return DRAW * n + CALL
