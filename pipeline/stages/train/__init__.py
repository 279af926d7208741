"""Stage 4, train: one model per (method, parameter set), each fitted by its own estimator class.

The stage names no learner: it builds the unfitted estimator from the config entry through the
registry (``tasks.registry.make``) and hands it to the driver for what the registry says the
learner is fed (``tasks.registry.feeds``). A driver moves data and nothing else: it reads the rows
the learner needs, calls the estimator's documented entry point on a worker, and stores the fitted
estimator (``storage.save_model``).
"""

import time
import warnings
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from metricpipe.context import StageContext
from metricpipe.folds import Fold, borrow_seed, borrowing, fold_split
from metricpipe.stages.common import DataInfo, labels_list
from metricpipe.stages.train import neighbours, pairs, pool, select, shuffle, statistics, stream, subset
from metricpipe.stages.train.fits import entry_fits, planned_fits
from metricpipe.store import Unit, hash_key
from metricpipe.tasks import registry
from metricpipe.tasks.base import seed_of
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.evaluation import higher_is_better
from metricpipe.tasks.splits import TRAIN, VAL, seen_classes

model_id = registry.model_name  # (the stages' name for it)


# A run prints this as a note before any work (RandomProjection.shape_notes); the worker's copy of the
# warning would reach the terminal as a raw line. Set once for the process: catch_warnings is not
# thread-safe, and a worker may run several fits at once.
warnings.filterwarnings("ignore", message="random projection to dim", category=UserWarning)


FEEDERS = {
    "statistics": statistics,
    "stream": stream,
    "pairs": pairs,
    "neighbours": neighbours,
    "subset": subset,
    "pool": pool,
}  # one feeder per kind of input (a learner's ``feeds``)


def largest_tasks(info, cfg, limit: float) -> list:
    """What each learner says its largest task holds (``Learner.largest_task``), fed what the feeder of
    its kind hands it (the feeder's ``fed``), with the run's setting that shrinks it."""
    n_train = int((info.split == TRAIN).sum())
    n_classes = len(info.classes or []) or 2
    out, seen = [], set()
    for spec in cfg.methods:
        for est in map(registry.make, registry.candidates(spec)):
            fed = FEEDERS[est.feeds].fed(est, info, cfg, n_train)
            task = est.largest_task(fed.rows, info.n_features, n_classes, fed.k, fed.anchors) if fed else None
            if task is not None and task[0] not in seen:
                seen.add(task[0])
                what, need, fix = task
                out.append((what, need, ", ".join(x for x in (fed.fix, fix) if x) + ", or raise memory_limit"))
    return out


def stored_bytes(info, cfg) -> list:
    """What the stage writes at the most (the disk rule): each seed's shuffled copy of the training
    rows its SGD learners read (the fitted models are small beside it)."""
    n_train = int((info.split == TRAIN).sum())
    specs = [f.spec for f in fits(info, cfg)[1]]
    out = []
    for seed, rows in _copy_rows(specs, len(info.classes or [])).items():
        out += shuffle.stored_bytes(shuffle.first_rows(n_train, info.chunk_rows, seed, rows), info.n_features)
    return out


def final_specs(fits: list) -> list:
    """One spec per model the run keeps (for the stages after train): each entry and repeat's, once."""
    out, seen = [], set()
    for f in fits:
        if (f.n, f.repeat) not in seen and not f.same_as_earlier:
            out.append(f.spec)
        seen.add((f.n, f.repeat))
    return out


def fits(info, cfg) -> tuple:
    """(the rows its fits see, every fit with its cost) of the train stage of ``cfg`` on ``info``, before
    any work (:func:`~metricpipe.stages.train.fits.planned_fits`, fed as this stage's feeders feed)."""
    return planned_fits(info, cfg, FEEDERS)


def model_key(spec: dict, stats: Unit, neighbours: Unit | None, data: DataInfo, fold: Fold = Fold()) -> str:
    inputs = {"stage": "model", "spec": spec, "statistics": stats.key, "data": data.unit.key, **fold.key()}
    if registry.feeds(spec["method"], spec) == "neighbours":  # (what its fit reads)
        inputs["neighbours"] = neighbours.key
    return hash_key(inputs)


