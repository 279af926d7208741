"""Open-ended classes (Mensink et al., Sections 3.4-3.6): add classes to a trained NCM / NCMC model
without touching W, and classify with the extended model.

`add_classes` streams the new images in row-blocks (one block in memory), sums them per class and
divides: the class means, or for an NCMC model the k-means centroids of each new class (k-means++
on a bounded sample, then Lloyd passes over the blocks). With a class hierarchy (a YAML map
``class: parent`` covering the new classes and the model's classes) the zero-shot prior of Eq. 33
is the average over the new class's ancestors of the mean of the training classes below each; Eq. 34
mixes it with the sample mean, mu_p = (n mu_s + m mu_z) / (n + m), m = ``prior_weight``. A class
with no images takes the prior alone. The extended model is a new committed unit; the model it
extends is never modified. It runs in the calling process: the work is one pass over the new data.
"""

import time
from pathlib import Path

import numpy as np

from metricpipe.commands.export import BLOCK_ROWS, codes_unit, data_config, encode_rows, open_input
from metricpipe.config import DataConfig, read_yaml
from metricpipe.sources import open_source
from metricpipe.store import Store, hash_key, load_estimator, open_array, save_estimator
from metricpipe.store.models import check_intact, codes_of, find_model, model_units, staged_arrays
from metricpipe.tasks import evaluation, registry
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.evaluation import knn_predict
from metricpipe.tasks.moments import class_sums
from metricpipe.tasks.normalize import normalize_rows
from metricpipe.tasks.validate import check_feature_block, label_values

KMEANS_SAMPLE = 2000
NCM = (evaluation.NCM, evaluation.NCMC)  # the classifiers over means (centroids) a new class can join


def ncm_models(store: Store, model: str | None = None) -> list:
    """Committed NCMML / NCMC models of the store (or the one whose key starts with ``model``), as
    (unit, commit record)."""

    def ncm(meta):  # an NCM classifier (NCMML, NCMC): the learner says so
        method = (meta.get("spec") or {}).get("method")
        return method in registry.METHODS and registry.estimator_class(method, meta["spec"]).own_classifier in NCM

    # --model names one model, as for predict, encode and export (an ambiguous prefix is refused)
    named = [find_model(store, model)] if model is not None else []
    if named and not ncm(named[0][1]):
        u, meta = named[0]
        raise InputError(
            f"{store.url}: model {u.key} is a {(meta.get('spec') or {}).get('method')} model, not NCMML "
            f"or NCMC; add-classes extends class means (`metricpipe models {store.url}` lists them)"
        )

    # without --model: the models runs kept (a model add-classes made already holds added classes; a
    # selection candidate that was not kept has no codes)
    def kept(u, meta):
        codes = codes_of(store, u.key, meta)
        return not meta.get("extends") and codes is not None and codes.done()

    found = [
        (u, meta)
        for u, meta in (named if model is not None else model_units(store))
        if ncm(meta) and (model is not None or kept(u, meta))
    ]
    if not found:
        what = f"model {model!r}" if model else "NCMML or NCMC model"
        raise InputError(
            f"{store.url}: no committed {what} in models/; train one with metricpipe run (methods: ncmml or ncmc)"
        )
    return found


def _open(path: str, features: str, labels: str, where: str):
    src = open_source(DataConfig(path=path, features=features, labels=labels))
    n, D = src.reader.shape[0], int(np.prod(src.reader.shape[1:]))
    y = np.asarray(src.labels)
    if y.ndim != 1 or len(y) != n:  # one class is fine here: adding a single class is the common case
        raise InputError(
            f"{src.name} (labels): labels must be 1-D with one per feature row; got shape {y.shape} for {n} rows"
        )
    names, codes = np.unique(label_values(y, f"{src.name} (labels)"), return_inverse=True)
    return src, n, D, codes.astype(np.int64), [c.item() for c in names]


def _blocks(src, n, D, normalize):
    for a in range(0, n, BLOCK_ROWS):
        X = src.reader.read(a, min(n, a + BLOCK_ROWS)).reshape(-1, D)
        check_feature_block(X, a, f"{src.name} (features)")
        yield a, normalize_rows(X.astype(np.float32), normalize).astype(np.float64)


