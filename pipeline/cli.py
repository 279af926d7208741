"""The ``metricpipe`` command. It parses arguments and hands off; errors become one line and exit 2.

Only click and the error types load with it: each command imports what it uses (the config, scikit-learn,
distributed) inside handle_errors, so ``--help`` is quick and a Ctrl-C during those imports gets the
one-line answer, not a traceback."""
from __future__ import annotations

import errno
import functools
import logging
import os
import shlex
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

import click

from metricpipe import __version__
from metricpipe.errors import STAGES, TERMINATING, StageError, Terminated, WorkersGone
from metricpipe.tasks.errors import InputError

if TYPE_CHECKING:
    from metricpipe.config import RunConfig

EXIT_INPUT = 2


def _echo(msg: str) -> None:
    click.echo(msg, err=True)


def handle_errors(fn):
    """Turn project errors into a one-line message and exit code 2; --verbose shows the traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        verbose = click.get_current_context().find_root().params.get("verbose", False)
        try:
            _dask_verbosity(verbose)
            return fn(*args, **kwargs)
        except (InputError, StageError) as e:
            if verbose:   # the traceback, and still the exit code a script tests for
                traceback.print_exc()
            _echo(f"error: {str(e).splitlines()[0]}")
            if isinstance(e, StageError) and "config" in kwargs:
                _echo(f"to resume: {_resume_command(kwargs)} (finished stages are kept)")
            sys.exit(EXIT_INPUT)
        except OSError as e:
            if _object_store_error(e) is not None:   # s3fs raises botocore's refusals as OSError (PermissionError, ...)
                _exit_object_store(e, verbose, kwargs)
            if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
                raise
            if verbose:
                traceback.print_exc()
            from metricpipe.store import write_fix   # a write that failed outside the store's own checks
            _echo(f"error: {e.filename or 'a write'}: {e.strerror}; {write_fix(e)}")
            sys.exit(EXIT_INPUT)
        except KeyboardInterrupt as e:
            _stop_interrupted(e, kwargs)
        except Exception as e:
            if _object_store_error(e) is None:
                raise
            _exit_object_store(e, verbose, kwargs)
    return wrapper


def _exit_object_store(e: BaseException, verbose: bool, kwargs: dict) -> None:
    if verbose:
        traceback.print_exc()
    _echo(f"error: {kwargs.get('store') or 'object storage'}: {_object_store_error(e)}")
    sys.exit(EXIT_INPUT)


def _object_store_error(e: BaseException) -> str | None:
    """One line for an object store that cannot be used (no credentials, an endpoint that does not
    answer, a request refused), None for any other error: botocore's exceptions, as s3fs raises them."""
    seen = set()
    while e is not None and id(e) not in seen:   # e, or what an OSError was raised from (s3fs's translation)
        seen.add(id(e))
        if type(e).__module__.split(".")[0] in ("botocore", "aiobotocore"):
            name, text = type(e).__name__, str(e).splitlines()[0] if str(e) else type(e).__name__
            if "Credentials" in name:
                return (f"{text} (S3); set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, in the "
                        f"environment of metricpipe and of the workers")
            if "Connect" in name or "Endpoint" in name or "Timeout" in name:
                return (f"{text} (S3); check the endpoint (AWS_ENDPOINT_URL_S3 for a server other than AWS) "
                        f"and that it is reachable")
            return f"the object store refused the request: {text}; check the credentials and the bucket's name"
        e = (e.__cause__ or e.__context__) if isinstance(e, OSError) else None
    return None


def _resume_command(kwargs: dict) -> str:
    """``metricpipe run CONFIG ... --resume`` with the options the run was given: where and how it ran
    (--store above all: without it the config's own store would be resumed)."""
    again = "".join(f" --{name.replace('_', '-')} {shlex.quote(str(kwargs[name]))}"
                    for name in ("store", "cluster", "workers", "memory_limit", "repeats") if kwargs.get(name))
    wait = click.get_current_context(silent=True)
    wait = wait and wait.meta.get("wait_timeout")
    again += f" --wait-timeout {wait:g}" if wait else ""
    again += " --verify-source" if kwargs.get("verify_source") else ""
    # a --force run stopped midway: the units it had not recomputed are back as they were (the store
    # sets a committed unit aside until its new copy commits), so finishing it forces again, which
    # reuses what it did recompute (runner.forcing); --no-resume is a --force of the first stage; a
    # --repair run recomputes only what is still damaged
    forced = STAGES[0] if kwargs.get("resume") is False else kwargs.get("force")   # (--no-resume: every stage)
    again += f" --force {forced}" if forced else ""
    again += " --repair" if kwargs.get("repair") else ""
    return f"metricpipe run {shlex.quote(str(kwargs['config']))}{again} --resume"


