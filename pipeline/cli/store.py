"""The commands that look after a store: inspect, models, report, gc and unlock."""

import os
import shlex
import sys

import click

from metricpipe.cli.errors import echo, handle_errors
from metricpipe.cli.options import example
from metricpipe.progress import human_bytes
from metricpipe.tasks.errors import InputError


@click.command(epilog=example("metricpipe inspect runs/digits --verify"))
@click.argument("store")
@click.option(
    "--verify",
    is_flag=True,
    help="Check every committed file against its checksum; exit 1 when any is missing or corrupt.",
)
@handle_errors
def inspect(store, verify):
    """Show what STORE holds: units, arrays, shapes, chunking and the inputs they were made from."""
    from metricpipe.store.describe import describe, verify_store  # deferred: loads Zarr

    if not verify:
        click.echo(describe(store))
        return
    checked, problems = verify_store(store)
    for p in problems:
        click.echo(f"DAMAGED {p}")
    click.echo(
        f"{checked} committed units checked; {len(problems)} problem(s)"
        + (
            "; 'metricpipe run CONFIG --repair' recomputes those of CONFIG's run (its models, selection "
            "candidates included)"
            if problems
            else ""
        )
    )
    if problems:
        sys.exit(1)


@click.command(epilog=example("metricpipe unlock s3://bucket/runs/fashion"))
@click.argument("store")
@handle_errors
def unlock(store):
    """Remove the lock a killed run left on STORE on object storage (a local store's needs no clearing)."""
    from metricpipe.store import Store  # deferred: loads Zarr

    st = Store(store)
    if st.local:  # a mistyped path: "no such store", as every other command says (on object storage a
        st.check_exists()  # store whose only object was its lock has no prefix left once it is cleared)
    echo(st.unlock())


def _in_use(st) -> str | None:
    """Who holds a local store's lock (None: nobody), found by taking it for an instant."""
    if not st.local or not os.path.exists(f"{st.root}/.lock"):  # no lock file: no run has held it
        return None
    try:
        with st.lock("metricpipe gc (listing)", tries=1):
            return None
    except InputError:
        return st.holder()
    except OSError:  # a store we may only read: no telling, and listing must not fail
        return None


@click.command(epilog=example("metricpipe gc runs/digits", "metricpipe gc runs/digits --delete"))
@click.argument("store")
@click.option("--delete", is_flag=True, help="Remove the units listed (without it, gc only lists them).")
@handle_errors
def gc(store, delete):
    """List the units of STORE that its last run did not use (earlier configs' results, what killed
    runs left), with their sizes; --delete removes them.

    Kept: every unit runs/latest.json names, the candidates of its parameter selections, the models
    add-classes made from its models, the shuffled copies of its data, and every unit committed after
    it started (a run that did not finish: its --resume reuses them)."""
    from metricpipe.commands.gc import unused_units  # deferred: loads Zarr
    from metricpipe.store import Store  # deferred: loads Zarr

    st = Store(store)
    _, found, later = unused_units(st)  # refuses a store without a finished run before taking its lock
    kept = (
        (
            f"; kept {later} unit{'s' if later != 1 else ''} committed after the last finished run started (a run "
            f"that did not finish, or add-classes: --resume reuses them)"
        )
        if later
        else ""
    )
    if not found:
        click.echo(f"{st.url}: nothing to remove: every other unit is used by the last run{kept}")
        return
    if not delete:
        busy = _in_use(st)  # a run under way: its unfinished units are being written, not left
        for unit, why, size in found:
            if busy and why.startswith("unfinished"):
                why = f"unfinished (the store is in use: {busy}; it may be writing it)"
            click.echo(f"{unit.rel:<30} {human_bytes(size):>9}  {why}")
        click.echo(
            f"{len(found)} unit{'s' if len(found) != 1 else ''}, {human_bytes(sum(s for _, _, s in found))}, "
            f"not used by the last run; 'metricpipe gc {shlex.quote(store)} --delete' removes them{kept}"
        )
        return
    st.check_writable()
    with st.lock("metricpipe gc"):
        _, found, later = unused_units(st)  # again under the lock: a run may have finished meanwhile
        for unit, why, size in found:
            unit.remove()
            click.echo(f"removed {unit.rel:<30} {human_bytes(size):>9}  {why}")
    click.echo(
        f"removed {len(found)} unit{'s' if len(found) != 1 else ''}, {human_bytes(sum(s for _, _, s in found))}{kept}"
    )


