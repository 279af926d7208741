"""The commands that run the pipeline: run (a config), demo (the digits example), stage (one source
into a store, alone)."""

import sys
from dataclasses import replace
from importlib.resources import files
from pathlib import Path

import click

from metricpipe.cli.errors import echo, handle_errors, in_options
from metricpipe.cli.options import apply_overrides, cluster_options, example, repeats_option
from metricpipe.errors import STAGES
from metricpipe.tasks.errors import InputError


@click.command(epilog=example("metricpipe run examples/digits.yaml --store /tmp/digits --workers 2"))
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--store", help="Store directory or fsspec URL (overrides config).")
@cluster_options(config=True)
@click.option(
    "--resume/--no-resume",
    default=True,
    show_default=True,
    help="Reuse committed, intact stages whose inputs match, or recompute everything.",
)
@click.option("--force", type=click.Choice(list(STAGES)), help="Recompute this stage and every stage after it.")
@click.option(
    "--repair",
    is_flag=True,
    help="Recompute committed results whose files fail verification "
    "(default: stop with an error naming the damaged file).",
)
@click.option("--performance-report", type=click.Path(dir_okay=False), help="Write Dask's HTML performance report.")
@click.option(
    "--verify-source",
    is_flag=True,
    help="Key the staged data by the source files' bytes (a full "
    "read), not their paths, sizes and mtimes: a moved or touched "
    "copy is then reused (data.verify_source).",
)
@repeats_option
@handle_errors
def run(
    config, store, cluster, workers, memory_limit, resume, force, repair, performance_report, verify_source, repeats
):
    """Run the whole pipeline described by CONFIG (YAML)."""
    from metricpipe.config import load_config  # deferred: loads scikit-learn
    from metricpipe.runner import run_pipeline  # deferred: loads Dask and scikit-learn

    cfg = apply_overrides(load_config(config), store, cluster, workers, memory_limit, repeats)
    if performance_report:  # written when the run ends: a path it cannot take is refused now
        from metricpipe.commands.export import check_out  # deferred: loads scikit-learn and Zarr

        d = cfg.data
        check_out(
            performance_report,
            "--performance-report",
            None,
            store=cfg.store,
            inputs=(
                (config, "CONFIG"),
                (d.path, "data.path"),
                (d.labels, "data.labels"),
                (d.pairs, "data.pairs"),
                *([(cfg.cluster, "cluster")] if cfg.cluster.endswith((".yaml", ".yml")) else []),
            ),
        )
    if verify_source:
        cfg = replace(cfg, data=replace(cfg.data, verify_source=True))
    run_pipeline(
        cfg,
        resume=resume,
        log=echo,
        performance_report=performance_report,
        force=force,
        repair=repair,
        terminal=sys.stderr.isatty(),
        result=click.echo,
    )  # progress on stderr, the results on stdout


@click.command(epilog=example("metricpipe plan examples/fashion-mnist-ncmml.yaml --workers 2"))
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--workers", type=click.IntRange(min=1), help="Number of workers the run will have (overrides config).")
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    help="G multiply-adds per second a task gets, to turn costs into time (default: a GEMM timed on one core "
    "now, times the share of a core the machine's load leaves).",
)
@repeats_option
@handle_errors
def plan(config, workers, rate, repeats):
    """List every model and selection candidate a run of CONFIG trains, with the time each takes, before any work.

    Reads the data's header and labels (nothing is staged, no cluster starts): each fit's cost comes
    from its learner's algorithm and the data's shape, in multiply-adds, turned into seconds by the
    rate a GEMM reaches on one core of this machine and the share of a core its load leaves a task.
    "at most": early stopping decides the steps, the most are counted; "unknown": the learner does
    not say.
    """
    from metricpipe.commands.plan import plan_lines  # deferred: loads scikit-learn and Zarr
    from metricpipe.config import load_config  # deferred: loads scikit-learn

    cfg = apply_overrides(load_config(config), None, None, workers, None, repeats)
    for line in plan_lines(cfg, None if rate is None else rate * 1e9, log=echo):
        click.echo(line)