def _stop_interrupted(e: KeyboardInterrupt, kwargs: dict | None = None) -> None:
    if isinstance(e, WorkersGone):   # stopped by the cluster's watch: a failed stage, as a StageError
        _echo(f"error: {e}")
        if kwargs and "config" in kwargs:
            _echo(f"to resume: {_resume_command(kwargs)} (finished stages are kept)")
        sys.unraisablehook = _quiet_after_interrupt
        sys.exit(EXIT_INPUT)
    how = "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted"
    ctx = click.get_current_context(silent=True)
    if kwargs and "config" in kwargs:   # metricpipe run
        _echo(f"{how}; finished stages are kept; to resume: {_resume_command(kwargs)}")
    elif ctx is not None and any(p.name == "resume" for p in ctx.command.params):   # demo
        _echo(f"{how}; finished stages are kept, rerun with --resume to continue")
    else:   # encode, evaluate, ...: no --resume (their outputs are written whole or not at all)
        _echo(f"{how}; rerun the command to start again")
    sys.unraisablehook = _quiet_after_interrupt
    sys.exit(143 if isinstance(e, Terminated) else 130)


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
    import re
    keys = {"data.split.column": "--split-column", "data.split.test": "--test", "data.split": "--split-column/--test",
            "data.path": data, "data.source": data,
            "data.features": "--features", "data.labels": "--labels", "data.ids": "--ids"}
    # whole keys only: not inside a path, a file name or a quoted array name ('data.labels.npy')
    pattern = re.compile(r"(?<![\w./'\"-])(" + "|".join(map(re.escape, keys)) + r")(?![\w'\"-]|\.\w)")

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except InputError as e:
                msg = str(e).replace(" (a config's relative paths are read from its folder)", "") \
                    .replace("set data.root or METRICPIPE_DATA", "set METRICPIPE_DATA")   # no data.root here
                e.args = (pattern.sub(lambda m: keys[m.group(1)], msg),)
                raise   # the same error (and traceback, with --verbose), in this command's words
        return wrapper
    return decorate


def _on_sigterm(signum, frame):
    TERMINATING.set()   # checked again at every gathered task, should this exception be swallowed
    raise Terminated()


VERBOSE_HELP = "Show tracebacks and debug logging."
LOG_ENV = "DASK_LOGGING__DISTRIBUTED"
_log_env_set_here = False   # whether LOG_ENV is ours to change (a user's own setting is kept)


def _set_verbosity(verbose: bool) -> None:
    """Our own one-line messages say what failed; Dask's per-task logs are for --verbose. Set through
    the environment so that worker processes started from here inherit it."""
    global _log_env_set_here
    level = "info" if verbose else "error"
    if LOG_ENV not in os.environ or _log_env_set_here:
        os.environ[LOG_ENV] = level
        _log_env_set_here = True
    if "dask" in sys.modules:   # else the command sets it (_dask_verbosity), once dask is imported
        _dask_verbosity(verbose)


def _dask_verbosity(verbose: bool) -> None:
    """The level in this process, over a user's DASK_LOGGING__DISTRIBUTED (which the workers keep);
    imported here, inside the command's handler, so a Ctrl-C during the import gets the hint."""
    import dask
    level = "info" if verbose else "error"
    # distributed's own config gives its client logger a level of its own (warning), applied when
    # distributed is imported: without -v its "Couldn't gather 1 keys, rescheduling" reached the terminal
    levels = {**dask.config.get("logging", {}), "distributed": level, "distributed.client": level}
    dask.config.set({"logging": levels})
    for name in ("distributed", "distributed.client"):   # and now, when distributed is already imported
        logging.getLogger(name).setLevel(level.upper())


def _verbose_after_command(ctx, param, value):
    """``metricpipe run X.yaml --verbose`` does what ``metricpipe --verbose run X.yaml`` does."""
    if value:
        ctx.find_root().params["verbose"] = True
        _set_verbosity(True)


