"""What the data rules out, checked once its header and labels are read and before any unit is written:
each learner's parameters against the data's shape (`check_methods`), the evaluation's K against the
splits, each stage's largest task against the workers' memory (`check_memory`), and what the run writes
against the store's free space (`check_disk`)."""

from dataclasses import replace

import numpy as np

from metricpipe import budget, stages
from metricpipe.budget import refuse_without_dense_covariance
from metricpipe.config import SPLIT_NAMES, EvaluateConfig, RunConfig, classifiers_given, unserved
from metricpipe.folds import borrowing
from metricpipe.stages.train.select import selection_rows
from metricpipe.store import chunk_bytes
from metricpipe.tasks import evaluation, pq, registry, splits
from metricpipe.tasks.errors import InputError


def largest_tasks(info, cfg: RunConfig, limit: float) -> list:
    """What the largest task of each stage of this run holds (each stage says: ``largest_tasks``)."""
    ran = [stages.statistics, stages.train, stages.encode, stages.evaluate] + (
        [stages.neighbours] if "neighbours" in stages.stage_names(cfg) else []
    )
    return [task for stage in ran for task in stage.largest_tasks(info, cfg, limit)]


def check_memory(client, info, cfg: RunConfig) -> None:
    """Refuse, before staging, a run whose largest task would not fit a worker (``budget``)."""
    budget.check_memory(client, cfg, lambda limit: largest_tasks(info, cfg, limit))


def stored_bytes(info, cfg: RunConfig) -> list:
    """(what, bytes, how to shrink it) of every unit this run writes at its largest, each stage saying
    (its ``stored_bytes``; the neighbour graph, models, evaluations and report are small beside them:
    ``budget.disk_margin``)."""
    specs = stages.train.final_specs(stages.train.fits(info, cfg)[1])
    return (
        stages.data.stored_bytes(info)
        + stages.statistics.stored_bytes(info, cfg)
        + stages.train.stored_bytes(info, cfg)
        + stages.encode.stored_bytes(info, cfg, specs)
    )


def check_disk(store, info, cfg: RunConfig) -> None:
    """Refuse, before staging, a run whose units would not fit the store's file system (the disk rule,
    ``budget.check_disk``): what each stage writes at the most (its ``stored_bytes``), less what the
    store's committed units of those kinds hold, counted alike (a resume reuses them). The stages
    check again, exactly, before they write."""
    if budget.disk_free(store) is None:
        return
    needs = stored_bytes(info, cfg)
    kinds = ("data", "statistics", "shuffled", "codes", stages.pq.KIND)
    held = sum(_counted(u) for kind in kinds for u in store.units(kind) if u.done())
    budget.check_disk(store, cfg, needs, held)


def _counted(unit) -> float:
    """A committed unit's bytes as the rule counts them (its chunks uncompressed); 0 if unreadable."""
    try:
        return chunk_bytes(unit.url)
    except Exception:  # a damaged unit is no credit (the stage that needs it verifies and recomputes it)
        return 0.0


def check_methods(cfg: RunConfig, info, log=print) -> RunConfig:
    """Every parameter the data's shape rules out (dim above the features, LDA's dim above
    classes - 1, classes that are not labels of the data, ...) is refused here, after the source's header
    and labels are read and before any unit is written. Returns the config with the default
    evaluation lists cut to what the splits hold (said in the log)."""
    noted = set()  # once per config entry and note, not per model or searched candidate
    for n, spec in enumerate(cfg.methods):
        _check_selection_metric(cfg, n, spec, info)
        for cand in registry.candidates(spec):
            for note in _check_candidate(cfg, n, cand, info):
                if (cfg.entry(n), note) not in noted:
                    log(f"  {cfg.entry(n)} ({stages.model_id(cand)}): {note}")
                    noted.add((cfg.entry(n), note))
    if "neighbours" in stages.stage_names(cfg):
        stages.check_neighbours_k(cfg, int((info.split == stages.TRAIN).sum()))
    _check_encode(cfg, info)
    return _check_classifiers(_check_retrieval(cfg, info, log), info, log)


