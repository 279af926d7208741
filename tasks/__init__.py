"""Pure numerical kernels and learners that run on Dask workers.

Everything here takes NumPy arrays and returns NumPy arrays: no Dask, no I/O, no logging
configuration, and every function is deterministic given its seed. A learner here can be used by
someone who has never heard of Dask.
"""
from metricpipe.tasks.errors import InputError

__all__ = ["InputError"]


def __getattr__(name: str):
    """A module of this package, imported on first use (``metricpipe.tasks.nml`` after ``import metricpipe``)."""
    import importlib
    if not name.startswith("_"):
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":   # a module that exists but fails to import: its own error
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
