"""Stage 6, evaluate: retrieval (test queries against the rest of the test set) and classification
(train as the database) of every model's codes; the kernels are in `metricpipe.tasks.evaluation`."""
import time
import warnings
from dataclasses import dataclass

import distributed
import numpy as np

from metricpipe.budget import (BLOCKS_PER_TASK, SPILL_FRACTION, index_budget, retrieval_db_budget, row_block, task_budget,
                               usable)
from metricpipe.config import NeighboursConfig, unserved
from metricpipe.context import StageContext
from metricpipe.store import Unit, array_names, create_array, hash_key, open_array, read_attrs, read_rows, row_chunk
from metricpipe.tasks import evaluation, metrics, moments, registry, splits, stream
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.validate import class_codes

from metricpipe.stages.common import (DataInfo, StagedRows, TEST, TRAIN, cached_estimator, commit_timed, moments_block,
                                      spec_params, tree_combine)
from metricpipe import ivf



def _retrieval_block(q_url: str, db_url: str, score: str, q_idx: np.ndarray, db_idx: np.ndarray,
                     rel_key: np.ndarray, ks: tuple, ukb: bool, chunk_rows: int, group: int,
                     accuracy_k: int | None = None, centroids: np.ndarray | None = None,
                     db_max: float | None = None) -> dict:
    """Queries ``q_idx`` against database ``db_idx`` (global rows, sorted). The database is read once
    per task when it fits in ``db_max`` bytes (the workers' share, pipeline/budget.py; default
    RETRIEVAL_DB_BYTES) (the test rows are spread over every row-block, so a read is a pass over the
    whole array), else streamed again for every group of queries (a pass over the array per group:
    the memory rule refuses a run where that would happen)."""
    Q = read_rows(q_url, q_idx)
    fits = len(db_idx) * open_array(db_url).shape[1] * 4 <= (RETRIEVAL_DB_BYTES if db_max is None else db_max)
    db = read_rows(db_url, db_idx) if fits else (lambda a, b: read_rows(db_url, db_idx[a:b]))
    return evaluation.retrieval(Q, q_idx, db_idx, db, rel_key, ks, ukb, score, chunk_rows, group, accuracy_k,
                                centroids)


# k-means for NMI/AMI is fitted on at most this many query rows per class (faiss's default cap, which
# pytorch-metric-learning's AccuracyCalculator uses), read in one task.
KMEANS_ROWS_PER_CLASS = 256


def _query_centroids(q_url: str, rows: np.ndarray, n_clusters: int, seed) -> np.ndarray:
    return evaluation.kmeans_fit(read_rows(q_url, rows), n_clusters, seed)


def _train_blocks(db_url: str, data_url: str, chunks: list, code: int = TRAIN):
    """(global train rows (split ``code``), their rows of ``db_url``) of each row-block with such rows,
    one at a time."""
    split, db = open_array(f"{data_url}/split"), open_array(db_url)
    for a, b in chunks:
        rows = np.flatnonzero(split[a:b] == code) + a
        if len(rows):
            yield rows, db[a:b][rows - a]


def _exact_knn(q_url: str, db_url: str, data_url: str, chunks: list, q_idx: np.ndarray, k: int, score: str):
    """(distances, global rows) of the k nearest train codes of the queries ``q_idx``, streaming the
    database one row-block at a time (the task holds the queries and one block)."""
    return evaluation.knn_neighbours(read_rows(q_url, q_idx), _train_blocks(db_url, data_url, chunks), k, score)


def _classify_block(q_url: str, db_url: str, score: str, q_idx: np.ndarray, data_url: str, chunks: list,
                    labels: np.ndarray, classifiers: tuple, means, graph_url: str | None,
                    ncm_model: dict | None = None, knn_ids=None, train: int = TRAIN) -> dict:
    """Errors of ``classifiers`` on the queries ``q_idx``. kNN votes over ``knn_ids`` (the queries'
    neighbour lists from the stored graph or an index) when given, else over an exact search of the
    rows of split code ``train``; ``means``: (class means, the classes that have one)."""
    Q = read_rows(q_url, q_idx)
    y = labels[q_idx]
    n_classes = int(labels.max()) + 1
    out = {}
    ks = [int(c[3:]) for c in classifiers if c.startswith("knn")]
    if ks:
        if knn_ids is None:
            knn_ids = evaluation.knn_neighbours(Q, _train_blocks(db_url, data_url, chunks, train), max(ks), score)[1]
        elif isinstance(knn_ids, tuple):   # an index's (distances, rows)
            knn_ids = knn_ids[1]
        elif isinstance(knn_ids, str):   # the stored graph's rows
            knn_ids = read_rows(knn_ids, q_idx)[:, :max(ks)].astype(np.int64)
        out.update(evaluation.knn_errors_from(evaluation.neighbour_labels(knn_ids, labels), y, ks, n_classes))
    soft = [int(c[8:]) for c in classifiers if c.startswith("softvote")]
    if soft:
        nbr = read_rows(f"{graph_url}/neighbours", q_idx).astype(np.int64)
        flat = np.unique(nbr[nbr >= 0])
        out.update(evaluation.softvote_errors(Q, y, nbr, read_rows(db_url, flat), flat, labels, soft, n_classes,
                                              score))
    if evaluation.NCM in classifiers:
        out[evaluation.NCM] = evaluation.ncm_errors(Q, y, means[0], ncm_model.get("bias") if ncm_model else None, means[1])
    if evaluation.NCMC in classifiers and ncm_model and ncm_model.get("centroids") is not None:
        out[evaluation.NCMC] = evaluation.ncmc_errors(Q, y, ncm_model["centroids"], ncm_model["owner"], n_classes)
    return out


