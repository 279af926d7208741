"""Runs the stage graph in order, shows progress, records timings, writes the manifest and report.

stage -> statistics -> [neighbours] -> train -> encode -> evaluate -> report
"""

import contextlib
import os
import shutil
import time
import uuid

import numpy as np

from metricpipe import stages
from metricpipe.checks import check_disk, check_memory, check_methods, skipped_classifiers
from metricpipe.cluster import DashboardHostError, connect, dashboard_lines
from metricpipe.config import SPLIT_NAMES, NeighboursConfig, RunConfig
from metricpipe.context import StageContext
from metricpipe.errors import STAGES, StageError, check_terminated
from metricpipe.estimate import estimate, run_lines
from metricpipe.report import build_report, package_versions, read_summary, winner_lines
from metricpipe.stages.evaluate import RETRIEVAL_QUERIES
from metricpipe.store import MARKER_SUFFIX, Store, to_json
from metricpipe.tasks import splits
from metricpipe.tasks.errors import InputError


def run_pipeline(
    cfg: RunConfig,
    resume: bool = True,
    log=print,
    performance_report: str | None = None,
    client=None,
    force: str | None = None,
    repair: bool = False,
    terminal: bool = False,
    result=None,
) -> str:
    """Run every stage of ``cfg``; return the path of the report's index.html. ``force`` recomputes
    that stage and the ones after it; ``repair`` recomputes committed units that fail verification;
    ``terminal`` shows each stage's progress as one updating line on stderr (else plain log lines);
    ``result`` takes the closing lines (the report's path, the best models, the winner; default ``log``),
    which the CLI writes to stdout and the rest to stderr."""
    store = Store(cfg.store)
    with removed_if_refused(store):
        return _run_locked(store, cfg, resume, log, performance_report, client, force, repair, terminal, result or log)


@contextlib.contextmanager
def removed_if_refused(store: Store):
    """A store this command creates and that holds nothing committed when its input is refused (its
    lock file, a begun staging unit) is removed, not left behind as an empty store."""
    new_dir = store.local and not os.path.exists(store.root)
    store.check_writable()
    try:
        yield
    except InputError:
        # only a store this process locked: a command refused because another holds the lock must not
        # remove that one's (still uncommitted) work
        if (
            new_dir
            and getattr(store, "locked_here", False)
            and os.path.isdir(store.root)
            and not _committed_anything(store.root)
        ):
            shutil.rmtree(store.root, ignore_errors=True)
        raise


def _restore_quietly(store, log) -> None:
    """Put back this run's set-aside units on the way out; a failure here must not hide the run's own."""
    try:
        store.restore_replaced()
    except OSError as e:
        log(f"  could not put back the units set aside to recompute ({e}); the next command on the store will")


def _committed_anything(root: str) -> bool:
    return any(name.endswith(MARKER_SUFFIX) for _, _, files in os.walk(root) for name in files)