@click.command(epilog=example("metricpipe demo --store /tmp/digits"))
@click.option("--store", default="runs/digits", show_default=True, help="Where to write the demo's store.")
@click.option(
    "--resume/--no-resume",
    default=True,
    show_default=True,
    help="Reuse finished units (a second demo, or one interrupted), as run does; --no-resume recomputes.",
)
@click.option("--repair", is_flag=True, help="Recompute units whose files differ from their commit, as run --repair.")
@cluster_options(config=True)
@repeats_option
@handle_errors
def demo(store, resume, repair, cluster, workers, memory_limit, repeats):
    """Run examples/digits.yaml: scikit-learn's digits on a LocalCluster and a local store."""
    from metricpipe.config import load_config  # deferred: loads scikit-learn
    from metricpipe.runner import run_pipeline  # deferred: loads Dask and scikit-learn

    cfg = apply_overrides(load_config(demo_config_path()), store, cluster, workers, memory_limit, repeats)
    run_pipeline(cfg, resume=resume, repair=repair, log=echo, terminal=sys.stderr.isatty(), result=click.echo)


def demo_config_path() -> Path:
    p = files("metricpipe.examples") / "digits.yaml"  # examples/ ships as metricpipe.examples
    if p.is_file():
        return Path(str(p))
    raise InputError("examples/digits.yaml is missing from this installation; reinstall metricpipe")


@click.command("stage", epilog=example("metricpipe stage digits --store /tmp/digits --normalize l2"))
@click.argument("source")
@click.option("--store", required=True, help="Store directory or fsspec URL.")
@click.option(
    "--features", default="X", show_default=True, help="Array name inside npz/h5/zarr, or column of a Parquet file."
)
@click.option("--labels", default="y", show_default=True, help="Label array name, or a .npy path.")
@click.option(
    "--normalize",
    default="none",
    show_default=True,
    type=click.Choice(["none", "l1", "l2", "power"]),
    help="Normalise each row before staging (as the config's data.normalize).",
)
@click.option(
    "--test",
    "test_fraction",
    default=None,
    type=float,
    help="Stratified test fraction (default 0.2; a source with its own split keeps it).",
)
@click.option("--split-column", help="Array of train/test/val/negatives strings instead of a random split.")
@cluster_options
@handle_errors
@in_options("SOURCE")
def stage_cmd(source, store, features, labels, normalize, test_fraction, split_column, cluster, workers, memory_limit):
    """Stage SOURCE (a path, or digits | fashion-mnist | synthetic) into the store, alone."""
    from metricpipe.cluster import connect, dashboard_lines  # deferred: loads Dask
    from metricpipe.config import parse_config  # deferred: loads scikit-learn
    from metricpipe.context import StageContext  # deferred: loads Dask and scikit-learn
    from metricpipe.runner import removed_if_refused  # deferred: loads Dask and scikit-learn
    from metricpipe.stages import prepare_data, run_stage  # deferred: loads Dask and scikit-learn
    from metricpipe.store import Store  # deferred: loads Zarr

    split = {"column": split_column} if split_column else {}  # both given: the config refuses the pair
    data = {
        "features": features,
        "labels": labels,
        "normalize": normalize,
        "split": split if test_fraction is None else {**split, "test": test_fraction},
    }
    data["source" if source in ("digits", "fashion-mnist", "synthetic") else "path"] = source
    cfg = apply_overrides(
        parse_config({"data": data}, where="metricpipe stage", base_dir=Path.cwd()),
        store,
        cluster,
        workers,
        memory_limit,
    )
    st = Store(cfg.store)
    with removed_if_refused(st), st.lock("metricpipe stage"):
        plan = prepare_data(cfg, st)  # bad input is refused before a cluster starts
        with connect(
            cfg.cluster, cfg.workers, cfg.threads_per_worker, cfg.memory_limit, cfg.dashboard, cfg.tls, cfg.wait_timeout
        ) as client:
            for line in dashboard_lines(client):
                echo(line)
            ctx = StageContext(client, st, cfg, log=echo, terminal=sys.stderr.isatty())
            with ctx.stage_progress("stage"):
                info = run_stage(ctx, plan)
    echo(f"Staged {info.n_samples} x {info.n_features} into {info.unit.url}")