class Trained(NamedTuple):
    """A model the run keeps: its spec as the records name it (the chosen candidate's), its unit,
    and the (config entry, repeat) pairs it is the model of (a baseline serves every repeat)."""

    spec: dict
    unit: Unit
    serves: tuple


@dataclass
class _Plan:
    """One config entry in one repeat: its candidates, the fold they fit, and what is kept."""

    n: int
    repeat: int
    spec: dict
    fold: Fold
    cands: list
    cunits: list
    sel_unit: Unit | None = None
    refit: bool = False  # refit the chosen candidate on every train row (its rows were borrowed)
    chosen: int | None = None  # the candidate kept, once known
    final: Unit | None = None  # the model kept (the chosen candidate, or its refit)


def _copy_rows(specs: list, n_classes: int) -> dict:
    """Per seed, the rows of the shuffled copy (``metricpipe.shuffle``) that its SGD learners read
    at most (``pool_rows()``; None: every row, also for a learner that does not say)."""
    need = {}
    for spec in specs:
        if registry.feeds(spec["method"], spec) not in ("stream", "pairs"):
            continue
        est = registry.make(spec)
        seed, rows = seed_of(est.random_state), est.pool_rows(n_classes)
        need[seed] = None if rows is None or need.get(seed, 0) is None else max(need.get(seed, 0), rows)
    return need


def _note_val_classes(ctx: StageContext, data: DataInfo, split: np.ndarray, n: int, spec: dict) -> None:
    """Say which classes a learner that early-stops on class error (NCMML, NCMC, k-NN ML) has no val
    row of, and why (few-shot classes; with data.pairs, rows the pairs join stay in train)."""
    est = registry.make(spec)
    if est.feeds != "stream":  # (the learners that early-stop on class error)
        return
    wanted = est.trained_classes(data.classes)
    wanted = wanted[np.isin(wanted, seen_classes(data.split, data.labels))]  # (data.split.classes: not those)
    missing = np.setdiff1d(wanted, data.labels[split == VAL])
    if not len(missing):
        return
    names = ", ".join(
        str(v) if isinstance(v, (int, np.integer)) else repr(str(v)) for v in (data.classes[c] for c in missing[:5])
    ) + (", ..." if len(missing) > 5 else "")
    d = ctx.config.data
    why = (
        "the val rows of data.split.column (or, where it has none, val: auto's share of its train rows)"
        if d.split.column
        else "data.split.val: auto borrows val rows only from train rows that no pair of data.pairs joins"
        if d.pairs and d.split.val == "auto"
        else "a class's share of data.split.val: auto is under one row when it has few rows"
        if d.split.val == "auto"
        else "the data's val rows"
    )
    ctx.log(
        f"  train: {ctx.config.entry(n)} ({model_id(spec)}): the val split holds no row of {len(missing)} of the "
        f"{len(wanted)} classes it trains on ({names}; {why}); its early stopping scores the others"
    )


def _splits(ctx: StageContext, data: DataInfo) -> tuple[bool, list]:
    """(whether the run borrows validation rows, each repeat's (fold, split codes))."""
    borrowed = borrowing(data.split, ctx.config.data.split.val)
    out = []
    for r in range(ctx.config.repeats):
        fold = Fold(borrow_seed(ctx.config.data.split.seed, r)) if borrowed else Fold()
        out.append((fold, fold_split(data.url, fold)))
    return borrowed, out


def _plans(ctx: StageContext, data: DataInfo, stats: Unit, neighbours: Unit | None) -> list[_Plan]:
    borrowed, folds = _splits(ctx, data)
    has_val = bool((folds[0][1] == VAL).any())
    if not has_val and any(spec.get("select") for spec in ctx.config.methods):
        d = ctx.config.data
        why = (
            "data.split.val: 0"
            if d.split.val != "auto"
            else "data.split.val: auto found none to borrow: every class keeps two train rows"
            + (", and rows data.pairs joins stay in train" if d.pairs else "")
        )
        ctx.log(f"  train: the data has no validation rows ({why}), so parameters keep their defaults")
    plans = []
    for e in entry_fits(ctx.config.methods, ctx.config.repeats, has_val, borrowed):
        fold, split = folds[e.repeat]
        if has_val and e.repeat == 0:
            _note_val_classes(ctx, data, split, e.n, e.spec)
        fold_n = fold if e.validated else Fold()  # nothing to choose or stop on: one model on every train row
        plan = _Plan(
            e.n,
            e.repeat,
            e.spec,
            fold_n,
            list(e.cands),
            [ctx.store.unit("models", model_key(c, stats, neighbours, data, fold_n)) for c in e.cands],
            refit=e.refit,
        )
        if len(e.cands) > 1:
            plan.sel_unit = ctx.store.unit(
                "selection",
                select.selection_key(plan.cunits, e.spec["select"]["metric"], ctx.config.seed, ctx.config),
            )
        plans.append(plan)
    return plans