def _parents(path: str | None) -> dict:
    if path is None:
        return {}
    if not Path(path).is_file():
        raise InputError(f"{path}: file not found (--hierarchy); check the path")
    raw = read_yaml(Path(path), "the hierarchy (--hierarchy)")  # as configs are read: YAML 1.2 numbers, no alias bombs
    if not isinstance(raw, dict):
        raise InputError(f"{path}: the hierarchy must map each class to its parent (class: parent)")
    parents = {}
    for k, v in raw.items():  # 13.0 (YAML reads it as a number) names class 13, and a text label '13.0'
        for spelling in dict.fromkeys([_node(k), str(k)]):
            parents.setdefault(spelling, _node(v))
    for start in parents:  # a cycle would make the ancestor walk endless: refuse it, naming the loop
        seen, c = [start], start
        while c in parents:
            c = parents[c]
            if c in seen:
                loop = " -> ".join(seen[seen.index(c) :] + [c])
                raise InputError(
                    f"{path}: the hierarchy has a cycle ({loop}); class {c!r} is its own ancestor, "
                    f"so give it a parent outside the loop (--hierarchy)"
                )
            seen.append(c)
    return parents


def _node(x) -> str:
    """A hierarchy node as text, as class names are compared (str of the class): a whole float is the
    integer's text (13.0 -> '13'); anything else its own text."""
    if isinstance(x, float) and x.is_integer() and abs(x) < 2.0**53:
        return str(int(x))
    return str(x)


def zero_shot_prior(name: str, parents: dict, class_means: dict) -> np.ndarray:
    """Eq. 33: the mean over the ancestors of ``name`` of each ancestor's mean, an ancestor's mean
    being the average of the means of the training classes below it."""

    def ancestors(c):
        out, c = [], str(c)  # the hierarchy file names classes as text
        while c in parents:
            c = parents[c]
            out.append(c)
        return out

    below = {}
    for c in class_means:
        for a in ancestors(c):
            below.setdefault(a, []).append(class_means[c])
    nodes = [a for a in ancestors(name) if a in below]
    if not nodes:
        raise InputError(
            f"hierarchy: class {name!r} has no ancestor shared with a trained class; give its "
            f"parent in the hierarchy file"
        )
    return np.mean([np.mean(below[a], axis=0) for a in nodes], axis=0)


def _zero_names(old_names: list, zero_shot: tuple) -> list:
    """--zero-shot names are text: as the model's classes are (integers when they are)."""
    return [
        int(z) if old_names and isinstance(old_names[0], int) and str(z).lstrip("-").isdigit() else z for z in zero_shot
    ]


def _check_target(unit, attrs, est, src, D: int, names: list, zero_shot: tuple, parents: dict) -> None:
    """Refuse new data a target model cannot take: another dimension, labels of another kind (text
    beside integers), classes it has, a hierarchy for a model of several centroids per class or for
    classes with no trained ancestor."""
    old_names = list(attrs.get("class_names") or [])
    if est.n_features_in_ != D:
        raise InputError(
            f"{src.name}: features have {D} dimensions but model {unit.key} takes "
            f"{est.n_features_in_}; give features of the staged data's dimension"
        )
    owner = np.asarray(est.centroid_classes_, np.int64)
    have = {old_names[c] for c in np.unique(owner)} if old_names else set()  # classes with centroids
    zero = _zero_names(old_names, zero_shot)
    text = {isinstance(c, str) for c in old_names}
    odd = [c for c in names + zero if len(text) == 1 and isinstance(c, str) not in text]
    if odd:  # one kind per model, so predict keeps returning labels of the kind the model was trained with
        raise InputError(
            f"{src.name}: class(es) {odd[:5]} are not {'text' if True in text else 'integers'} like "
            f"model {unit.key}'s classes (e.g. {old_names[0]!r}); give the new classes labels of "
            f"that kind"
        )
    both = sorted(set(names) & set(zero), key=str)
    if both:  # a zero-shot class has no images: one with images would be added twice
        raise InputError(
            f"--zero-shot: class(es) {both[:5]} have images in {src.name}; a zero-shot class is one "
            f"with no images (its mean is the prior alone): drop it from --zero-shot"
        )
    dup = sorted({z for z in zero if zero.count(z) > 1}, key=str)
    if dup:
        raise InputError(f"--zero-shot: class(es) {dup[:5]} given more than once; name each once")
    clash = sorted(set(names + zero) & have, key=str)
    if clash:
        raise InputError(
            f"{src.name}: class(es) {clash[:5]} are already in model {unit.key}; new data must hold new classes only"
        )
    k = int(getattr(est, "centroids", 1))  # the model's k (a few-shot class of its own may hold fewer)
    if parents and k > 1:
        raise InputError(
            f"--hierarchy: model {unit.key} keeps {k} centroids per class; the zero-shot prior "
            f"(Eqs. 33-34) is for one mean per class (NCMML); pick that model with --model"
        )
    if parents:  # every new class needs an ancestor shared with a trained class (zero_shot_prior refuses)
        for name in names + zero:
            zero_shot_prior(name, parents, {old_names[c]: np.zeros(1) for c in np.unique(owner)})