@click.command(epilog=example("metricpipe models runs/digits"))
@click.argument("store")
@handle_errors
def models(store):
    """List STORE's trained models: key, method, code dimension, whether its run encoded it, the
    staged data it was trained on (key prefix) and its normalisation, the last run's headline metrics
    (from STORE/report), and parameters; a model add-classes made names the model it extends and the
    classes it added.

    In Python, metricpipe.load_model(STORE, KEY) returns one as a fitted estimator (in a Pipeline
    after the run's normalizer when it had one)."""
    from metricpipe.report import model_headlines  # deferred: loads scikit-learn and Zarr
    from metricpipe.store import Store  # deferred: loads Zarr
    from metricpipe.store.models import damaged_models, describe  # deferred: loads Zarr

    rows = describe(store)
    damaged = damaged_models(store)
    if damaged:  # said first: a listing without them reads as if they never existed
        click.echo(
            f"{store}: {len(damaged)} model(s) with a damaged commit marker, not listed: "
            f"{', '.join(damaged)}; `metricpipe inspect --verify {store}` lists every problem and "
            f"`metricpipe run CONFIG --repair` recomputes them",
            err=True,
        )
    if not rows:
        click.echo(f"{store}: no committed models")
        return
    names, values = model_headlines(Store(store))
    widths = [max(6, len(n)) for n in names]
    metrics = "".join(f"{n:>{w}}  " for n, w in zip(names, widths))
    click.echo(
        f"{'key':<16}  {'method':<10} {'codes':>5}  {'encoded':<7}  {'data':<8}  {'normalize':<9}  {metrics}parameters"
    )
    for r in rows:
        shown = values.get(r["key"], [None] * len(names))
        metrics = "".join("-".rjust(w) + "  " if v is None else f"{v:>{w}.4f}  " for v, w in zip(shown, widths))
        click.echo(
            f"{r['key']:<16}  {r['method']:<10} {r['dim']:>5}  {'yes' if r['encoded'] else 'no':<7}  "
            f"{(r['data'] or '-')[:8]:<8}  {r['normalize'] or '-':<9}  {metrics}{_parameters(r)}"
        )
    if names:
        click.echo(f"{', '.join(names)}: the last run's test figures (report/index.html defines them); - : not scored")
    if not all(r["encoded"] for r in rows):
        click.echo(
            "encoded no: a candidate that parameter selection did not keep (or a fit on the train rows less "
            "the validation rows, which its refit replaced), or a model made by add-classes; "
            "load_model, encode and export --npz take any model, predict's kNN and export --faiss an "
            "encoded one"
        )


def _parameters(row: dict) -> str:
    """A model's parameters, then what it was made from: the model and the classes add-classes added to
    it, or the fit a refit replaced."""
    from metricpipe.tasks.registry import param_text  # deferred: loads scikit-learn

    # random_state None is seed 0 (the one spelling keys use for both): shown as the seed it is
    params = " ".join(
        f"{k}={param_text(0 if k == 'random_state' and v is None else v)}" for k, v in sorted(row["params"].items())
    )
    if row["extends"]:
        added = ", ".join(param_text(c) for c in row["added"])
        return f"{params} (add-classes: {row['extends']} + {len(row['added'])} class(es): {added})"
    return f"{params} (refit of {row['refit_of']})" if row["refit_of"] else params


@click.command(epilog=example("metricpipe report runs/digits"))
@click.argument("store")
@handle_errors
def report(store):
    """Rebuild STORE/report from the stored results of the last run."""
    from metricpipe.report import build_report, read_summary, winner_lines  # deferred: loads scikit-learn and Zarr
    from metricpipe.store import Store  # deferred: loads Zarr

    st = Store(store)
    st.check_exists()
    st.check_writable()
    manifest = st.last_run()
    click.echo(f"Report: {build_report(st, manifest)}")  # results on stdout, as run writes them
    for line in winner_lines(read_summary(st)):
        click.echo(line)
