"""The stages, one module each, run in this order by `metricpipe.runner`:

    data (staging) -> statistics -> [neighbours] -> train -> encode -> evaluate -> report

Each opens its inputs lazily, checks them, writes its output template, maps `metricpipe.tasks`
kernels over row-blocks on the workers, and commits its unit. A stage wires; it does not compute:
worker-side functions (prefixed ``_``) read exactly the row-block they are given, call a kernel and
write their own chunk-aligned region, so no task holds more than a row-block of features (a kNN
task holds a query block and a database block) and no two tasks write the same chunk. The report
stage is `metricpipe.report`.
"""

from metricpipe.stages import encode, evaluate, neighbours, statistics, train
from metricpipe.stages.common import TEST, TRAIN, VAL, DataInfo, load_features
from metricpipe.stages.data import DataPlan, check_nonnegative_for, prepare_data, run_stage
from metricpipe.stages.encode import run_encode, run_quantise
from metricpipe.stages.evaluate import EVAL_BUDGET, RETRIEVAL_DB_BYTES, run_evaluate, run_evaluate_encoded
from metricpipe.stages.neighbours import check_neighbours_k, run_neighbours
from metricpipe.stages.statistics import run_statistics
from metricpipe.stages.train import model_id, run_train
from metricpipe.tasks import registry

__all__ = [
    "stage_names",
    "TEST",
    "TRAIN",
    "VAL",
    "DataInfo",
    "encode",
    "evaluate",
    "neighbours",
    "statistics",
    "train",
    "DataPlan",
    "check_neighbours_k",
    "check_nonnegative_for",
    "EVAL_BUDGET",
    "RETRIEVAL_DB_BYTES",
    "load_features",
    "model_id",
    "prepare_data",
    "run_encode",
    "run_evaluate",
    "run_evaluate_encoded",
    "run_quantise",
    "run_neighbours",
    "run_stage",
    "run_statistics",
    "run_train",
]


def stage_names(cfg) -> list[str]:
    """The stages a run of ``cfg`` runs, in order (the neighbours stage only when something reads the graph)."""
    needs_graph = (
        cfg.neighbours is not None
        or any(registry.feeds(m["method"]) == "neighbours" for m in cfg.methods)
        or any(c.startswith("softvote") for c in cfg.evaluate.classifiers)
    )
    return ["stage", "statistics"] + (["neighbours"] if needs_graph else []) + ["train", "encode", "evaluate", "report"]