def _keeps_distances(model_url: str) -> bool:
    """Whether a model's codes keep the staged features' Euclidean distances (identity, a full-rank
    rotation): the neighbours stage's graph is then their kNN graph."""
    est = cached_estimator(model_url)
    enc = getattr(est, "_encoder", None)
    return enc is not None and enc().keeps_distances(est.n_features_in_)


def _knn_queries(ctx: StageContext, data: DataInfo) -> int:
    """The test rows kNN classifies: every one, or about ``evaluate.classification.queries``."""
    n_test = int((data.split == TEST).sum())
    q = ctx.config.evaluate.classify_queries
    return n_test if q is None else min(q, n_test)


def _knn_nlist(ctx: StageContext, data: DataInfo, n_train: int) -> int:
    """Lists of kNN's IVF indexes: as the neighbours stage's (``ivf.nlist_for``), fewer when only
    ``evaluate.classification.queries`` test rows are classified."""
    return ivf.nlist_searched(n_train, _knn_queries(ctx, data))


def _knn_streamed(ctx: StageContext, data: DataInfo, n_train: int, dim: int) -> bool:
    """Whether kNN's search of a view of ``dim`` dimensions runs over the streamed train codes (its
    classified rows held by every task, no index) rather than through a faiss index."""
    k = max([int(c[3:]) for c in ctx.config.evaluate.classifiers if c.startswith("knn")], default=1)
    nprobe = (ctx.config.neighbours or NeighboursConfig()).nprobe
    return ivf.streamed(_knn_queries(ctx, data), dim, k, _knn_nlist(ctx, data, n_train),
                        data.chunk_rows * dim * 4.0, task_budget(ctx.client), nprobe)


def _index_plan(ctx: StageContext, data: DataInfo, cunit: Unit, n_train: int) -> list | None:
    """The IVF searches kNN would run for these codes' views past ivf.EXACT_MAX_TRAIN: over the streamed
    codes, or through an index whose bytes per row follow the workers' memory (so they key the
    evaluation)."""
    if n_train <= ivf.EXACT_MAX_TRAIN or not any(c.startswith("knn") for c in ctx.config.evaluate.classifiers):
        return None
    budget = index_budget(ctx.client, data.chunk_rows, data.n_features)
    dims = [open_array(f"{cunit.url}/{v}").shape[1] for v in ("codes", "base") if v in array_names(cunit.url)]
    nb = ctx.config.neighbours or NeighboursConfig()
    nlist = _knn_nlist(ctx, data, n_train)
    factories = [f"IVF{nlist},Flat,streamed" if _knn_streamed(ctx, data, n_train, d) else
                 ivf.factory_string(n_train, d, nlist, budget, ctx.config.source_file,
                                    ctx.config.setting("memory_limit")) for d in dims]
    return factories + [{"nprobe": nb.nprobe, **({"rerank": nb.rerank} if any(",PQ" in f for f in factories) else {})}]


