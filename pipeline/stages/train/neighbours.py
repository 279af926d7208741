"""Train-stage driver for SL-NE and SL-DE: selects the training rows, reads them block by block into
the estimator's input space, and calls the estimator's entry points (`tasks.slne`); no learning here.

SL-NE holds its training set in the preprocessed space (n_train x p floats) in one task: the SGD
of Algorithm 1 visits samples in random order. An SL-DE member holds only its projection
(n_train x d), which is what lets members of a high-dimensional input train on small workers: a
task per row-block preprocesses its training rows once and writes them in every member's subspace
to a scratch array in the model's unit, each member is one task reading its own
(:func:`metricpipe.tasks.slne.fit_member`), and one more task assembles them
(:meth:`SLDE.assemble`). At millions of rows, ``neighbours.queries`` bounds the training set: the
sampled rows and their neighbours.
"""

import time

import numpy as np
from sklearn.base import clone

from metricpipe.config import NeighboursConfig
from metricpipe.folds import Fold, fold_split
from metricpipe.stages.common import Fed
from metricpipe.store import array_names, create_array, load_arrays, open_array, read_rows, remove_tree, save_model
from metricpipe.tasks import slne
from metricpipe.tasks.splits import TRAIN, VAL


def _statistics(stats_url: str):
    stats, _ = load_arrays(stats_url)
    return stats["mean"], stats["pca_components"]


# Validation rows an SL-NE / SL-DE member stops early on (a seeded sample of the val split).
VALIDATION_ROWS = 2000


def _validation(data_url: str, graph_url: str, to_space, split: np.ndarray):
    """(Z_val, y_val, neighbourhoods among the training rows as local indices) of at most
    VALIDATION_ROWS val rows of ``split`` (the user's, or those a selection borrowed), their
    neighbourhoods from the stored graph; None when there are none or the graph was sampled
    (neighbours.queries: val rows were not searched)."""
    if "query_rows" in array_names(graph_url):
        return None
    val = np.flatnonzero(split == VAL)
    if not len(val):
        return None
    if len(val) > VALIDATION_ROWS:
        val = np.sort(np.random.default_rng([0, 61]).choice(val, VALIDATION_ROWS, replace=False))
    train = np.flatnonzero(split == TRAIN)
    g = read_rows(f"{graph_url}/neighbours", val).astype(np.int64)
    pos = np.minimum(np.searchsorted(train, np.maximum(g, 0)), len(train) - 1)
    nbr = np.where((g >= 0) & (train[pos] == g), pos, -1)
    labels = open_array(f"{data_url}/label")[:]
    return to_space(read_rows(f"{data_url}/features", val)), labels[val], nbr


def _within(lists: np.ndarray, split: np.ndarray) -> np.ndarray:
    """Neighbour lists (global rows, -1 none) kept to the rows ``split`` has in train, in their order:
    the graph of every stored train row restricted to a fold's (the nearest fit rows of a row are
    its nearest stored train rows less the borrowed ones)."""
    lists = np.where((lists >= 0) & (split[np.maximum(lists, 0)] == TRAIN), lists, -1)
    return np.take_along_axis(lists, np.argsort(lists < 0, axis=1, kind="stable"), axis=1)


def _selected(data_url: str, graph_url: str, split: np.ndarray):
    """(rows, y, graph) of the training rows: ``split``'s train rows, or with a sampled graph
    (neighbours.queries) the sampled ones and their neighbours (:func:`slne.training_graph`), sorted;
    their labels; their graph in local indices."""
    if "query_rows" in array_names(graph_url):
        anchors = open_array(f"{graph_url}/query_rows")[:]
        anchors = anchors[split[anchors] == TRAIN]
    else:
        anchors = np.flatnonzero(split == TRAIN)
    rows, graph = slne.training_graph(
        anchors, _within(read_rows(f"{graph_url}/neighbours", anchors).astype(np.int64), split)
    )
    return rows, open_array(f"{data_url}/label")[:][rows], graph


def _inputs(data_url: str, graph_url: str, chunks: list, to_space, split: np.ndarray):
    """(Z, y, graph) of the training rows (:func:`_selected`): ``to_space`` maps each row-block's
    selected rows into the estimator's input space."""
    rows, y, graph = _selected(data_url, graph_url, split)
    features = open_array(f"{data_url}/features")
    parts = []
    for a, b in chunks:  # one row-block at a time; only the rows in the input space are kept
        local = rows[(rows >= a) & (rows < b)] - a
        if len(local):
            parts.append(to_space(features[a:b][local]))
    return np.concatenate(parts), y, graph


def _train_slne(est, spec, data_url, stats_url, graph_url, chunks, model_url, fold) -> dict:
    est = clone(est)  # fitted here, never the caller's object (a threaded worker shares it)
    mean, components = _statistics(stats_url)
    to_space = est.input_map(mean, components)
    split = fold_split(data_url, fold)
    Z, y, graph = _inputs(data_url, graph_url, chunks, to_space, split)
    val = _validation(data_url, graph_url, to_space, split) if est.validates() else None
    t0, c0 = time.perf_counter(), time.thread_time()
    est.fit_space(Z, y, graph, mean, components, *(val or ()))
    seconds = time.perf_counter() - t0
    return save_model(
        model_url,
        est,
        spec,
        seconds,
        cpu_seconds=time.thread_time() - c0,
        samples_per_second=est.epochs * len(Z) / max(seconds, 1e-9),
        best_epoch=est.best_epoch(),
    )


# -- SL-DE: the training rows are read and preprocessed once, for every member --------------------------
# A task per row-block writes its training rows in each member's subspace into that member's scratch
# array in the model's unit (piece i: block i's rows); a member task reads its own array alone. Each
# member reading every row-block itself read and preprocessed the features N_E times (500,000 x 4,096
# rows, 8 members: 66 GB read, 327 s of the members' wall time).
SCRATCH = "member_rows"  # in the model's unit, removed before it is saved


