"""What one evaluation reads (:class:`Protocol`: the seen classes', or the held-out ones') and how its
queries are cut into tasks: fixed sizes, so the split is the same on any cluster."""

from dataclasses import dataclass

import numpy as np

from metricpipe.config import unserved
from metricpipe.context import StageContext
from metricpipe.stages.common import TEST, TRAIN, DataInfo
from metricpipe.store import open_array
from metricpipe.tasks import evaluation, registry, scoring, splits, stream

# Fixed (not worker-count dependent) so that every query meets the same GEMM shapes on any cluster.
CLASSIFY_QUERIES = 4096


# Retrieval's queries (every test row, or a seeded sample: scoring.RETRIEVAL_QUERIES past that many)
# and k-means's rows for NMI/AMI (scoring.KMEANS_ROWS_PER_CLASS per class, read in one task) are
# tasks.scoring's, which evaluate_embeddings applies to codes in memory.


# An evaluation task's memory: EVAL_BUDGET bytes beyond its queries, of which a retrieval task
# keeps up to RETRIEVAL_DB_BYTES for its database (the test rows of one view; streamed again for
# every group of queries when larger) and the rest for a group's distance matrix, its sorted copy and
# masks. A view's queries are cut into at most RETRIEVAL_TASKS tasks (fixed, so the split is the same
# on any cluster), each reading the database once.
EVAL_BUDGET = 2.5e8


RETRIEVAL_DB_BYTES = 1.5e8


RETRIEVAL_TASKS = 8


def fixed_blocks(idx: np.ndarray, size: int) -> list[np.ndarray]:
    return [idx[a : a + size] for a in range(0, len(idx), size)]


def query_group(n_db: int, budget_bytes: float = EVAL_BUDGET - RETRIEVAL_DB_BYTES) -> int:
    """Queries scored at once: 36 bytes per query x database entry within ``budget_bytes`` (24 for the
    distances, their sorted copy and masks; 12 for the map@r top-k selection and MRR's first-relevant
    ranks, issue 20)."""
    return int(max(1, budget_bytes // max(1, n_db * 36)))


def query_blocks(idx: np.ndarray, n_db: int) -> list[np.ndarray]:
    """One block per retrieval task: at least one group, at most RETRIEVAL_TASKS blocks."""
    return fixed_blocks(idx, max(query_group(n_db), -(-len(idx) // RETRIEVAL_TASKS)))


@dataclass(frozen=True)
class Protocol:
    """The rows one evaluation of a model reads: the seen classes' (train rows the kNN database and the
    class means, test rows the queries) or, when the run holds classes out (``data.split.classes``),
    theirs: retrieval among their test rows, kNN over their train rows, NCM (and an NCMC model's
    mixture) with means (centroids) from their train rows, as ``metricpipe add-classes`` adds them."""

    name: str | None  # the records' "classes": None (no class held out), "seen" or "unseen"
    train: int  # split code of the database and mean rows
    test: np.ndarray  # the test rows (the retrieval database)
    queries: np.ndarray  # retrieval queries: every test row, or a seeded sample of them
    classified: np.ndarray  # the test rows classified
    ks: tuple  # retrieval's K
    acc_k: int  # map@r & co.: the largest class less one
    km_rows: np.ndarray  # the query rows k-means (NMI, AMI) is fitted on
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
    # retrieval queries: every test image, or a seeded sample of them (evaluate.retrieval.queries)
    queries = scoring.retrieval_queries(test, ev.queries, ctx.config.seed)
    if ev.queries is None and len(queries) < len(test) and ev.retrieval:  # (retrieval: false: the sample
        ctx.log(  # serves the clustering scores alone)
            f"  evaluate: retrieval by a seeded sample of {len(queries):,} of the {len(test):,}{of} test rows "
            f"(set evaluate.retrieval.queries to change it)"
        )
    # classification: every test image, or a seeded class-stratified sample (evaluate.classification.queries)
    classified = (
        test
        if ev.classify_queries is None
        else test[
            stream.sample(
                data.labels[test],
                ev.classify_queries,
                open_array(f"{data.url}/row_key")[:][test],
                ctx.config.seed,
                stream.EVALUATED,
            )
        ]
    )
    rel_key = data.groups if data.groups is not None else data.labels
    ukb = data.groups is not None and bool(np.all(np.bincount(data.groups[test])[np.unique(data.groups[test])] == 4))
    # map@r & co. (test queries against the test set, itself left out): k = the largest class less one
    acc_k = evaluation.accuracy_k(evaluation.relevant_counts(rel_key[queries], rel_key[test], True))
    n_clusters = len(np.unique(data.labels[queries]))
    km_rows = scoring.kmeans_rows(queries, n_clusters, ctx.config.seed)
    # the unseen classes' test rows are fewer: retrieval's K beyond them is left out there (K = 1 stays)
    ks = scoring.retrieval_ks(ev.retrieval_k, len(test))
    return Protocol(
        name, train, test, queries, classified, ks, acc_k, km_rows, n_clusters, ukb, int((data.split == train).sum())
    )


def served_classifiers(ev, spec: dict, proto: Protocol | None = None) -> tuple:
    """The classifiers a model is scored with: those the config lists that it can serve (``unserved``)
    and its own (``own_classifier``: ncm for NCMML, ncmc for NCMC) even when the list lacks it. On the
    held-out classes (``proto``), no soft vote (it votes over the neighbours stage's graph of the
    seen classes' rows) and no kNN over more neighbours than their train rows."""
    own = registry.estimator_class(spec["method"], spec).own_classifier
    asked = ev.classifiers + ((own,) if own and own not in ev.classifiers else ())
    served = tuple(c for c in asked if not unserved(spec, c))
    if proto is not None and proto.name == "unseen":
        served = tuple(
            c
            for c in served
            if not c.startswith("softvote") and not (c.startswith("knn") and int(c[3:]) > proto.n_train)
        )
    return served
