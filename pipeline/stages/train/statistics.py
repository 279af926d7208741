"""The feeder of the learners fed the statistics stage's moments (identity, PCA, PCA-whitening, LDA,
random projections): one task reads the statistics and calls ``fit_statistics``."""

import time

from metricpipe.budget import refuse_without_dense_covariance
from metricpipe.store import load_arrays, save_model


def _fit(est, spec: dict, stats_url: str, model_url: str) -> dict:
    stats, _ = load_arrays(stats_url)
    t0, c0 = time.perf_counter(), time.thread_time()
    est.fit_statistics(stats)
    return save_model(model_url, est, spec, time.perf_counter() - t0, cpu_seconds=time.thread_time() - c0)


def submit(ctx, spec, est, data, stats, neighbours, unit, name, fold):
    """The one task that fits ``est`` (every train row: the statistics' rows, whatever the fold)."""
    if not stats.meta().get("dense", True):
        refuse_without_dense_covariance(
            est,
            data.n_features,
            ctx.config.statistics.max_dense_dim,
            f"{ctx.config.source_file}: methods: {spec['method']}",
        )
    return ctx.submit(_fit, est, spec, stats.url, unit.url, name=f"train-{name}")


def fed(est, info, cfg, n_train: int):
    """Moments: no task of its fit holds more than the statistics stage's (None: nothing to add)."""
    return None


def reads(est, info, cfg, n_rows: int) -> int:
    """Nothing inside the fit: the statistics are read before it."""
    return 0
