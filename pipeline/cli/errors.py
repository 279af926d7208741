"""How a command ends: the project's errors as one line and exit code 2, Ctrl-C and SIGTERM with the
resume hint, and the Dask log level that --verbose sets."""

import errno
import functools
import logging
import os
import re
import shlex
import sys
import traceback
import warnings

import click

from metricpipe.errors import STAGES, TERMINATING, ConfigError, StageError, Terminated, WorkersGone
from metricpipe.tasks.errors import InputError

EXIT_INPUT = 2


def echo(msg: str) -> None:
    click.echo(msg, err=True)


def handle_errors(fn):
    """Turn project errors into a one-line message and exit code 2; --verbose shows the traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        verbose = click.get_current_context().find_root().params.get("verbose", False)
        try:
            dask_verbosity(verbose)
            return fn(*args, **kwargs)
        except (InputError, StageError) as e:
            if verbose:  # the traceback, and still the exit code a script tests for
                traceback.print_exc()
            lines = str(e).splitlines()
            for line in lines if isinstance(e, ConfigError) else lines[:1]:  # a config's mistakes, all of them
                echo(f"error: {line}")
            if isinstance(e, StageError) and "config" in kwargs:
                echo(f"to resume: {_resume_command(kwargs)} (finished stages are kept)")
            sys.exit(EXIT_INPUT)
        except OSError as e:
            if _object_store_error(e) is not None:  # s3fs raises botocore's refusals as OSError (PermissionError, ...)
                _exit_object_store(e, verbose, kwargs)
            if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
                raise
            if verbose:
                traceback.print_exc()
            # a write that failed outside the store's own checks
            from metricpipe.store import write_fix  # deferred: loads Zarr

            echo(f"error: {e.filename or 'a write'}: {e.strerror}; {write_fix(e)}")
            sys.exit(EXIT_INPUT)
        except KeyboardInterrupt as e:
            stop_interrupted(e, kwargs)
        except Exception as e:
            if _object_store_error(e) is None:
                raise
            _exit_object_store(e, verbose, kwargs)

    return wrapper


def _exit_object_store(e: BaseException, verbose: bool, kwargs: dict) -> None:
    if verbose:
        traceback.print_exc()
    echo(f"error: {kwargs.get('store') or 'object storage'}: {_object_store_error(e)}")
    sys.exit(EXIT_INPUT)


def _object_store_error(e: BaseException) -> str | None:
    """One line for an object store that cannot be used (no credentials, an endpoint that does not
    answer, a request refused), None for any other error: botocore's exceptions, as s3fs raises them."""
    seen = set()
    while e is not None and id(e) not in seen:  # e, or what an OSError was raised from (s3fs's translation)
        seen.add(id(e))
        if type(e).__module__.split(".")[0] in ("botocore", "aiobotocore"):
            name, text = type(e).__name__, str(e).splitlines()[0] if str(e) else type(e).__name__
            if "Credentials" in name:
                return (
                    f"{text} (S3); set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, in the "
                    f"environment of metricpipe and of the workers"
                )
            if "Connect" in name or "Endpoint" in name or "Timeout" in name:
                return (
                    f"{text} (S3); check the endpoint (AWS_ENDPOINT_URL_S3 for a server other than AWS) "
                    f"and that it is reachable"
                )
            return f"the object store refused the request: {text}; check the credentials and the bucket's name"
        e = (e.__cause__ or e.__context__) if isinstance(e, OSError) else None
    return None


def _resume_command(kwargs: dict) -> str:
    """``metricpipe run CONFIG ... --resume`` with the options the run was given: where and how it ran
    (--store above all: without it the config's own store would be resumed)."""
    again = "".join(
        f" --{name.replace('_', '-')} {shlex.quote(str(kwargs[name]))}"
        for name in ("store", "cluster", "workers", "memory_limit", "repeats")
        if kwargs.get(name)
    )
    wait = click.get_current_context(silent=True)
    wait = wait and wait.meta.get("wait_timeout")
    again += f" --wait-timeout {wait:g}" if wait else ""
    again += " --verify-source" if kwargs.get("verify_source") else ""
    # a --force run stopped midway: the units it had not recomputed are back as they were (the store
    # sets a committed unit aside until its new copy commits), so finishing it forces again, which
    # reuses what it did recompute (runner.forcing); --no-resume is a --force of the first stage; a
    # --repair run recomputes only what is still damaged
    forced = STAGES[0] if kwargs.get("resume") is False else kwargs.get("force")  # (--no-resume: every stage)
    again += f" --force {forced}" if forced else ""
    again += " --repair" if kwargs.get("repair") else ""
    return f"metricpipe run {shlex.quote(str(kwargs['config']))}{again} --resume"


