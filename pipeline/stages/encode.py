"""Stage 5, encode: every model applied to every row-block (``codes`` (sample, code)); a bilinear
model (SL-NE, SL-DE) also writes the two views whose inner product is its exact similarity."""

import time

import numpy as np
import sklearn

from metricpipe.context import StageContext
from metricpipe.stages.common import DataInfo, cached_estimator, commit_timed, load_features, write_template
from metricpipe.store import hash_key, open_array
from metricpipe.tasks import registry
from metricpipe.tasks.errors import InputError


def check_codes(codes: np.ndarray, start: int, spec: dict, what: str = "codes") -> None:
    """Refuse codes that are not finite (e.g. PCA-whitening with a tiny eps dividing by a zero variance):
    one line naming the model, its parameters and the first bad row, instead of metrics at chance."""
    if np.isfinite(codes).all():  # one pass and no temporary index array in the common case
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


def _encode_block(data_url: str, model_url: str, code_url: str, start: int, stop: int, spec: dict) -> int:
    model = cached_estimator(model_url)
    X = load_features(data_url, start, stop)
    # Staging refused non-finite features, so scikit-learn's finiteness check of the input (15 ms
    # of a 64 MB block's 105 ms PCA transform) is skipped; the codes are checked below. No value
    # changes: `metricpipe encode` (export.encode_rows) still gives the same bits.
    with sklearn.config_context(assume_finite=True):
        codes = model.transform(X)
    check_codes(codes, start, spec)
    open_array(f"{code_url}/codes", mode="r+")[start:stop] = codes
    if getattr(model, "M_", None) is not None:  # bilinear: also the two views whose inner product is the exact score
        with sklearn.config_context(assume_finite=True):
            query, base = model.exact_views(X)
        check_codes(query, start, spec, "query view")
        check_codes(base, start, spec, "base view")
        open_array(f"{code_url}/query", mode="r+")[start:stop] = query
        open_array(f"{code_url}/base", mode="r+")[start:stop] = base
    return stop - start


def run_encode(ctx: StageContext, data: DataInfo, models: list) -> list[tuple[dict, object, int]]:
    """Apply every model to every row-block; returns [(spec, codes unit, code dim)]."""
    out, futures, labels, pending = [], [], [], []
    t0 = time.perf_counter()
    for spec, model, *_ in models:
        meta = model.meta()
        dim = int(meta["dim"])
        unit = ctx.store.unit("codes", hash_key({"stage": "codes", "model": model.key, "data": data.unit.key}))
        out.append((spec, unit, dim))
        if ctx.reuse(unit, "encode"):
            continue
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
        for a, b in data.chunks:
            futures.append(
                ctx.submit(
                    _encode_block, data.url, model.url, unit.url, a, b, spec, name=f"encode-{registry.model_name(spec)}"
                )
            )
            labels.append(f"model {registry.model_name(spec)} rows {a}..{b - 1}")
    if len(pending) < len(out):
        ctx.log(f"  encode: reusing {len(out) - len(pending)} of {len(out)} encodings")
    try:
        ctx.gather(futures, "encode", labels)
    except InputError:
        for unit, _ in pending:  # a model's codes refused (e.g. not finite): no half-written codes are left
            unit.discard()
        raise
    for unit, meta in pending:
        commit_timed(ctx, unit, t0, meta)
    return out


def work(info, cfg, specs: list) -> float:
    """Multiply-adds of encoding every row with each model of ``specs`` (each learner says what its
    transform costs)."""
    n_classes = len(info.classes or []) or 2
    return sum(registry.make(s).transform_cost(info.n_samples, info.n_features, n_classes) for s in specs)
