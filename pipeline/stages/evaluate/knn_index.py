"""kNN classification past ivf.EXACT_MAX_TRAIN train rows: IVF lists of the train codes, searched
over the streamed codes or through faiss indexes built as the neighbours stage builds its own
(`metricpipe.ivf`), with recall@k against exact search on a sample of the queries."""

import time
from dataclasses import dataclass

import distributed
import numpy as np

from metricpipe import ivf
from metricpipe.budget import index_budget, task_budget
from metricpipe.config import NeighboursConfig
from metricpipe.context import StageContext
from metricpipe.stages.common import TEST, TRAIN, DataInfo
from metricpipe.stages.evaluate.blocks import exact_knn
from metricpipe.store import Unit, array_names, create_array, open_array, row_chunk


def knn_queries(ctx: StageContext, data: DataInfo) -> int:
    """The test rows kNN classifies: every one, or about ``evaluate.classification.queries``."""
    n_test = int((data.split == TEST).sum())
    q = ctx.config.evaluate.classify_queries
    return n_test if q is None else min(q, n_test)


def knn_nlist(ctx: StageContext, data: DataInfo, n_train: int) -> int:
    """Lists of kNN's IVF indexes: as the neighbours stage's (``ivf.nlist_for``), fewer when only
    ``evaluate.classification.queries`` test rows are classified."""
    return ivf.nlist_searched(n_train, knn_queries(ctx, data))


def knn_streamed(ctx: StageContext, data: DataInfo, n_train: int, dim: int) -> bool:
    """Whether kNN's search of a view of ``dim`` dimensions runs over the streamed train codes (its
    classified rows held by every task, no index) rather than through a faiss index."""
    k = max([int(c[3:]) for c in ctx.config.evaluate.classifiers if c.startswith("knn")], default=1)
    nprobe = (ctx.config.neighbours or NeighboursConfig()).nprobe
    return ivf.streamed(
        knn_queries(ctx, data),
        dim,
        k,
        knn_nlist(ctx, data, n_train),
        data.chunk_rows * dim * 4.0,
        task_budget(ctx.client),
        nprobe,
    )


def index_plan(ctx: StageContext, data: DataInfo, cunit: Unit, n_train: int) -> list | None:
    """The IVF searches kNN would run for these codes' views past ivf.EXACT_MAX_TRAIN: over the streamed
    codes, or through an index whose bytes per row follow the workers' memory (so they key the
    evaluation)."""
    if n_train <= ivf.EXACT_MAX_TRAIN or not any(c.startswith("knn") for c in ctx.config.evaluate.classifiers):
        return None
    budget = index_budget(ctx.client, data.chunk_rows, data.n_features)
    dims = [open_array(f"{cunit.url}/{v}").shape[1] for v in ("codes", "base") if v in array_names(cunit.url)]
    nb = ctx.config.neighbours or NeighboursConfig()
    nlist = knn_nlist(ctx, data, n_train)
    factories = [
        f"IVF{nlist},Flat,streamed"
        if knn_streamed(ctx, data, n_train, d)
        else ivf.factory_string(n_train, d, nlist, budget, ctx.config.source_file, ctx.config.setting("memory_limit"))
        for d in dims
    ]
    return factories + [{"nprobe": nb.nprobe, **({"rerank": nb.rerank} if any(",PQ" in f for f in factories) else {})}]


def ivf_lists(ctx: StageContext, data: DataInfo, jobs: list, graph_index: str | None) -> None:
    """Fill the jobs' kNN lists (``job["lists"]``, one per query block) from IVF lists of their train
    codes: searched over the streamed codes when every task can hold the classified rows
    (``knn_streamed``: no index, ``ivf.search_streamed``, as the neighbours stage searches a sampled
    graph), else from faiss IVF indexes built as the neighbours stage builds its own
    (pipeline/ivf.py); a job whose codes keep the features' distances searches the neighbours
    stage's index (``job["index"]``) instead, when that stage kept one.
    Every index trains at once (one task each, so both workers work); the searches go view by view
    (priorities), as a worker holds one filled index at a time. Records recall@k against exact
    search on a seeded sample of each view's queries in ``job["knn_note"]``; the built indexes are
    deleted once searched."""
    ivf_args = _IvfRun(ctx, data)
    _build_indexes(ivf_args, jobs, graph_index)
    _search_indexes(ivf_args, jobs)
    _recall_and_release(ctx, jobs, ivf_args.nprobe)


