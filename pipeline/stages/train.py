"""Stage 4, train: one model per (method, parameter set), each fitted by its own estimator class.

The stage names no learner: it builds the unfitted estimator from the config entry through the
registry (``tasks.registry.make``) and hands it to the driver for what the registry says the
learner is fed (``tasks.registry.feeds``). A driver moves data and nothing else: it reads the rows
the learner needs, calls the estimator's documented entry point on a worker, and stores the fitted
estimator (``storage.save_model``).
"""
import time
import warnings

import numpy as np

from metricpipe import nml_train, select, slem_train, slne_train, sparse_train, stream_train
from metricpipe.context import StageContext
from metricpipe.budget import refuse_without_dense_covariance
from metricpipe.stages.common import DataInfo
from metricpipe.storage import Unit, hash_key, load_arrays, save_model
from metricpipe.tasks import registry
from metricpipe.tasks.base import seed_of
from metricpipe.tasks.evaluation import higher_is_better
from metricpipe.tasks.errors import InputError

def model_id(spec: dict) -> str:
    """A short readable name: method, dim, then the parameters that differ from their defaults."""
    defaults = registry.defaults(registry.estimator_class(spec["method"], spec), spec)
    if spec["method"] == "slem":   # the kernel picks the class: named unless it is the method's default
        defaults["kernel"] = "linear"
    extra = "-".join(f"{k}{registry.param_text(v)}" for k, v in sorted(registry.params_of(spec).items())
                     if k != "dim" and v is not None and (k not in defaults or v != defaults[k]))
    return "-".join(str(x) for x in (spec["method"], spec.get("dim") or "", extra) if x != "")


# A run prints this as a note before any work (RandomProjection.shape_notes); the worker's copy of the
# warning would reach the terminal as a raw line. Set once for the process: catch_warnings is not
# thread-safe, and a worker may run several fits at once.
warnings.filterwarnings("ignore", message="random projection to dim", category=UserWarning)


def _fit_statistics(est, spec: dict, stats_url: str, model_url: str) -> dict:
    stats, _ = load_arrays(stats_url)
    t0 = time.perf_counter()
    est.fit_statistics(stats)
    return save_model(model_url, est, spec, time.perf_counter() - t0)


def _statistics_driver(ctx, spec, est, data, stats, neighbours, unit, name):
    if not stats.meta().get("dense", True):
        refuse_without_dense_covariance(est, data.n_features, ctx.config.statistics.max_dense_dim,
                                        f"{ctx.config.source_file}: methods: {spec['method']}")
    return ctx.submit(_fit_statistics, est, spec, stats.url, unit.url, name=f"train-{name}")


DRIVERS = {
    "statistics": _statistics_driver,
    "stream": stream_train.submit,
    "pairs": nml_train.submit,
    "neighbours": slne_train.submit,
    "subset": sparse_train.submit,
    "pool": slem_train.submit,
}


def model_key(spec: dict, stats: Unit, neighbours: Unit | None, data: DataInfo) -> str:
    inputs = {"stage": "model", "spec": spec, "statistics": stats.key, "data": data.unit.key}
    if registry.feeds(spec["method"]) == "neighbours":
        inputs["neighbours"] = neighbours.key
    return hash_key(inputs)


def _copy_rows(specs: list, n_classes: int) -> dict:
    """Per seed, the rows of the shuffled copy (``metricpipe.shuffle``) that its SGD learners read
    at most (``pool_rows()``; None: every row, also for a learner that does not say)."""
    need = {}
    for spec in specs:
        if registry.feeds(spec["method"]) not in ("stream", "pairs"):
            continue
        est = registry.make(spec)
        seed, rows = seed_of(est.random_state), getattr(est, "pool_rows", lambda c: None)(n_classes)
        need[seed] = None if rows is None or need.get(seed, 0) is None else max(need.get(seed, 0), rows)
    return need


def _note_val_classes(ctx: StageContext, data: DataInfo, n: int, spec: dict) -> None:
    """Say which classes a learner that early-stops on class error (NCMML, NCMC, k-NN ML) has no val
    row of, and why (few-shot classes; with data.pairs, rows the pairs join stay in train)."""
    est = registry.make(spec)
    if not hasattr(est, "trained_classes"):
        return
    wanted = est.trained_classes(data.classes)
    missing = np.setdiff1d(wanted, data.labels[data.split == select.VAL])
    if not len(missing):
        return
    names = ", ".join(str(v) if isinstance(v, (int, np.integer)) else repr(str(v))
                      for v in (data.classes[c] for c in missing[:5])) + (", ..." if len(missing) > 5 else "")
    d = ctx.config.data
    why = ("the val rows of data.split.column (or, where it has none, val: auto's share of its train rows)"
           if d.split.column else
           "data.split.val: auto carves val rows only from train rows that no pair of data.pairs joins"
           if d.pairs and d.split.val == "auto" else
           "a class's share of data.split.val: auto is under one row when it has few rows" if d.split.val == "auto"
           else "the data's val rows")
    ctx.log(f"  train: {ctx.config.entry(n)} ({model_id(spec)}): the val split holds no row of {len(missing)} of the "
            f"{len(wanted)} classes it trains on ({names}; {why}); its early stopping scores the others")


