"""Parameter selection on the validation split: the train stage's candidates, scored and chosen.

A methods entry whose learner declares a ``search_space`` (and whose config leaves those
parameters unset) becomes several candidate models, one per grid point (``registry.candidates``).
Each candidate is an ordinary model unit trained by the usual driver, so the candidates of every
entry run concurrently as separate tasks on the workers. Each is then scored by a task on the
validation split (``tasks.evaluation.validation_score``): its validation rows (at most
VAL_QUERIES, a stratified sample of the ``val`` split) query a stratified sample of the train
split (at most REFERENCE_ROWS) in the candidate's code space, by the learner's
``selection_metric`` or the entry's ``select.metric``. The best candidate is the entry's model;
the test split is never read. The scores and the choice are a ``selection`` unit, keyed by the
candidates' model keys, the metric and the sample, which the report lists.

Where the data has no ``val`` rows, the candidates train on the train rows less a share that the
selection borrows as its validation rows (``metricpipe.folds``), and the chosen candidate is then
refitted on every train row (``select.refit``, as scikit-learn's ``GridSearchCV(refit=True)``),
so every model of the run, the baselines too, ends on the same train rows.
"""

import numpy as np

from metricpipe.config import NeighboursConfig
from metricpipe.store import hash_key, load_estimator, read_rows
from metricpipe.tasks import evaluation, knn, stream
from metricpipe.tasks.splits import TRAIN, VAL

VAL_QUERIES = 5000  # validation rows that score a candidate
REFERENCE_ROWS = 20000  # train rows they are compared with (the kNN database, the mAP database)
SELECTION_BUDGET = 2.5e8  # bytes of features the scoring task holds (validation + reference rows)