def _ivf_lists(ctx: StageContext, data: DataInfo, jobs: list, graph_index: str | None) -> None:
    """Fill the jobs' kNN lists (``job["lists"]``, one per query block) from IVF lists of their train
    codes: searched over the streamed codes when every task can hold the classified rows
    (``_knn_streamed``: no index, ``ivf.search_streamed``, as the neighbours stage searches a sampled
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
        self.nlist = _knn_nlist(ctx, data, len(self.train))
        self.tb = tuple((a, b) for a, b in data.chunks if (data.split[a:b] == TRAIN).any())
        self.budget = index_budget(ctx.client, data.chunk_rows, data.n_features)


def _build_indexes(run: "_IvfRun", jobs: list, graph_index: str | None) -> None:
    """Each job's index trained and filled (or its streamed search submitted), and its recall's exact side."""
    ctx, data, seed, split_url, nprobe, train, nlist, tb, budget = (
        run.ctx, run.data, run.seed, run.split_url, run.nprobe, run.train, run.nlist, run.tb, run.budget)
    for i, job in enumerate(jobs):
        q_url, db_url = job["urls"]
        # seeded by the job's own unit and view, never its place in this run's list (which depends on the
        # other models and on which evaluations were reused): the same key gives the same sample
        rng = np.random.default_rng([seed, 38, int(job["unit"].key, 16), ("codes", "exact").index(job["view"])])
        asked = np.concatenate(job["blocks"])
        job["probe"] = np.sort(rng.choice(asked, min(len(asked), ivf.RECALL_QUERIES), replace=False))
        job["metric"] = "l2" if job["score"] == "euclidean" else "ip"   # the index's and the re-scoring's
        dim = open_array(db_url).shape[1]
        job["streamed"] = job["index"] is None and _knn_streamed(ctx, data, len(train), dim)
        if job["streamed"]:   # no index: the train codes are read once, the recall check's exact side too
            sample = np.sort(rng.choice(train, ivf.sample_rows(len(train), nlist), replace=False))
            job["lists"], job["exact"], job["approx"] = ivf.search_streamed(
                ctx, q_url, db_url, split_url, tb, job["blocks"], job["probe"], sample, nlist, nprobe, job["k"],
                job["metric"], "knn-index", priority=len(jobs) - i)
            job["factory"], job["rerank"], job["reused"] = f"IVF{nlist},Flat over the streamed codes", 1, False
            continue
        job["exact"] = ctx.submit(_exact_knn, q_url, db_url, data.url, data.chunks, job["probe"], job["k"],
                                  job["score"], name="knn-recall")
        job["token"] = f"{job['unit'].url}/{job['view']}@{time.time_ns()}"
        job["reused"] = job["index"] is not None
        if job["reused"]:    # the neighbours stage's index, stored with its graph
            job["factory"], job["ready"] = graph_index, []
            continue
        job["index"] = f"{job['unit'].url}/knn-index-{job['view']}"
        job["factory"] = ivf.factory_string(len(train), dim, nlist, budget, ctx.config.source_file,
                                            ctx.config.setting("memory_limit"))
        sample = np.sort(rng.choice(train, ivf.sample_rows(len(train), nlist), replace=False))
        trained = ctx.submit(ivf.train, db_url, job["index"], sample, job["factory"], seed, job["metric"],
                             name="knn-index-train")
        create_array(f"{job['index']}/ivf_codes", (data.n_samples, ivf.code_bytes(job["factory"], dim)),
                     (row_chunk(data.chunk_rows, data.n_samples), ivf.code_bytes(job["factory"], dim)), np.uint8)
        job["ready"] = [ctx.submit(_after, ivf.encode, (db_url, split_url, job["index"], job["token"], a, b), trained,
                                   name="knn-index-encode") for a, b in tb]


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
        job["lists"] = [ctx.submit(_after, ivf.search, args + (q, kc, nprobe), *job["ready"],
                                   name="knn-index-search", priority=len(jobs) - i) for q in job["blocks"]]
        job["approx"] = ctx.submit(_after, ivf.search, args + (job["probe"], kc, nprobe), *job["ready"],
                                   name="knn-index-search", priority=len(jobs) - i)
        if job["rerank"] > 1:
            rescore = (job["urls"][0], job["urls"][1], tb)
            job["lists"] = ivf.rescored(ctx, *rescore, job["blocks"], job["lists"], job["k"], kc, job["metric"],
                                        "knn-index", priority=len(jobs) - i)
            job["approx"] = ivf.rescored(ctx, *rescore, [job["probe"]], [job["approx"]], job["k"], kc, job["metric"],
                                         "knn-index", priority=len(jobs) - i)[0]


def _recall_and_release(ctx: StageContext, jobs: list, nprobe: int) -> None:
    """Each job's recall@k against exact search in its ``knn_note``; the indexes built here deleted."""
    for job in jobs:
        e, a = ctx.gather([job["exact"], job["approx"]], "evaluate", ["recall: exact", "recall: index"])
        job["knn_note"] = {"knn_search": f"{job['factory']}, nprobe {nprobe}"
                                         + (f", rerank {job['rerank']}" if job["rerank"] > 1 else "")
                                         + (" (the neighbours stage's index)" if job["reused"] else ""),
                           "knn_recall": ivf.recall(e, a, job["k"])}
        ctx.log(f"  evaluate: kNN of {job['unit'].rel} ({job['view']}) through {job['knn_note']['knn_search']}: "
                f"recall@{job['k']} {job['knn_note']['knn_recall']:.3f} against exact search on "
                f"{len(job['probe'])} queries")
    distributed.wait([f for job in jobs for f in job["lists"]])  # (a failed search: reported by its classify task)
    ctx.client.run(ivf.release)
    for job in jobs:
        if not job["reused"] and not job["streamed"]:   # built here: scratch once searched
            ctx.store.fs.rm(f"{job['unit']._root}/knn-index-{job['view']}", recursive=True)