def add_classes(
    store_url: str,
    data_path: str,
    features: str = "X",
    labels: str = "y",
    model: str | None = None,
    hierarchy: str | None = None,
    prior_weight: float = 0.0,
    zero_shot: tuple = (),
    log=print,
) -> list:
    """Add the classes of ``data_path`` (and ``zero_shot`` classes, prior only) to the store's NCM
    models. Returns one dict per extended model."""
    if not np.isfinite(prior_weight) or prior_weight < 0:  # (click's FloatRange lets nan through)
        raise InputError(
            f"--prior-weight {prior_weight}: expected a finite number >= 0 (m of Eq. 34, the prior's "
            f"weight against the sample mean)"
        )
    store = Store(store_url)
    store.check_exists()
    targets = ncm_models(store, model)
    for unit, meta in targets if model is None else ():  # (find_model checked the one --model names)
        check_intact(store, unit, meta)  # a damaged model would be extended with its damage, then committed
    src, n, D, codes, names = _open(data_path, features, labels, "new data")
    if n == 0 and not zero_shot:  # (NCMC's k-means failed on it; NCMML committed a model of no new class)
        raise InputError(
            f"{src.name}: no rows (data.path); give a file with at least one labelled row of each new "
            f"class (classes with no images are named with --zero-shot)"
        )
    parents = _parents(hierarchy)
    if (zero_shot or prior_weight > 0) and not parents:
        raise InputError("--zero-shot and --prior-weight need --hierarchy (a YAML map class: parent)")
    ests = [load_estimator(unit.url) for unit, _ in targets]  # each read once: checked, then extended
    for (unit, attrs), est in zip(targets, ests):  # every target checked before any is written
        _check_target(unit, attrs, est, src, D, names, zero_shot, parents)
    out = []
    for (unit, attrs), est in zip(targets, ests):
        t0 = time.perf_counter()
        new_unit = store.unit("models", _extended_key(unit, src, features, labels, parents, prior_weight, zero_shot))
        if new_unit.done() and not new_unit.verify():  # the same command again: its model is there already
            out.append(_reused(new_unit, unit, log))
            continue
        old_names = list(attrs.get("class_names") or [])  # the run's labels and added names: compared by value
        extra_names = _add_centroids(est, attrs, old_names, src, n, D, codes, names, parents, prior_weight, zero_shot)
        out.append(_write_extended(new_unit, unit, est, attrs, old_names, names + extra_names, n, t0, log))
    return out


def _extended_key(unit, src, features: str, labels: str, parents: dict, prior_weight: float, zero_shot: tuple) -> str:
    """The key of the model ``unit`` extended with ``src``'s classes: what the command was given."""
    return hash_key(
        {
            "stage": "add-classes",
            "model": unit.key,
            "data": src.fingerprint,
            "features": features,
            "labels": labels,
            "hierarchy": parents,
            "prior_weight": prior_weight,
            "zero_shot": list(zero_shot),
        }
    )


def _reused(new_unit, unit, log) -> dict:
    """The record of an extended model written before by the same command."""
    meta = new_unit.meta()
    info = {k: meta[k] for k in ("model", "extends", "added", "images", "seconds")}
    log(f"{new_unit.rel}: reusing ({unit.key} + {len(info['added'])} class(es), added before)")
    return info


def _class_means(src, n, D, codes, names, normalize: str) -> tuple[np.ndarray, np.ndarray]:
    """(each new class's mean, its count of rows), in one pass over ``src``."""
    sums, counts = np.zeros((len(names), D)), np.zeros(len(names), np.int64)
    for a, X in _blocks(src, n, D, normalize):
        y = codes[a : a + len(X)]
        sums += class_sums(X, y, len(names))
        counts += np.bincount(y, minlength=len(names))
    return sums / np.maximum(counts, 1)[:, None], counts