def run_train(ctx: StageContext, data: DataInfo, stats: Unit, neighbours: Unit | None) -> list[tuple[dict, Unit]]:
    """One model per spec of the config; a spec with parameters left to selection trains every
    candidate and keeps the best on the validation split (``metricpipe.select``). Returns
    [(spec of the model kept, its unit)]."""
    plans, units = [], {}   # per spec: (spec, candidates, their units, selection unit or None, reused)
    has_val = bool((data.split == select.VAL).any())
    if not has_val and any(spec.get("select") for spec in ctx.config.methods):
        d = ctx.config.data
        why = ("data.split.val: 0" if d.split.val != "auto" else
               "data.split.val: auto found none to carve: every class keeps two train rows"
               + (", and rows data.pairs joins stay in train" if d.pairs else ""))
        ctx.log(f"  train: the data has no validation rows ({why}), so parameters keep their defaults")
    for n, spec in enumerate(ctx.config.methods):
        if has_val:
            _note_val_classes(ctx, data, n, spec)
        cands = registry.candidates(spec) if has_val else registry.candidates(spec)[:1]
        cunits = [ctx.store.unit("models", model_key(c, stats, neighbours, data)) for c in cands]
        sel_unit, done = None, False
        if len(cands) > 1:
            sel_unit = ctx.store.unit("selection", select.selection_key(cunits, spec["select"]["metric"],
                                                                        ctx.config.seed, ctx.config))
            done = ctx.reuse(sel_unit, "train") and ctx.reuse(cunits[sel_unit.meta()["chosen"]], "train")
        plans.append((spec, cands, cunits, sel_unit, done))
        if not done:
            for c, u in zip(cands, cunits):
                units.setdefault(u.key, (c, u))
        elif ctx.repair:   # a damaged candidate the selection did not keep is retrained alone; the selection stands
            for i, (c, u) in enumerate(zip(cands, cunits)):
                if i != sel_unit.meta()["chosen"] and (u.done() or u.marker_damaged()) and not ctx.reuse(u, "train"):
                    units.setdefault(u.key, (c, u))
    pending = [p for p in plans if p[3] is not None and not p[4]]
    sel_future, n_val = None, 0
    if pending:
        sel_future, n_val = select.submit_data(ctx, data, [p[0]["select"]["metric"] for p in pending])
    # a candidate may fail (diverge) without failing the run, unless a spec without selection needs it
    required = {us[0].key: n for n, (_, _, us, su, _) in enumerate(plans) if su is None}   # key: its spec
    ctx.shuffle_rows = _copy_rows([spec for spec, _ in units.values()], len(data.classes))
    todo = {}
    for key, (spec, unit) in units.items():
        if ctx.reuse(unit, "train"):
            continue
        unit.begin()
        driver = DRIVERS[registry.feeds(spec["method"])]
        ctx.returning_errors = True  # a candidate may diverge (a score, not a failure); else named below
        try:
            todo[key] = (spec, unit, driver(ctx, spec, registry.make(spec), data, stats, neighbours, unit,
                                            model_id(spec)))
        finally:
            ctx.returning_errors = False
    kept = sum(1 for _, _, us, su, done in plans if done or (su is None and us[0].key not in todo))
    chosen = sum(1 for *_, done in plans if done)
    if kept:
        ctx.log(f"  train: reusing {kept} of {len(plans)} models"
                + (f" ({chosen} with their parameter selection)" if chosen else ""))
    scores = {}
    for spec, cands, cunits, sel_unit, _ in pending:
        for c, u in zip(cands, cunits):
            trained = todo[u.key][2] if u.key in todo else None
            scores[(sel_unit.key, u.key)] = select.submit_score(ctx, trained, u, spec["select"]["metric"], sel_future,
                                                                model_id(c))
    t0 = time.perf_counter()
    items = list(todo.values())

    def commit(i, res):
        """Each model is committed as its task returns: an interrupt or a later failure keeps it."""
        spec, unit, _ = items[i]
        if isinstance(res, Exception):
            if unit.key in required:   # a model the run needs: its config entry's one line
                raise InputError(f"{ctx.config.source_file}: {ctx.config.entry(required[unit.key])} "
                                 f"({model_id(spec)}): {res}") from None
            unit.discard()   # the selection records the failure; no half-written model is left behind
            return
        unit.commit({**res, "spec": spec, "seconds": round(res["fit_seconds"], 3),
                     "wall": round(time.perf_counter() - t0, 3), "data": data.unit.key,
                     "normalize": ctx.config.data.normalize,
                     "class_names": [c.item() if hasattr(c, "item") else c for c in data.classes]})
        if "samples_per_second" in res:
            ctx.log(f"  train: {model_id(spec)} {res['samples_per_second']:.0f} samples/s")
        if unit.key in required and res.get("best_iter") == 0:   # (a candidate's start is the selection's affair)
            ctx.log(f"  train: {model_id(spec)}: early stopping kept the model it starts from (no step lowered "
                    f"its validation score); its parameters may not suit this data (select: true searches them)")

    ctx.gather([f for *_, f in items], "train", [f"model {model_id(s)}" for s, *_ in items], on_result=commit)
    keys = list(scores)
    values = ctx.gather([scores[k] for k in keys], "train", [f"selection score {k[1]}" for k in keys])
    values = dict(zip(keys, values))
    out = []
    for n, (spec, cands, cunits, sel_unit, done) in enumerate(plans):
        if sel_unit is None:
            out.append((cands[0], cunits[0]))
            continue
        if not done:
            _commit_selection(ctx, n, cands, cunits, sel_unit, [values[(sel_unit.key, u.key)] for u in cunits], n_val)
        best = sel_unit.meta()["chosen"]
        out.append((cands[best], cunits[best]))
        ctx.selections.append(sel_unit.rel)
    # a selection may choose the model another entry sets (identical entries are merged at load):
    # it is encoded and evaluated once (twice, the second encode wiped the unit the first was writing)
    unique = []
    for spec, unit in out:
        if all(unit.key != u.key for _, u in unique):
            unique.append((spec, unit))
    if len(unique) < len(out):
        ctx.log(f"  train: {len(out) - len(unique)} entr{'y' if len(out) - len(unique) == 1 else 'ies'} ended with "
                f"the model another entry has; it is encoded and evaluated once")
    return unique


