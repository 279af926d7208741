"""The encoded databases' evaluation (``encode.pq``): the test rows' retrieval (mAP, MAP@R, ...) and
kNN classification through each product quantiser's index, uncompressed queries against the
compressed database, plus its bytes per vector and the queries per second of its kNN search on one
thread. The metrics are the float codes' (:func:`metricpipe.tasks.scoring.view_metrics` over
:func:`metricpipe.tasks.pq.retrieval`'s and :func:`metricpipe.tasks.pq.knn_errors`' results); the
records carry ``pq_bytes`` and the index, in an evaluation unit of their own."""

import time

import numpy as np

from metricpipe.context import StageContext
from metricpipe.stages import pq as pq_units
from metricpipe.stages.common import TEST, DataInfo, commit_timed, spec_params
from metricpipe.stages.evaluate.protocol import CLASSIFY_QUERIES, fixed_blocks, protocols, query_blocks, query_group
from metricpipe.store import Unit, hash_key, read_rows
from metricpipe.tasks import pq
from metricpipe.tasks.scoring import view_metrics


def run_evaluate_encoded(ctx: StageContext, data: DataInfo, encoded: list) -> list[Unit]:
    """One evaluation unit per encoded database (:class:`metricpipe.stages.pq.Encoded`), in order:
    the seen classes' protocol (test queries, train database), searched through the index."""
    if not encoded:
        return []
    proto, ev = protocols(ctx, data)[0], ctx.config.evaluate
    knn = tuple(c for c in ev.classifiers if c.startswith("knn") and int(c[3:]) <= proto.n_train)
    labels_f = ctx.client.scatter(data.labels, broadcast=True, hash=False)
    rel_f = labels_f if data.groups is None else ctx.client.scatter(data.groups, broadcast=True, hash=False)
    out, jobs = [], []
    for e in encoded:
        unit = ctx.store.unit(
            "evaluation",
            hash_key({"stage": "pq-evaluation", "pq": e.unit.key, "evaluate": ev.__dict__, "seed": ctx.config.seed}),
        )
        out.append(unit)
        if ctx.reuse(unit, "evaluate"):
            continue
        unit.begin()
        token, name = e.unit.meta()["committed"], f"pq{e.pq_bytes}"
        ret = [
            ctx.submit(
                retrieval_block,
                e.unit.url,
                data.url,
                token,
                e.source.url,
                q,
                rel_f,
                proto.ks,
                proto.acc_k,
                query_group(len(proto.test)),
                name=f"retrieval-{name}",
            )
            for q in (query_blocks(proto.queries, len(proto.test)) if ev.retrieval else [])
        ]
        cls = [
            ctx.submit(
                classify_block,
                e.unit.url,
                data.url,
                token,
                e.source.url,
                q,
                proto.train,
                labels_f,
                [int(c[3:]) for c in knn],
                name=f"classify-{name}",
            )
            for q in fixed_blocks(proto.classified, CLASSIFY_QUERIES)
        ]
        jobs.append((e, unit, ret, cls))
    t0 = time.perf_counter()
    for e, unit, ret, cls in jobs:
        found = ctx.gather(ret + cls, "evaluate", [f"{e.unit.rel} block {i}" for i in range(len(ret) + len(cls))])
        records = encoded_records(e, proto, data, knn, found[: len(ret)], found[len(ret) :])
        unit.write_json("records.json", records)
        commit_timed(ctx, unit, t0, {"pq": e.unit.key})
    return out


def encoded_records(e, proto, data: DataInfo, knn: tuple, ret_res: list, cls_res: list) -> list[dict]:
    """The records of one encoded database: the float codes' metrics, its bytes per vector and the
    queries per second of its kNN search (one thread), each with the model's method, dimension and
    parameters, ``pq_bytes`` and the index (faiss's factory string)."""
    meta = e.unit.meta()
    spec = e.source.spec
    base = {
        "method": spec["method"],
        "dim": e.source.dim,
        "params": spec_params(spec),
        "pq_bytes": e.pq_bytes,
        "index": meta["index"],
    }
    found = view_metrics(
        proto.ks,
        knn,
        data.labels[proto.classified],
        ret_res,
        [errors for errors, _ in cls_res] if knn else [],
        query_labels=data.labels[proto.queries],
    )
    seconds = sum(s for _, s in cls_res)
    found += [
        {"classifier": None, "metric": "bytes_per_vector", "value": meta["bytes_per_vector"]},
        {"classifier": None, "metric": "qps", "value": len(proto.classified) / seconds if seconds > 0 else None},
    ]
    return [{**base, **m} for m in found]


def retrieval_block(unit_url, data_url, token, q_url, q_idx, rel_key, ks, accuracy_k, group) -> dict:
    """The queries ``q_idx`` (their uncompressed vectors in ``q_url``) against the test rows' index."""
    index, rows = pq_units.filled_index(unit_url, data_url, TEST, token)
    return pq.retrieval(index, read_rows(q_url, q_idx), q_idx, rows, rel_key, ks, accuracy_k, group)


def classify_block(unit_url, data_url, token, q_url, q_idx, train: int, labels, ks: list) -> tuple[dict, float]:
    """kNN errors of the queries ``q_idx`` against the index of the rows of split ``train``, and the
    search's seconds (one thread)."""
    index, _ = pq_units.filled_index(unit_url, data_url, train, token)
    n_classes = int(np.max(labels)) + 1
    return pq.knn_errors(index, read_rows(q_url, q_idx), labels[q_idx], labels, ks, n_classes)