def stop_interrupted(e: KeyboardInterrupt, kwargs: dict | None = None) -> None:
    if isinstance(e, WorkersGone):  # stopped by the cluster's watch: a failed stage, as a StageError
        echo(f"error: {e}")
        if kwargs and "config" in kwargs:
            echo(f"to resume: {_resume_command(kwargs)} (finished stages are kept)")
        _quiet_after_interrupt_from_now()
        sys.exit(EXIT_INPUT)
    how = "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted"
    ctx = click.get_current_context(silent=True)
    if kwargs and "config" in kwargs:  # metricpipe run
        echo(f"{how}; finished stages are kept; to resume: {_resume_command(kwargs)}")
    elif ctx is not None and any(p.name == "resume" for p in ctx.command.params):  # demo
        echo(f"{how}; finished stages are kept, rerun with --resume to continue")
    else:  # encode, evaluate, ...: no --resume (their outputs are written whole or not at all)
        echo(f"{how}; rerun the command to start again")
    _quiet_after_interrupt_from_now()
    sys.exit(143 if isinstance(e, Terminated) else 130)


def _quiet_after_interrupt_from_now() -> None:
    """The one line said, what the interrupt cut short stays quiet at exit: finalisers
    (:func:`_quiet_after_interrupt`) and the coroutines of an async read it stopped (zarr's
    ``open_array``: "coroutine ... was never awaited", seen after the resume hint on a loaded machine)."""
    sys.unraisablehook = _quiet_after_interrupt
    warnings.filterwarnings("ignore", message=r"coroutine .* was never awaited", category=RuntimeWarning)


def _quiet_after_interrupt(unraisable, _default=sys.unraisablehook) -> None:
    """After an interrupt, the finaliser of an object whose construction it cut short fails on the
    attribute it never set (distributed's Future.__del__: "'Future' object has no attribute
    '_cleared'", printed after the resume hint in a fresh-venv run of the SIGTERM test); a second
    interrupt can land in a finaliser too. Neither is news to someone who stopped the run: dropped;
    anything else is shown as Python would."""
    if not isinstance(unraisable.exc_value, (AttributeError, KeyboardInterrupt)):
        _default(unraisable)


def in_options(data: str):
    """For a command without a config: the shared readers' errors cite config keys (data.path,
    data.labels, ...); name this command's argument and options instead."""
    keys = {
        "data.split.column": "--split-column",
        "data.split.test": "--test",
        "data.split": "--split-column/--test",
        "data.path": data,
        "data.source": data,
        "data.features": "--features",
        "data.labels": "--labels",
        "data.ids": "--ids",
    }
    # whole keys only: not inside a path, a file name or a quoted array name ('data.labels.npy')
    pattern = re.compile(r"(?<![\w./'\"-])(" + "|".join(map(re.escape, keys)) + r")(?![\w'\"-]|\.\w)")

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except InputError as e:
                msg = (
                    str(e)
                    .replace(" (a config's relative paths are read from its folder)", "")
                    .replace("set data.root or METRICPIPE_DATA", "set METRICPIPE_DATA")
                )  # no data.root here
                e.args = (pattern.sub(lambda m: keys[m.group(1)], msg),)
                raise  # the same error (and traceback, with --verbose), in this command's words

        return wrapper

    return decorate


def on_sigterm(signum, frame):
    TERMINATING.set()  # checked again at every gathered task, should this exception be swallowed
    raise Terminated()


LOG_ENV = "DASK_LOGGING__DISTRIBUTED"
_log_env_set_here = False  # whether LOG_ENV is ours to change (a user's own setting is kept)


def set_verbosity(verbose: bool) -> None:
    """Our own one-line messages say what failed; Dask's per-task logs are for --verbose. Set through
    the environment so that worker processes started from here inherit it."""
    global _log_env_set_here
    level = "info" if verbose else "error"
    if LOG_ENV not in os.environ or _log_env_set_here:
        os.environ[LOG_ENV] = level
        _log_env_set_here = True
    if "dask" in sys.modules:  # else the command sets it (dask_verbosity), once dask is imported
        dask_verbosity(verbose)


def dask_verbosity(verbose: bool) -> None:
    """The level in this process, over a user's DASK_LOGGING__DISTRIBUTED (which the workers keep);
    imported here, inside the command's handler, so a Ctrl-C during the import gets the hint."""
    import dask  # deferred: --help starts without Dask

    level = "info" if verbose else "error"
    # distributed's own config gives its client logger a level of its own (warning), applied when
    # distributed is imported: without -v its "Couldn't gather 1 keys, rescheduling" reached the terminal
    levels = {**dask.config.get("logging", {}), "distributed": level, "distributed.client": level}
    dask.config.set({"logging": levels})
    for name in ("distributed", "distributed.client"):  # and now, when distributed is already imported
        logging.getLogger(name).setLevel(level.upper())
