"""Train-stage wiring for SL-NE and SL-DE: the workers' side reads the training rows block by block,
maps them to the SL-NE input space (and a member's subspace), and calls `tasks.slne`.

SL-NE holds its training set in the preprocessed space (n_train x p floats) in one task: the SGD
of Algorithm 1 visits samples in random order. An SL-DE member holds only its projection
(n_train x d), which is what lets members of a high-dimensional input train on small workers. At
millions of rows, ``neighbours.queries`` bounds the training set: the sampled rows and their
neighbours.
"""
import time

import numpy as np

from metricpipe.storage import array_names, load_arrays, open_array, read_rows, save_arrays
from metricpipe.tasks import slne
from metricpipe.tasks.errors import InputError

TRAIN = 0


def _space(stats_url: str, dim: int | None):
    stats, _ = load_arrays(stats_url)
    comps = stats["pca_components"]
    if dim is not None and dim > len(comps):
        raise InputError(f"The 'dim' (or 'input_dim') parameter of slne/slde must be <= {len(comps)}, the PCA "
                         f"directions available. Got {dim} instead.")
    p = len(comps) if dim is None else dim
    return stats["mean"].astype(np.float32), comps[:p].T.astype(np.float32)


def _inputs(data_url: str, stats_url: str, graph_url: str, chunks: list, dim, Pn=None):
    """(Z, y, graph) of the training rows: Z in the SL-NE space (optionally projected by Pn), graph as
    local indices. The training rows are the train split, or with a sampled graph (neighbours.queries)
    the sampled rows and their neighbours; a neighbour-only row has no graph row of its own (-1) and
    takes part through the symmetrised edges of Eq. 4."""
    mean, P = _space(stats_url, dim)
    split = open_array(f"{data_url}/split")[:]
    labels = open_array(f"{data_url}/label")[:]
    if "query_rows" in array_names(graph_url):
        anchors = open_array(f"{graph_url}/query_rows")[:]
        g = read_rows(f"{graph_url}/neighbours", anchors)
        rows = np.union1d(anchors, g[g >= 0])
    else:
        anchors = rows = np.flatnonzero(split == TRAIN)
        g = read_rows(f"{graph_url}/neighbours", rows)
    keep = np.zeros(len(split), bool)
    keep[rows] = True
    parts = []
    for a, b in chunks:  # one row-block at a time; only the projected rows are kept
        local = np.flatnonzero(keep[a:b])
        if len(local):
            Z = slne.preprocess(open_array(f"{data_url}/features")[a:b][local], mean, P)
            parts.append(Z if Pn is None else Z @ Pn.T)
    pos = np.full(len(split), -1, np.int64)
    pos[rows] = np.arange(len(rows))
    graph = np.full((len(rows), g.shape[1]), -1, np.int64)
    graph[pos[anchors]] = np.where(g >= 0, pos[np.maximum(g, 0)], -1)
    return np.concatenate(parts), labels[rows], graph, mean, P


def _save(model_url: str, spec: dict, mean, P, M, L, meta: dict) -> dict:
    save_arrays(model_url, {"pre_mean": mean, "pre_P": P, "W": L, "M": M},
                {"spec": spec, "dim": int(L.shape[1]), "fit_meta": meta, "identity": False, "score": "inner"})
    return {"dim": int(L.shape[1]), "score": "inner", "bilinear_dim": int(P.shape[1])}


def _train_slne(spec, data_url, stats_url, graph_url, chunks, model_url) -> dict:
    Z, y, graph, mean, P = _inputs(data_url, stats_url, graph_url, chunks, spec.get("dim"))
    t0 = time.perf_counter()
    model = slne.SLNE(**slne.slne_params(spec), seed=spec["seed"]).fit(Z, y, graph)
    seconds = time.perf_counter() - t0
    L = slne.factor(model.M_, spec.get("rank"))
    res = _save(model_url, spec, mean, P, model.M_, L, {"history": model.history})
    return {**res, "fit_seconds": seconds, "samples_per_second": spec["epochs"] * len(Z) / max(seconds, 1e-9)}


def _subspaces(spec, stats_url):
    _, P = _space(stats_url, spec.get("input_dim"))
    return slne.subspaces(P.shape[1], spec["members"], spec["dim"], spec["subspace"], spec["seed"])


def _train_member(spec, n, data_url, stats_url, graph_url, chunks):
    Pn = _subspaces(spec, stats_url)[n]
    Zn, y, graph, _, _ = _inputs(data_url, stats_url, graph_url, chunks, spec.get("input_dim"), Pn)
    return slne.fit_member(Zn, y, graph, slne.slne_params(spec), slne.member_seed(spec["seed"], n))


def _assemble(spec, data_url, stats_url, graph_url, chunks, model_url, *members) -> dict:
    """Sum the members (Eq. 8), optionally refine them jointly, factor each into codes."""
    Ps = _subspaces(spec, stats_url)
    Ms = [m for m, _ in members]
    t0 = time.perf_counter()
    mean, P = _space(stats_url, spec.get("input_dim"))
    if spec.get("refine"):
        Z, y, graph, _, _ = _inputs(data_url, stats_url, graph_url, chunks, spec.get("input_dim"))
        Ms = slne.refine(Ps, Ms, Z, y, graph, slne.slne_params(spec), spec["seed"])
    M = slne.ensemble_matrix(Ps, Ms)
    # codes: concatenated members' factors, <code_x, code_y> = sum_n <L_n P_n z_x, L_n P_n z_y>
    L = np.concatenate([Pn.T @ slne.factor(Mn, spec.get("rank")) for Pn, Mn in zip(Ps, Ms)], axis=1)
    metas = [meta for _, meta in members]
    res = _save(model_url, spec, mean, P, M, L.astype(np.float32),
                {"members": [{"history": m["history"], "seconds": m["seconds"]} for m in metas]})
    seconds = sum(m["seconds"] for m in metas) + time.perf_counter() - t0
    return {**res, "fit_seconds": seconds, "member_seconds": [m["seconds"] for m in metas],
            "samples_per_second": float(np.mean([m["samples_per_second"] for m in metas]))}


def submit(ctx, spec: dict, data, stats, neighbours, unit, name: str):
    """Submit the tasks that train one SL-NE or SL-DE model; returns the future of its result."""
    args = (data.url, stats.url, neighbours.url, data.chunks)
    if spec["method"] == "slne":
        return ctx.submit(_train_slne, spec, *args, unit.url, name=f"train-{name}")
    members = [ctx.submit(_train_member, spec, n, *args, name=f"train-{name}-member{n}")
               for n in range(spec["members"])]
    return ctx.submit(_assemble, spec, *args, unit.url, *members, name=f"train-{name}-ensemble")
