"""Stage 6, evaluate: retrieval (test queries against the rest of the test set) and classification
(train as the database) of every model's codes; the kernels are in `metricpipe.tasks.evaluation`.

    protocol   what an evaluation reads (seen / held-out classes) and how queries are cut into tasks
    blocks     the worker-side functions (a block of queries each)
    knn_index  kNN through IVF lists past ivf.EXACT_MAX_TRAIN train rows
    records    the metric records of a view
    encoded    the encoded databases (encode.pq), searched through their product quantisers
"""

import time

from metricpipe import ivf
from metricpipe.budget import BLOCKS_PER_TASK, SPILL_FRACTION, retrieval_db_budget, row_block, usable
from metricpipe.config import NeighboursConfig
from metricpipe.context import StageContext
from metricpipe.stages.common import TEST, TRAIN, DataInfo, commit_timed, moments_block, spec_params, tree_combine
from metricpipe.stages.evaluate.blocks import (
    class_means,
    classify_block,
    keeps_distances,
    query_centroids,
    read_ncm_model,
    retrieval_block,
    unseen_ncm_model,
)
from metricpipe.stages.evaluate.encoded import run_evaluate_encoded
from metricpipe.stages.evaluate.knn_index import index_plan, ivf_lists
from metricpipe.stages.evaluate.protocol import (
    CLASSIFY_QUERIES,
    EVAL_BUDGET,
    RETRIEVAL_DB_BYTES,
    Protocol,
    fixed_blocks,
    protocols,
    query_blocks,
    query_group,
    served_classifiers,
)
from metricpipe.stages.evaluate.records import view_records
from metricpipe.store import Unit, hash_key, read_attrs
from metricpipe.tasks import evaluation, knn, madds, registry
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.scoring import RETRIEVAL_QUERIES
from metricpipe.tasks.validate import class_codes

__all__ = [
    "CLASSIFY_QUERIES",
    "EVAL_BUDGET",
    "RETRIEVAL_DB_BYTES",
    "RETRIEVAL_QUERIES",
    "Protocol",
    "largest_tasks",
    "protocols",
    "run_evaluate",
    "run_evaluate_encoded",
    "served_classifiers",
]


class _Run:
    """What every evaluation of this stage shares: the protocols, the scattered labels, the graph."""

    def __init__(self, ctx: StageContext, data: DataInfo, codes: list, neighbours: Unit | None):
        self.ctx, self.data, self.neighbours = ctx, data, neighbours
        self.protos = protocols(ctx, data)
        self.db_max = retrieval_db_budget(ctx.client, EVAL_BUDGET - RETRIEVAL_DB_BYTES)
        self.labels_f = ctx.client.scatter(data.labels, broadcast=True, hash=False)
        self.rel_f = (
            self.labels_f if data.groups is None else ctx.client.scatter(data.groups, broadcast=True, hash=False)
        )
        self.graph_url = neighbours.url if neighbours is not None else None
        self.graph = neighbours.meta() if neighbours is not None else {}
        # When the models that leave classes out of training all keep the same ones, every model also
        # reports its errors on the other classes' test images: the control beside the new-class figure.
        subsets = {tuple(self.trained(spec)) for spec, *_ in codes if spec.get("classes")}
        self.common = list(subsets.pop()) if len(subsets) == 1 else None

    def trained(self, spec) -> list:
        """The class codes a model learns from ([] for all): [5, 6], ["5", "6"] and [6, 5] name one subset."""
        return class_codes(spec["classes"], self.data.classes).tolist() if spec.get("classes") else []

    def trained_on(self, spec) -> list | None:
        return self.trained(spec) or self.common


def run_evaluate(
    ctx: StageContext, data: DataInfo, codes: list, neighbours: Unit | None = None
) -> list[tuple[dict, Unit]]:
    """Retrieval (test queries against the rest of test) and classification (train as database).

    Every model is evaluated on its codes; a bilinear model (SL-NE, SL-DE) also on its exact
    similarity (query view Z M against base view Z), so the loss from factoring is visible. When the
    run holds classes out, every model is also evaluated on them (:class:`Protocol`).
    """
    if any(c.startswith("softvote") for c in ctx.config.evaluate.classifiers) and neighbours is None:
        raise InputError(
            f"{ctx.config.source_file}: evaluate: softvote classifiers need the neighbours stage; "
            f"add neighbours: {{k: 50}}"
        )
    run = _Run(ctx, data, codes, neighbours)
    out, jobs, costs, reused = [], [], {}, 0
    for spec, cunit, dim in codes:
        unit = _evaluation_unit(run, spec, cunit)
        out.append((spec, unit))
        if ctx.reuse(unit, "evaluate"):
            reused += 1
            continue
        unit.begin()
        costs[unit.key] = cunit.meta().get("cost")
        jobs += _view_jobs(run, spec, cunit, unit, dim)
    indexed = [job for job in jobs if _knn_source(run, job)]
    if indexed:
        ivf_lists(ctx, data, indexed, run.graph.get("index"))
    _submit_classify(run, jobs)
    if reused:
        ctx.log(f"  evaluate: reusing {reused} of {len(codes)} evaluations")
    _write_records(run, jobs, costs)
    return out


