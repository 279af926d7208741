"""Errors raised by the orchestration layer (user-input errors are tasks.errors.InputError)."""
from metricpipe.tasks.errors import InputError


class StageError(RuntimeError):
    """A task failed on a worker for a reason other than bad input; names the stage and the block."""


__all__ = ["InputError", "StageError"]