def _after(fn, args: tuple, *deps):
    """``fn(*args)`` once the tasks ``deps`` are done (their results unused)."""
    return fn(*args)


def _ncm_model(model_url: str) -> dict | None:
    """What the ncm / ncmc classifiers need from an NCMML/NCMC model: class biases (dot form) and
    the centroids in code space with their classes (only when some class has more than one)."""
    est = cached_estimator(model_url)
    if getattr(est, "centroids_", None) is None:
        return None
    owner = np.asarray(est.centroid_classes_, np.int64)
    out = {"bias": est.class_bias_, "centroids": None, "owner": owner}
    if np.bincount(owner).max() > 1:
        out["centroids"] = est.transform(est.centroids_).astype(np.float64)
    return out


def _class_means(m) -> tuple[np.ndarray, np.ndarray]:
    """(class means (C, d), the class codes with rows): only those compete (the classes a run holds
    out have no train row, the seen ones no held-out row)."""
    stats = moments.finalize_statistics(m)
    return stats["class_means"].astype(np.float32), np.flatnonzero(stats["class_counts"] > 0)


# Fixed (not worker-count dependent) so that every query meets the same GEMM shapes on any cluster.
CLASSIFY_QUERIES = 4096
# Retrieval ranks the whole test split for each query (the full-ranking mAP): past this many test rows
# a seeded sample of this many queries does it, unless evaluate.retrieval.queries says otherwise.
RETRIEVAL_QUERIES = 10_000


def _fixed_blocks(idx: np.ndarray, size: int) -> list[np.ndarray]:
    return [idx[a:a + size] for a in range(0, len(idx), size)]


# An evaluation task's memory: EVAL_BUDGET bytes beyond its queries, of which a retrieval task
# keeps up to RETRIEVAL_DB_BYTES for its database (the test rows of one view; streamed again for
# every group of queries when larger) and the rest for a group's distance matrix, its sorted copy and
# masks. A view's queries are cut into at most RETRIEVAL_TASKS tasks (fixed, so the split is the same
# on any cluster), each reading the database once.
EVAL_BUDGET = 2.5e8
RETRIEVAL_DB_BYTES = 1.5e8
RETRIEVAL_TASKS = 8