def _check_encode(cfg: RunConfig, info) -> None:
    """encode.pq's quantisers train 256 centroids per sub-quantiser on the train rows: as many rows at least."""
    n_train = int((info.split == stages.TRAIN).sum())
    if cfg.encode.pq and n_train < pq.CENTROIDS:
        raise InputError(
            f"{cfg.source_file}: encode.pq: a product quantiser trains {pq.CENTROIDS} centroids per "
            f"sub-quantiser on the train rows, and the data has {n_train}; give at least {pq.CENTROIDS} "
            f"train rows, or leave encode.pq out"
        )


def _check_selection_metric(cfg: RunConfig, n: int, spec: dict, info) -> None:
    """A knnK (softvoteK) selection metric votes over the train rows selection compares with: K of them at most."""
    metric = (spec.get("select") or {}).get("metric", "")
    if not metric.startswith(("knn", "softvote")):
        return
    k = int(metric[3:] if metric.startswith("knn") else metric[8:])
    split = info.split  # (sized with stand-in row keys: which rows are borrowed waits for staging)
    if borrowing(split, cfg.data.split.val):
        split = splits.borrow(split, info.labels, np.arange(len(split), dtype=np.uint64), cfg.data.split.seed)
    n_ref = len(selection_rows(split, info.labels, info.n_features, cfg.seed)[1])
    if k > n_ref:  # every candidate would vote over every reference row: a tie
        raise InputError(
            f"{cfg.source_file}: {cfg.entry(n)} ({stages.model_id(spec)}): select.metric {metric} "
            f"votes over more neighbours than the {n_ref} train rows that selection compares "
            f"the validation rows with; use K <= {n_ref}"
        )


def _check_candidate(cfg: RunConfig, n: int, cand: dict, info) -> list[str]:
    """Refuse what the data's shape rules out for one model (or searched candidate); the notes to log."""
    where = f"{cfg.source_file}: {cfg.entry(n)} ({stages.model_id(cand)})"
    n_seen = len(splits.seen_classes(info.split, info.labels))  # the classes data.split.classes leaves to learn
    try:
        est = registry.make(cand)
        est.check_data_shape(info.n_features, n_seen)
        trained = est.trained_classes(info.classes)  # the labels NCMML's classes names are the data's
        if len(trained) < len(info.classes):
            _refuse_held_out(trained, splits.unseen_classes(info.split, info.labels), info.classes)
    except InputError as e:
        raise InputError(f"{where}: {e}") from None
    refuse_without_dense_covariance(est, info.n_features, cfg.statistics.max_dense_dim, where)
    raw = cfg.raw.get("methods") or []
    i = cfg.method_entries[n] if n < len(cfg.method_entries) else n
    asked = raw[i] if i < len(raw) and isinstance(raw[i], dict) else {}
    return est.shape_notes(info.n_features, n_seen) + _pool_notes(est, info, asked)


def _pool_notes(est, info, entry: dict) -> list[str]:
    """A SLEM negative pool whose config ``entry`` asks for more images than its split holds takes
    them all: said, since the model's parameters still read the count asked for (the default
    count, 15,000 at most, goes unsaid)."""
    if est.feeds != "pool":  # (a pool learner's parameter negatives says which rows make its pool)
        return []
    neg = est.negatives
    asked = entry.get("negatives")
    asked = asked if isinstance(asked, list) else [asked]  # (a sweep of pools: a list of them)
    if (
        not isinstance(neg, dict)
        or not any(isinstance(a, dict) and "count" in a for a in asked)
        or not isinstance(neg.get("count"), int)
        or neg.get("split", "train") not in SPLIT_NAMES
    ):
        return []
    split = neg.get("split", "train")
    have = int((info.split == SPLIT_NAMES.index(split)).sum())
    if 2 <= have < neg["count"]:
        return [f"negatives.count {neg['count']:,} is more than the {have:,} {split} rows: the pool is all of them"]
    return []


def _refuse_held_out(named, held, classes: list) -> None:
    """A learner's ``classes`` may not name a class data.split.classes holds out: it never sees its rows."""
    both = np.intersect1d(named, held)
    if len(both):
        raise InputError(
            f"classes lists {classes[int(both[0])]!r}, which data.split.classes holds out (no learner "
            f"sees its rows); drop it from one of them"
        )