def _commit_selection(ctx, n, cands, cunits, sel_unit, results, n_val) -> None:
    spec = ctx.config.methods[n]
    metric, grid = spec["select"]["metric"], spec["select"]["grid"]
    scores = [None if isinstance(r, Exception) else float(r) for r in results]
    best = select.choose(metric, scores)
    name = model_id(cands[0])
    if best < 0:
        first = next(r for r in results if isinstance(r, Exception))
        raise InputError(f"{ctx.config.source_file}: {ctx.config.entry(n)} ({name}): every candidate failed; the "
                         f"first: {first}")
    rows = [{"params": {k: c[k] for k in grid}, "model": u.key,
             "score": s, "error": None if s is not None else str(r).splitlines()[0]}
            for c, u, s, r in zip(cands, cunits, scores, results)]
    sel_unit.begin()
    label = model_id({k: v for k, v in cands[0].items() if k not in grid})   # the entry, searched parameters aside
    ctx.commit(sel_unit, {"method": spec["method"], "label": label, "metric": metric, "grid": grid,
                          "validation_rows": n_val,
                          "higher_is_better": higher_is_better(metric),
                          "candidates": rows, "chosen": best, "model": cunits[best].key, "spec": cands[best]})
    shown = "; ".join(f"{select.describe(grid, r['params'])}: "
                      + (f"{r['score']:.4f}" if r["score"] is not None else "failed") for r in rows)
    ctx.log(f"  train: {label} selected {select.describe(grid, rows[best]['params'])} by "
            f"{metric} on {n_val:,} validation rows ({shown})")
    failed = [r for r in rows if r["score"] is None]
    if failed:   # why, once: candidates usually fail alike (a rate that diverges)
        why = str(failed[0]["error"])
        for k in grid:   # "lower 'lr' (now 300.0)" is advice for a value the user set, not a searched one
            why = why.split(f"; lower '{k}'")[0]
        ctx.log(f"  train: {label}: {len(failed)} of {len(rows)} candidates failed, the selection compares the "
                f"others; {select.describe(grid, failed[0]['params'])}: {why}")