def _query_group(n_db: int, budget_bytes: float = EVAL_BUDGET - RETRIEVAL_DB_BYTES) -> int:
    """Queries scored at once: 36 bytes per query x database entry within ``budget_bytes`` (24 for the
    distances, their sorted copy and masks; 12 for the map@r top-k selection and MRR's first-relevant
    ranks, issue 20)."""
    return int(max(1, budget_bytes // max(1, n_db * 36)))


def _query_blocks(idx: np.ndarray, n_db: int) -> list[np.ndarray]:
    """One block per retrieval task: at least one group, at most RETRIEVAL_TASKS blocks."""
    return _fixed_blocks(idx, max(_query_group(n_db), -(-len(idx) // RETRIEVAL_TASKS)))


@dataclass(frozen=True)
class Protocol:
    """The rows one evaluation of a model reads: the seen classes' (train rows the kNN database and the
    class means, test rows the queries) or, when the run holds classes out (``data.split.classes``),
    theirs: retrieval among their test rows, kNN over their train rows, NCM (and an NCMC model's
    mixture) with means (centroids) from their train rows, as ``metricpipe add-classes`` adds them."""
    name: str | None        # the records' "classes": None (no class held out), "seen" or "unseen"
    train: int              # split code of the database and mean rows
    test: np.ndarray        # the test rows (the retrieval database)
    queries: np.ndarray     # retrieval queries: every test row, or a seeded sample of them
    classified: np.ndarray  # the test rows classified
    ks: tuple               # retrieval's K
    acc_k: int              # map@r & co.: the largest class less one
    km_rows: np.ndarray     # the query rows k-means (NMI, AMI) is fitted on
    n_clusters: int
    ukb: bool
    n_train: int


def protocols(ctx: StageContext, data: DataInfo) -> list[Protocol]:
    """The seen classes' protocol, and the held-out classes' when the run has some."""
    held = len(splits.unseen_classes(data.split, data.labels)) > 0
    out = [_protocol(ctx, data, "seen" if held else None, TRAIN, TEST)]
    return out + [_protocol(ctx, data, "unseen", splits.UNSEEN_TRAIN, splits.UNSEEN_TEST)] if held else out


def _protocol(ctx: StageContext, data: DataInfo, name: str | None, train: int, test_code: int) -> Protocol:
    ev = ctx.config.evaluate
    test = data.rows(test_code)
    of = "" if name is None else f" {name}-class"
    queries = test  # retrieval queries: every test image, or a seeded sample of them (evaluate.retrieval.queries)
    n_queries = ev.queries
    if n_queries is None and len(test) > RETRIEVAL_QUERIES:
        n_queries = RETRIEVAL_QUERIES
        if ev.retrieval:   # (retrieval: false: the sample serves the clustering scores alone)
            ctx.log(f"  evaluate: retrieval by a seeded sample of {n_queries:,} of the {len(test):,}{of} test rows "
                    f"(set evaluate.retrieval.queries to change it)")
    if n_queries is not None and n_queries < len(test):
        queries = np.sort(np.random.default_rng([ctx.config.seed, 31]).choice(test, n_queries, replace=False))
    # classification: every test image, or a seeded class-stratified sample (evaluate.classification.queries)
    classified = test if ev.classify_queries is None else test[stream.sample(
        data.labels[test], ev.classify_queries, open_array(f"{data.url}/row_key")[:][test], ctx.config.seed,
        stream.EVALUATED)]
    rel_key = data.groups if data.groups is not None else data.labels
    ukb = data.groups is not None and bool(np.all(np.bincount(data.groups[test])[np.unique(data.groups[test])] == 4))
    # map@r & co. (test queries against the test set, itself left out): k = the largest class less one
    acc_k = evaluation.accuracy_k(evaluation.relevant_counts(rel_key[queries], rel_key[test], True))
    n_clusters = len(np.unique(data.labels[queries]))
    km_rows = np.sort(np.random.default_rng([ctx.config.seed, 32]).choice(
        queries, min(len(queries), KMEANS_ROWS_PER_CLASS * n_clusters), replace=False))
    # the unseen classes' test rows are fewer: retrieval's K beyond them is left out there (K = 1 stays)
    ks = tuple(k for k in ev.retrieval_k if k < len(test)) or (1,)
    return Protocol(name, train, test, queries, classified, ks, acc_k, km_rows, n_clusters, ukb,
                    int((data.split == train).sum()))


def served_classifiers(ev, spec: dict, proto: Protocol | None = None) -> tuple:
    """The classifiers a model is scored with: those the config lists that it can serve (``unserved``)
    and its own (``own_classifier``: ncm for NCMML, ncmc for NCMC) even when the list lacks it. On the
    held-out classes (``proto``), no soft vote (it votes over the neighbours stage's graph of the
    seen classes' rows) and no kNN over more neighbours than their train rows."""
    own = registry.estimator_class(spec["method"], spec).own_classifier
    asked = ev.classifiers + ((own,) if own and own not in ev.classifiers else ())
    served = tuple(c for c in asked if not unserved(spec, c))
    if proto is not None and proto.name == "unseen":
        served = tuple(c for c in served if not c.startswith("softvote")
                       and not (c.startswith("knn") and int(c[3:]) > proto.n_train))
    return served


def _unseen_ncm_model(model_url: str, data_url: str, chunks: list, code: int) -> dict | None:
    """An NCMC model's mixture over the held-out classes: k centroids per class by k-means over their
    train rows (split ``code``) in the input space, as ``metricpipe add-classes`` makes them, in code
    space (only when some class has more than one; else NCMC is NCM)."""
    est = cached_estimator(model_url)
    labels = open_array(f"{data_url}/label")[:]
    rows = StagedRows(data_url, chunks, np.flatnonzero(open_array(f"{data_url}/split")[:] == code))
    cents, owner = est.class_centroids(rows, rows.fit, int(labels.max()) + 1)
    owner = np.asarray(owner, np.int64)
    if np.bincount(owner).max() <= 1:
        return None
    return {"bias": None, "centroids": est.transform(cents).astype(np.float64), "owner": owner}


def run_evaluate(ctx: StageContext, data: DataInfo, codes: list, neighbours: Unit | None = None
                 ) -> list[tuple[dict, Unit]]:
    """Retrieval (test queries against the rest of test) and classification (train as database).

    Every model is evaluated on its codes; a bilinear model (SL-NE, SL-DE) also on its exact
    similarity (query view Z M against base view Z), so the loss from factoring is visible. When the
    run holds classes out, every model is also evaluated on them (:class:`Protocol`).
    """
    ev = ctx.config.evaluate
    protos = protocols(ctx, data)
    seen = protos[0]
    rel_key = data.groups if data.groups is not None else data.labels
    n_train = seen.n_train
    db_max = retrieval_db_budget(ctx.client, EVAL_BUDGET - RETRIEVAL_DB_BYTES)
    labels_f = ctx.client.scatter(data.labels, broadcast=True, hash=False)
    rel_f = labels_f if data.groups is None else ctx.client.scatter(rel_key, broadcast=True, hash=False)
    if any(c.startswith("softvote") for c in ev.classifiers) and neighbours is None:
        raise InputError(f"{ctx.config.source_file}: evaluate: softvote classifiers need the neighbours stage; "
                         f"add neighbours: {{k: 50}}")
    graph_url = neighbours.url if neighbours is not None else None
    graph = neighbours.meta() if neighbours is not None else {}
    graph_all = graph.get("queries") == data.n_samples   # every row's neighbours, test rows too
    # When the models that leave classes out of training all keep the same ones, every model also
    # reports its errors on the other classes' test images: the control beside the new-class figure.
    # Which classes count as new is a result of the unit, so it is in its key.
    # (as class codes: [5, 6], ["5", "6"] and [6, 5] name one subset)
    def trained(spec) -> list:
        return class_codes(spec["classes"], data.classes).tolist() if spec.get("classes") else []
    subsets = {tuple(trained(spec)) for spec, *_ in codes if spec.get("classes")}
    common = list(subsets.pop()) if len(subsets) == 1 else None
    out, jobs, costs, indexed, reused = [], [], {}, [], 0
    for spec, cunit, dim in codes:
        # the classifiers a model serves beyond the config's (its own): a result of the unit, so in its key
        added = [c for c in served_classifiers(ev, spec) if c not in ev.classifiers]
        own = {"own_classifier": added} if added else {}
        unit = ctx.store.unit("evaluation", hash_key({"stage": "evaluation", "seed": ctx.config.seed, "codes": cunit.key,
                                                     "graph": neighbours.key if neighbours else None,
                                                     "evaluate": ev.__dict__, "data": data.unit.key,
                                                     "indexes": _index_plan(ctx, data, cunit, n_train),
                                                     "trained_on": trained(spec) or common, **own}))
        out.append((spec, unit))
        if ctx.reuse(unit, "evaluate"):
            reused += 1
            continue
        unit.begin()
        cmeta = cunit.meta()
        costs[unit.key] = cmeta.get("cost")
        views = [("codes", f"{cunit.url}/codes", f"{cunit.url}/codes", (cmeta.get("score") or "euclidean"))]
        if cmeta.get("bilinear"):
            views.append(("exact", f"{cunit.url}/query", f"{cunit.url}/base", "inner"))
        model_url = ctx.store.unit("models", read_attrs(cunit.url)["model"]).url
        for proto in protos:
            for view, q_url, db_url, score in views:
                jobs.append(_job(ctx, data, proto, spec, unit, dim, view, q_url, db_url, score, model_url, rel_f,
                                 db_max, served_classifiers(ev, spec, proto)))
                job = jobs[-1]
                if proto is not seen or not job["k"]:
                    continue   # (the held-out classes' kNN: an exact search over their train rows)
                keeps = view == "codes" and _keeps_distances(model_url)
                if keeps and graph_all and job["k"] <= graph["k"]:
                    job["lists"] = [f"{graph_url}/neighbours"] * len(job["blocks"])   # the graph is the codes' graph
                    job["knn_note"] = {"knn_search": "graph", "knn_recall": graph.get("recall", 1.0)}
                elif n_train > ivf.EXACT_MAX_TRAIN and score in ("euclidean", "inner"):
                    # the neighbours stage's index is an index of these codes too (a streamed search keeps none)
                    job["index"] = graph_url if keeps and graph.get("method") == "ivf" and not graph.get("streamed") else None
                    indexed.append(job)
    if indexed:
        _ivf_lists(ctx, data, indexed, graph.get("index"))
    for job in jobs:
        (q_url, db_url), (means, ncm_model, served) = job["urls"], job["classify"]
        if served:
            job["cls"] = [ctx.submit(_classify_block, q_url, db_url, job["score"], q, data.url, data.chunks, labels_f,
                                     served, means, graph_url, ncm_model, lists, job["proto"].train,
                                     name=f"classify-{registry.model_name(job['spec'])}")
                          for q, lists in zip(job["blocks"], job["lists"])]
    if reused:
        ctx.log(f"  evaluate: reusing {reused} of {len(codes)} evaluations")
    t0 = time.perf_counter()
    records = {}
    for job in jobs:
        spec, unit, dim, view, score, ret, cls, knn_note, proto = (
            job[k] for k in ("spec", "unit", "dim", "view", "score", "ret", "cls", "knn_note", "proto"))
        seen_classes = proto.name != "unseen"
        trained_on = (trained(spec) or common) if seen_classes else None    # class codes, as test_labels
        name = f"{registry.model_name(spec)} ({view}{'' if proto.name is None else ', ' + proto.name + ' classes'})"
        ret_res = ctx.gather(ret, "evaluate", [f"model {name} retrieval block {i}" for i in range(len(ret))])
        cls_res = ctx.gather(cls, "evaluate", [f"model {name} classification block {i}" for i in range(len(cls))])
        extra = {} if view == "codes" and score == "euclidean" else {"view": view, "score": score}
        recs = records.setdefault(unit.key, (unit, []))[1]
        recs.extend(_records(spec, dim, proto.ks, job["classify"][2], data.labels[proto.classified], ret_res,
                             cls_res, extra, trained_on, data.labels[proto.queries], knn_note, proto.name))
        if view == "codes" and seen_classes and costs.get(unit.key):  # the projection's size and cost by its metrics
            base = {"method": spec["method"], "dim": dim, "classifier": None,
                    "params": spec_params(spec)}
            recs.extend({**base, "metric": k, "value": v} for k, v in costs[unit.key].items())
    for unit, recs in records.values():
        unit.write_json("records.json", recs)
        commit_timed(ctx, unit, t0, {})
    return out


def _job(ctx: StageContext, data: DataInfo, proto: Protocol, spec: dict, unit: Unit, dim: int, view: str, q_url: str,
         db_url: str, score: str, model_url: str, rel_f, db_max: float, served: tuple) -> dict:
    """Submit one view's retrieval under ``proto`` and what its classification needs (class means, an
    NCM model's biases or centroids); the classify tasks follow once kNN's lists are known."""
    ev = ctx.config.evaluate
    means = None
    if evaluation.NCM in served:
        parts = [ctx.submit(moments_block, data.url, a, b, len(data.classes), False, db_url, proto.train,
                            name="ncm-means") for a, b in data.chunks]
        means = ctx.submit(_class_means, tree_combine(ctx, parts, "ncm-combine"), name="ncm-means")
    cents = ctx.submit(_query_centroids, q_url, proto.km_rows, proto.n_clusters, [ctx.config.seed, 33],
                       name=f"kmeans-{registry.model_name(spec)}") if ev.retrieval else None
    ret = [ctx.submit(_retrieval_block, q_url, db_url, score, q, proto.test, rel_f, proto.ks, proto.ukb,
                      data.chunk_rows, _query_group(len(proto.test)), proto.acc_k, cents, db_max,
                      name=f"retrieval-{registry.model_name(spec)}")
           for q in _query_blocks(proto.queries, len(proto.test))] if ev.retrieval else []
    ncm_model = None
    own = registry.estimator_class(spec["method"], spec).own_classifier
    if view == "codes" and own in served:
        if proto.name != "unseen":
            ncm_model = ctx.submit(_ncm_model, model_url, name="ncm-model")
        elif own == evaluation.NCMC:   # the held-out classes' centroids (the dot form's biases are the implied ones)
            ncm_model = ctx.submit(_unseen_ncm_model, model_url, data.url, data.chunks, proto.train,
                                   name="ncm-model")
    blocks = _fixed_blocks(proto.classified, CLASSIFY_QUERIES)
    return {"spec": spec, "unit": unit, "dim": dim, "view": view, "score": score, "ret": ret, "cls": [],
            "knn_note": {}, "blocks": blocks, "lists": [None] * len(blocks), "proto": proto, "index": None,
            "k": max([int(c[3:]) for c in served if c.startswith("knn")], default=0),
            "urls": (q_url, db_url), "classify": (means, ncm_model, served)}


ACCURACY_METRICS = ("map@r", "r_precision", "precision@1", "mrr")


def _records(spec: dict, dim: int, ks: tuple, classifiers: tuple, test_labels: np.ndarray, ret_res: list,
             cls_res: list, extra: dict | None = None, trained_on: list | None = None,
             query_labels: np.ndarray | None = None, knn_note: dict | None = None,
             classes: str | None = None) -> list[dict]:
    """Metric records of retrieval at ``ks`` and of ``classifiers``; ``test_labels`` are the classified
    test rows' labels, ``query_labels`` the retrieval queries' (default: ``test_labels``); ``knn_note``
    says how kNN found its neighbours (``knn_search``: graph or the index, ``knn_recall`` against exact
    search), recorded as metrics; ``classes`` ("seen" or "unseen", :class:`Protocol`), when the run
    holds classes out, the classes they are measured on."""
    query_labels = test_labels if query_labels is None else query_labels
    params = {**spec_params(spec), **(extra or {})}
    base = {"method": spec["method"], "dim": dim, "params": params, **({"classes": classes} if classes else {})}
    recs = []
    with warnings.catch_warnings():   # no query with a relevant image: NaN, which the run's start noted
        warnings.simplefilter("ignore", RuntimeWarning)
        return _record_list(recs, base, ks, classifiers, test_labels, ret_res, cls_res, trained_on, query_labels,
                            knn_note)


def _record_list(recs, base, ks, classifiers, test_labels, ret_res, cls_res, trained_on, query_labels,
                 knn_note) -> list[dict]:
    if ret_res:
        cat = {k: np.concatenate([r[k] for r in ret_res]) for k in ret_res[0]}
        recs.append({**base, "classifier": None, "metric": "map", "value": float(np.nanmean(cat["ap"]))})
        for j, k in enumerate(ks):
            recs.append({**base, "classifier": None, "metric": f"mprec@{k}",
                         "value": float(metrics.class_average(cat["prec"][:, j], query_labels))})
            recs.append({**base, "classifier": None, "metric": f"recall@{k}",
                         "value": float(np.nanmean(cat["recall"][:, j]))})
        if "ukb4" in cat:
            recs.append({**base, "classifier": None, "metric": "ukb4", "value": float(cat["ukb4"].mean())})
        if "map@r" in cat:   # pytorch-metric-learning's AccuracyCalculator metrics (tasks.metrics)
            acc = evaluation.mean_accuracy({m: cat[m] for m in ACCURACY_METRICS})
            recs.extend({**base, "classifier": None, "metric": m, "value": acc[m]} for m in ACCURACY_METRICS)
        if "cluster" in cat:
            acc = metrics.clustering_scores(query_labels, cat["cluster"])
            recs.extend({**base, "classifier": None, "metric": m, "value": acc[m]} for m in ("nmi", "ami"))
    if cls_res:
        # a model trained on some classes only is also scored on the test images of the others
        new = None if not trained_on else ~np.isin(test_labels, trained_on)
        for c in classifiers:
            if c not in cls_res[0]:  # e.g. ncmc for a model without centroids
                continue
            top1 = np.concatenate([r[c][0] for r in cls_res])
            top5 = np.concatenate([r[c][1] for r in cls_res])
            recs.append({**base, "classifier": c, "metric": "top1_error", "value": float(top1.mean())})
            recs.append({**base, "classifier": c, "metric": "top5_error", "value": float(top5.mean())})
            if c.startswith("knn") and knn_note:
                recs.append({**base, "classifier": c, "metric": "knn_recall", "value": knn_note.get("knn_recall"),
                             "search": knn_note["knn_search"]})
            if new is not None and new.any():
                recs.append({**base, "classifier": c, "metric": "top1_error_new_classes", "value": float(top1[new].mean())})
                recs.append({**base, "classifier": c, "metric": "top5_error_new_classes", "value": float(top5[new].mean())})
    return recs


def largest_tasks(info, cfg, limit: float) -> list:
    """A row-block task beside the evaluation's buffers, a retrieval task's database (the test split's
    codes, held whole: n_test x the widest code the config names), a soft-vote task."""
    D, n_train, n_test = info.n_features, int((info.split == TRAIN).sum()), int((info.split == TEST).sum())
    need = BLOCKS_PER_TASK * row_block(info) + EVAL_BUDGET
    fix = "lower data.chunk_mb or raise memory_limit"
    if EVAL_BUDGET >= 0.9 * usable(limit):   # smaller blocks cannot help: the buffers alone do not fit
        fix = (f"raise memory_limit to at least {-(-need // SPILL_FRACTION // 1e6):,.0f} MB (the evaluation's "
               f"buffers alone take {EVAL_BUDGET / 1e6:,.0f} MB)")
    out = [("a row-block task (4 row-blocks and the evaluation's buffers)", need, fix)]
    n_classes = len(info.classes or []) or 2
    learners = [registry.make(cand) for spec in cfg.methods for cand in registry.candidates(spec)]
    if cfg.evaluate.retrieval and learners:
        d = max(est.code_dim(D, n_classes) for est in learners)
        out.append((f"a retrieval task's database (the {n_test:,} test rows' codes, up to {d} dimensions)",
                    n_test * d * 4.0 + EVAL_BUDGET - RETRIEVAL_DB_BYTES,
                    "set evaluate.retrieval: false, lower data.split's test share, or raise memory_limit"))
    if any(c.startswith("softvote") for c in cfg.evaluate.classifiers) and learners and n_train:
        d = max(est.view_dim(D, n_classes) for est in learners)   # (SL-NE's exact view too)
        k = (cfg.neighbours or NeighboursConfig()).k
        rows = min(n_train, CLASSIFY_QUERIES * k)
        out.append((f"a soft-vote task ({CLASSIFY_QUERIES:,} queries' {k} stored neighbours: {rows:,} rows of codes up "
                    f"to {d} dimensions)", (rows + CLASSIFY_QUERIES) * d * 4.0 + evaluation.SOFTVOTE_GROUP_BYTES,
                    "lower neighbours.k, drop the softvote classifiers, or raise memory_limit"))
    return out
