"""Errors raised by the orchestration layer (user-input errors are tasks.errors.InputError)."""

import threading

from metricpipe.tasks.errors import InputError

# The stages a run commits units for, in order (the report follows them); here, not in context.py,
# so the command line can offer them without importing distributed.
STAGES = ("stage", "statistics", "neighbours", "train", "encode", "evaluate")


class ConfigError(InputError):
    """Bad settings in a config file or on the command line: one line per mistake, each naming the file
    (or option) and the key, so a config with three mistakes is told all three at once."""


class StageError(RuntimeError):
    """A task failed on a worker for a reason other than bad input; names the stage and the block."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's or a service manager's stop) handled like Ctrl-C: units being written stay
    uncommitted, the cluster is closed and the resume hint printed."""


class WorkersGone(KeyboardInterrupt):
    """The cluster has had no worker (or no scheduler) for the run's wait_timeout. Raised in the main
    thread by the cluster's watch (cluster.WorkerWatch) wherever the run waits, and so handled like
    an interrupt: units being written stay uncommitted and the cluster is closed; the command line
    prints it as an error with the resume hint (exit 2)."""


# Set by the SIGTERM handler. The handler also raises Terminated at once, but Python runs it between
# any two bytecodes, and an exception raised there can be swallowed (a library's broad except, a
# finaliser): a CI run went on to exit 0. So the run checks the flag at every gathered task and stage.
TERMINATING = threading.Event()


def check_terminated() -> None:
    if TERMINATING.is_set():
        raise Terminated()


__all__ = ["InputError", "StageError", "Terminated", "TERMINATING", "WorkersGone", "check_terminated"]