class _Group(click.Group):
    """Every subcommand also takes --verbose/-v (after its name, where people type it)."""

    def add_command(self, cmd, name=None):
        if not any(p.name == "verbose" for p in cmd.params):
            cmd.params.append(click.Option(["--verbose", "-v"], is_flag=True, expose_value=False, is_eager=True,
                                           callback=_verbose_after_command, help=VERBOSE_HELP))
        super().add_command(cmd, name)

    def parse_args(self, ctx, args):
        """Any argument with a NUL byte is refused before click reads it (click.Path's stat, and every
        file function after it, raises ValueError on one): one place for every command."""
        for i, a in enumerate(args):
            if "\0" in a:
                opt, eq, value = a.partition("=")
                name = opt if eq and opt.startswith("-") else args[i - 1] if i and args[i - 1].startswith("--") \
                    else f"metricpipe {args[0]}"
                from metricpipe.config import ConfigError, check_no_nul
                try:
                    check_no_nul(value if eq and opt.startswith("-") else a, name)
                except ConfigError as e:
                    _echo(f"error: {e}")
                    sys.exit(EXIT_INPUT)
        return super().parse_args(ctx, args)


@click.group(cls=_Group)
@click.option("--verbose", "-v", is_flag=True, help=VERBOSE_HELP)
@click.version_option(version=__version__, prog_name="metricpipe")   # the code's, not an editable install's stale metadata
def main(verbose):
    """metricpipe: supervised compact codes for image descriptors, on Dask."""
    import signal
    signal.signal(signal.SIGTERM, _on_sigterm)
    _set_verbosity(verbose)


def _cluster_options(f=None, *, config: bool = False):
    """--cluster, --workers and --memory-limit; ``config=True`` for a command that reads a config file."""
    if f is None:
        return lambda g: _cluster_options(g, config=config)
    over = " (overrides config)" if config else ""
    f = click.option("--cluster", help=f"local | tcp://HOST:PORT | tls://HOST:PORT | a cluster spec YAML{over}.")(f)
    f = click.option("--workers", type=click.IntRange(min=1), help=f"Number of workers{over}.")(f)
    f = click.option("--memory-limit", callback=_check_memory_limit,
                     help="Per-worker memory limit of a local cluster, e.g. 2GB.")(f)
    # kept in click's context for _apply, so that the commands' signatures stay as they are
    f = click.option("--wait-timeout", type=click.FloatRange(min=1), expose_value=False,
                     callback=lambda ctx, param, value: ctx.meta.__setitem__("wait_timeout", value),
                     help=f"Seconds to wait for a worker (none joined, or all gone) before stopping{over}.")(f)
    return f


def _check_memory_limit(ctx, param, value):
    """Refused by click before anything starts (as the config's memory_limit is when loaded)."""
    if value is None:
        return None
    try:   # read by click before the command's handler, and the config module imports scikit-learn
        from metricpipe.config import ConfigError, check_memory_limit
    except KeyboardInterrupt as e:
        _stop_interrupted(e)
    try:
        return check_memory_limit(value, "--memory-limit")
    except ConfigError as e:
        raise click.BadParameter(str(e).rsplit(": ", 1)[-1]) from None


def _apply(cfg: RunConfig, store, cluster, workers, memory_limit, repeats=None) -> RunConfig:
    from metricpipe.config import MAX_REPEATS, ConfigError, check_cluster, check_store_url
    if repeats is not None and repeats > MAX_REPEATS:   # (the config's bound: checked here, not on import)
        raise ConfigError(f"--repeats: must be <= {MAX_REPEATS} (every repeat trains every learned model again), "
                          f"got {repeats}")
    if store is not None:
        check_store_url(store, "--store")
    if cluster is not None:
        check_cluster(cluster, "--cluster")
    return cfg.from_command_line(store=store, cluster=cluster, workers=workers, memory_limit=memory_limit,
                                 wait_timeout=click.get_current_context().meta.get("wait_timeout"),
                                 repeats=repeats)


_repeats_option = click.option("--repeats", type=click.IntRange(min=1),
                               help="Train every learned model with N seeds and validation carves; the report "
                                    "gives mean +/- sd and a paired verdict (overrides config's repeats).")


@main.command()
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--store", help="Store directory or fsspec URL (overrides config).")
@_cluster_options(config=True)
@click.option("--resume/--no-resume", default=True, show_default=True,
              help="Reuse committed, intact stages whose inputs match, or recompute everything.")
@click.option("--force", type=click.Choice(list(STAGES)), help="Recompute this stage and every stage after it.")
@click.option("--repair", is_flag=True, help="Recompute committed results whose files fail verification "
                                             "(default: stop with an error naming the damaged file).")
@click.option("--performance-report", type=click.Path(dir_okay=False), help="Write Dask's HTML performance report.")
@click.option("--verify-source", is_flag=True, help="Key the staged data by the source files' bytes (a full "
                                                    "read), not their paths, sizes and mtimes: a moved or touched "
                                                    "copy is then reused (data.verify_source).")
