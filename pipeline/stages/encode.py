"""Stage 5, encode: every model applied to every row-block (``codes`` (sample, code)); a bilinear
model (SL-NE, SL-DE) also writes the two views whose inner product is its exact similarity. With
``encode.pq``, the encoded databases: per size, a product quantiser of each model's codes and of the
raw features, and every row's PQ code (:mod:`metricpipe.stages.pq`)."""

import collections
import time

import numpy as np
import sklearn

from metricpipe import budget
from metricpipe.context import StageContext
from metricpipe.stages import pq as pq_units
from metricpipe.stages.common import (
    TRAIN,
    DataInfo,
    cached_estimator,
    commit_timed,
    load_features,
    under,
    write_template,
)
from metricpipe.store import hash_key, stored_rows, write_rows
from metricpipe.tasks import pq, registry
from metricpipe.tasks.code_metric import vector_metric
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.validate import all_finite


def check_codes(codes: np.ndarray, start: int, spec: dict, what: str = "codes") -> None:
    """Refuse codes that are not finite (e.g. PCA-whitening with a tiny eps dividing by a zero variance):
    one line naming the model, its parameters and the first bad row, instead of metrics at chance."""
    if all_finite(codes):  # no temporary of the codes' size in the common case
        return
    bad = ~np.isfinite(codes)
    r, c = np.argwhere(bad)[0]
    params = ", ".join(f"{k}: {v}" for k, v in spec.items() if k not in ("method", "select"))
    try:
        sgd = "lr" in registry.estimator_class(spec.get("method"), spec)._parameter_constraints
    except InputError:
        sgd = False
    hint = "a lower lr: its training diverged" if sgd else "e.g. a larger eps for pcaw"
    raise InputError(
        f"methods ({registry.model_name(spec)}): {int(bad.sum())} {what} value(s) are not finite, first "
        f"{codes[r, c]} at row {start + r}, column {c} (parameters {{{params}}}); the model "
        f"divides by zero or overflows: change these parameters ({hint})"
    )


# A task reads its row-block once and encodes it with up to MODELS_PER_TASK models (each model's own
# task re-read the block: at 4,096-d, 8 models read the 8.2 GB of features 8 times), no more than the
# worker's estimator cache holds, and the models are split over more tasks while the stage has fewer
# than MIN_TASKS (a run of one or two blocks still spreads its models over the workers).
MODELS_PER_TASK = cached_estimator.cache_parameters()["maxsize"]
MIN_TASKS = 16


