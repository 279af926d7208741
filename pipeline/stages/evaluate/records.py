"""The metric records of one view's evaluation: retrieval at each K, each classifier's errors (the
metrics are tasks.scoring's, as evaluate_embeddings computes them in memory; here they get the
model's method, dimension and parameters)."""

import numpy as np

from metricpipe.stages.common import spec_params
from metricpipe.tasks.scoring import view_metrics


def view_records(
    spec: dict,
    dim: int,
    ks: tuple,
    classifiers: tuple,
    test_labels: np.ndarray,
    ret_res: list,
    cls_res: list,
    extra: dict | None = None,
    trained_on: list | None = None,
    query_labels: np.ndarray | None = None,
    knn_note: dict | None = None,
    classes: str | None = None,
) -> list[dict]:
    """Metric records of retrieval at ``ks`` and of ``classifiers``; ``test_labels`` are the classified
    test rows' labels, ``query_labels`` the retrieval queries' (default: ``test_labels``); ``knn_note``
    says how kNN found its neighbours (``knn_search``: graph or the index, ``knn_recall`` against exact
    search), recorded as metrics; ``classes`` ("seen" or "unseen", :class:`Protocol`), when the run
    holds classes out, the classes they are measured on."""
    params = {**spec_params(spec), **(extra or {})}
    base = {"method": spec["method"], "dim": dim, "params": params, **({"classes": classes} if classes else {})}
    found = view_metrics(ks, classifiers, test_labels, ret_res, cls_res, trained_on, query_labels, knn_note)
    return [{**base, **m} for m in found]
