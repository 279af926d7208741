"""The ``metricpipe`` command. It parses arguments and hands off; errors become one line and exit 2.

Only click and the error types load with it: each command imports what it uses (the config, scikit-learn,
distributed) inside handle_errors, so ``--help`` is quick and a Ctrl-C during those imports gets the
one-line answer, not a traceback. ``main`` is the group; the commands live by what they work on: ``run``
(run, plan, demo, stage), ``store`` (inspect, models, report, gc, unlock), ``results`` (encode, export, predict,
evaluate, add-classes, synth); ``options`` holds the options they share, ``errors`` how a command ends."""

import signal
import sys

import click

from metricpipe import __version__
from metricpipe.cli import results, run, store
from metricpipe.cli.errors import EXIT_INPUT, echo, handle_errors, on_sigterm, set_verbosity

__all__ = ["handle_errors", "main"]

VERBOSE_HELP = "Show tracebacks and debug logging."


def _verbose_after_command(ctx, param, value):
    """``metricpipe run X.yaml --verbose`` does what ``metricpipe --verbose run X.yaml`` does."""
    if value:
        ctx.find_root().params["verbose"] = True
        set_verbosity(True)


class _Group(click.Group):
    """Every subcommand also takes --verbose/-v (after its name, where people type it)."""

    def add_command(self, cmd, name=None):
        if not any(p.name == "verbose" for p in cmd.params):
            cmd.params.append(
                click.Option(
                    ["--verbose", "-v"],
                    is_flag=True,
                    expose_value=False,
                    is_eager=True,
                    callback=_verbose_after_command,
                    help=VERBOSE_HELP,
                )
            )
        super().add_command(cmd, name)

    def parse_args(self, ctx, args):
        """Any argument with a NUL byte is refused before click reads it (click.Path's stat, and every
        file function after it, raises ValueError on one): one place for every command."""
        for i, a in enumerate(args):
            if "\0" in a:
                opt, eq, value = a.partition("=")
                name = (
                    opt
                    if eq and opt.startswith("-")
                    else args[i - 1]
                    if i and args[i - 1].startswith("--")
                    else f"metricpipe {args[0]}"
                )
                from metricpipe.config import ConfigError, check_no_nul  # deferred: loads scikit-learn

                try:
                    check_no_nul(value if eq and opt.startswith("-") else a, name)
                except ConfigError as e:
                    echo(f"error: {e}")
                    sys.exit(EXIT_INPUT)
        return super().parse_args(ctx, args)


@click.group(cls=_Group)
@click.option("--verbose", "-v", is_flag=True, help=VERBOSE_HELP)
@click.version_option(
    version=__version__, prog_name="metricpipe"
)  # the code's, not an editable install's stale metadata
def main(verbose):
    """metricpipe: supervised compact codes for image descriptors, on Dask."""
    signal.signal(signal.SIGTERM, on_sigterm)
    set_verbosity(verbose)


for command in (
    run.run,
    run.plan,
    run.demo,
    run.stage_cmd,
    store.inspect,
    store.models,
    store.report,
    store.gc,
    store.unlock,
    results.encode,
    results.export,
    results.predict,
    results.evaluate,
    results.add_classes_cmd,
    results.synth,
):
    main.add_command(command)
