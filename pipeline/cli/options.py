"""The options several commands share: where to run (--cluster, --workers, --memory-limit,
--wait-timeout), --repeats, and how they override a config."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from metricpipe.cli.errors import stop_interrupted

if TYPE_CHECKING:
    from metricpipe.config import RunConfig


#: The --model option's help where a command takes one model of a store.
MODEL_KEY_HELP = "Key (or key prefix) of a model in STORE (see 'metricpipe models STORE')."


def example(*commands: str) -> str:
    """A command's epilog: its examples, one a line, shown by --help as written (click's \\b)."""
    return "\b\nExample" + ("s" if len(commands) > 1 else "") + ":\n" + "\n".join(f"  {c}" for c in commands)


def cluster_options(f=None, *, config: bool = False):
    """--cluster, --workers and --memory-limit; ``config=True`` for a command that reads a config file."""
    if f is None:
        return lambda g: cluster_options(g, config=config)
    over = " (overrides config)" if config else ""
    f = click.option("--cluster", help=f"local | tcp://HOST:PORT | tls://HOST:PORT | a cluster spec YAML{over}.")(f)
    f = click.option("--workers", type=click.IntRange(min=1), help=f"Number of workers{over}.")(f)
    f = click.option(
        "--memory-limit", callback=_check_memory_limit, help="Per-worker memory limit of a local cluster, e.g. 2GB."
    )(f)
    # kept in click's context for apply_overrides, so that the commands' signatures stay as they are
    f = click.option(
        "--wait-timeout",
        type=click.FloatRange(min=1),
        expose_value=False,
        callback=lambda ctx, param, value: ctx.meta.__setitem__("wait_timeout", value),
        help=f"Seconds to wait for a worker (none joined, or all gone) before stopping{over}.",
    )(f)
    return f


def _check_memory_limit(ctx, param, value):
    """Refused by click before anything starts (as the config's memory_limit is when loaded)."""
    if value is None:
        return None
    try:  # read by click before the command's handler, and the config module imports scikit-learn
        from metricpipe.config import ConfigError, check_memory_limit  # deferred: loads scikit-learn
    except KeyboardInterrupt as e:
        stop_interrupted(e)
    try:
        return check_memory_limit(value, "--memory-limit")
    except ConfigError as e:
        raise click.BadParameter(str(e).rsplit(": ", 1)[-1]) from None


def apply_overrides(cfg: RunConfig, store, cluster, workers, memory_limit, repeats=None) -> RunConfig:
    """``cfg`` with the command line's --store, --cluster, --workers, --memory-limit, --wait-timeout and
    --repeats over the config's."""
    from metricpipe.config import MAX_REPEATS, ConfigError, check_cluster, check_store_url  # deferred: scikit-learn

    if repeats is not None and repeats > MAX_REPEATS:  # (the config's bound: checked here, not on import)
        raise ConfigError(
            f"--repeats: must be <= {MAX_REPEATS} (every repeat trains every learned model again), got {repeats}"
        )
    if store is not None:
        check_store_url(store, "--store")
    if cluster is not None:
        check_cluster(cluster, "--cluster")
    return cfg.from_command_line(
        store=store,
        cluster=cluster,
        workers=workers,
        memory_limit=memory_limit,
        wait_timeout=click.get_current_context().meta.get("wait_timeout"),
        repeats=repeats,
    )


repeats_option = click.option(
    "--repeats",
    type=click.IntRange(min=1),
    help="Train every learned model with N seeds and validation carves; the report "
    "gives mean +/- sd and a paired verdict (overrides config's repeats).",
)
