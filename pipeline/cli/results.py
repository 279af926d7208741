"""The commands that take results out of a run or bring data in: encode, export, predict, evaluate,
add-classes and synth."""

import time

import click

from metricpipe.cli.errors import echo, handle_errors, in_options
from metricpipe.cli.options import MODEL_KEY_HELP, apply_overrides, cluster_options, example
from metricpipe.tasks.errors import InputError


@click.command(epilog=example("metricpipe synth --samples 20000 --dim 64 --classes 10 --store synth.zarr"))
@click.option("--samples", type=click.IntRange(min=4), required=True, help="Rows N.")
@click.option("--dim", type=click.IntRange(min=1), required=True, help="Features D.")
@click.option("--classes", type=click.IntRange(min=2), default=10, show_default=True, help="Number of classes.")
@click.option("--store", required=True, type=click.Path(), help="The Zarr store to create (e.g. synth.zarr).")
@click.option(
    "--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed of the class means and noise."
)
@click.option("--nonnegative", is_flag=True, help="Clip at 0 (ReLU-like features, e.g. for NML).")
@click.option(
    "--separation",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="Scale of the class signal against unit noise (lower is harder).",
)
@click.option(
    "--nuisance",
    type=click.FloatRange(min=0),
    default=1.7,
    show_default=True,
    help="Standard deviation along the D // 16 class-free directions (0 = none; higher is harder "
    "for raw features and PCA, not for a learned projection).",
)
@click.option(
    "--overlap",
    type=click.FloatRange(0, 1),
    default=0.0,
    show_default=True,
    help="Share of the nuisance inside the class signal's subspace: 0 keeps it orthogonal (it hurts "
    "retrieval only); 1 puts it inside, where it also blurs nearest-class-mean classification and a "
    "learned metric can undo it.",
)
@click.option(
    "--chunk-mb",
    type=click.FloatRange(min=0.001),
    default=64.0,
    show_default=True,
    help="Megabytes of features per chunk (one block a worker writes).",
)
@cluster_options
@handle_errors
def synth(
    samples,
    dim,
    classes,
    store,
    seed,
    nonnegative,
    separation,
    nuisance,
    overlap,
    chunk_mb,
    cluster,
    workers,
    memory_limit,
):
    """Write N x D class-structured synthetic features (X, y) as a Zarr store, blockwise on the workers;
    use it with data: {path: STORE}.

    The class means are spread as over 32 directions whatever D and C, so the flags, not the shape, set
    how hard the data is. The papers' shape (raw mAP about 0.26, l2 NCM top-5 error 0.22, LDA-512 far
    better): --dim 4096 --classes 1000 --nuisance 2 --overlap 1 (add --nonnegative for NML)."""
    from metricpipe.cluster import connect, dashboard_lines  # deferred: loads Dask
    from metricpipe.commands.synth import check_args, write_synthetic  # deferred: loads Zarr
    from metricpipe.config import parse_config  # deferred: loads scikit-learn

    check_args(store, samples, dim, classes)
    cfg = apply_overrides(
        parse_config({"data": {"source": "digits"}}, where="metricpipe synth"), None, cluster, workers, memory_limit
    )
    with connect(
        cfg.cluster, cfg.workers, cfg.threads_per_worker, cfg.memory_limit, cfg.dashboard, cfg.tls, cfg.wait_timeout
    ) as client:
        for line in dashboard_lines(client):
            echo(line)
        write_synthetic(
            client,
            store,
            samples,
            dim,
            classes,
            seed,
            nonnegative,
            chunk_mb,
            log=echo,
            separation=separation,
            nuisance=nuisance,
            overlap=overlap,
        )