def _add_centroids(
    est, attrs, old_names: list, src, n, D, codes, names: list, parents: dict, prior_weight: float, zero_shot: tuple
) -> list:
    """Add the new classes' centroids to ``est`` (and the zero-shot classes', from the prior alone);
    return the zero-shot classes' names."""
    owner = np.asarray(est.centroid_classes_, np.int64)
    zero = _zero_names(old_names, zero_shot)
    k = int(est.get_params().get("centroids", 1))  # the model's k (a few-shot class may hold fewer)
    C0 = len(old_names)
    new_means, counts = _class_means(src, n, D, codes, names, attrs.get("normalize", "none"))
    trained = {old_names[c]: est.centroids_[owner == c].mean(0) for c in np.unique(owner)}
    if parents:
        for j, name in enumerate(names):  # Eq. 34
            mu_z = zero_shot_prior(name, parents, trained)
            new_means[j] = (counts[j] * new_means[j] + prior_weight * mu_z) / (counts[j] + prior_weight)
    if k > 1:  # (a class with fewer images than k: one centroid on each, as NCMC's fit)
        cents, new_owner = _kmeans_new(type(est), src, n, D, codes, names, k, attrs.get("normalize", "none"))
        new_owner = C0 + new_owner
    else:
        cents, new_owner = new_means, np.arange(C0, C0 + len(names))
    extra_names = list(zero)
    extra = [zero_shot_prior(z, parents, trained) for z in extra_names]
    all_cents = np.concatenate(
        [est.centroids_, cents.astype(np.float32)] + ([np.array(extra, np.float32)] if extra else [])
    )
    all_owner = np.concatenate([owner, new_owner, np.arange(C0 + len(names), C0 + len(names) + len(extra))])
    est.add_centroids(all_cents[len(owner) :], all_owner[len(owner) :])
    return extra_names


def _write_extended(new_unit, unit, est, attrs, old_names: list, added: list, n: int, t0: float, log) -> dict:
    """Write the extended model ``est`` as ``new_unit`` and commit it; return its record."""
    new_unit.begin()
    save_estimator(
        new_unit.url,
        est,
        {"spec": attrs.get("spec"), "dim": attrs.get("dim"), "score": attrs.get("score"), "extends": unit.key},
    )
    seconds = time.perf_counter() - t0
    info = {
        "model": new_unit.rel,
        "extends": unit.key,
        "added": added,
        "images": int(n),
        "seconds": round(seconds, 4),
    }
    new_unit.commit(
        {
            **info,
            "spec": attrs.get("spec"),
            "dim": attrs.get("dim"),
            "score": attrs.get("score"),
            "normalize": attrs.get("normalize", "none"),
            "class_names": old_names + added,
            "data": attrs.get("data"),
        }
    )
    log(f"{new_unit.rel}: {unit.key} + {len(added)} class(es) from {n} images in {seconds:.3f} s")
    return info


def _kmeans_new(cls, src, n, D, codes, names, k, normalize):
    """k centroids per new class (one on each image of a class with fewer), by the model's class ``cls``
    (NCMC): k-means++ on up to KMEANS_SAMPLE rows of each, Lloyd over the blocks. Returns (centroids,
    their new-class codes)."""
    rng = np.random.default_rng(0)
    keep = np.zeros(n, bool)
    for j in range(len(names)):
        rows = np.flatnonzero(codes == j)
        keep[rng.choice(rows, min(len(rows), KMEANS_SAMPLE), replace=False)] = True
    sample, ys = [], []
    for a, X in _blocks(src, n, D, normalize):
        m = keep[a : a + len(X)]
        sample.append(X[m])
        ys.append(codes[a : a + len(X)][m])

    def blocks():
        for a, X in _blocks(src, n, D, normalize):
            yield X, codes[a : a + len(X)]

    return cls(centroids=k, kmeans_iters=10, random_state=0).kmeans(
        np.concatenate(sample), np.concatenate(ys), blocks, len(names)
    )