def _plan_members(data_url: str, graph_url: str, chunks: list, fold, url: str, members: int, d: int):
    """The training rows (:func:`_selected`) and the rows of each row-block among them; makes each
    member's scratch array (row-block, row, d) float32, one chunk a row-block."""
    rows, y, graph = _selected(data_url, graph_url, fold_split(data_url, fold))
    cuts = np.searchsorted(rows, [a for a, _ in chunks] + [chunks[-1][1]])
    most = max(1, int(np.diff(cuts).max()))
    for n in range(members):
        create_array(f"{url}/{SCRATCH}/{n}", (len(chunks), most, d), (1, most, d), np.float32, fill_value=np.nan)
    return rows, y, graph, cuts


def _member_rows(est, data_url: str, stats_url: str, url: str, i: int, a: int, b: int, plan) -> int:
    """Row-block i (rows a:b): its training rows in every member's subspace (:meth:`SLDE.members_map`),
    each into piece i of that member's scratch array; returns how many."""
    rows, cuts = plan[0], plan[3]
    local = rows[cuts[i] : cuts[i + 1]] - a
    if len(local):
        mean, components = _statistics(stats_url)
        parts = est.members_map(mean, components)(open_array(f"{data_url}/features")[a:b][local])
        for n, Z in enumerate(parts):
            open_array(f"{url}/{SCRATCH}/{n}", mode="r+")[i, : len(local)] = Z
    return len(local)


def _train_member(est, n, data_url, stats_url, graph_url, url, fold, plan, *counts):
    """Member n on its rows in the scratch array (``counts``: each row-block's, written before)."""
    _, y, graph, _ = plan
    pieces = open_array(f"{url}/{SCRATCH}/{n}")[:]
    Zn = np.concatenate([pieces[i, :c] for i, c in enumerate(counts)])
    mean, components = _statistics(stats_url)
    to_space = est.member_map(mean, components, n)  # (the validation rows only)
    return slne.fit_member(
        est.member_params(n),
        Zn,
        y,
        graph,
        est.member_seed(n),
        validation=_validation(data_url, graph_url, to_space, fold_split(data_url, fold)),
    )


def _assemble(est, spec, data_url, stats_url, graph_url, chunks, model_url, fold, *members) -> dict:
    """The fitted ensemble from its members (the training rows are read again only for ``refine``)."""
    est = clone(est)
    remove_tree(f"{model_url}/{SCRATCH}")  # the members' rows (their tasks are done): not part of the model
    mean, components = _statistics(stats_url)
    Z = y = graph = None
    if est.refine:
        Z, y, graph = _inputs(data_url, graph_url, chunks, est.input_map(mean, components), fold_split(data_url, fold))
    t0, c0 = time.perf_counter(), time.thread_time()
    est.assemble(list(members), mean, components, Z, y, graph)
    metas = [meta for _, meta in members]
    seconds = sum(m["seconds"] for m in metas) + time.perf_counter() - t0
    return save_model(
        model_url,
        est,
        spec,
        seconds,
        cpu_seconds=sum(m.get("cpu_seconds", 0.0) for m in metas) + time.thread_time() - c0,
        members=len(metas),
        member_seconds=[m["seconds"] for m in metas],
        samples_per_second=float(np.mean([m["samples_per_second"] for m in metas])),
    )


def submit(ctx, spec: dict, est, data, stats, neighbours, unit, name: str, fold: Fold):
    """Submit the tasks that train one SL-NE (one task) or SL-DE (its training rows in every member's
    subspace, a task per row-block; a task per member; one that assembles them) model; returns the
    future of the train stage's record of it."""
    args = (data.url, stats.url, neighbours.url, data.chunks)
    k = open_array(f"{stats.url}/pca_components").shape[0]  # the input space's p (metadata only)
    p = min(est.input_dim or k, k)
    n_members = est.n_members(p)
    if not n_members:  # one task fits it
        return ctx.submit(_train_slne, est, spec, *args, unit.url, fold, name=f"train-{name}")
    plan = ctx.submit(
        _plan_members,
        data.url,
        neighbours.url,
        data.chunks,
        fold,
        unit.url,
        n_members,
        est.member_size(p),
        name=f"train-{name}-rows",
    )
    counts = [
        ctx.submit(_member_rows, est, data.url, stats.url, unit.url, i, a, b, plan, name=f"train-{name}-member-rows")
        for i, (a, b) in enumerate(data.chunks)
    ]
    members = [
        ctx.submit(
            _train_member,
            est,
            n,
            data.url,
            stats.url,
            neighbours.url,
            unit.url,
            fold,
            plan,
            *counts,
            name=f"train-{name}-member{n}",
        )
        for n in range(n_members)
    ]
    # the task that ends in the model carries its name (the plan's estimate of the whole model is its)
    return ctx.submit(_assemble, est, spec, *args, unit.url, fold, *members, name=f"train-{name}")


def fed(est, info, cfg, n_train: int) -> Fed:
    """Its training rows and their neighbour lists: the train rows, or with neighbours.queries the
    sampled rows (the only ones with a list) and their neighbours."""
    nb = cfg.neighbours or NeighboursConfig()
    anchors = n_train if nb.queries is None else min(n_train, nb.queries)
    rows = n_train if nb.queries is None else min(n_train, nb.queries * (nb.k + 1))
    return Fed(rows, nb.k, anchors, "set neighbours.queries (the sampled rows and their neighbours train it)")


def reads(est, info, cfg, n_rows: int) -> int:
    """Nothing inside the fit: its rows and graph are read before it."""
    return 0