@click.command(
    "add-classes", epilog=example("metricpipe add-classes runs/digits new_classes.npz --labels y --model 3f2a")
)
@click.argument("store")
@click.argument("new_data", type=click.Path(exists=False))
@click.option(
    "--features", default="X", show_default=True, help="Array name inside npz/h5/zarr, or column of a Parquet file."
)
@click.option("--labels", default="y", show_default=True, help="Label array name, or a .npy path.")
@click.option("--model", help="Extend only the model whose key starts with this (default: every NCM model).")
@click.option("--hierarchy", type=click.Path(dir_okay=False), help="YAML map class: parent (zero-shot prior, Eq. 33).")
@click.option(
    "--prior-weight",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="m of Eq. 34: weight of the zero-shot prior against the sample mean.",
)
@click.option("--zero-shot", multiple=True, help="A class with no images, placed by the hierarchy alone.")
@handle_errors
@in_options("NEW_DATA")
def add_classes_cmd(store, new_data, features, labels, model, hierarchy, prior_weight, zero_shot):
    """Add the classes of NEW_DATA to STORE's NCMML/NCMC models without retraining W."""
    from metricpipe.commands.classes import add_classes  # deferred: loads scikit-learn
    from metricpipe.store import Store  # deferred: loads Zarr

    st = Store(store)
    st.check_exists()
    st.check_writable()
    with st.lock("metricpipe add-classes"):
        add_classes(store, new_data, features, labels, model, hierarchy, prior_weight, zero_shot, log=echo)


@click.command(epilog=example("metricpipe evaluate codes.npz --queries 1000 --out metrics.json"))
@click.argument("embeddings", type=click.Path(exists=False))
@click.option(
    "--labels", default="y", show_default=True, help="Label array or column name inside the file, or a .npy path."
)
@click.option(
    "--features", default="X", show_default=True, help="Embedding array (npz/h5/zarr) or list column (parquet)."
)
@click.option("--queries", help="N: a seeded, class-stratified sample of N rows queries all; or a FILE of queries.")
@click.option("--reference", type=click.Path(exists=False), help="A FILE of references the EMBEDDINGS query.")
@click.option("--query-labels", help="Labels of --queries FILE (default: --labels when it is a name).")
@click.option("--reference-labels", help="Labels of --reference FILE (default: --labels when it is a name).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Query sample and k-means seed.")
@click.option("--out", type=click.Path(dir_okay=False), help="Write the metric records (JSON) here.")
@cluster_options
@handle_errors
def evaluate(
    embeddings,
    labels,
    features,
    queries,
    reference,
    query_labels,
    reference_labels,
    seed,
    out,
    cluster,
    workers,
    memory_limit,
):
    """MAP@R, R-precision, precision@1, MRR, NMI and AMI of EMBEDDINGS (npy, npz, h5, zarr, parquet) as
    pytorch-metric-learning's AccuracyCalculator defines them: in this process for small inputs (up to
    4 million values, rows x dimensions, and 400 million query-reference pairs), else out of core on
    the cluster (always when --cluster, --workers or --memory-limit is given)."""
    from metricpipe.budget import limit_name  # deferred: loads scikit-learn
    from metricpipe.cluster import connect, dashboard_lines  # deferred: loads Dask
    from metricpipe.commands import assess  # deferred: loads Dask and scikit-learn
    from metricpipe.config import parse_config  # deferred: loads scikit-learn
    from metricpipe.runner import max_rss_mb, peak_rss  # deferred: loads Dask and scikit-learn

    if out:
        from metricpipe.commands.export import check_out  # deferred: loads scikit-learn and Zarr

        check_out(
            out,
            "--out",
            None,
            inputs=(
                (embeddings, "EMBEDDINGS"),
                (queries, "--queries"),
                (reference, "--reference"),
                (labels, "--labels"),
                (query_labels, "--query-labels"),
                (reference_labels, "--reference-labels"),
            ),
        )
    q, rows, ref, self_in = assess.plan_sides(
        embeddings, features, labels, queries, reference, query_labels, reference_labels, seed
    )
    cfg = apply_overrides(
        parse_config({"data": {"source": "digits"}}, where="metricpipe evaluate"), None, cluster, workers, memory_limit
    )
    t0 = time.perf_counter()
    if (cluster, workers, memory_limit) == (None, None, None) and assess.fits_in_process(q, rows, ref):
        records = assess.evaluate_in_process(q, rows, ref, self_in, seed, log=echo)
        _evaluated(out, records, time.perf_counter() - t0, [("this process", max_rss_mb())])
        return
    with connect(
        cfg.cluster, cfg.workers, cfg.threads_per_worker, cfg.memory_limit, cfg.dashboard, cfg.tls, cfg.wait_timeout
    ) as client:
        for line in dashboard_lines(client):
            echo(line)
        t0 = time.perf_counter()
        records = assess.evaluate_embeddings(
            client,
            q,
            rows,
            ref,
            self_in,
            seed,
            log=echo,
            limit_setting="--memory-limit" if cfg.cluster == "local" else limit_name(cfg),
        )
        seconds = time.perf_counter() - t0
        peaks = peak_rss(client)
    _evaluated(out, records, seconds, peaks)