@_repeats_option
@handle_errors
def run(config, store, cluster, workers, memory_limit, resume, force, repair, performance_report, verify_source,
        repeats):
    """Run the whole pipeline described by CONFIG (YAML)."""
    from dataclasses import replace

    from metricpipe.config import load_config
    from metricpipe.runner import run_pipeline

    cfg = _apply(load_config(config), store, cluster, workers, memory_limit, repeats)
    if performance_report:   # written when the run ends: a path it cannot take is refused now
        from metricpipe.export import check_out
        d = cfg.data
        check_out(performance_report, "--performance-report", None, store=cfg.store,
                  inputs=((config, "CONFIG"), (d.path, "data.path"), (d.labels, "data.labels"), (d.pairs, "data.pairs"),
                          *([(cfg.cluster, "cluster")] if cfg.cluster.endswith((".yaml", ".yml")) else [])))
    if verify_source:
        cfg = replace(cfg, data=replace(cfg.data, verify_source=True))
    run_pipeline(cfg, resume=resume, log=_echo, performance_report=performance_report, force=force, repair=repair,
                 terminal=sys.stderr.isatty(), result=click.echo)   # progress on stderr, the results on stdout


@main.command()
@click.option("--store", default="runs/digits", show_default=True, help="Where to write the demo's store.")
@click.option("--resume/--no-resume", default=True, show_default=True,
              help="Reuse finished units (a second demo, or one interrupted), as run does; --no-resume recomputes.")
@click.option("--repair", is_flag=True, help="Recompute units whose files differ from their commit, as run --repair.")
@_cluster_options(config=True)
@_repeats_option
@handle_errors
def demo(store, resume, repair, cluster, workers, memory_limit, repeats):
    """Run examples/digits.yaml: scikit-learn's digits on a LocalCluster and a local store."""
    from metricpipe.config import load_config
    from metricpipe.runner import run_pipeline

    cfg = _apply(load_config(demo_config_path()), store, cluster, workers, memory_limit, repeats)
    run_pipeline(cfg, resume=resume, repair=repair, log=_echo, terminal=sys.stderr.isatty(), result=click.echo)


def demo_config_path() -> Path:
    from importlib.resources import files
    p = files("metricpipe.examples") / "digits.yaml"   # examples/ ships as metricpipe.examples
    if p.is_file():
        return Path(str(p))
    raise InputError("examples/digits.yaml is missing from this installation; reinstall metricpipe")


@main.command("stage")
@click.argument("source")
@click.option("--store", required=True, help="Store directory or fsspec URL.")
@click.option("--features", default="X", show_default=True, help="Array name inside npz/h5/zarr, or column of a Parquet file.")
@click.option("--labels", default="y", show_default=True, help="Label array name, or a .npy path.")
@click.option("--normalize", default="none", show_default=True, type=click.Choice(["none", "l1", "l2", "power"]))
@click.option("--test", "test_fraction", default=None, type=float,
              help="Stratified test fraction (default 0.2; a source with its own split keeps it).")
@click.option("--split-column", help="Array of train/test/val/negatives strings instead of a random split.")
@_cluster_options
@handle_errors
@in_options("SOURCE")
def stage_cmd(source, store, features, labels, normalize, test_fraction, split_column, cluster, workers,
              memory_limit):
    """Stage SOURCE (a path, or digits | fashion-mnist | synthetic) into the store, alone."""
    from metricpipe.cluster import connect, dashboard_lines
    from metricpipe.config import parse_config
    from metricpipe.context import StageContext
    from metricpipe.runner import removed_if_refused
    from metricpipe.stages import prepare_data, run_stage
    from metricpipe.store import Store

    split = {"column": split_column} if split_column else {}    # both given: the config refuses the pair
    data = {"features": features, "labels": labels, "normalize": normalize,
            "split": split if test_fraction is None else {**split, "test": test_fraction}}
    data["source" if source in ("digits", "fashion-mnist", "synthetic") else "path"] = source
    cfg = _apply(parse_config({"data": data}, where="metricpipe stage", base_dir=Path.cwd()), store, cluster,
                 workers, memory_limit)
    st = Store(cfg.store)
    with removed_if_refused(st), st.lock("metricpipe stage"):
        plan = prepare_data(cfg, st)     # bad input is refused before a cluster starts
        with connect(cfg.cluster, cfg.workers, cfg.threads_per_worker, cfg.memory_limit, cfg.dashboard,
                     cfg.tls, cfg.wait_timeout) as client:
            for line in dashboard_lines(client):
                _echo(line)
            ctx = StageContext(client, st, cfg, log=_echo, terminal=sys.stderr.isatty())
            with ctx.stage_progress("stage"):
                info = run_stage(ctx, plan)
    _echo(f"Staged {info.n_samples} x {info.n_features} into {info.unit.url}")