@dataclass
class _IvfRun:
    """What every job's IVF search shares: the train rows and their blocks, the lists and probes."""

    ctx: StageContext
    data: DataInfo

    def __post_init__(self):
        ctx, data = self.ctx, self.data
        self.seed, self.split_url = ctx.config.seed, f"{data.url}/split"
        self.nb = ctx.config.neighbours or NeighboursConfig()
        self.nprobe = self.nb.nprobe
        self.train = data.rows(TRAIN)
        self.nlist = knn_nlist(ctx, data, len(self.train))
        self.tb = tuple((a, b) for a, b in data.chunks if (data.split[a:b] == TRAIN).any())
        self.budget = index_budget(ctx.client, data.chunk_rows, data.n_features)


def _build_indexes(run: "_IvfRun", jobs: list, graph_index: str | None) -> None:
    """Each job's index trained and filled (or its streamed search submitted), and its recall's exact side."""
    ctx, data, seed, split_url, nprobe, train, nlist, tb, budget = (
        run.ctx,
        run.data,
        run.seed,
        run.split_url,
        run.nprobe,
        run.train,
        run.nlist,
        run.tb,
        run.budget,
    )
    for i, job in enumerate(jobs):
        q_url, db_url = job["urls"]
        # seeded by the job's own unit and view, never its place in this run's list (which depends on the
        # other models and on which evaluations were reused): the same key gives the same sample
        rng = np.random.default_rng([seed, 38, int(job["unit"].key, 16), ("codes", "exact").index(job["view"])])
        asked = np.concatenate(job["blocks"])
        job["probe"] = np.sort(rng.choice(asked, min(len(asked), ivf.RECALL_QUERIES), replace=False))
        job["metric"] = "l2" if job["score"] == "euclidean" else "ip"  # the index's and the re-scoring's
        dim = open_array(db_url).shape[1]
        job["streamed"] = job["index"] is None and knn_streamed(ctx, data, len(train), dim)
        if job["streamed"]:  # no index: the train codes are read once, the recall check's exact side too
            sample = np.sort(rng.choice(train, ivf.sample_rows(len(train), nlist), replace=False))
            job["lists"], job["exact"], job["approx"] = ivf.search_streamed(
                ctx,
                q_url,
                db_url,
                split_url,
                tb,
                job["blocks"],
                job["probe"],
                sample,
                nlist,
                nprobe,
                job["k"],
                job["metric"],
                "knn-index",
                priority=len(jobs) - i,
            )
            job["factory"], job["rerank"], job["reused"] = f"IVF{nlist},Flat over the streamed codes", 1, False
            continue
        job["exact"] = ctx.submit(
            exact_knn, q_url, db_url, data.url, data.chunks, job["probe"], job["k"], job["score"], name="knn-recall"
        )
        job["token"] = f"{job['unit'].url}/{job['view']}@{time.time_ns()}"
        job["reused"] = job["index"] is not None
        if job["reused"]:  # the neighbours stage's index, stored with its graph
            job["factory"], job["ready"] = graph_index, []
            continue
        job["index"] = f"{job['unit'].url}/knn-index-{job['view']}"
        job["factory"] = ivf.factory_string(
            len(train), dim, nlist, budget, ctx.config.source_file, ctx.config.setting("memory_limit")
        )
        sample = np.sort(rng.choice(train, ivf.sample_rows(len(train), nlist), replace=False))
        trained = ctx.submit(
            ivf.train, db_url, job["index"], sample, job["factory"], seed, job["metric"], name="knn-index-train"
        )
        create_array(
            f"{job['index']}/ivf_codes",
            (data.n_samples, ivf.code_bytes(job["factory"], dim)),
            (row_chunk(data.chunk_rows, data.n_samples), ivf.code_bytes(job["factory"], dim)),
            np.uint8,
        )
        job["ready"] = [
            ctx.submit(
                _after,
                ivf.encode,
                (db_url, split_url, job["index"], job["token"], a, b),
                trained,
                name="knn-index-encode",
            )
            for a, b in tb
        ]


