"""Stage 4, train: one model per (method, parameter set), each fitted by its own estimator class.

The stage names no learner: it builds the unfitted estimator from the config entry through the
registry (``tasks.registry.make``) and hands it to the driver for what the registry says the
learner is fed (``tasks.registry.feeds``). A driver moves data and nothing else: it reads the rows
the learner needs, calls the estimator's documented entry point on a worker, and stores the fitted
estimator (``storage.save_model``).
"""
import time

from metricpipe import nml_train, slem_train, slne_train, sparse_train, stream_train
from metricpipe.context import StageContext
from metricpipe.stages.common import DataInfo
from metricpipe.storage import Unit, hash_key, load_arrays, save_model
from metricpipe.tasks import registry
from metricpipe.tasks.errors import InputError

def model_id(spec: dict) -> str:
    """A short readable name: method, dim, then the parameters that differ from their defaults."""
    defaults = registry.defaults(registry.estimator_class(spec["method"], spec))
    extra = "-".join(f"{k}{v}" for k, v in sorted(spec.items())
                     if k not in ("method", "dim") and v is not None and (k not in defaults or v != defaults[k]))
    return "-".join(str(x) for x in (spec["method"], spec.get("dim") or "", extra) if x != "")


def _fit_statistics(est, spec: dict, stats_url: str, model_url: str) -> dict:
    stats, _ = load_arrays(stats_url)
    t0 = time.perf_counter()
    est.fit_statistics(stats)
    return save_model(model_url, est, spec, time.perf_counter() - t0)


def _statistics_driver(ctx, spec, est, data, stats, neighbours, unit, name):
    if spec["method"] == "lda" and not stats.meta().get("dense", True):
        raise InputError(f"{ctx.config.source_file}: methods: lda needs a dense covariance but D="
                         f"{data.n_features} > statistics.max_dense_dim; raise max_dense_dim or drop lda")
    return ctx.submit(_fit_statistics, est, spec, stats.url, unit.url, name=f"train-{name}")


DRIVERS = {
    "statistics": _statistics_driver,
    "stream": stream_train.submit,
    "pairs": nml_train.submit,
    "neighbours": slne_train.submit,
    "subset": sparse_train.submit,
    "pool": slem_train.submit,
}


def model_key(spec: dict, stats: Unit, neighbours: Unit | None, data: DataInfo) -> str:
    inputs = {"stage": "model", "spec": spec, "statistics": stats.key, "data": data.unit.key}
    if registry.feeds(spec["method"]) == "neighbours":
        inputs["neighbours"] = neighbours.key
    return hash_key(inputs)


def run_train(ctx: StageContext, data: DataInfo, stats: Unit, neighbours: Unit | None) -> list[tuple[dict, Unit]]:
    """One model per spec of the config; returns [(spec, model unit)]."""
    todo, out = [], []
    for spec in ctx.config.methods:
        unit = ctx.store.unit("models", model_key(spec, stats, neighbours, data))
        out.append((spec, unit))
        if ctx.reuse(unit, "train"):
            continue
        unit.begin()
        driver = DRIVERS[registry.feeds(spec["method"])]
        todo.append((spec, unit, driver(ctx, spec, registry.make(spec), data, stats, neighbours, unit, model_id(spec))))
    if len(todo) < len(out):
        ctx.log(f"  train: reusing {len(out) - len(todo)} of {len(out)} models")
    t0 = time.perf_counter()
    results = ctx.gather([f for *_, f in todo], "train", [f"model {model_id(s)}" for s, *_ in todo])
    for (spec, unit, _), res in zip(todo, results):
        unit.commit({**res, "spec": spec, "seconds": round(res["fit_seconds"], 3),
                     "wall": round(time.perf_counter() - t0, 3), "data": data.unit.key,
                     "normalize": ctx.config.data.normalize,
                     "class_names": [c.item() if hasattr(c, "item") else c for c in data.classes]})
        if "samples_per_second" in res:
            ctx.log(f"  train: {model_id(spec)} {res['samples_per_second']:.0f} samples/s")
    return out