def run_train(ctx: StageContext, data: DataInfo, stats: Unit, neighbours: Unit | None) -> list[Trained]:
    """One model per config entry (and repeat): an entry with parameters left to selection trains
    every candidate on the train rows less the validation rows it borrows, keeps the best on them
    (``metricpipe.select``) and refits it on every train row (``select.refit``); a learner that
    stops early does the same with its one candidate. Returns the models kept, each once."""
    plans = _plans(ctx, data, stats, neighbours)
    _resume_choices(ctx, plans)
    ctx.shuffle_rows = _copy_rows([c for p in plans for c in p.cands], len(data.classes))
    # phase 1: every candidate (and every model fitted once) whose entry has no choice yet
    todo, required = _candidates_to_fit(ctx, plans)
    for p in plans:  # what the plan expected and the run already has: no time left for it
        for c, u in zip(p.cands, p.cunits):
            if u.key not in todo:
                ctx.skip_task(f"train-{model_id(c)}")
    futures = _submit(ctx, todo, data, stats, neighbours)
    scores = _submit_scores(ctx, plans, futures, data)
    _gather_models(ctx, futures, required, data)
    _choose(ctx, plans, scores, data, stats, neighbours)
    # phase 2: the chosen candidates refitted on every train row
    refits, refit_of = _refits(ctx, plans, data, stats, neighbours)
    trained = _submit(ctx, refits, data, stats, neighbours, refit_of)
    _gather_models(ctx, trained, set(trained), data, refit_of)
    made = set(futures) | set(trained)
    kept = sum(1 for p in plans if p.final.key not in made and not any(u.key in made for u in p.cunits))
    if kept:
        ctx.log(f"  train: reusing {kept} of {len(plans)} models")
    ctx.validated = sorted(
        {u.rel for p in plans if p.refit for u in p.cunits if u.done() and u.key != p.final.key}
    )  # the fits a refit replaced (gc keeps them)
    return _kept(ctx, plans)


def _resume_choices(ctx: StageContext, plans: list) -> None:
    """What a resumed run already has: a committed selection's choice (with its candidates beyond the
    grid), or a validated single model's fit."""
    for p in plans:
        if p.sel_unit is not None:
            if ctx.reuse(p.sel_unit, "train"):
                _with_extensions(ctx, p, p.sel_unit.meta())
                if ctx.reuse(p.cunits[p.sel_unit.meta()["chosen"]], "train"):
                    p.chosen = p.sel_unit.meta()["chosen"]
        elif p.refit and ctx.reuse(p.cunits[0], "train"):
            p.chosen = 0


def _candidates_to_fit(ctx: StageContext, plans: list) -> tuple[dict, set]:
    """({key: (spec, unit, fold, plan)} of every candidate to fit, the keys whose failure ends the run:
    the models fitted once). A plan with a choice fits nothing, unless --repair finds a candidate damaged."""
    todo, required = {}, set()
    for p in plans:
        if p.chosen is not None:
            if ctx.repair and p.sel_unit is not None:  # a damaged candidate not kept is retrained alone
                for i, u in enumerate(p.cunits):
                    if i != p.chosen and (u.done() or u.marker_damaged()) and not ctx.reuse(u, "train"):
                        todo.setdefault(u.key, (p.cands[i], u, p.fold, p))
            continue
        for c, u in zip(p.cands, p.cunits):
            todo.setdefault(u.key, (c, u, p.fold, p))
        if p.sel_unit is None:
            required.add(p.cunits[0].key)
    return todo, required