def _run_locked(store, cfg, resume, log, performance_report, client, force, repair, terminal, result) -> str:
    with contextlib.ExitStack() as stack:
        stack.enter_context(store.lock("metricpipe run", log=log))  # one writer at a time
        back = store.restored + store.restore_replaced()  # a killed --force/--no-resume run's set-aside units
        if back:
            log(
                f"Restored {len(back)} committed unit(s) that a stopped run had set aside to recompute "
                f"({', '.join(back[:3])}{', ...' if len(back) > 3 else ''})"
            )
        if client is None and cfg.cluster == "local":  # this run's, if it stops before committing them,
            stack.callback(_restore_quietly, store, log)  # once its own workers are gone (registered
            # before the cluster, so called after it closes); on another cluster a cancelled task may
            # still write, so the next command on the store restores them
        quiet_log = []  # a finished run's worker log that stayed empty; removed once the cluster has closed
        stack.callback(_remove_empty, quiet_log)
        plan = stages.prepare_data(cfg, store)  # refuse bad input before starting anything
        cfg = check_methods(cfg, plan.info, log)
        check_disk(store, plan.info, cfg)
        if client is None:
            try:
                client = stack.enter_context(
                    connect(
                        cfg.cluster,
                        cfg.workers,
                        cfg.threads_per_worker,
                        cfg.memory_limit,
                        cfg.dashboard,
                        cfg.tls,
                        cfg.wait_timeout,
                    )
                )
            except DashboardHostError as e:  # found as the cluster starts: name the config too
                raise InputError(f"{cfg.source_file}: {e}") from None
        check_memory(client, plan.info, cfg)
        est = _announce(client, cfg, plan.info, log)  # the plan, before any work; then the dashboard
        worker_log = _log_workers_to_store(client, store) if cfg.cluster == "local" else None
        if performance_report:
            from distributed import performance_report as perf

            stack.enter_context(perf(filename=performance_report))
        try:
            store.run_id = uuid.uuid4().hex[:16]  # the commit markers of this run carry it, its task keys too
            forced_by = forcing(store, force if resume else STAGES[0], resume, log)
            ctx = StageContext(
                client,
                store,
                cfg,
                resume=resume,
                log=log,
                force=force,
                repair=repair,
                terminal=terminal,
                forced_by=forced_by,
                run_id=store.run_id,
                estimates=est.progress_estimates(),
                rate=est.rate,
            )
            out = _run(ctx, plan, log, result)
            forcing(store, None, resume, log)  # finished: nothing left to continue
            quiet_log += [worker_log] if worker_log else []
            return out
        except StageError as e:
            if worker_log is None:
                raise
            raise StageError(f"{str(e).splitlines()[0]} (worker tracebacks: {worker_log})") from e


def _announce(client, cfg: RunConfig, info, log):
    """What a run says once its input is checked and its cluster is up, before any work: its plan
    (each config entry's fits and their time, :mod:`metricpipe.estimate`), then the dashboard's link,
    then what the config sets that the cluster ignores. Returns the plan."""
    try:  # the tasks the cluster runs at once: its workers' threads
        slots = sum(client.nthreads().values()) or None
    except Exception:  # noqa: BLE001 - a scheduler that does not say: the config's
        slots = None
    est = estimate(cfg, info, slots=slots)
    for line in run_lines(est):
        log(line)
    if cfg.dashboard is not None or cfg.cluster != "local":
        for line in dashboard_lines(client):
            log(line)
    if cfg.cluster.startswith(("tcp://", "tls://")):  # a running scheduler: its workers are what they are
        unused = [cfg.setting(k) for k in ("workers", "memory_limit") if k in cfg.overridden or k in cfg.raw]
        if unused:
            log(
                f"  note: {' and '.join(unused)} apply to a local cluster only; the scheduler at {cfg.cluster} "
                f"runs on its own workers"
            )
    return est


# A --force (or --no-resume) run that has not finished: {"stage": its stage, "runs": the run ids of
# the attempts so far}. An attempt that continues it with the same --force reuses what they committed.
FORCING = "runs/forcing.json"


def forcing(store: Store, stage: str | None, resume: bool, log) -> tuple:
    """Record that this run forces ``stage`` (None: no stage; ``resume`` off: every stage, given as the
    first) and return the ids of the stopped runs of the same --force it continues: the units they
    committed are already recomputed. A run that forces nothing, or something else, or recomputes
    everything (--no-resume), starts afresh, so a stale record never spares a unit; a run that
    finishes ends the record (``stage`` None)."""
    path = store.inside(FORCING)
    if stage is None:
        if store.fs.exists(path):
            store.fs.rm(path)
        return ()
    try:
        record = store.read_json(FORCING)
    except (FileNotFoundError, ValueError, OSError):  # none, or torn: nothing to continue
        record = None
    earlier = (
        tuple(record.get("runs", ())) if resume and isinstance(record, dict) and record.get("stage") == stage else ()
    )
    if earlier:
        log(
            f"Continuing the --force {stage} run that stopped: the units it recomputed are kept "
            f"(--no-resume recomputes everything)"
        )
    store.write_text(FORCING, to_json({"stage": stage, "runs": [*earlier, store.run_id]}))
    return earlier