def _evaluated(out: str | None, records: list, seconds: float, peaks: list) -> None:
    """Write evaluate's records to ``out`` (when given) and print them, the time and the peak memory."""
    from metricpipe.commands import assess  # deferred: loads Dask and scikit-learn

    if out:
        assess.write_records(out, records)
    for r in records:
        click.echo(f"{r['metric']:<12} {r['value']:.6f}")
    echo(
        f"evaluated in {seconds:.1f} s; peak RSS: "
        + ", ".join(f"{who} {mb:,.0f} MB" for who, mb in peaks)
        + (f"; records in {out}" if out else "")
    )


@click.command(epilog=example("metricpipe predict runs/digits digits --model 3f2a --out labels.npy"))
@click.argument("store")
@click.argument("data", type=click.Path(exists=False))
@click.option("--model", required=True, help=MODEL_KEY_HELP)
@click.option(
    "--features", default="X", show_default=True, help="Array name inside npz/h5/zarr, or column of a Parquet file."
)
@click.option(
    "--labels",
    default=None,
    help="Label array name (default: y when DATA has it) or .npy path: also print the top-1 error.",
)
@click.option(
    "--k",
    "k",
    type=click.IntRange(min=1),
    default=None,
    help="Classify by the k nearest train codes (default for models without class means: 10).",
)
@click.option("--out", type=click.Path(dir_okay=False), help="Write the predicted labels (.npy).")
@handle_errors
@in_options("DATA")
def predict(store, data, model, features, labels, k, out):
    """Classify the rows of DATA (a path, or digits | fashion-mnist) with a model of STORE: nearest class
    mean for NCMML/NCMC models, else the majority of the k nearest train codes of the model's run."""
    import numpy as np  # deferred: --help starts without numpy

    from metricpipe.commands.classes import predict as run_predict  # deferred: loads scikit-learn
    from metricpipe.commands.export import check_out, written_whole  # deferred: loads scikit-learn and Zarr

    if out:
        check_out(out, "--out", (".npy",), inputs=((data, "DATA"), (labels, "--labels")), store=store)
    names, error, unknown = run_predict(store, model, data, features, labels, k)
    if out:  # written whole or not at all
        try:
            with written_whole(out) as tmp:
                np.save(tmp, names)
        except OSError as e:
            raise InputError(f"{out}: cannot write the predictions (--out): {e.strerror or e}") from None
    notes = ([] if labels else ["against DATA's y"]) + (
        [f"{unknown} rows whose label is not a class of the model count as errors"] if unknown else []
    )
    against = f" ({'; '.join(notes)})" if notes else ""
    if error is not None:
        scored = f"; top-1 error {error:.4f}{against}"
    else:
        scored = (
            (
                "; no top-1 error: none of DATA's y is a class of the model (give --labels to score against "
                "another array)"
            )
            if unknown
            else ""
        )
    echo(f"{len(names)} rows classified{scored}" + (f"; predictions in {out}" if out else ""))