@main.command()
@click.option("--samples", type=click.IntRange(min=4), required=True, help="Rows N.")
@click.option("--dim", type=click.IntRange(min=1), required=True, help="Features D.")
@click.option("--classes", type=click.IntRange(min=2), default=10, show_default=True)
@click.option("--store", required=True, type=click.Path(), help="The Zarr store to create (e.g. synth.zarr).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--nonnegative", is_flag=True, help="Clip at 0 (ReLU-like features, e.g. for NML).")
@click.option("--separation", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="Scale of the class signal against unit noise (lower is harder).")
@click.option("--nuisance", type=click.FloatRange(min=0), default=1.7, show_default=True,
              help="Standard deviation along the D // 16 class-free directions (0 = none; higher is harder "
                   "for raw features and PCA, not for a learned projection).")
@click.option("--chunk-mb", type=click.FloatRange(min=0.001), default=64.0, show_default=True)
@_cluster_options
@handle_errors
def synth(samples, dim, classes, store, seed, nonnegative, separation, nuisance, chunk_mb, cluster, workers,
          memory_limit):
    """Write N x D class-structured synthetic features (X, y) as a Zarr store, blockwise on the workers;
    use it with data: {path: STORE}."""
    from metricpipe.cluster import connect, dashboard_lines
    from metricpipe.config import parse_config
    from metricpipe.synth import check_args, write_synthetic

    check_args(store, samples, dim, classes)
    cfg = _apply(parse_config({"data": {"source": "digits"}}, where="metricpipe synth"), None, cluster, workers,
                 memory_limit)
    with connect(cfg.cluster, cfg.workers, cfg.threads_per_worker, cfg.memory_limit, cfg.dashboard, cfg.tls,
                 cfg.wait_timeout) as client:
        for line in dashboard_lines(client):
            _echo(line)
        write_synthetic(client, store, samples, dim, classes, seed, nonnegative, chunk_mb, log=_echo,
                        separation=separation, nuisance=nuisance)


@main.command()
@click.argument("store")
@click.option("--verify", is_flag=True, help="Check every committed file against its checksum; exit 1 when "
                                             "any is missing or corrupt.")
@handle_errors
def inspect(store, verify):
    """Show what STORE holds: units, arrays, shapes, chunking and the inputs they were made from."""
    from metricpipe.store.describe import describe, verify_store

    if not verify:
        click.echo(describe(store))
        return
    checked, problems = verify_store(store)
    for p in problems:
        click.echo(f"DAMAGED {p}")
    click.echo(f"{checked} committed units checked; {len(problems)} problem(s)"
               + ("; 'metricpipe run CONFIG --repair' recomputes those of CONFIG's run (its models, selection "
                  "candidates included)" if problems else ""))
    if problems:
        sys.exit(1)


@main.command()
@click.argument("store")
@handle_errors
def unlock(store):
    """Remove the lock a killed run left on STORE on object storage (a local store's needs no clearing)."""
    from metricpipe.store import Store

    st = Store(store)
    if st.local:   # a mistyped path: "no such store", as every other command says (on object storage a
        st.check_exists()   # store whose only object was its lock has no prefix left once it is cleared)
    _echo(st.unlock())


def _in_use(st) -> str | None:
    """Who holds a local store's lock (None: nobody), found by taking it for an instant."""
    if not st.local or not os.path.exists(f"{st.root}/.lock"):   # no lock file: no run has held it
        return None
    try:
        with st.lock("metricpipe gc (listing)", tries=1):
            return None
    except InputError:
        return st.holder()
    except OSError:   # a store we may only read: no telling, and listing must not fail
        return None