def _refits(ctx: StageContext, plans: list, data, stats, neighbours) -> tuple[dict, dict]:
    """Each plan's final model: its chosen candidate, or that candidate's refit on every train row
    (with the parameters the fit said repeat its schedule). ({key: (spec, unit, fold, plan)} to fit,
    {refit key: the chosen candidate's key})."""
    refits, refit_of = {}, {}
    for p in plans:
        if p.chosen is None:
            p.chosen = 0
        if not p.refit:
            p.final = p.cunits[p.chosen]
            continue
        chosen = p.cunits[p.chosen]
        params = chosen.meta().get("refit", {})
        if params is None:  # the learner: a refit would see no more rows than this fit did, so keep it
            p.final = chosen
            continue
        spec = {**p.cands[p.chosen], **params}
        p.final = ctx.store.unit("models", model_key(spec, stats, neighbours, data))
        refits.setdefault(p.final.key, (spec, p.final, Fold(), p))
        refit_of[p.final.key] = chosen.key
    return refits, refit_of


def _with_extensions(ctx, p: _Plan, meta: dict) -> None:
    """A committed selection's candidates beyond its grid (it searched past an edge) back in the plan,
    in its order, so that its choice indexes them."""
    for row in meta.get("candidates", [])[len(p.cands) :]:
        p.cands.append({**p.cands[0], **row["params"]})
        p.cunits.append(ctx.store.unit("models", row["model"]))


def _submit(ctx: StageContext, todo: dict, data, stats, neighbours, refit_of: dict | None = None) -> dict:
    """Submit the training of every unit of ``todo`` ({key: (spec, unit, fold, plan)}) that is not
    reusable; returns {key: (spec, unit, future, plan)}. A refit's task (``refit_of``) is named
    after the candidate it refits: ``train-NAME-refit``."""
    out = {}
    for key, (spec, unit, fold, plan) in todo.items():
        name = f"{model_id(plan.cands[plan.chosen])}-refit" if refit_of and key in refit_of else model_id(spec)
        if ctx.reuse(unit, "train"):
            ctx.skip_task(f"train-{name}")
            continue
        unit.begin()
        driver = FEEDERS[registry.feeds(spec["method"], spec)].submit
        ctx.returning_errors = True  # a candidate may diverge (a score, not a failure); else named below
        try:
            out[key] = (
                spec,
                unit,
                driver(ctx, spec, registry.make(spec), data, stats, neighbours, unit, name, fold),
                plan,
            )
        finally:
            ctx.returning_errors = False
    return out


def _submit_scores(ctx: StageContext, plans: list[_Plan], futures: dict, data) -> dict:
    """Each pending selection's candidates scored on its repeat's validation rows."""
    pending = [p for p in plans if p.sel_unit is not None and p.chosen is None]
    scores, rows = {}, {}
    for p in pending:
        if p.repeat not in rows:
            split = fold_split(data.url, p.fold)
            metrics = [q.spec["select"]["metric"] for q in pending if q.repeat == p.repeat]
            rows[p.repeat] = select.submit_data(ctx, data, split, metrics)
        scores.update(_score(ctx, p, p.cands, p.cunits, futures, rows[p.repeat][0]))
    return {"futures": scores, "rows": rows}


def _score(ctx, p: _Plan, cands, cunits, futures: dict, sel_future) -> dict:
    out = {}
    for c, u in zip(cands, cunits):
        trained = futures[u.key][2] if u.key in futures else None  # (this runs after it)
        out[(p.sel_unit.key, u.key)] = select.submit_score(
            ctx, trained, u, p.spec["select"]["metric"], sel_future, model_id(c)
        )
    return out


def _gather_models(ctx: StageContext, futures: dict, required: set, data, refit_of: dict | None = None) -> None:
    """Wait for the models of ``futures``, committing each as its task returns (an interrupt or a later
    failure keeps it); a failed model in ``required`` stops the run with its entry's one line, once
    the other models have finished and are kept (a k-NN ML that diverged after 69 steps cancelled an
    NCMC 80 minutes into its fit, and SL-DE's members: a rerun had them all to fit again)."""
    t0 = time.perf_counter()
    items = list(futures.values())
    names = [
        model_id(plan.cands[plan.chosen]) + " refitted" if refit_of and unit.key in refit_of else model_id(spec)
        for spec, unit, _, plan in items
    ]

    failed = []

    def commit(i, res):
        spec, unit, _, plan = items[i]
        if isinstance(res, Exception):
            unit.discard()  # no half-written model is left behind (a selection records the failure)
            if unit.key in required:  # a model the run needs: its config entry's one line, said now
                failed.append(f"{ctx.config.source_file}: {ctx.config.entry(plan.n)} ({model_id(spec)}): {res}")
                if len(failed) == 1 and len(items) > 1:
                    ctx.log(f"  train: {failed[0]}; the other models go on and are kept, then the run stops")
            return
        unit.commit(
            {
                **res,
                "spec": spec,
                "seconds": round(res["fit_seconds"], 3),
                "wall": round(time.perf_counter() - t0, 3),
                "data": data.unit.key,
                "normalize": ctx.config.data.normalize,
                "class_names": labels_list(data.classes),
                **({"refit_of": refit_of[unit.key]} if refit_of and unit.key in refit_of else {}),
            }
        )
        if "samples_per_second" in res:
            ctx.log(f"  train: {names[i]} {res['samples_per_second']:.0f} samples/s")

    ctx.gather([f for _, _, f, _ in items], "train", [f"model {n}" for n in names], on_result=commit)
    if failed:
        raise InputError(failed[0])