# Worker logs of a local run: into STORE/logs/ (the terminal shows our one-line messages).
def _to_file(path: str) -> None:
    import logging

    log = logging.getLogger("distributed")
    for h in list(log.handlers):
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
            log.removeHandler(h)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.WARNING)
    log.propagate = False


def _remove_empty(paths: list) -> None:
    for p in paths:
        if os.path.exists(p) and not os.path.getsize(p):
            os.remove(p)


def _log_workers_to_store(client, store) -> str | None:
    if not store.local:
        return None
    os.makedirs(store.inside("logs"), exist_ok=True)
    path = store.inside(f"logs/workers-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log")
    client.run(_to_file, path)  # the workers' (the local scheduler runs in this process: its logging is ours)
    return path


def _run(ctx: StageContext, plan, log, result) -> str:
    """The stages in order on ``plan``'s data, then the report; returns the report's path."""
    cfg = ctx.config
    names = stages.stage_names(cfg)
    timings, started = [], time.time()
    t_run = time.perf_counter()

    def stage(i, name, fn, *args):
        check_terminated()
        log(f"[{i}/{len(names)}] {name} ...")
        t0, tasks0 = time.perf_counter(), ctx.tasks
        with ctx.stage_progress(name):  # one counter over all the stage's tasks
            result = fn(*args)
        seconds = time.perf_counter() - t0
        timings.append({"stage": name, "seconds": round(seconds, 3), "tasks": ctx.tasks - tasks0})
        log(f"Completed {i} of {len(names)} stages ({name}, {seconds:.1f} s)")
        return result

    i = iter(range(1, len(names) + 1))
    data = stage(next(i), "stage", stages.run_stage, ctx, plan)
    stages.check_nonnegative_for(cfg, data)
    stats = stage(next(i), "statistics", stages.run_statistics, ctx, data)
    graph = None
    if "neighbours" in names:
        if cfg.neighbours is None:
            cfg = ctx.config = cfg.with_overrides(neighbours=NeighboursConfig())
        graph = stage(next(i), "neighbours", stages.run_neighbours, ctx, data)
        note = _neighbours_note(graph.meta(), data.n_samples)
        if note:
            timings[-1]["note"] = note
    models = stage(next(i), "train", stages.run_train, ctx, data, stats, graph)
    codes, encoded, unencoded = stage(next(i), "encode", _encode, ctx, data, models)
    evals, encoded_evals = stage(next(i), "evaluate", _evaluate, ctx, data, codes, graph, encoded)
    manifest = _manifest(ctx, cfg, data, stats, graph, models, codes, evals, started, timings)
    manifest["units"].update(pq=[e.unit.rel for e in encoded], pq_evaluation=[u.rel for u in encoded_evals])
    manifest["pq_skipped"] = unencoded
    return _report(ctx, manifest, len(names), t_run, log, result)


def _encode(ctx: StageContext, data, models) -> tuple:
    """The encode stage: every model's codes, then the encoded databases (encode.pq)."""
    codes = stages.run_encode(ctx, data, models)
    return (codes, *stages.run_quantise(ctx, data, codes))


def _evaluate(ctx: StageContext, data, codes, graph, encoded) -> tuple:
    """The evaluate stage: every model's codes, then the encoded databases through their indexes."""
    return stages.run_evaluate(ctx, data, codes, graph), stages.run_evaluate_encoded(ctx, data, encoded)


def _neighbours_note(g: dict, n_samples: int) -> str:
    """The neighbours stage's note in the timings: how approximate an IVF graph is, how many rows searched."""
    notes = []
    if g.get("method") == "ivf":  # the report shows how approximate the graph is
        how = "over the streamed rows" if g.get("streamed") else f"rerank {g.get('rerank', 1)}"
        notes.append(f"{g['index']}, nprobe {g['nprobe']}, {how}: recall@{g['k']} {g['recall']:.3f} against exact")
    if g.get("queries") is not None and g["queries"] < n_samples:
        notes.append(f"{g['queries']:,} sampled train rows searched")
    return "; ".join(notes)