@main.command()
@click.argument("store")
@click.option("--delete", is_flag=True, help="Remove the units listed (without it, gc only lists them).")
@handle_errors
def gc(store, delete):
    """List the units of STORE that its last run did not use (earlier configs' results, what killed
    runs left), with their sizes; --delete removes them.

    Kept: every unit runs/latest.json names, the candidates of its parameter selections, the models
    add-classes made from its models, the shuffled copies of its data, and every unit committed after
    it started (a run that did not finish: its --resume reuses them)."""
    from metricpipe.progress import human_bytes
    from metricpipe.store.gc import unused_units
    from metricpipe.store import Store

    st = Store(store)
    _, found, later = unused_units(st)   # refuses a store without a finished run before taking its lock
    kept = (f"; kept {later} unit{'s' if later != 1 else ''} committed after the last finished run started (a run "
            f"that did not finish, or add-classes: --resume reuses them)") if later else ""
    if not found:
        click.echo(f"{st.url}: nothing to remove: every other unit is used by the last run{kept}")
        return
    if not delete:
        busy = _in_use(st)   # a run under way: its unfinished units are being written, not left
        for unit, why, size in found:
            if busy and why.startswith("unfinished"):
                why = f"unfinished (the store is in use: {busy}; it may be writing it)"
            click.echo(f"{unit.rel:<30} {human_bytes(size):>9}  {why}")
        click.echo(f"{len(found)} unit{'s' if len(found) != 1 else ''}, {human_bytes(sum(s for _, _, s in found))}, not used by "
                   f"the last run; 'metricpipe gc {shlex.quote(store)} --delete' removes them{kept}")
        return
    st.check_writable()
    with st.lock("metricpipe gc"):
        _, found, later = unused_units(st)   # again under the lock: a run may have finished meanwhile
        for unit, why, size in found:
            unit.remove()
            click.echo(f"removed {unit.rel:<30} {human_bytes(size):>9}  {why}")
    click.echo(f"removed {len(found)} unit{'s' if len(found) != 1 else ''}, {human_bytes(sum(s for _, _, s in found))}{kept}")


@main.command()
@click.argument("store")
@handle_errors
def models(store):
    """List STORE's trained models: key, method, code dimension, whether its run encoded it, the
    staged data it was trained on (key prefix) and its normalisation, and parameters.

    In Python, ``metricpipe.load_model(STORE, KEY)`` returns one as a fitted estimator (in a Pipeline
    after the run's normalizer when it had one)."""
    from metricpipe.store.models import damaged_models, describe
    from metricpipe.tasks.registry import param_text

    rows = describe(store)
    damaged = damaged_models(store)
    if damaged:   # said first: a listing without them reads as if they never existed
        click.echo(f"{store}: {len(damaged)} model(s) with a damaged commit marker, not listed: "
                   f"{', '.join(damaged)}; `metricpipe inspect --verify {store}` lists every problem and "
                   f"`metricpipe run CONFIG --repair` recomputes them", err=True)
    if not rows:
        click.echo(f"{store}: no committed models")
        return
    click.echo(f"{'key':<16}  {'method':<10} {'codes':>5}  {'encoded':<7}  {'data':<8}  {'normalize':<9}  parameters")
    for r in rows:
        # random_state None is seed 0 (the one spelling keys use for both): shown as the seed it is
        params = " ".join(f"{k}={param_text(0 if k == 'random_state' and v is None else v)}"
                          for k, v in sorted(r["params"].items()))
        ext = f" (extends {r['extends']})" if r["extends"] else f" (refit of {r['refit_of']})" if r["refit_of"] else ""
        click.echo(f"{r['key']:<16}  {r['method']:<10} {r['dim']:>5}  {'yes' if r['encoded'] else 'no':<7}  "
                   f"{(r['data'] or '-')[:8]:<8}  {r['normalize'] or '-':<9}  {params}{ext}")
    if not all(r["encoded"] for r in rows):
        click.echo("encoded no: a candidate that parameter selection did not keep (or a fit on the train rows less "
                   "the validation rows, which its refit replaced), or a model made by add-classes; "
                   "load_model, encode and export --npz take any model, predict's kNN and export --faiss an "
                   "encoded one")


@main.command()
@click.argument("store")
@handle_errors
def report(store):
    """Rebuild STORE/report from the stored results of the last run."""
    from metricpipe.report import build_report, read_summary, winner_lines
    from metricpipe.store import Store

    st = Store(store)
    st.check_exists()
    st.check_writable()
    manifest = st.last_run()
    click.echo(f"Report: {build_report(st, manifest)}")   # results on stdout, as run writes them
    for line in winner_lines(read_summary(st)):
        click.echo(line)


@main.command("add-classes")
@click.argument("store")
@click.argument("new_data", type=click.Path(exists=False))
@click.option("--features", default="X", show_default=True, help="Array name inside npz/h5/zarr, or column of a Parquet file.")
@click.option("--labels", default="y", show_default=True, help="Label array name, or a .npy path.")
@click.option("--model", help="Extend only the model whose key starts with this (default: every NCM model).")
@click.option("--hierarchy", type=click.Path(dir_okay=False), help="YAML map class: parent (zero-shot prior, Eq. 33).")
@click.option("--prior-weight", default=0.0, show_default=True, type=click.FloatRange(min=0),
              help="m of Eq. 34: weight of the zero-shot prior against the sample mean.")