def _choose(ctx: StageContext, plans: list[_Plan], scores: dict, data, stats, neighbours) -> None:
    """Each pending selection's choice; a choice at the edge of its grid searches outward first
    (``select.outward``), each step's candidates trained on the same rows and scored as the others."""
    keys = list(scores["futures"])
    values = ctx.gather([scores["futures"][k] for k in keys], "train", [f"selection score {k[1]}" for k in keys])
    values = dict(zip(keys, values))
    pending = [p for p in plans if p.sel_unit is not None and p.chosen is None]
    results = {id(p): [values[(p.sel_unit.key, u.key)] for u in p.cunits] for p in pending}
    steps = {id(p): {} for p in pending}
    while True:
        todo, new = {}, []
        for p in pending:
            for c in _outward(ctx, p, results[id(p)], steps[id(p)]):
                u = ctx.store.unit("models", model_key(c, stats, neighbours, data, p.fold))
                p.cands.append(c)
                p.cunits.append(u)
                todo.setdefault(u.key, (c, u, p.fold, p))
                new.append((p, c, u))
        if not new:
            break
        futures = _submit(ctx, todo, data, stats, neighbours)
        more = {}
        for p in {id(q): q for q, _, _ in new}.values():
            mine = [(c, u) for q, c, u in new if q is p]
            more.update(
                _score(ctx, p, [c for c, _ in mine], [u for _, u in mine], futures, scores["rows"][p.repeat][0])
            )
        _gather_models(ctx, futures, set(), data)
        got = ctx.gather(list(more.values()), "train", [f"selection score {k[1]}" for k in more])
        for (sel_key, _), value in zip(more, got):
            p = next(q for q in pending if q.sel_unit.key == sel_key)
            results[id(p)].append(value)
    for p in plans:
        if p.sel_unit is None:
            unit = p.cunits[0]
            if p.refit and unit.done() and unit.meta().get("best_iter") == 0 and p.repeat == 0:
                ctx.log(
                    f"  train: {model_id(p.cands[0])}: early stopping kept the model it starts from (no step "
                    f"lowered its validation score); its parameters may not suit this data (select: true "
                    f"searches them)"
                )
            continue
        if p.chosen is None:
            _commit_selection(ctx, p, results[id(p)], scores["rows"][p.repeat][1], steps[id(p)])
        p.chosen = p.sel_unit.meta()["chosen"]
        ctx.selections.append(p.sel_unit.rel)


def _outward(ctx, p: _Plan, results: list, steps: dict) -> list[dict]:
    """The candidates one log step beyond the edge the current choice sits on (none inside its grid)."""
    metric, grid = p.spec["select"]["metric"], p.spec["select"]["grid"]
    best = select.choose(metric, [None if isinstance(r, Exception) else float(r) for r in results])
    if best < 0:
        return []
    chosen, out = p.cands[best], []
    floats = {k: v for k, v in grid.items() if all(isinstance(x, float) for x in v)}
    for name, (side, value) in select.outward(floats, p.cands, chosen, steps).items():
        steps[(name, side)] = steps.get((name, side), 0) + 1
        cand = {**chosen, name: float(f"{value:.12g}")}
        try:
            registry.make(cand)._validate_params()
        except Exception:  # noqa: BLE001 - beyond what the parameter allows: that side is bounded
            steps[(name, side)] = select.EDGE_STEPS
            continue
        if cand not in p.cands:
            out.append(cand)
    if out:
        again = f" (repeat {p.repeat})" if p.repeat else ""
        ctx.log(
            f"  train: {model_id({k: v for k, v in chosen.items() if k not in grid})}{again}: "
            f"{select.describe(grid, chosen)} is at the edge of its grid; also trying "
            + "; ".join(select.describe({k: 0 for k in grid if c[k] != chosen[k]}, c) for c in out)
        )
    return out