@click.command(epilog=example("metricpipe encode runs/digits digits --model 3f2a --out codes.npz"))
@click.argument("store")
@click.argument("data", type=click.Path(exists=False))
@click.option("--model", required=True, help=MODEL_KEY_HELP)
@click.option(
    "--out",
    required=True,
    type=click.Path(),
    help="Codes file: .npy, .npz (X, y, ids), .zarr (X, y, "
    "ids) or .parquet (id, label, code columns); y / label "
    "when DATA has labels, ids / id with --ids.",
)
@click.option(
    "--features", default="X", show_default=True, help="Array name inside npz/h5/zarr, or column of a Parquet file."
)
@click.option("--labels", default=None, help="Label array name (default: y when DATA has it) or .npy path.")
@click.option("--ids", default=None, help="Array of row ids to carry into the output.")
@cluster_options
@handle_errors
@in_options("DATA")
def encode(store, data, model, out, features, labels, ids, cluster, workers, memory_limit):
    """Encode every row of DATA (a path, or digits | fashion-mnist) with a model of STORE, normalised as
    in training; on the cluster when DATA is large or --cluster is given."""
    from metricpipe.cluster import connect  # deferred: loads Dask
    from metricpipe.commands.export import encode as run_encode  # deferred: loads scikit-learn and Zarr
    from metricpipe.config import parse_config  # deferred: loads scikit-learn

    cfg = apply_overrides(
        parse_config({"data": {"source": "digits"}}, where="metricpipe encode"), None, cluster, workers, memory_limit
    )

    def client():
        return connect(
            cfg.cluster, cfg.workers, cfg.threads_per_worker, cfg.memory_limit, cfg.dashboard, cfg.tls, cfg.wait_timeout
        )

    r = run_encode(store, model, data, out, features, labels, ids, client, cluster_given=cluster is not None, log=echo)
    cols = [c for c in ("labels", "ids") if r[c]]
    echo(
        f"Encoded {r['rows']:,} rows with model {r['model']} ({r['method']}, {r['dim']} dimensions) into {out}"
        + (f" with {' and '.join(cols)}" if cols and not out.lower().endswith(".npy") else "")
    )


@click.command(
    epilog=example(
        "metricpipe export runs/digits --model 3f2a --npz model.npz",
        "metricpipe export runs/digits --model 3f2a --faiss codes.faiss --split test",
        "metricpipe export runs/digits --model 3f2a --faiss pq8.faiss --pq 8",
    )
)
@click.argument("store")
@click.option("--model", required=True, help=MODEL_KEY_HELP)
@click.option(
    "--faiss",
    "faiss_path",
    type=click.Path(dir_okay=False),
    help="Write the SPLIT rows' codes as a faiss index (ids: rows of the staged data).",
)
@click.option(
    "--split",
    default="test",
    show_default=True,
    type=click.Choice(["test", "train", "val", "all"]),
    help="Which rows go into the faiss index (test: the database the run's retrieval searched).",
)
@click.option(
    "--pq",
    "pq_bytes",
    type=click.IntRange(min=1),
    default=None,
    help="With --faiss: the run's encoded database of M bytes per vector (a size of its encode.pq: the "
    "product quantiser the evaluation searched) instead of the float codes.",
)
@click.option(
    "--npz",
    "npz_path",
    type=click.Path(dir_okay=False),
    help="Write the model as plain arrays + model_json (apply it with numpy: see the README).",
)
@handle_errors
def export(store, model, faiss_path, split, pq_bytes, npz_path):
    """Export a model of STORE: its codes as a faiss index, or the model as arrays usable without metricpipe."""
    from metricpipe.commands.export import check_out, export_faiss, export_npz  # deferred: loads scikit-learn and Zarr

    if not faiss_path and not npz_path:
        raise InputError("metricpipe export: nothing to write; give --faiss PATH and/or --npz PATH")
    if pq_bytes is not None and not faiss_path:
        raise InputError(f"--pq {pq_bytes}: names the encoded database --faiss writes; give --faiss PATH too")
    for p, opt, formats in ((faiss_path, "--faiss", (".faiss", ".index")), (npz_path, "--npz", (".npz",))):
        if p:
            check_out(p, opt, formats, store=store)
    if faiss_path and pq_bytes is not None:
        from metricpipe.commands.encoded import export_encoded  # deferred: loads faiss

        r = export_encoded(store, model, faiss_path, split, pq_bytes)
        echo(
            f"faiss index ({r['index']}, {r['bytes_per_vector']} bytes per vector, {r['metric']}) of "
            f"{r['rows']:,} {split} rows of model {r['model']}'s encoded database in {faiss_path}"
        )
    elif faiss_path:
        r = export_faiss(store, model, faiss_path, split)
        echo(
            f"faiss index ({r['index']}, {r['metric']}) of {r['rows']:,} {split} codes of model {r['model']} "
            f"in {faiss_path}"
        )
    if npz_path:
        r = export_npz(store, model, npz_path)
        echo(
            f"model {r['model']} ({r['method']}: {r['kind']}, arrays {', '.join(r['arrays']) or 'none'}) in {npz_path}"
        )
