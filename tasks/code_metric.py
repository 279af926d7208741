"""How a learner's codes are compared, under metric-learn's names (``get_metric``, ``pair_distance``,
``pair_score``) and as scikit-learn's neighbour estimators take it (``knn_params``): the mixin every
:class:`~metricpipe.tasks.base.Learner` has. It reads the learner's ``code_metric`` and ``transform``."""

import numpy as np
from sklearn.utils.validation import check_is_fitted

from metricpipe.tasks.errors import InputError


class CodeComparison:
    """Compare codes as ``code_metric`` says: Euclidean distance, or minus the inner product."""

    def code_distance(self, a, b):
        """How this learner's codes rank neighbours, lower nearer, as metricpipe's kNN, retrieval and
        evaluation compare them (``code_metric``): the Euclidean distance ``||a - b||`` ("euclidean"),
        or minus the inner product ``-a . b`` ("inner": SL-NE, SL-DE, sparse projectors; a
        dissimilarity, not a metric: it can be negative); kernel SLEM: minus Eq. 16's cosine.

        Parameters
        ----------
        a, b : array-like of shape (n_codes,) or (n_pairs, n_codes)
            Two codes, or two arrays of codes compared row by row.

        Returns
        -------
        float, or ndarray of shape (n_pairs,)
        """
        A, B = np.asarray(a, np.float64), np.asarray(b, np.float64)
        d = self._code_distances(np.atleast_2d(A), np.atleast_2d(B))
        return float(d[0]) if A.ndim == 1 and B.ndim == 1 else d

    def _code_distances(self, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        """code_distance of the rows of A (n, d) and B (n, d), row by row."""
        if self.code_metric == "inner":
            return -np.einsum("ij,ij->i", A, B)
        return np.sqrt(np.einsum("ij,ij->i", A - B, A - B))

    def pair_distance(self, pairs) -> np.ndarray:
        """:meth:`code_distance` of the codes of each pair of input rows (metric-learn's
        ``pair_distance``).

        Parameters
        ----------
        pairs : array-like of shape (n_pairs, 2, n_features)
            Pairs of input rows.

        Returns
        -------
        ndarray of shape (n_pairs,)
        """
        pairs = np.asarray(pairs)
        if pairs.ndim != 3 or pairs.shape[1] != 2:
            raise InputError(
                f"{type(self).__name__}.pair_distance: pairs of shape {pairs.shape}; give (n_pairs, 2, n_features)"
            )
        Z = self.transform(pairs.reshape(-1, pairs.shape[-1])).reshape(len(pairs), 2, -1)
        return self.code_distance(Z[:, 0], Z[:, 1])

    def pair_score(self, pairs) -> np.ndarray:
        """Minus :meth:`pair_distance`: higher is more similar (metric-learn's ``pair_score``).

        Parameters
        ----------
        pairs : array-like of shape (n_pairs, 2, n_features)
            Pairs of input rows.

        Returns
        -------
        ndarray of shape (n_pairs,)
        """
        return -self.pair_distance(pairs)

    def get_metric(self):
        """A function ``d(u, v)`` of two input rows (1-D arrays of ``n_features_in_`` values): the
        :meth:`code_distance` of their codes, as metric-learn's ``get_metric``. scikit-learn's
        neighbour estimators take it on raw features (``KNeighborsClassifier(metric=est.get_metric(),
        algorithm="brute")``); on codes, :meth:`knn_params` is faster.

        Returns
        -------
        callable (u, v) -> float
        """
        check_is_fitted(self)

        def metric_fun(u, v):
            return float(self.pair_distance(np.stack([np.ravel(u), np.ravel(v)])[None])[0])

        return metric_fun

    def knn_params(self) -> dict:
        """The keyword arguments of scikit-learn's ``KNeighborsClassifier`` / ``NearestNeighbors`` that
        compare this learner's codes as metricpipe does: ``{"metric": "euclidean"}``, or for codes
        compared otherwise (``code_metric`` "inner", kernel SLEM) ``{"metric": self.code_distance,
        "algorithm": "brute"}``. Euclidean distance on inner-product codes finds other neighbours.

        Returns
        -------
        dict
        """
        if self.code_metric == "euclidean":
            return {"metric": "euclidean"}
        return {"metric": self.code_distance, "algorithm": "brute"}


#: How a vector index (faiss) compares the codes of a learner, by its ``code_metric``.
VECTOR_METRICS = {"euclidean": "l2", "inner": "ip"}


def vector_metric(code_metric: str | None) -> str | None:
    """``"l2"`` (Euclidean codes) or ``"ip"`` (inner product: SL-NE, SL-DE, sparse projectors): how a
    vector index such as faiss's compares a learner's codes, as its ``code_metric`` says (None:
    Euclidean); None when the codes are compared by another score (kernel SLEM's Eq. 16), which no
    vector index computes.

    Parameters
    ----------
    code_metric : str or None
        A learner's :attr:`~metricpipe.tasks.base.Learner.code_metric`, or a model's recorded one.

    Returns
    -------
    str or None
    """
    return VECTOR_METRICS.get(code_metric or "euclidean")