def _kept(ctx: StageContext, plans: list[_Plan]) -> list[Trained]:
    """The final models, each once with every (entry, repeat) it serves: a selection may choose the
    model another entry sets (identical entries are merged at load), and a model without a seed
    or selection is the same in every repeat."""
    out = {}
    for p in plans:
        spec = p.cands[p.chosen]
        if p.final.key in out:
            s, u, serves = out[p.final.key]
            out[p.final.key] = Trained(s, u, serves + ((p.n, p.repeat),))
        else:
            out[p.final.key] = Trained(spec, p.final, ((p.n, p.repeat),))
    shared = sum(1 for t in out.values() if len({n for n, _ in t.serves}) > 1)
    if shared:
        ctx.log(
            f"  train: {shared} entr{'y' if shared == 1 else 'ies'} ended with the model another entry has; "
            f"it is encoded and evaluated once"
        )
    return list(out.values())


def _commit_selection(ctx, p: _Plan, results, n_val, steps: dict) -> None:
    spec = p.spec
    cands, cunits, sel_unit = p.cands, p.cunits, p.sel_unit
    metric, grid = spec["select"]["metric"], spec["select"]["grid"]
    scores = [None if isinstance(r, Exception) else float(r) for r in results]
    best = select.choose(metric, scores)
    name = model_id(cands[0])
    if best < 0:
        first = next(r for r in results if isinstance(r, Exception))
        raise InputError(
            f"{ctx.config.source_file}: {ctx.config.entry(p.n)} ({name}): every candidate failed; the first: {first}"
        )
    rows = [
        {
            "params": {k: c[k] for k in grid},
            "model": u.key,
            "score": s,
            "error": None if s is not None else str(r).splitlines()[0],
        }
        for c, u, s, r in zip(cands, cunits, scores, results)
    ]
    sel_unit.begin()
    label = model_id({k: v for k, v in cands[0].items() if k not in grid})  # the entry, searched parameters aside
    edge = select.at_edge({k: v for k, v in grid.items() if all(isinstance(x, float) for x in v)}, cands, cands[best])
    ctx.commit(
        sel_unit,
        {
            "method": spec["method"],
            "label": label,
            "metric": metric,
            "grid": grid,
            "validation_rows": n_val,
            "repeat": p.repeat,
            "entry": p.n,
            "extended": len(cands) - len(registry.candidates(spec)),
            "edge": edge,
            "higher_is_better": higher_is_better(metric),
            "candidates": rows,
            "chosen": best,
            "model": cunits[best].key,
            "spec": cands[best],
        },
    )
    shown = "; ".join(
        f"{select.describe(grid, r['params'])}: " + (f"{r['score']:.4f}" if r["score"] is not None else "failed")
        for r in rows
    )
    again = f" (repeat {p.repeat})" if p.repeat else ""
    ctx.log(
        f"  train: {label}{again} selected {select.describe(grid, rows[best]['params'])} by "
        f"{metric} on {n_val:,} validation rows ({shown})"
    )
    for name, side in edge.items():
        extreme = "largest" if side == "upper" else "smallest"
        ctx.log(
            f"  train: {label}{again}: {name} {cands[best][name]:g} is still the {extreme} value tried after "
            f"{steps.get((name, side), 0)} step(s) beyond the grid; the best may lie further "
            f"(set select.{name} to search there)"
        )
    failed = [r for r in rows if r["score"] is None]
    if failed:  # why, once: candidates usually fail alike (a rate that diverges)
        why = str(failed[0]["error"])
        for k in grid:  # "lower 'lr' (now 300.0)" is advice for a value the user set, not a searched one
            why = why.split(f"; lower '{k}'")[0]
        ctx.log(
            f"  train: {label}: {len(failed)} of {len(rows)} candidates failed, the selection compares the "
            f"others; {select.describe(grid, failed[0]['params'])}: {why}"
        )
