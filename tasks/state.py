"""What the pipeline stores of a fitted learner and how it rebuilds one: the mixin every
:class:`~metricpipe.tasks.base.Learner` has. Only declared attributes come back, so an array added
to a stored model (a store made by someone else) cannot change what the rebuilt estimator computes."""

from sklearn.utils.validation import check_is_fitted


class StoredState:
    """A learner's fitted attributes out (:meth:`fitted_state`) and back in (:meth:`from_state`)."""

    #: the fitted attributes a class adds to its bases' (:meth:`declared_state` collects them): the
    #: only ones :meth:`from_state` sets, so an array added to a stored model (a store made by
    #: someone else) cannot change what the rebuilt estimator computes (Identity given ``components_``)
    fitted_attributes: tuple = ("n_features_in_", "feature_names_in_")

    @classmethod
    def declared_state(cls) -> frozenset:
        """Every fitted attribute the class declares (its ``fitted_attributes`` and its bases').

        Returns
        -------
        frozenset of str
        """
        return frozenset(a for c in cls.__mro__ for a in vars(c).get("fitted_attributes", ()))

    def fitted_state(self) -> dict:
        """Every fitted attribute (public, ending in ``_``), as the pipeline stores it.

        Returns
        -------
        dict of str to object
            Arrays, scipy sparse arrays, numbers, strings and JSON-able lists/dicts; the pipeline
            stores arrays in Zarr and the rest as JSON.
        """
        check_is_fitted(self)
        return {k: v for k, v in vars(self).items() if k.endswith("_") and not k.startswith("_")}

    @classmethod
    def from_state(cls, params: dict, state: dict) -> "StoredState":
        """The fitted estimator from its parameters and :meth:`fitted_state`.

        Parameters
        ----------
        params : dict
            The estimator's parameters (``get_params()``).
        state : dict
            Its fitted attributes; one the class does not declare (:meth:`declared_state`) is not set.

        Returns
        -------
        Learner
            The fitted estimator.
        """
        est = cls(**params)
        declared = cls.declared_state()
        for k, v in state.items():
            if k in declared:
                setattr(est, k, v)
        return est