@click.option("--zero-shot", multiple=True, help="A class with no images, placed by the hierarchy alone.")
@handle_errors
@in_options("NEW_DATA")
def add_classes_cmd(store, new_data, features, labels, model, hierarchy, prior_weight, zero_shot):
    """Add the classes of NEW_DATA to STORE's NCMML/NCMC models without retraining W."""
    from metricpipe.classes import add_classes
    from metricpipe.store import Store

    st = Store(store)
    st.check_exists()
    st.check_writable()
    with st.lock("metricpipe add-classes"):
        add_classes(store, new_data, features, labels, model, hierarchy, prior_weight, zero_shot, log=_echo)


@main.command()
@click.argument("embeddings", type=click.Path(exists=False))
@click.option("--labels", default="y", show_default=True, help="Label array or column name inside the file, or a .npy path.")
@click.option("--features", default="X", show_default=True, help="Embedding array (npz/h5/zarr) or list column (parquet).")
@click.option("--queries", help="N: a seeded, class-stratified sample of N rows queries all; or a FILE of queries.")
@click.option("--reference", type=click.Path(exists=False), help="A FILE of references the EMBEDDINGS query.")
@click.option("--query-labels", help="Labels of --queries FILE (default: --labels when it is a name).")
@click.option("--reference-labels", help="Labels of --reference FILE (default: --labels when it is a name).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Query sample and k-means seed.")
@click.option("--out", type=click.Path(dir_okay=False), help="Write the metric records (JSON) here.")
@_cluster_options
@handle_errors
def evaluate(embeddings, labels, features, queries, reference, query_labels, reference_labels, seed, out, cluster,
             workers, memory_limit):
    """MAP@R, R-precision, precision@1, MRR, NMI and AMI of EMBEDDINGS (npy, npz, h5, zarr, parquet) as
    pytorch-metric-learning's AccuracyCalculator defines them, out of core on the cluster."""
    import time

    from metricpipe.assess import evaluate_embeddings, plan_sides, write_records
    from metricpipe.budget import limit_name
    from metricpipe.cluster import connect, dashboard_lines
    from metricpipe.config import parse_config
    from metricpipe.runner import peak_rss

    if out:
        from metricpipe.export import check_out
        check_out(out, "--out", None, inputs=((embeddings, "EMBEDDINGS"), (queries, "--queries"),
                                              (reference, "--reference"), (labels, "--labels"),
                                              (query_labels, "--query-labels"), (reference_labels, "--reference-labels")))
    q, rows, ref, self_in = plan_sides(embeddings, features, labels, queries, reference, query_labels,
                                       reference_labels, seed)
    cfg = _apply(parse_config({"data": {"source": "digits"}}, where="metricpipe evaluate"), None, cluster, workers,
                 memory_limit)
    with connect(cfg.cluster, cfg.workers, cfg.threads_per_worker, cfg.memory_limit, cfg.dashboard, cfg.tls,
                 cfg.wait_timeout) as client:
        for line in dashboard_lines(client):
            _echo(line)
        t0 = time.perf_counter()
        records = evaluate_embeddings(client, q, rows, ref, self_in, seed, log=_echo,
                                      limit_setting="--memory-limit" if cfg.cluster == "local" else limit_name(cfg))
        seconds = time.perf_counter() - t0
        peaks = peak_rss(client)
    if out:
        write_records(out, records)
    for r in records:
        click.echo(f"{r['metric']:<12} {r['value']:.6f}")
    _echo(f"evaluated in {seconds:.1f} s; peak RSS: " + ", ".join(f"{who} {mb:,.0f} MB" for who, mb in peaks)
          + (f"; records in {out}" if out else ""))


@main.command()
@click.argument("store")
@click.argument("data", type=click.Path(exists=False))
@click.option("--model", required=True, help="Key (or key prefix) of a model in STORE (`metricpipe models STORE`).")
@click.option("--features", default="X", show_default=True, help="Array name inside npz/h5/zarr, or column of a Parquet file.")
@click.option("--labels", default=None,
              help="Label array name (default: y when DATA has it) or .npy path: also print the top-1 error.")
@click.option("--k", "k", type=click.IntRange(min=1), default=None,
              help="Classify by the k nearest train codes (default for models without class means: 10).")