def _check_retrieval(cfg: RunConfig, info, log) -> RunConfig:
    """Each retrieval query ranks the other test rows: the default K list is cut to them, a K the user
    gave is refused past them, and a test split where no class has two rows is warned of."""
    ev, n_test = cfg.evaluate, int((info.split == stages.TEST).sum())
    if not ev.retrieval:
        return cfg
    given = cfg.raw.get("evaluate") if isinstance(cfg.raw.get("evaluate"), dict) else {}
    user_k = isinstance(given.get("retrieval"), dict) and "k" in given["retrieval"]
    if not user_k and max(ev.retrieval_k) > n_test - 1:  # the default list, on a small test split
        ks = tuple(k for k in ev.retrieval_k if k <= n_test - 1) or (1,)
        log(f"  evaluate: {n_test} test rows: retrieval k {list(ks)} (the default's larger K need more rows)")
        cfg = replace(cfg, evaluate=replace(ev, retrieval_k=ks))
    if max(cfg.evaluate.retrieval_k) > n_test - 1:
        raise InputError(
            f"{cfg.source_file}: evaluate.retrieval.k: {max(cfg.evaluate.retrieval_k)} is more than "
            f"the retrieval database holds (each test query ranks the other {n_test - 1} test rows); "
            f"use K <= {n_test - 1}"
        )
    groups = info.groups  # a query with nothing relevant to find has no AP: every retrieval figure would be NaN
    keys = (groups if groups is not None else info.labels)[info.split == stages.TEST]
    if len(keys) and not evaluation.can_rank(keys):
        log(
            f"  evaluate: no class{' (group)' if groups is not None else ''} has two of the {n_test} test "
            f"rows, so no retrieval query has a relevant image to find: mAP, recall and MAP@R are undefined "
            f"(NaN in the report); give the test split two or more rows of a class, or set "
            f"evaluate.retrieval: false"
        )
    return cfg


def _check_classifiers(cfg: RunConfig, info, log) -> RunConfig:
    """A knnK classifier votes over the train rows: the defaults are cut to them, a K the user gave is
    refused past them; the default classifiers a model cannot serve are logged as skipped."""
    ev, n_train = cfg.evaluate, int((info.split == stages.TRAIN).sum())
    knn = [int(c[3:]) for c in ev.classifiers if c.startswith("knn")]
    if knn and max(knn) > n_train and not classifiers_given(cfg.raw):  # the defaults, on a small train split
        kept = tuple(c for c in ev.classifiers if not c.startswith("knn") or int(c[3:]) <= n_train)
        log(f"  evaluate: {n_train} train rows: classifiers {list(kept)} (the default's larger knnK need more rows)")
        cfg = replace(cfg, evaluate=replace(ev, classifiers=kept))
        knn = [k for k in knn if k <= n_train]
    for s in skipped_classifiers(cfg, cfg.methods):
        if s["model"] != "every model":  # that one is logged above
            log(f"  evaluate: {s['model']} skips {s['classifier']}: {s['reason']}")
    if knn and max(knn) > n_train:
        raise InputError(
            f"{cfg.source_file}: evaluate.classification.classifiers: knn{max(knn)} votes over more "
            f"neighbours than the {n_train} train rows; use knnK with K <= {n_train}"
        )
    return cfg


def skipped_classifiers(cfg: RunConfig, specs) -> list[dict]:
    """{model, classifier, reason} for each default classifier a model cannot serve (``unserved``): it is
    skipped for that model, and the run manifest and report say so. A classifier the user lists is
    refused at load instead."""
    if classifiers_given(cfg.raw):
        return []
    small = [
        {
            "model": "every model",
            "classifier": c,  # check_methods dropped it
            "reason": "votes over more neighbours than the train split holds",
        }
        for c in EvaluateConfig.classifiers
        if c not in cfg.evaluate.classifiers
    ]
    return small + [
        {"model": stages.model_id(spec), "classifier": c, "reason": why}
        for spec in specs
        for c in cfg.evaluate.classifiers
        if (why := unserved(spec, c))
    ]