def predict(
    store_url: str, model: str, data_path: str, features: str = "X", labels: str | None = None, k: int | None = None
):
    """Labels predicted for every row of ``data_path`` (a path or a builtin name) by any model, and the
    top-1 error when the data carries labels (``labels``, or by default its ``y`` when it has one). An
    NCMML / NCMC model classifies by its class means (Eq. 5,
    Eq. 22's mixture or Eq. 27) unless ``k`` is given; any other model by the majority of the ``k``
    (default 10) nearest train codes of its run, compared as the model compares codes. Returns the labels
    (in the model's own kind, int64 or str), the error (None without labels) and how many rows carry a
    label that is not a class of the model (counted as errors: no prediction can be right for them)."""
    data_config(data_path, features, labels)  # a built-in's refusals, before the store is read
    store = Store(store_url)
    store.check_exists()
    unit, attrs = find_model(store, model)
    est = load_estimator(unit.url)
    names = list(attrs.get("class_names") or [])
    src = open_input(data_path, features, labels)  # labels None: y when DATA has it
    n, D = src.reader.shape[0], int(np.prod(src.reader.shape[1:]))
    if D != est.n_features_in_:
        raise InputError(f"{src.name}: features have {D} dimensions but model {unit.key} takes {est.n_features_in_}")
    normalize = attrs.get("normalize", "none")
    pred = np.empty(n, np.int64)
    if est.own_classifier is not None and k is None:
        for a, X in _blocks(src, n, D, normalize):
            pred[a : a + len(X)] = est.predict(X)  # nearest class mean (Eq. 5), Eq. 22's mixture or Eq. 27
    else:
        k = k or 10
        cu, train = codes_unit(store, unit, attrs, "train")
        codes = open_array(f"{cu.url}/codes")
        if k > len(train):
            raise InputError(
                f"--k {k} votes over more neighbours than the {len(train)} train rows of model "
                f"{unit.key}'s run; use --k <= {len(train)}"
            )
        y_train = open_array(f"{staged_arrays(store, attrs, ('label',))}/label")[:].astype(np.int64)
        step = codes.chunks[0]
        parts = [
            (train[s : s + step], codes.get_orthogonal_selection((train[s : s + step], slice(None))))
            for s in range(0, len(train), step)
        ]  # the train codes (small: the model's dimension)
        for a in range(0, n, BLOCK_ROWS):
            Q = encode_rows(unit.url, data_path, features, normalize, a, min(n, a + BLOCK_ROWS))
            pred[a : a + len(Q)] = knn_predict(Q, parts, y_train, k, est.code_metric, len(names))
            if (pred[a : a + len(Q)] < 0).any():  # no labelled neighbour: a code that is not finite
                bad = a + int(np.argmax(pred[a : a + len(Q)] < 0))
                raise InputError(
                    f"{src.name}: row {bad} has no neighbour among the train codes (its code under "
                    f"model {unit.key} is not finite); check that row's features"
                )
    out = np.asarray(names)[pred] if names else pred  # labels of the model's own kind (int64 or str)
    error, unknown = None, 0
    if src.labels is not None:  # a y the user did not name is checked as strictly as --labels y
        error, unknown = _top1_error(
            src, f"--labels {labels}" if labels else "DATA's y", names, pred, unit.key, strict=labels is not None
        )
    return out, error, unknown


def _top1_error(src, where: str, names: list, pred: np.ndarray, key: str, strict: bool) -> tuple[float | None, int]:
    """The fraction of rows whose label (compared by value: 3.0 is class 3, "3" is not) is not the
    predicted class, and the number of rows whose label is no class of the model. When none is,
    ``strict`` (labels the user named) refuses; else there is no error rate (None)."""
    n = len(pred)
    truth = np.asarray(src.labels)
    if truth.shape != (n,):
        raise InputError(
            f"{src.name} ({where}): labels of shape {truth.shape} for {n} rows; give a 1-D array with one label per row"
        )
    truth = label_values(truth, f"{src.name} ({where})")
    index = {c: i for i, c in enumerate(names)}
    truth_idx = np.array([index.get(t.item(), -1) for t in truth])
    if n and (truth_idx < 0).all():
        if not strict:
            return None, n
        raise InputError(
            f"{src.name} ({where}): none of the labels is a class of model {key} "
            f"(e.g. {truth[0].item()!r}; its classes: {names[:3]}...); give the labels the model "
            f"was trained with"
        )
    return float(np.mean(pred != truth_idx)), int(np.sum(truth_idx < 0))