def _evaluation_unit(run: _Run, spec: dict, cunit: Unit) -> Unit:
    """A model's evaluation unit, keyed by its codes, the graph, the evaluate section, the IVF plan,
    the classes it was trained on and the classifiers it serves beyond the config's (its own)."""
    ctx, data, ev = run.ctx, run.data, run.ctx.config.evaluate
    added = [c for c in served_classifiers(ev, spec) if c not in ev.classifiers]
    own = {"own_classifier": added} if added else {}
    return ctx.store.unit(
        "evaluation",
        hash_key(
            {
                "stage": "evaluation",
                "seed": ctx.config.seed,
                "codes": cunit.key,
                "graph": run.neighbours.key if run.neighbours else None,
                "evaluate": ev.__dict__,
                "data": data.unit.key,
                "indexes": index_plan(ctx, data, cunit, run.protos[0].n_train),
                "trained_on": run.trained_on(spec),
                **own,
            }
        ),
    )


def _view_jobs(run: _Run, spec: dict, cunit: Unit, unit: Unit, dim: int) -> list[dict]:
    """One job per protocol and view of a model's codes (a bilinear model's exact view too), retrieval submitted."""
    cmeta = cunit.meta()
    views = [("codes", f"{cunit.url}/codes", f"{cunit.url}/codes", (cmeta.get("score") or "euclidean"))]
    if cmeta.get("bilinear"):
        views.append(("exact", f"{cunit.url}/query", f"{cunit.url}/base", "inner"))
    model_url = run.ctx.store.unit("models", read_attrs(cunit.url)["model"]).url
    return [
        _job(
            run,
            proto,
            spec,
            unit,
            dim,
            view,
            q_url,
            db_url,
            score,
            model_url,
            served_classifiers(run.ctx.config.evaluate, spec, proto),
        )
        for proto in run.protos
        for view, q_url, db_url, score in views
    ]


def _knn_source(run: _Run, job: dict) -> bool:
    """Where a seen-class job's kNN finds its neighbours: the stored graph when the codes keep the
    features' distances (its lists set here), else an exact search, or past ivf.EXACT_MAX_TRAIN train
    rows IVF lists (True: ``ivf_lists`` fills them, from the neighbours stage's index when it fits)."""
    graph = run.graph
    if job["proto"] is not run.protos[0] or not job["k"]:
        return False  # (the held-out classes' kNN: an exact search over their train rows)
    keeps = job["view"] == "codes" and keeps_distances(job["model_url"])
    if keeps and graph.get("queries") == run.data.n_samples and job["k"] <= graph["k"]:
        job["lists"] = [f"{run.graph_url}/neighbours"] * len(job["blocks"])  # the graph is the codes' graph
        job["knn_note"] = {"knn_search": "graph", "knn_recall": graph.get("recall", 1.0)}
        return False
    if run.protos[0].n_train > ivf.EXACT_MAX_TRAIN and job["score"] in ("euclidean", "inner"):
        # the neighbours stage's index is an index of these codes too (a streamed search keeps none)
        job["index"] = run.graph_url if keeps and graph.get("method") == "ivf" and not graph.get("streamed") else None
        return True
    return False


def _submit_classify(run: _Run, jobs: list) -> None:
    """Each job's classify tasks, one per query block, once its kNN lists are known."""
    for job in jobs:
        (q_url, db_url), (means, ncm, served) = job["urls"], job["classify"]
        if served:
            job["cls"] = [
                run.ctx.submit(
                    classify_block,
                    q_url,
                    db_url,
                    job["score"],
                    q,
                    run.data.url,
                    run.data.chunks,
                    run.labels_f,
                    served,
                    means,
                    run.graph_url,
                    ncm,
                    lists,
                    job["proto"].train,
                    name=f"classify-{registry.model_name(job['spec'])}",
                    madds=_classify_cost(job, len(q)) if lists is None else None,  # (given lists: no search)
                )
                for q, lists in zip(job["blocks"], job["lists"])
            ]


