"""Stored models as estimators: list a store's models, load one as a fitted scikit-learn estimator."""

import numpy as np

from metricpipe.store import Store, Unit, hash_key, load_estimator, read_attrs
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.normalize import normalize_rows


def model_units(store: Store) -> list[tuple[Unit, dict]]:
    """Committed model units of the store with their commit records (spec, dim, data, ...)."""
    return [(u, u.meta()) for u in store.units("models") if u.done()]


def codes_of(store: Store, key: str, meta: dict) -> Unit | None:
    """The unit of model ``key``'s codes on its run's staged data (None: the model records no staged
    data); committed only when its run encoded it (not for an unkept selection candidate, nor for a
    model add-classes made)."""
    if not meta.get("data"):
        return None
    # keyed by the release that made the model (its run encoded it with that release): after an upgrade
    # the store's models keep their codes for export and predict. Markers name it from 0.3.6; before,
    # the release of the store's last finished run is the best guess, then this one.
    inputs = {"stage": "codes", "model": key, "data": meta["data"]}
    if meta.get("version"):
        return store.unit("codes", hash_key(inputs, meta["version"]))
    guesses = [store.unit("codes", hash_key(inputs))]
    try:
        ran = store.last_run().get("versions", {}).get("metricpipe")
    except InputError:  # none, or damaged: the release running now is the guess
        ran = None
    if ran:
        guesses.insert(0, store.unit("codes", hash_key(inputs, ran)))
    return next((u for u in guesses if u.done()), guesses[-1])


def find_model(store: Store, key: str) -> tuple[Unit, dict]:
    """The one committed model whose key starts with ``key``, its files checked against the checksums of
    its commit (a damaged chunk would otherwise fail deep in a decoder, or decode to wrong weights)."""
    if not isinstance(key, str):
        raise InputError(
            f"{store.url}: a model key is text, e.g. the first characters of one `metricpipe models "
            f"{store.url}` lists; got {key!r}"
        )
    key = key.strip().lower()  # keys are lower-case hexadecimal
    found = [(u, m) for u, m in model_units(store) if u.key.startswith(key)]
    if not found:
        damaged = [u for u in store.units("models") if u.key.startswith(key) and u.marker_damaged()]
        if len(damaged) == 1:
            raise InputError(
                f"{store.url}: model {damaged[0].key} is damaged: its commit record "
                f"models/{damaged[0].key}.committed.json is truncated or was edited; rerun the run that made it "
                f"with --repair (metricpipe run CONFIG --repair) to recompute it"
            )
        raise InputError(
            f"{store.url}: no committed model {key!r} in models/; `metricpipe models {store.url}` lists them"
        )
    if len(found) > 1:
        more = ", ..." if len(found) > 4 else ""
        raise InputError(
            f"{store.url}: model {key!r} matches {len(found)} models "
            f"({', '.join(u.key for u, _ in found[:4])}{more}); give more of the key"
        )
    check_intact(store, *found[0])
    return found[0]


def check_intact(store: Store, unit: Unit, meta: dict) -> None:
    """Refuse model ``unit`` if a file differs from its commit's checksums, naming what recomputes it."""
    bad = unit.verify()
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        fix = (
            f"delete {unit.rel} and rerun the metricpipe add-classes that made it"
            if meta.get("extends")
            else "rerun the run that made it with --repair (metricpipe run CONFIG --repair) to recompute it"
        )
        raise InputError(f"{store.url}: model {unit.key} is damaged: {bad[0]}{more}; {fix}")


def staged_arrays(store: Store, meta: dict, names: tuple) -> str:
    """The URL of the staged data a model was trained on (``meta``: its commit record), once the
    group's metadata and the files of its arrays ``names`` (e.g. ``("split",)``) are found as their
    commit made them."""
    unit = store.unit("data", meta["data"])
    bad = (
        unit.verify(keep=lambda rel: rel == "zarr.json" or rel.split("/")[0] in names)
        if unit.done()
        else [f"{unit.rel}: not committed"]
    )
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise InputError(
            f"{store.url}: the staged data of the model is damaged: {bad[0]}{more}; rerun the run that "
            f"made it with --repair (metricpipe run CONFIG --repair) to recompute it"
        )
    return unit.url


def with_normalization(est, normalize: str | None):
    """``est`` behind the row normalisation the run applied at staging (none: ``est`` itself)."""
    if not normalize or normalize == "none":
        return est
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import FunctionTransformer

    step = FunctionTransformer(
        normalize_rows, kw_args={"kind": normalize}, validate=True, feature_names_out="one-to-one"
    )
    n_features = getattr(est, "n_features_in_", None)
    if n_features:  # fitted on no rows (it learns nothing): the pipeline then names its output features
        rows, names = np.zeros((1, n_features)), getattr(est, "feature_names_in_", None)
        if names is not None:
            import pandas as pd

            rows = pd.DataFrame(rows, columns=names)
        step.fit(rows)
    return Pipeline([("normalize", step), (est.method, est)])


def load_model(store_url: str, key: str):
    """The fitted estimator of model ``key`` (a key or its prefix) in ``store_url``; its transform
    takes raw features: with the run's ``data.normalize`` (other than none) it is a scikit-learn
    ``Pipeline`` of that normalizer and the estimator (``model[-1]``), else the estimator itself."""
    store = Store(store_url)
    store.check_is_store()  # (STORE/models given for STORE said "no committed model")
    unit, meta = find_model(store, key)
    est = load_estimator(unit.url)
    names = meta.get("class_names")
    if names is not None and len(est.fitted_state().get("classes_", ())) == len(names):
        est.classes_ = np.asarray(names)  # predict / score in the data's own labels, not class codes
    normalize = meta.get("normalize", read_attrs(unit.url).get("normalize"))
    return with_normalization(est, normalize)


def describe(store_url: str) -> list[dict]:
    """One row per committed model: key, method, dimension, parameters, what it extends and the classes
    add-classes added to it, the staged data it was trained on (its key) and that data's normalisation
    (None where the commit does not say)."""
    store = Store(store_url)
    store.check_is_store()
    rows = []
    for unit, meta in model_units(store):
        spec = dict(meta.get("spec") or {})
        if spec.get("members") is None and meta.get("members"):  # SL-DE's member rule, as it resolved
            spec["members"] = f"{meta['members']} (rule)"
        codes = codes_of(store, unit.key, meta)
        rows.append(
            {
                "key": unit.key,
                "method": spec.pop("method", "?"),
                "dim": meta.get("dim"),
                "params": spec,
                "extends": meta.get("extends"),
                "added": meta.get("added") or [],
                "refit_of": meta.get("refit_of"),
                "encoded": bool(codes and codes.done()),
                "data": meta.get("data"),
                "normalize": meta.get("normalize"),
            }
        )
    return sorted(rows, key=lambda r: (r["method"], str(r["dim"]), r["key"]))


def damaged_models(store_url: str) -> list[str]:
    """Keys of the models whose commit marker exists but is not a whole record of the model (truncated,
    edited, bit-flipped): not listed by :func:`describe`, which shows committed models only."""
    return [u.key for u in Store(store_url).units("models") if u.marker_damaged()]
