"""Stage 2, statistics: mean, covariance, class means and scatters, PCA basis (blockwise tree reduction)."""

import time

import dask.array as da
import numpy as np

from metricpipe.budget import row_block
from metricpipe.context import StageContext
from metricpipe.stages.common import TRAIN, DataInfo, commit_timed, moments_block, tree_combine
from metricpipe.store import Unit, hash_key, open_array, save_arrays
from metricpipe.tasks import madds, moments

# ---- 2. statistics -------------------------------------------------------------------------------------


def _finalize_statistics(m, url: str, n_components) -> dict:
    stats = moments.finalize_statistics(m, n_components)
    save_arrays(url, stats)
    return {"n_train": int(m.n)}


def run_statistics(ctx: StageContext, data: DataInfo) -> Unit:
    """Mean, covariance (blockwise tree reduction), class counts/means, scatters, PCA basis."""
    cfg = ctx.config.statistics
    dense = data.n_features <= cfg.max_dense_dim
    # the seed reaches randomized PCA only: dense statistics (and every model made from them) are the
    # same for any seed, so a new seed does not recompute them
    key = hash_key(
        {
            "stage": "statistics",
            "data": data.unit.key,
            "dense": dense,
            "seed": None if dense else ctx.config.seed,
            "components": None if dense else cfg.components,
        }
    )
    unit = ctx.store.unit("statistics", key)
    if ctx.reuse(unit, "statistics"):
        ctx.log(f"  statistics: reusing {unit.rel}")
        return unit
    t0 = time.perf_counter()
    unit.begin()
    D = data.n_features
    parts, total = tree_combine(
        ctx,
        (
            ctx.submit(
                moments_block,
                data.url,
                a,
                b,
                len(data.classes),
                dense,
                name="moments-block",
                madds=madds.gemm(D, D, int((data.split[a:b] == TRAIN).sum())) if dense else None,
            )
            for a, b in data.chunks
        ),
        "moments-combine",
    )
    # wait, without fetching the blocks' moments (a D x D matrix each, freed once combined), so that a
    # failure names its block
    ctx.gather(parts, "statistics", [f"rows {a}..{b - 1}" for a, b in data.chunks], fetch=False)
    if dense:
        finalize = ctx.submit(
            _finalize_statistics, total, unit.url, None, name="statistics-finalize", madds=madds.eigh(D)
        )
        meta = ctx.gather([finalize], "statistics")[0]
    else:
        meta = _randomized_statistics(ctx, data, total, unit, cfg.components)
    commit_timed(ctx, unit, t0, {**meta, "dense": dense})
    return unit


def _randomized_statistics(ctx, data, total, unit, n_components) -> dict:
    """PCA by dask's out-of-core randomized SVD when D is too large for a dense covariance."""
    m = ctx.gather([total], "statistics")[0]
    stats = moments.finalize_statistics(m)
    train = data.rows(TRAIN)
    X = da.from_zarr(open_array(f"{data.url}/features"))[train] - stats["mean"].astype(np.float32)
    k = min(n_components, data.n_features, len(train))
    u, s, v = da.linalg.svd_compressed(X.rechunk({1: -1}), k=k, n_power_iter=2, seed=ctx.config.seed)
    s, v = ctx.client.compute([s, v], sync=True)
    stats["pca_variances"] = (np.asarray(s, np.float64) ** 2) / (m.n - 1)
    stats["pca_components"] = moments.fix_signs(np.asarray(v, np.float64))
    save_arrays(unit.url, stats)
    return {"n_train": int(m.n)}


def largest_tasks(info, cfg, limit: float) -> list:
    """The D x D covariance (float64): a block's partial and the two being combined, beside a row-block."""
    D = info.n_features
    if D > cfg.statistics.max_dense_dim:
        return []
    return [
        (
            f"the statistics stage's {D} x {D} covariance (3 copies, float64)",
            3 * 8.0 * D * D + row_block(info),
            f"set statistics.max_dense_dim below {D} (randomized PCA) or raise memory_limit",
        )
    ]


def stored_bytes(info, cfg) -> list:
    """What the stage writes (the disk rule), float64: the class means and, up to max_dense_dim, four
    D x D matrices (covariance, the two scatters, the PCA basis); past it the randomized PCA's basis."""
    D, C = info.n_features, len(info.classes or [])
    square = 4 * D if D <= cfg.statistics.max_dense_dim else min(cfg.statistics.components, D)
    return [(f"the statistics ({D:,}-d, {C:,} classes, float64)", 8.0 * D * (square + C), "")]


def work(info, cfg, specs: list) -> float | None:
    """Multiply-adds of the stage (:mod:`metricpipe.tasks.madds`'s unit): the moments of the train rows
    and the PCA; None past statistics.max_dense_dim (randomized PCA: not estimated)."""
    if info.n_features > cfg.statistics.max_dense_dim:
        return None
    return moments.statistics_cost(int((info.split == TRAIN).sum()), info.n_features)
