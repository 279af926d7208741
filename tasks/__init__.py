"""Pure numerical kernels and learners that run on Dask workers.

Everything here takes NumPy arrays and returns NumPy arrays: no Dask, no I/O, no logging
configuration, and every function is deterministic given its seed. A learner here can be used by
someone who has never heard of Dask.
"""
from metricpipe.tasks.errors import InputError

__all__ = ["InputError"]
