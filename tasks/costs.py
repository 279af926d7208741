"""What a learner costs, stated before any work and after its fit: the mixin every
:class:`~metricpipe.tasks.base.Learner` has. A plan (`metricpipe plan`) prices each fit and encoding
from the data's shape; the report lists each fitted encoder's cost per image."""

from metricpipe.tasks import madds
from metricpipe.tasks.madds import FitCost


class StatedCost:
    """A learner's fit and transform costs from the data's shape (:meth:`fit_cost`,
    :meth:`transform_cost`), and a fitted encoder's per image (:meth:`cost`)."""

    def fit_cost(self, n_rows: int, n_features: int, n_classes: int, k: int = 0, n_val: int = 0) -> FitCost | None:
        """What fitting it costs on data of this shape, before any work: multiply-adds in the unit of
        :mod:`metricpipe.tasks.madds` (a float64 GEMM's), from its algorithm (the steps it takes, the
        products each makes, the factorisations), ``at_most`` where early stopping decides the steps.

        Parameters
        ----------
        n_rows : int
            The rows its fit is fed (its training rows, its pool of negatives).
        n_features, n_classes : int
            The data's dimension and classes.
        k : int
            Neighbours per row of the graph it is fed (SL-NE, SL-DE), else 0.
        n_val : int
            Validation rows it is given (its early stopping), 0 when it holds its own out.

        Returns
        -------
        FitCost or None
            None when the learner does not say (a plan shows "unknown").
        """
        return None

    def transform_cost(self, n_rows: int, n_features: int, n_classes: int) -> float:
        """What encoding rows costs, before any fit: a projection to :meth:`code_dim` columns, and the
        rows read (decompressed) and checked, by default.

        Parameters
        ----------
        n_rows : int
            The rows encoded.
        n_features, n_classes : int
            The data's dimension and classes.

        Returns
        -------
        float
            Multiply-adds in the unit of :mod:`metricpipe.tasks.madds`.
        """
        projection = madds.gemm(n_rows, self.code_dim(n_features, n_classes), n_features)
        return projection + madds.passes(n_rows * n_features, 4)

    def cost(self) -> dict:
        """What the encoder costs per image; subclasses with a projection override it.

        Returns
        -------
        dict
            ``nnz`` (non-zeros), ``storage_bytes`` and ``flops_per_image`` (multiply-adds); 0 each
            when it has no projection.
        """
        return {"nnz": 0, "storage_bytes": 0, "flops_per_image": 0}
