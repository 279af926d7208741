"""The metric records of one view's evaluation: retrieval at each K, each classifier's errors."""

import warnings

import numpy as np

from metricpipe.stages.common import spec_params
from metricpipe.tasks import evaluation, metrics

ACCURACY_METRICS = ("map@r", "r_precision", "precision@1", "mrr")


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
    query_labels = test_labels if query_labels is None else query_labels
    params = {**spec_params(spec), **(extra or {})}
    base = {"method": spec["method"], "dim": dim, "params": params, **({"classes": classes} if classes else {})}
    recs = []
    with warnings.catch_warnings():  # no query with a relevant image: NaN, which the run's start noted
        warnings.simplefilter("ignore", RuntimeWarning)
        return _record_list(
            recs, base, ks, classifiers, test_labels, ret_res, cls_res, trained_on, query_labels, knn_note
        )


def _record_list(
    recs, base, ks, classifiers, test_labels, ret_res, cls_res, trained_on, query_labels, knn_note
) -> list[dict]:
    if ret_res:
        cat = {k: np.concatenate([r[k] for r in ret_res]) for k in ret_res[0]}
        recs.append({**base, "classifier": None, "metric": "map", "value": float(np.nanmean(cat["ap"]))})
        for j, k in enumerate(ks):
            recs.append(
                {
                    **base,
                    "classifier": None,
                    "metric": f"mprec@{k}",
                    "value": float(metrics.class_average(cat["prec"][:, j], query_labels)),
                }
            )
            recs.append(
                {**base, "classifier": None, "metric": f"recall@{k}", "value": float(np.nanmean(cat["recall"][:, j]))}
            )
        if "ukb4" in cat:
            recs.append({**base, "classifier": None, "metric": "ukb4", "value": float(cat["ukb4"].mean())})
        if "map@r" in cat:  # pytorch-metric-learning's AccuracyCalculator metrics (tasks.metrics)
            acc = evaluation.mean_accuracy({m: cat[m] for m in ACCURACY_METRICS})
            recs.extend({**base, "classifier": None, "metric": m, "value": acc[m]} for m in ACCURACY_METRICS)
        if "cluster" in cat:
            acc = metrics.clustering_scores(query_labels, cat["cluster"])
            recs.extend({**base, "classifier": None, "metric": m, "value": acc[m]} for m in ("nmi", "ami"))
    if cls_res:
        # a model trained on some classes only is also scored on the test images of the others
        new = None if not trained_on else ~np.isin(test_labels, trained_on)
        for c in classifiers:
            if c not in cls_res[0]:  # e.g. ncmc for a model without centroids
                continue
            top1 = np.concatenate([r[c][0] for r in cls_res])
            top5 = np.concatenate([r[c][1] for r in cls_res])
            recs.append({**base, "classifier": c, "metric": "top1_error", "value": float(top1.mean())})
            recs.append({**base, "classifier": c, "metric": "top5_error", "value": float(top5.mean())})
            if c.startswith("knn") and knn_note:
                recs.append(
                    {
                        **base,
                        "classifier": c,
                        "metric": "knn_recall",
                        "value": knn_note.get("knn_recall"),
                        "search": knn_note["knn_search"],
                    }
                )
            if new is not None and new.any():
                recs.append(
                    {**base, "classifier": c, "metric": "top1_error_new_classes", "value": float(top1[new].mean())}
                )
                recs.append(
                    {**base, "classifier": c, "metric": "top5_error_new_classes", "value": float(top5[new].mean())}
                )
    return recs
