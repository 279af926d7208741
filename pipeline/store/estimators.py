"""A fitted learner in the store: its declared fitted attributes (arrays in Zarr, sparse arrays as their
CSC parts, the rest as JSON) and parameters, rebuilt by its class (``from_state``)."""

import numpy as np

from metricpipe.store.arrays import load_arrays, save_arrays
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.registry import estimator_class


def save_estimator(url: str, est, attrs: dict | None = None) -> None:
    """Store a fitted learner: its fitted attributes (arrays as Zarr arrays, scipy sparse arrays as
    their CSC parts, everything else as JSON), its method name and parameters. ``attrs`` adds facts
    about the run (the spec, the staged data's normalisation, ...)."""
    import scipy.sparse

    arrays, state, sparse = {}, {}, []
    for name, value in est.fitted_state().items():
        if scipy.sparse.issparse(value):
            W = value.tocsc()
            small = np.uint16 if W.shape[0] <= np.iinfo(np.uint16).max else np.int32
            arrays.update(
                {
                    f"{name}.data": W.data,
                    f"{name}.indices": W.indices.astype(small),
                    f"{name}.indptr": W.indptr,
                    f"{name}.shape": np.array(W.shape),
                }
            )
            sparse.append(name)
        elif isinstance(value, np.ndarray) and value.ndim > 0:
            arrays[name] = value
        elif isinstance(value, np.ndarray):
            state[name] = value.item()
        else:
            state[name] = value
    params = {k: v for k, v in est.get_params(deep=False).items()}
    save_arrays(
        url, arrays, {**(attrs or {}), "method": est.method, "params": params, "state": state, "sparse_arrays": sparse}
    )


def load_estimator(url: str):
    """The fitted learner stored at ``url`` by :func:`save_estimator`."""
    import scipy.sparse

    arrays, attrs = load_arrays(url)
    if "method" not in attrs or "params" not in attrs:
        raise InputError(
            f"{url}: this model was stored by metricpipe before 0.2, which kept no estimator; "
            f"rerun its config to train it again"
        )
    state = dict(attrs.get("state", {}))
    for name in attrs.get("sparse_arrays", []):
        state[name] = scipy.sparse.csc_array(
            (arrays.pop(f"{name}.data"), arrays.pop(f"{name}.indices").astype(np.int32), arrays.pop(f"{name}.indptr")),
            shape=tuple(int(s) for s in arrays.pop(f"{name}.shape")),
        )
    state.update(arrays)
    cls = estimator_class(attrs["method"], attrs["params"])
    return cls.from_state(attrs["params"], state)


def save_model(url: str, est, spec: dict, fit_seconds: float, **extra) -> dict:
    """Store a fitted learner for the encode and evaluate stages; returns the train stage's record
    of it (output dimension, how codes compare, encoder cost, fit time and ``extra`` facts)."""
    dim = int(est._n_features_out)
    info = {
        "dim": dim,
        "score": est.code_metric,
        "fit_seconds": float(fit_seconds),
        "cost": est.cost(),
        "refit": est.refit_params(),
        **extra,
    }
    M = getattr(est, "M_", None)
    if M is not None:  # bilinear (SL-NE, SL-DE): the encode stage also writes the exact views
        info["bilinear_dim"] = int(M.shape[0])
    save_estimator(url, est, {"spec": spec, "dim": dim, "score": est.code_metric})
    return info