def _manifest(ctx: StageContext, cfg, data, stats, graph, models, codes, evals, started: float, timings: list) -> dict:
    """runs/latest.json: the run's settings, data set, units, repeats and timings (the report reads it)."""
    held = splits.unseen_classes(data.split, data.labels)  # data.split.classes
    return {
        # the file's settings with those the command line replaced (--store, --workers, ...)
        "config": {**cfg.raw, **{k: getattr(cfg, k) for k in sorted(cfg.overridden)}},
        "store": ctx.store.url,
        "started": started,
        "versions": package_versions(),
        "dataset": {
            "source": data.unit.meta().get("source"),
            "key": data.unit.key,
            "n_samples": data.n_samples,
            "n_features": data.n_features,
            "n_classes": len(data.classes),
            "splits": {SPLIT_NAMES[c]: int(n) for c, n in enumerate(np.bincount(data.split)) if n},
            **({"unseen_classes": [data.classes[c] for c in held]} if len(held) else {}),
        },
        "units": {
            "data": data.unit.rel,
            "statistics": stats.rel,
            "neighbours": graph.rel if graph else None,
            "models": [m.unit.rel for m in models],
            "codes": [u.rel for _, u, _ in codes],
            "selection": ctx.selections,
            "validated": ctx.validated,
        },
        # per model (in the order of units.models and evaluation_units): the [config entry, repeat]
        # pairs it is the model of
        "serves": [[list(s) for s in m.serves] for m in models],
        "repeats": cfg.repeats,
        # what the report's verdict counts a test item's worth in, and the objective its closing line names
        "test_items": scored_items(cfg, int((data.split == stages.TEST).sum())),
        "objective": cfg.objective,
        "evaluation_units": [u.rel for _, u in evals],
        "timings": timings,
        "skipped": skipped_classifiers(cfg, [m.spec for m in models]),
    }


def _report(ctx: StageContext, manifest: dict, n_stages: int, t_run: float, log, result) -> str:
    """The last stage: write the manifest and the report, then the peak RSS and the winner lines."""
    t0 = time.perf_counter()
    log(f"[{n_stages}/{n_stages}] report ...")
    manifest["seconds"] = time.perf_counter() - t_run
    ctx.store.write_text("runs/latest.json", to_json(manifest))
    path = build_report(ctx.store, manifest)
    manifest["timings"].append({"stage": "report", "seconds": round(time.perf_counter() - t0, 3)})
    log(f"Completed {n_stages} of {n_stages} stages (report)")
    peaks = peak_rss(ctx.client)
    if peaks:
        log("Peak RSS: " + ", ".join(f"{who} {mb:,.0f} MB" for who, mb in peaks))
    result(f"Report: {path}")
    for line in winner_lines(read_summary(ctx.store)):  # the last lines name the winner
        result(line)
    return path


def scored_items(cfg: RunConfig, n_test: int) -> dict:
    """{objective: the test items scored}: the retrieval queries (every test row, or a seeded sample of
    evaluate.retrieval.queries, RETRIEVAL_QUERIES unset past that) and the classified test rows
    (about evaluate.classification.queries of them, a stratified sample), as the evaluate stage takes
    them. The report's verdict calls a difference below one item's worth a tie."""
    ev, out = cfg.evaluate, {}
    if ev.retrieval:
        asked = ev.queries if ev.queries is not None else RETRIEVAL_QUERIES
        out["retrieval"] = min(asked, n_test)
    if ev.classifiers:
        out["classification"] = min(ev.classify_queries or n_test, n_test)
    return out


def max_rss_mb() -> float:
    """This process's peak resident memory in MB.

    Linux's VmHWM, not getrusage's ru_maxrss: ru_maxrss carries over fork and exec, so a worker that
    a 2.4 GB process spawned reports 2.4 GB whatever it used itself; VmHWM belongs to the process's
    own address space."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    import resource
    import sys

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024.0  # bytes on macOS, KiB elsewhere


def peak_rss(client) -> list[tuple[str, float]]:
    """(process, peak resident MB) for this client process and each worker process."""
    try:
        workers = client.run(max_rss_mb)
    except Exception:  # a remote cluster may refuse client.run; the figure is informative only
        workers = {}
    return [("client", max_rss_mb())] + [(f"worker {i}", mb) for i, (_, mb) in enumerate(sorted(workers.items()))]