def selection_rows(split: np.ndarray, labels: np.ndarray, n_features: int, seed: int) -> tuple:
    """(validation rows, reference rows): stratified, seeded samples of the val and train splits,
    sized by VAL_QUERIES and REFERENCE_ROWS and shrunk together to fit SELECTION_BUDGET."""
    val, train = np.flatnonzero(split == VAL), np.flatnonzero(split == TRAIN)
    cap = max(200, int(SELECTION_BUDGET // (4 * n_features)))
    n_val = min(len(val), VAL_QUERIES, max(100, cap // 5))
    n_ref = min(len(train), REFERENCE_ROWS, max(100, cap - n_val))

    def sample(rows, size, purpose):
        rank = np.random.default_rng([seed, 59, purpose]).permutation(len(rows))
        return rows[stream.stratified_subset(labels[rows], size, rank)]

    return sample(val, n_val, 0), sample(train, n_ref, 1)


def _selection_data(data_url: str, val: np.ndarray, ref: np.ndarray, labels: np.ndarray, k: int) -> dict:
    """The rows every candidate is scored on, read once; with ``k``, each validation row's k nearest
    reference rows in the input space (the neighbourhood a soft vote runs over)."""
    Xv, Xr = read_rows(f"{data_url}/features", val), read_rows(f"{data_url}/features", ref)
    out = {"Xv": Xv, "yv": labels[val], "Xr": Xr, "yr": labels[ref], "nbr": None}
    if k:
        out["nbr"] = knn.block_topk(Xv, Xr, min(k, len(Xr)))[1]
    return out


def _score(trained, model_url: str, metric: str, sel: dict):
    """One candidate's validation score (``trained``: its training task's result, so this runs after
    it; an InputError there, a diverged fit, is passed on as this candidate's result)."""
    if isinstance(trained, Exception):
        return trained
    est = load_estimator(model_url)
    return evaluation.validation_score(est, metric, sel["Xv"], sel["yv"], sel["Xr"], sel["yr"], sel["nbr"])


def selection_key(cand_units: list, metric: str, seed: int, config) -> str:
    return hash_key(
        {
            "stage": "selection",
            "models": [u.key for u in cand_units],
            "metric": metric,
            "seed": seed,
            "rows": [VAL_QUERIES, REFERENCE_ROWS, SELECTION_BUDGET],
            **({"voters_from": voter_pool(config)} if metric.startswith("softvote") else {}),
        }
    )


def voter_pool(config) -> int:
    """Neighbours per validation row a soft vote chooses its voters from: the graph's size."""
    return (config.neighbours or NeighboursConfig()).k


def softvote_k(metrics: list[str]) -> int:
    return max([int(m[8:]) for m in metrics if m.startswith("softvote")] or [0])


def submit_data(ctx, data, split: np.ndarray, metrics: list[str]):
    """The scoring rows of ``split`` (a repeat's, with the validation rows it borrowed) as one future
    (None when it has no validation rows). A soft vote picks its K voters among each row's
    neighbourhood of the graph's size (neighbours.k), as the evaluate stage's softvoteK does: with
    only K neighbours fetched, every model would vote with the same K."""
    val, ref = selection_rows(split, data.labels, data.n_features, ctx.config.seed)
    if not len(val):
        return None, 0
    labels = data.labels.astype(np.int64)
    k = softvote_k(metrics)
    k = max(k, voter_pool(ctx.config)) if k else 0
    return ctx.submit(_selection_data, data.url, val, ref, labels, k, name="selection-rows"), len(val)


def submit_score(ctx, trained, unit, metric: str, sel_future, name: str):
    ctx.returning_errors = True
    try:
        return ctx.submit(_score, trained, unit.url, metric, sel_future, name=f"select-{name}")
    finally:
        ctx.returning_errors = False


def choose(metric: str, scores: list) -> int:
    """Index of the best candidate: lowest error or highest mAP; failed candidates (None) never win;
    ties go to the earlier candidate (the defaults come first)."""
    better = evaluation.higher_is_better(metric)
    ok = [i for i, s in enumerate(scores) if s is not None and np.isfinite(s)]
    if not ok:
        return -1
    return min(ok, key=lambda i: (-scores[i] if better else scores[i], i))


# A choice at the edge of its grid is searched further, a log step at a time, this many steps per end
# of each parameter: a best value that keeps moving outward is said (log and report), not hidden.
EDGE_STEPS = 2


def outward(grid: dict, tried: list[dict], chosen: dict, steps: dict) -> dict:
    """{parameter: next value} for each searched parameter whose chosen value is the largest or the
    smallest positive number tried for it: the next value a log step further (the ratio of the two
    outermost values tried on that side), while ``steps`` ({(parameter, "upper"|"lower"): steps
    taken}) is under EDGE_STEPS. A candidate that failed (diverged) still bounds its side."""
    out = {}
    for name in grid:
        values = sorted({t[name] for t in tried})
        value = chosen[name]
        if len(values) < 2 or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values
        ):
            continue
        if value == values[-1] and steps.get((name, "upper"), 0) < EDGE_STEPS:
            out[name] = ("upper", value * value / values[-2])
        elif value == values[0] and steps.get((name, "lower"), 0) < EDGE_STEPS:
            out[name] = ("lower", value * value / values[1])
    return out


def at_edge(grid: dict, tried: list[dict], chosen: dict) -> dict:
    """{parameter: "upper"|"lower"} for each searched numeric parameter whose chosen value is still the
    largest or smallest tried."""
    out = {}
    for name in grid:
        values = sorted({t[name] for t in tried if isinstance(t[name], (int, float)) and not isinstance(t[name], bool)})
        if len(values) >= 2 and chosen[name] in (values[0], values[-1]):
            out[name] = "upper" if chosen[name] == values[-1] else "lower"
    return out


def describe(grid: dict, params: dict) -> str:
    """'step 0.02, margin 0.05': a candidate's searched parameters."""
    return ", ".join(f"{k} {params[k]:g}" if isinstance(params[k], float) else f"{k} {params[k]}" for k in grid)