def _search_indexes(run: "_IvfRun", jobs: list) -> None:
    """Each job's query blocks searched in its index, view by view (priorities), re-scored on the codes
    when the index is PQ."""
    ctx, data, split_url, nprobe, tb, nb = run.ctx, run.data, run.split_url, run.nprobe, run.tb, run.nb
    for i, job in enumerate(jobs):
        if job["streamed"]:
            continue
        # the neighbours stage's index holds the features: its queries are the features' rows (the
        # codes are a rotation of them, so the same rows are nearest; re-scoring may use the codes)
        q_url = f"{data.url}/features" if job["reused"] else job["urls"][0]
        args = (q_url, split_url, job["index"], job["token"], tb)
        # a PQ index's distances are approximate: rerank x k candidates, re-scored exactly on the codes
        job["rerank"] = nb.rerank if ",PQ" in job["factory"] else 1
        kc = job["k"] * job["rerank"]
        job["lists"] = [
            ctx.submit(
                _after,
                ivf.search,
                args + (q, kc, nprobe),
                *job["ready"],
                name="knn-index-search",
                priority=len(jobs) - i,
            )
            for q in job["blocks"]
        ]
        job["approx"] = ctx.submit(
            _after,
            ivf.search,
            args + (job["probe"], kc, nprobe),
            *job["ready"],
            name="knn-index-search",
            priority=len(jobs) - i,
        )
        if job["rerank"] > 1:
            rescore = (job["urls"][0], job["urls"][1], tb)
            job["lists"] = ivf.rescored(
                ctx,
                *rescore,
                job["blocks"],
                job["lists"],
                job["k"],
                kc,
                job["metric"],
                "knn-index",
                priority=len(jobs) - i,
            )
            job["approx"] = ivf.rescored(
                ctx,
                *rescore,
                [job["probe"]],
                [job["approx"]],
                job["k"],
                kc,
                job["metric"],
                "knn-index",
                priority=len(jobs) - i,
            )[0]


def _recall_and_release(ctx: StageContext, jobs: list, nprobe: int) -> None:
    """Each job's recall@k against exact search in its ``knn_note``; the indexes built here deleted."""
    for job in jobs:
        e, a = ctx.gather([job["exact"], job["approx"]], "evaluate", ["recall: exact", "recall: index"])
        job["knn_note"] = {
            "knn_search": f"{job['factory']}, nprobe {nprobe}"
            + (f", rerank {job['rerank']}" if job["rerank"] > 1 else "")
            + (" (the neighbours stage's index)" if job["reused"] else ""),
            "knn_recall": ivf.recall(e, a, job["k"]),
        }
        ctx.log(
            f"  evaluate: kNN of {job['unit'].rel} ({job['view']}) through {job['knn_note']['knn_search']}: "
            f"recall@{job['k']} {job['knn_note']['knn_recall']:.3f} against exact search on "
            f"{len(job['probe'])} queries"
        )
    distributed.wait([f for job in jobs for f in job["lists"]])  # (a failed search: reported by its classify task)
    ctx.client.run(ivf.release)
    for job in jobs:
        if not job["reused"] and not job["streamed"]:  # built here: scratch once searched
            ctx.store.fs.rm(f"{job['unit'].root}/knn-index-{job['view']}", recursive=True)


def _after(fn, args: tuple, *deps):
    """``fn(*args)`` once the tasks ``deps`` are done (their results unused)."""
    return fn(*args)