def _classify_cost(job: dict, n_queries: int) -> float | None:
    """Multiply-adds of a classify task's exact kNN search over the train rows (None: no kNN)."""
    return knn.search_cost(n_queries, job["proto"].n_train, job["dim"]) if job["k"] else None


def _write_records(run: _Run, jobs: list, costs: dict) -> None:
    """Gather every job's results and commit each evaluation unit with its records."""
    ctx, data = run.ctx, run.data
    t0 = time.perf_counter()
    records = {}
    for job in jobs:
        spec, unit, dim, view, score, proto = (job[k] for k in ("spec", "unit", "dim", "view", "score", "proto"))
        seen_classes = proto.name != "unseen"
        name = f"{registry.model_name(spec)} ({view}{'' if proto.name is None else ', ' + proto.name + ' classes'})"
        ret_res = ctx.gather(
            job["ret"], "evaluate", [f"model {name} retrieval block {i}" for i in range(len(job["ret"]))]
        )
        cls_res = ctx.gather(
            job["cls"], "evaluate", [f"model {name} classification block {i}" for i in range(len(job["cls"]))]
        )
        extra = {} if view == "codes" and score == "euclidean" else {"view": view, "score": score}
        recs = records.setdefault(unit.key, (unit, []))[1]
        recs.extend(
            view_records(
                spec,
                dim,
                proto.ks,
                job["classify"][2],
                data.labels[proto.classified],
                ret_res,
                cls_res,
                extra,
                run.trained_on(spec) if seen_classes else None,
                data.labels[proto.queries],
                job["knn_note"],
                proto.name,
            )
        )
        if view == "codes" and seen_classes and costs.get(unit.key):  # the projection's size and cost by its metrics
            base = {"method": spec["method"], "dim": dim, "classifier": None, "params": spec_params(spec)}
            recs.extend({**base, "metric": k, "value": v} for k, v in costs[unit.key].items())
    for unit, recs in records.values():
        unit.write_json("records.json", recs)
        commit_timed(ctx, unit, t0, {})


def _job(
    run: _Run,
    proto: Protocol,
    spec: dict,
    unit: Unit,
    dim: int,
    view: str,
    q_url: str,
    db_url: str,
    score: str,
    model_url: str,
    served: tuple,
) -> dict:
    """Submit one view's retrieval under ``proto`` and what its classification needs (class means, an
    NCM model's biases or centroids); the classify tasks follow once kNN's lists are known."""
    means = _class_means_task(run, proto, db_url) if evaluation.NCM in served else None
    ret = _retrieval_tasks(run, proto, spec, dim, q_url, db_url, score) if run.ctx.config.evaluate.retrieval else []
    ncm_model = _ncm_model_task(run, proto, spec, view, model_url, served)
    blocks = fixed_blocks(proto.classified, CLASSIFY_QUERIES)
    return {
        "spec": spec,
        "unit": unit,
        "dim": dim,
        "view": view,
        "score": score,
        "ret": ret,
        "cls": [],
        "knn_note": {},
        "blocks": blocks,
        "lists": [None] * len(blocks),
        "proto": proto,
        "index": None,
        "k": max([int(c[3:]) for c in served if c.startswith("knn")], default=0),
        "urls": (q_url, db_url),
        "classify": (means, ncm_model, served),
        "model_url": model_url,
    }


def _class_means_task(run: _Run, proto: Protocol, db_url: str):
    """The classes' means of the train rows in the codes at ``db_url`` (a tree of partial moments)."""
    ctx, data = run.ctx, run.data
    _, total = tree_combine(
        ctx,
        (
            ctx.submit(moments_block, data.url, a, b, len(data.classes), False, db_url, proto.train, name="ncm-means")
            for a, b in data.chunks
        ),
        "ncm-combine",
    )
    return ctx.submit(class_means, total, name="ncm-means")


