"""Pure numerical kernels and learners that run on Dask workers.

Everything here takes NumPy arrays and returns NumPy arrays: no Dask, no I/O, no logging
configuration, and every function is deterministic given its seed. A learner here can be used by
someone who has never heard of Dask.
"""

from metricpipe.tasks.errors import InputError

__all__ = ["InputError"]


def submodule_on_first_use(package: str, name: str):
    """Module ``package.name``, imported on first use (``metricpipe.tasks.nml`` after ``import
    metricpipe``); AttributeError, as for any missing attribute, when there is no such module."""
    import importlib

    if not name.startswith("_"):
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{package}.{name}":  # a module that exists but fails to import: its own error
                raise
    raise AttributeError(f"module {package!r} has no attribute {name!r}")


def __getattr__(name: str):
    return submodule_on_first_use(__name__, name)
