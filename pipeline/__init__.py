"""metricpipe: supervised compact codes for large image-descriptor collections.

Every learner is a scikit-learn estimator, usable in memory without Dask::

    from metricpipe import NCMML
    codes = NCMML(dim=32).fit(X_train, y_train).transform(X_test)

and the same classes are driven out of core by the Dask pipeline (``metricpipe run CONFIG``);
:func:`load_model` returns a stored model of a run as a fitted estimator, and
:func:`evaluate_embeddings` scores codes in memory with the evaluate stage's metrics.

This package is the orchestration layer (config, CLI, stages, storage, cluster, report; no maths);
``metricpipe.tasks`` holds the estimators and numerical kernels.
"""

__version__ = "0.4.1"

import os as _os

if _os.environ.pop("METRICPIPE_STARTING_WORKER", None) == "1":
    # A local cluster's worker process, spawned while the client held Ctrl-C (cluster.interrupts_deferred):
    # it shares the terminal's process group, so a Ctrl-C during its imports would kill it with a
    # traceback. It ignores SIGINT from here on; the client, which gets the Ctrl-C too, stops it. (Popped:
    # not passed on to what the worker starts.)
    import signal as _signal
    import threading as _threading

    if _threading.current_thread() is _threading.main_thread():
        _signal.signal(_signal.SIGINT, _signal.SIG_IGN)


# The estimators load on first use (PEP 562), so the command line starts without scikit-learn and
# scipy (``metricpipe --help`` in 0.08 s here, not 1.8 s) and a Ctrl-C during those imports reaches its handler.
def __getattr__(name: str):
    if name in _PUBLIC_FUNCTIONS:
        import importlib  # deferred: the function's module loads scikit-learn

        value = getattr(importlib.import_module(_PUBLIC_FUNCTIONS[name]), name)
        globals()[name] = value
        return value
    if name in _PUBLIC_ESTIMATORS:
        from metricpipe.tasks import registry  # deferred: imports scikit-learn (1.8 s), not needed by --help

        value = next(cls for cls in registry.ESTIMATORS if cls.__name__ == name)
        globals()[name] = value  # later lookups skip this function
        return value
    from metricpipe.tasks import submodule_on_first_use  # deferred: metricpipe.tasks imports on first use

    return submodule_on_first_use(__name__, name)


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC_ESTIMATORS) | set(_PUBLIC_FUNCTIONS))


def load_model(store: str, key: str):
    """The fitted estimator of a model a run stored.

    Parameters
    ----------
    store : str
        The run's store: a directory or an fsspec URL (``s3://BUCKET/PREFIX``).
    key : str
        The model's key, or a prefix of it (``metricpipe models STORE`` lists them).

    Returns
    -------
    estimator : Learner or sklearn.pipeline.Pipeline
        Its ``transform`` takes raw features, as given to ``metricpipe run``, and returns codes of
        shape (n_samples, n_codes): when the run normalised its data (``data.normalize``), the
        estimator comes wrapped in a scikit-learn ``Pipeline`` whose first step applies that
        normalisation.

    Raises
    ------
    InputError
        One line when no model or several have that key, or the model's files fail their checksums.
    """
    from metricpipe.store.models import load_model as load  # deferred: Zarr and scikit-learn on first use

    return load(store, key)


#: the registry's estimator classes (``metricpipe.tasks.registry.ESTIMATORS``; a test keeps the two equal)
_PUBLIC_ESTIMATORS = (
    "ESVM",
    "Identity",
    "KNNML",
    "KernelSLEM",
    "LDA",
    "LinearML",
    "NCMC",
    "NCMML",
    "NML",
    "PCA",
    "PCAWhitening",
    "RandomProjection",
    "SLDE",
    "SLEM",
    "SLNE",
    "SparseProjector",
)
#: functions of metricpipe.tasks users call from here: name -> module (loaded on first use, as the estimators)
_PUBLIC_FUNCTIONS = {"evaluate_embeddings": "metricpipe.tasks.scoring"}
__all__ = [*_PUBLIC_ESTIMATORS, *_PUBLIC_FUNCTIONS, "load_model"]