def model_groups(n_models: int, n_blocks: int) -> list[list[int]]:
    """The models' positions, split into the groups one task per block encodes."""
    if n_models == 0:
        return []
    groups = max(-(-n_models // MODELS_PER_TASK), -(-min(MIN_TASKS, n_models * n_blocks) // max(1, n_blocks)))
    return [g.tolist() for g in np.array_split(np.arange(n_models), min(groups, n_models)) if len(g)]


def _encode_block(data_url: str, start: int, stop: int, models: list) -> list[dict]:
    """Encode rows start:stop with each of ``models`` ((model url, codes unit url, spec), the block read
    once); returns, per model, the checksums of the chunk files written (paths inside its unit)."""
    X = load_features(data_url, start, stop)
    return [_encode_rows(X, start, *m) for m in models]


def _encode_rows(X: np.ndarray, start: int, model_url: str, code_url: str, spec: dict) -> dict:
    model = cached_estimator(model_url)
    # Staging refused non-finite features, so scikit-learn's finiteness check of the input (15 ms
    # of a 64 MB block's 105 ms PCA transform) is skipped; the codes are checked below. No value
    # changes: `metricpipe encode` (export.encode_rows) still gives the same bits.
    with sklearn.config_context(assume_finite=True):
        codes = model.transform(X)
    check_codes(codes, start, spec)
    written = under("codes", write_rows(f"{code_url}/codes", start, codes))
    if getattr(model, "M_", None) is not None:  # bilinear: also the two views whose inner product is the exact score
        with sklearn.config_context(assume_finite=True):
            query, base = model.exact_views(X)
        check_codes(query, start, spec, "query view")
        check_codes(base, start, spec, "base view")
        written.update(under("query", write_rows(f"{code_url}/query", start, query)))
        written.update(under("base", write_rows(f"{code_url}/base", start, base)))
    return written


def run_encode(ctx: StageContext, data: DataInfo, models: list) -> list[tuple[dict, object, int]]:
    """Apply every model to every row-block; returns [(spec, codes unit, code dim)]."""
    out, todo = [], []
    for spec, model, *_ in models:
        meta = model.meta()
        unit = ctx.store.unit("codes", hash_key({"stage": "codes", "model": model.key, "data": data.unit.key}))
        out.append((spec, unit, int(meta["dim"])))
        if not ctx.reuse(unit, "encode"):
            todo.append((spec, model, meta, unit))
    widths = [int(meta["dim"]) + 2 * int(meta.get("bilinear_dim") or 0) for _, _, meta, _ in todo]
    needs = [_codes_need(data, spec, w) for (spec, *_), w in zip(todo, widths)]
    budget.check_disk(ctx.store, ctx.config, needs, who="the encode stage")
    futures, labels, pending, owner = [], [], [], []
    t0 = time.perf_counter()
    for spec, model, meta, unit in todo:
        dim = int(meta["dim"])
        unit.begin()
        variables = {"codes": (("sample", "code"), (data.n_samples, dim), np.float32, np.nan)}
        if meta.get("bilinear_dim"):
            p = int(meta["bilinear_dim"])
            variables["query"] = (("sample", "input"), (data.n_samples, p), np.float32, np.nan)
            variables["base"] = (("sample", "input"), (data.n_samples, p), np.float32, np.nan)
        # codes are stored bare: float codes gain little from LZ4 (1.07x on PCA codes) and compressing
        # them took a quarter of a block's encode time
        write_template(
            unit.url,
            variables,
            {},
            {"model": model.key, "spec": spec, "score": meta.get("score"), "bilinear": bool(meta.get("bilinear_dim"))},
            data.chunk_rows,
            compress=False,
        )
        pending.append(
            (
                unit,
                {
                    "score": meta.get("score") or "euclidean",
                    "bilinear": bool(meta.get("bilinear_dim")),
                    "cost": meta.get("cost"),
                    "model": model.key,
                    "spec": spec,
                },
            )
        )  # inspect names the model
    # each block's task reads it once for its group of models (model_groups); its cost is theirs
    learners = [registry.make(spec) for spec, *_ in todo]  # (each transform's cost prices the tasks)
    n_classes = len(data.classes) or 2
    for group in model_groups(len(todo), len(data.chunks)):
        names = [registry.model_name(todo[i][0]) for i in group]
        who = names[0] if len(names) == 1 else f"{len(names)}-models"
        for a, b in data.chunks:
            futures.append(
                ctx.submit(
                    _encode_block,
                    data.url,
                    a,
                    b,
                    [(todo[i][1].url, pending[i][0].url, todo[i][0]) for i in group],
                    name=f"encode-{who}",
                    madds=sum(learners[i].transform_cost(b - a, data.n_features, n_classes) for i in group),
                )
            )
            labels.append(f"model{'s' if len(names) > 1 else ''} {', '.join(names)} rows {a}..{b - 1}")
            owner.append(group)
    if len(pending) < len(out):
        ctx.log(f"  encode: reusing {len(out) - len(pending)} of {len(out)} encodings")
    try:
        written = [{} for _ in pending]
        for group, sums in zip(owner, ctx.gather(futures, "encode", labels)):
            for i, part in zip(group, sums):
                written[i].update(part)
    except InputError:
        for unit, _ in pending:  # a model's codes refused (e.g. not finite): no half-written codes are left
            unit.discard()
        raise
    for (unit, meta), sums in zip(pending, written):
        commit_timed(ctx, unit, t0, meta, sums)
    return out


def _codes_need(data: DataInfo, spec: dict, width: int) -> tuple:
    """(what, bytes, how to shrink) of one model's codes of ``width`` floats per row (the disk rule)."""
    n_rows, stored = data.n_samples, stored_rows(data.n_samples, data.chunk_rows)
    views = "input_dim" in registry.make(spec).get_params()  # (a bilinear learner's exact views are that wide)
    fix = f"lower its {'input_dim (its exact views) or dim' if views else 'dim'}, or leave it out"
    return (f"the codes of {registry.model_name(spec)} ({n_rows:,} x {width:,} float32)", 4.0 * stored * width, fix)


def _pq_need(data: DataInfo, pq_bytes: int, sources: int) -> tuple:
    return (
        f"{sources} encoded database(s) of {pq_bytes} bytes per vector",
        float(stored_rows(data.n_samples, data.chunk_rows)) * pq_bytes * sources,
        "fewer encode.pq sizes",
    )


def stored_bytes(info, cfg, specs: list) -> list:
    """What the stage writes at the most (the disk rule): every model's codes and a bilinear one's
    exact views (each learner's ``stored_width``), and per size of ``encode.pq`` every model's PQ codes
    and the anchor's (a model whose codes no vector index compares is counted too: an upper bound)."""
    n_classes, D = len(info.classes or []) or 2, info.n_features
    out = [_codes_need(info, s, registry.make(s).stored_width(D, n_classes)) for s in specs]
    return out + [_pq_need(info, M, len(specs) + 1) for M in cfg.encode.pq]


def run_quantise(ctx: StageContext, data: DataInfo, codes: list) -> tuple[list, list]:
    """``encode.pq``: per size, a product quantiser of each model's codes whose metric is a vector
    space's (the learner's code_metric says) and of the raw features, trained on a seeded sample of
    train rows, then every row's PQ code, one task per row-block. Returns ([Encoded], [skip notes])."""
    sizes = ctx.config.encode.pq
    if not sizes:
        return [], []
    sources, skipped = [], []
    for spec, unit, dim in codes:
        meta = unit.meta()
        metric = vector_metric(meta.get("score"))
        if metric is None:  # e.g. kernel SLEM's Eq. 16: no vector index computes it
            name, how = registry.model_name(spec), ":".join(meta["score"].split(":")[:2])
            skipped.append({"model": name, "reason": f"it compares codes by {how}, not in a vector space"})
            ctx.log(f"  encode: no product quantiser of {name}: it compares codes by {how}, not in a vector space")
            continue
        sources.append(pq_units.Source(spec, meta["model"], f"{unit.url}/codes", dim, metric, False))
    out = [
        pq_units.Encoded(s, m, pq_units.unit_for(ctx.store, data, s, m, ctx.config.seed))
        for s in [*sources, pq_units.anchor(data)]
        for m in sizes
    ]
    todo = [e for e in out if not ctx.reuse(e.unit, "encode")]
    if len(todo) < len(out):
        ctx.log(f"  encode: reusing {len(out) - len(todo)} of {len(out)} encoded databases")
    try:
        _quantise(ctx, data, todo)
    except InputError:
        for e in todo:
            e.unit.discard()
        raise
    return out, skipped


def _quantise(ctx: StageContext, data: DataInfo, todo: list) -> None:
    """Each encoded database as one chain of tasks: its quantiser's training, its codes array, then
    every row-block encoded with it. The chains go in longest training first: Dask places a task whose
    kind it has not timed as if it took half a second, so three OPQ trainings of about an hour each
    (4,096-d), submitted after fifteen short ones, all queued on one worker and the idle one never
    took one. Each database is committed (with its real bytes per vector, the trained index's
    ``sa_code_size``) as soon as its last block is written, while the others still run: a stop keeps
    the finished ones."""
    sizes = sorted({e.pq_bytes for e in todo})
    needs = [_pq_need(data, M, sum(e.pq_bytes == M for e in todo)) for M in sizes]
    budget.check_disk(ctx.store, ctx.config, needs, who="the encode stage")
    t0, seed = time.perf_counter(), ctx.config.seed
    rows = {dim: pq_units.sample_rows(data, dim, seed) for dim in sorted({e.source.dim for e in todo})}
    cost = [pq.train_cost(len(rows[e.source.dim]), e.source.dim, e.pq_bytes, e.source.rotate) for e in todo]
    futures, labels, owner, arrays = [], [], [], set()  # arrays: the positions of the codes arrays' tasks
    for i in sorted(range(len(todo)), key=lambda i: -cost[i]):
        e, sample = todo[i], rows[todo[i].source.dim]
        pq_units.begin(e.unit, e.source, e.pq_bytes)
        args = (e.source.url, sample, e.unit.url, e.pq_bytes, e.source.metric, e.source.rotate, seed)
        trained = ctx.submit(pq_units.train_quantiser, *args, name=f"pq-train-{_name(e)}", madds=cost[i])
        codes = ctx.submit(
            pq_units.create_codes, e.unit.url, data.n_samples, data.chunk_rows, trained, name=f"pq-codes-{_name(e)}"
        )
        arrays.add(len(futures))
        futures.append(codes)
        labels.append(f"{_name(e)} quantiser")
        owner.append(i)
        for a, b in data.chunks:  # the trained quantiser goes to each worker once (the train task's result)
            futures.append(
                ctx.submit(
                    pq_units.encode_rows,
                    e.source.url,
                    e.unit.url,
                    trained,
                    codes,
                    a,
                    b,
                    name=f"pq-encode-{_name(e)}",
                    madds=pq.encode_cost(b - a, e.source.dim, e.pq_bytes, e.source.rotate),
                )
            )
            labels.append(f"{_name(e)} rows {a}..{b - 1}")
            owner.append(i)
    left = collections.Counter(owner)
    size = {}

    def finished(j: int, result) -> None:
        i = owner[j]
        if j in arrays:
            size[i] = result
        left[i] -= 1
        if not left[i]:
            e = todo[i]
            meta = {
                "model": e.source.model,
                "spec": e.source.spec,
                "pq_bytes": e.pq_bytes,
                "bytes_per_vector": size[i],
                "index": pq.factory(e.source.dim, e.pq_bytes, e.source.rotate),
                "metric": e.source.metric,
                "sample_rows": len(rows[e.source.dim]),
            }
            commit_timed(ctx, e.unit, t0, meta)

    ctx.gather(futures, "encode", labels, on_result=finished)


def _name(e) -> str:
    """An encoded database as logs and task names say it: the model's name (the anchor's), its size."""
    spec = e.source.spec
    who = f"{pq.ANCHOR} (raw)" if e.source.model is None else registry.model_name(spec)
    return f"{who} pq{e.pq_bytes}"


def largest_tasks(info, cfg, limit: float) -> list:
    """A quantiser's training (encode.pq): its sample of the widest vectors it encodes, the raw features
    (the anchor's OPQ), held with the copies faiss makes while it trains."""
    if not cfg.encode.pq:
        return []
    rows = pq_units.sample_size(int((info.split == TRAIN).sum()), info.n_features)
    return [
        (
            f"a product quantiser's training ({rows:,} sampled train rows of {info.n_features} features, "
            f"{pq_units.TRAIN_COPIES} copies)",
            pq_units.TRAIN_COPIES * 4.0 * rows * info.n_features,
            "raise memory_limit, or leave encode.pq out",
        )
    ]


def work(info, cfg, specs: list) -> float:
    """Multiply-adds of encoding every row with each model of ``specs`` (each learner says what its
    transform costs) and, per size of ``encode.pq``, of training and applying the product quantiser
    of each model's codes and the anchor's OPQ + PQ of the features (a model whose codes no vector
    index compares is counted too: an upper bound)."""
    n_classes, D = len(info.classes or []) or 2, info.n_features
    total = sum(registry.make(s).transform_cost(info.n_samples, D, n_classes) for s in specs)
    n_train = int((info.split == TRAIN).sum())
    sources = [(registry.make(s).code_dim(D, n_classes), False) for s in specs] + [(D, True)]
    for M in cfg.encode.pq:
        for dim, rotate in sources:
            rows = pq_units.sample_size(n_train, dim)
            total += pq.train_cost(rows, dim, M, rotate) + pq.encode_cost(info.n_samples, dim, M, rotate)
    return total
