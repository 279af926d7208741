"""Which fits the train stage makes, known before any work: per config entry and repeat, the
candidates it trains (one model when nothing is chosen or stopped on), on which rows, whether the
chosen one is refitted on every train row, and what each fit costs (the learner says:
``Learner.fit_cost``). The stage (:func:`metricpipe.stages.train.run_train`) and the plan
(`metricpipe plan`) read the same answer."""

import json
from dataclasses import dataclass

import numpy as np

from metricpipe.folds import borrowing
from metricpipe.tasks import madds, registry, splits
from metricpipe.tasks.base import seed_of
from metricpipe.tasks.madds import FitCost
from metricpipe.tasks.splits import TRAIN, VAL


@dataclass(frozen=True)
class EntryFits:
    """Config entry ``n`` in repeat ``repeat``: its spec there, the candidates it fits, whether they fit
    the fold's rows and are judged on its validation rows (``validated``), and whether the chosen one
    is refitted on every train row afterwards (``refit``: the validation rows were borrowed)."""

    n: int
    repeat: int
    spec: dict
    cands: list
    validated: bool
    refit: bool


def repeat_spec(spec: dict, repeat: int) -> dict:
    """The entry's spec for repeat ``repeat``: a learner with a seed gets ``random_state`` + repeat
    (repeat 0 is the entry as written); one without keeps its spec (its repeats differ only by the
    rows a selection borrows)."""
    if repeat == 0 or "random_state" not in registry.defaults(registry.estimator_class(spec["method"], spec)):
        return spec
    return {**spec, "random_state": seed_of(spec.get("random_state")) + repeat}


def entry_fits(methods: list, repeats: int, has_val: bool, borrowed: bool) -> list[EntryFits]:
    """Every (entry, repeat)'s fits: an entry with parameters left to selection fits every candidate,
    a learner that stops early its one candidate, on the fold (the train rows less the validation rows,
    ``has_val``: there are some); anything else one model on every train row."""
    out = []
    for r in range(repeats):
        for n, entry in enumerate(methods):
            spec = repeat_spec(entry, r)
            cands = registry.candidates(spec)
            validated = has_val and (len(cands) > 1 or registry.make(cands[0]).validates())
            refit = validated and borrowed and (spec.get("select") or {}).get("refit", True)
            out.append(EntryFits(n, r, spec, cands if validated else cands[:1], validated, bool(refit)))
    return out


@dataclass(frozen=True)
class Rows:
    """The rows a run's fits see: every train row (``train``), and a candidate's fold: ``fit`` rows to
    fit, ``val`` to validate (``borrowed``: taken from the train rows)."""

    train: int
    fit: int
    val: int
    borrowed: bool


def fold_rows(info, val_setting, seed: int) -> Rows:
    """The rows of the fold a selection works on, counted from the labels before staging (which rows
    are borrowed waits for the staged rows' keys; how many per class does not)."""
    split = info.split
    borrowed = borrowing(split, val_setting)
    fold = splits.borrow(split, info.labels, np.arange(len(split), dtype=np.uint64), seed) if borrowed else split
    return Rows(int((split == TRAIN).sum()), int((fold == TRAIN).sum()), int((fold == VAL).sum()), borrowed)


@dataclass(frozen=True)
class Fit:
    """One fit of the plan: its entry and repeat, the spec, ``role`` ("model", "candidate" or "refit"),
    the rows it is fed, its cost (None: the learner does not say) and whether an earlier line of the
    plan is the same fit (trained once)."""

    n: int
    repeat: int
    spec: dict
    role: str
    rows: int
    cost: FitCost | None
    same_as_earlier: bool = False


def planned_fits(info, cfg, feeders: dict) -> tuple[Rows, list[Fit]]:
    """The train stage's fits of ``cfg`` on data ``info`` (before staging), each with its cost;
    ``feeders``: the train stage's, which say what each kind of learner is fed."""
    rows = fold_rows(info, cfg.data.split.val, cfg.data.split.seed)
    n_classes = len(info.classes or []) or 2
    out, seen = [], set()

    def cost_of(spec, n_rows, n_val):
        est = registry.make(spec)
        feeder = feeders[est.feeds]
        fed = feeder.fed(est, info, cfg, n_rows)
        fit = est.fit_cost(fed.rows if fed else n_rows, info.n_features, n_classes, fed.k if fed else 0, n_val)
        read = feeder.reads(est, info, cfg, n_rows)  # what its feeder reads inside the fit
        return fit if fit is None or not read else fit + FitCost(madds.read(read * info.n_features))

    def add(e, spec, role, n_rows, n_val, cost, fold):
        key = json.dumps([spec, fold, role == "refit"], sort_keys=True, default=str)
        out.append(Fit(e.n, e.repeat, spec, role, n_rows, cost, key in seen))
        seen.add(key)

    for e in entry_fits(cfg.methods, cfg.repeats, rows.val > 0, rows.borrowed):
        n_rows, n_val = (rows.fit, rows.val) if e.validated else (rows.train, 0)
        fold = e.repeat if e.validated and rows.borrowed else None
        costs = [cost_of(c, n_rows, n_val) for c in e.cands]
        role = "candidate" if e.validated else "model"
        for c, cost in zip(e.cands, costs):
            add(e, c, role, n_rows, n_val, cost, fold)
        if e.refit and registry.make(e.cands[0]).refits(n_rows):
            stops = registry.make(e.cands[0]).validates()
            refit = _refit_cost([cost_of(c, rows.train, 0) for c in e.cands], stops)
            add(e, e.cands[0], "refit", rows.train, 0, refit, None)
    return rows, out


def _refit_cost(costs: list, stops_early: bool) -> FitCost | None:
    """The chosen candidate's refit: the dearest candidate on every train row, an upper bound where
    they differ or early stopping cut the steps the refit repeats (both known once they are scored)."""
    if any(c is None for c in costs):
        return None
    top = max(c.madds for c in costs)
    return FitCost(top, stops_early or any(c.at_most for c in costs) or min(c.madds for c in costs) < top)
