"""Shared by the benchmark scripts (run from the repository root: python benchmarks/bench_*.py)."""
import time


def timed(f, repeat=5):
    """(mean seconds per call over ``repeat`` calls after one warm-up call, the last result)."""
    f()
    t = time.perf_counter()
    for _ in range(repeat):
        out = f()
    return (time.perf_counter() - t) / repeat, out