def _retrieval_tasks(run: _Run, proto: Protocol, spec: dict, dim: int, q_url: str, db_url: str, score: str) -> list:
    """The query blocks' retrieval tasks, after the k-means centroids of the queries they cluster with."""
    ctx, data = run.ctx, run.data
    cents = ctx.submit(
        query_centroids,
        q_url,
        proto.km_rows,
        proto.n_clusters,
        [ctx.config.seed, 33],
        name=f"kmeans-{registry.model_name(spec)}",
    )
    return [
        ctx.submit(
            retrieval_block,
            q_url,
            db_url,
            score,
            q,
            proto.test,
            run.rel_f,
            proto.ks,
            proto.ukb,
            data.chunk_rows,
            query_group(len(proto.test)),
            proto.acc_k,
            cents,
            run.db_max,
            name=f"retrieval-{registry.model_name(spec)}",
            madds=knn.search_cost(len(q), len(proto.test), dim) + len(q) * madds.sort(len(proto.test)),
        )
        for q in query_blocks(proto.queries, len(proto.test))
    ]


def _ncm_model_task(run: _Run, proto: Protocol, spec: dict, view: str, model_url: str, served: tuple):
    """The model's own NCM classifier (its biases, or the held-out classes' centroids), when it serves."""
    ctx, data = run.ctx, run.data
    own = registry.estimator_class(spec["method"], spec).own_classifier
    if view == "codes" and own in served:
        if proto.name != "unseen":
            return ctx.submit(read_ncm_model, model_url, name="ncm-model")
        if own == evaluation.NCMC:  # the held-out classes' centroids (the dot form's biases are the implied ones)
            return ctx.submit(unseen_ncm_model, model_url, data.url, data.chunks, proto.train, name="ncm-model")
    return None


def largest_tasks(info, cfg, limit: float) -> list:
    """A row-block task beside the evaluation's buffers, a retrieval task's database (the test split's
    codes, held whole: n_test x the widest code the config names), a soft-vote task."""
    D, n_train, n_test = info.n_features, int((info.split == TRAIN).sum()), int((info.split == TEST).sum())
    need = BLOCKS_PER_TASK * row_block(info) + EVAL_BUDGET
    fix = "lower data.chunk_mb or raise memory_limit"
    if EVAL_BUDGET >= 0.9 * usable(limit):  # smaller blocks cannot help: the buffers alone do not fit
        fix = (
            f"raise memory_limit to at least {-(-need // SPILL_FRACTION // 1e6):,.0f} MB (the evaluation's "
            f"buffers alone take {EVAL_BUDGET / 1e6:,.0f} MB)"
        )
    out = [("a row-block task (4 row-blocks and the evaluation's buffers)", need, fix)]
    n_classes = len(info.classes or []) or 2
    learners = [registry.make(cand) for spec in cfg.methods for cand in registry.candidates(spec)]
    if cfg.evaluate.retrieval and learners:
        d = max(est.code_dim(D, n_classes) for est in learners)
        out.append(
            (
                f"a retrieval task's database (the {n_test:,} test rows' codes, up to {d} dimensions)",
                n_test * d * 4.0 + EVAL_BUDGET - RETRIEVAL_DB_BYTES,
                "set evaluate.retrieval: false, lower data.split's test share, or raise memory_limit",
            )
        )
    if any(c.startswith("softvote") for c in cfg.evaluate.classifiers) and learners and n_train:
        d = max(est.view_dim(D, n_classes) for est in learners)  # (SL-NE's exact view too)
        k = (cfg.neighbours or NeighboursConfig()).k
        rows = min(n_train, CLASSIFY_QUERIES * k)
        out.append(
            (
                f"a soft-vote task ({CLASSIFY_QUERIES:,} queries' {k} stored neighbours: {rows:,} rows of codes up "
                f"to {d} dimensions)",
                (rows + CLASSIFY_QUERIES) * d * 4.0 + evaluation.SOFTVOTE_GROUP_BYTES,
                "lower neighbours.k, drop the softvote classifiers, or raise memory_limit",
            )
        )
    return out


def work(info, cfg, specs: list) -> float:
    """Multiply-adds of scoring the codes of each model of ``specs``: classification, the classified
    test rows searched among the train rows; retrieval, each query's distances to the test rows, fully
    ranked (the mAP's)."""
    ev, n_classes = cfg.evaluate, len(info.classes or []) or 2
    n_train, n_test = int((info.split == TRAIN).sum()), int((info.split == TEST).sum())
    total = 0.0
    for spec in specs:
        d = registry.make(spec).view_dim(info.n_features, n_classes)
        if ev.classifiers:
            total += knn.search_cost(min(ev.classify_queries or n_test, n_test), n_train, d)
        if ev.retrieval:
            q = min(ev.queries if ev.queries is not None else RETRIEVAL_QUERIES, n_test)
            total += knn.search_cost(q, n_test, d) + q * madds.sort(n_test)
    return total