@click.option("--out", type=click.Path(dir_okay=False), help="Write the predicted labels (.npy).")
@handle_errors
@in_options("DATA")
def predict(store, data, model, features, labels, k, out):
    """Classify the rows of DATA (a path, or digits | fashion-mnist) with a model of STORE: nearest class
    mean for NCMML/NCMC models, else the majority of the k nearest train codes of the model's run."""
    import numpy as np

    from metricpipe.classes import predict as run_predict
    from metricpipe.export import check_out, written_whole

    if out:
        check_out(out, "--out", (".npy",), inputs=((data, "DATA"), (labels, "--labels")), store=store)
    names, error, unknown = run_predict(store, model, data, features, labels, k)
    if out:  # written whole or not at all
        try:
            with written_whole(out) as tmp:
                np.save(tmp, names)
        except OSError as e:
            raise InputError(f"{out}: cannot write the predictions (--out): {e.strerror or e}") from None
    notes = ([] if labels else ["against DATA's y"]) + ([f"{unknown} rows whose label is not a class of the model "
                                                          f"count as errors"] if unknown else [])
    against = f" ({'; '.join(notes)})" if notes else ""
    if error is not None:
        scored = f"; top-1 error {error:.4f}{against}"
    else:
        scored = ("; no top-1 error: none of DATA's y is a class of the model (give --labels to score against "
                  "another array)") if unknown else ""
    _echo(f"{len(names)} rows classified{scored}" + (f"; predictions in {out}" if out else ""))


@main.command()
@click.argument("store")
@click.argument("data", type=click.Path(exists=False))
@click.option("--model", required=True, help="Key (or key prefix) of a model in STORE (`metricpipe models STORE`).")
@click.option("--out", required=True, type=click.Path(), help="Codes file: .npy, .npz (X, y, ids), .zarr (X, y, "
                                                              "ids) or .parquet (id, label, code columns); y / label "
                                                              "when DATA has labels, ids / id with --ids.")
@click.option("--features", default="X", show_default=True, help="Array name inside npz/h5/zarr, or column of a Parquet file.")
@click.option("--labels", default=None, help="Label array name (default: y when DATA has it) or .npy path.")
@click.option("--ids", default=None, help="Array of row ids to carry into the output.")
@_cluster_options
@handle_errors
@in_options("DATA")
def encode(store, data, model, out, features, labels, ids, cluster, workers, memory_limit):
    """Encode every row of DATA (a path, or digits | fashion-mnist) with a model of STORE, normalised as
    in training; on the cluster when DATA is large or --cluster is given."""
    from metricpipe.cluster import connect
    from metricpipe.config import parse_config
    from metricpipe.export import encode as run_encode

    cfg = _apply(parse_config({"data": {"source": "digits"}}, where="metricpipe encode"), None, cluster, workers,
                 memory_limit)

    def client():
        return connect(cfg.cluster, cfg.workers, cfg.threads_per_worker, cfg.memory_limit, cfg.dashboard, cfg.tls,
                       cfg.wait_timeout)

    r = run_encode(store, model, data, out, features, labels, ids, client, cluster_given=cluster is not None,
                   log=_echo)
    cols = [c for c in ("labels", "ids") if r[c]]
    _echo(f"Encoded {r['rows']:,} rows with model {r['model']} ({r['method']}, {r['dim']} dimensions) into {out}"
          + (f" with {' and '.join(cols)}" if cols and not out.lower().endswith(".npy") else ""))


@main.command()
@click.argument("store")
@click.option("--model", required=True, help="Key (or key prefix) of a model in STORE (`metricpipe models STORE`).")
@click.option("--faiss", "faiss_path", type=click.Path(dir_okay=False),
              help="Write the SPLIT rows' codes as a faiss index (ids: rows of the staged data).")
@click.option("--split", default="test", show_default=True, type=click.Choice(["test", "train", "val", "all"]),
              help="Which rows go into the faiss index (test: the database the run's retrieval searched).")
@click.option("--npz", "npz_path", type=click.Path(dir_okay=False),
              help="Write the model as plain arrays + model_json (apply it with numpy: see the README).")
@handle_errors
def export(store, model, faiss_path, split, npz_path):
    """Export a model of STORE: its codes as a faiss index, or the model as arrays usable without metricpipe."""
    from metricpipe.export import check_out, export_faiss, export_npz

    if not faiss_path and not npz_path:
        raise InputError("metricpipe export: nothing to write; give --faiss PATH and/or --npz PATH")
    for p, opt, formats in ((faiss_path, "--faiss", (".faiss", ".index")), (npz_path, "--npz", (".npz",))):
        if p:
            check_out(p, opt, formats, store=store)
    if faiss_path:
        r = export_faiss(store, model, faiss_path, split)
        _echo(f"faiss index ({r['index']}, {r['metric']}) of {r['rows']:,} {split} codes of model {r['model']} "
              f"in {faiss_path}")
    if npz_path:
        r = export_npz(store, model, npz_path)
        _echo(f"model {r['model']} ({r['method']}: {r['kind']}, arrays {', '.join(r['arrays']) or 'none'}) "
              f"in {npz_path}")


if __name__ == "__main__":
    main()
