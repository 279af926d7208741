"""Stage 1, staging: read the source in row-blocks, validate, normalise, write `features` (sample, feature)."""

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from metricpipe import budget
from metricpipe.config import SPLIT_NAMES, USER_SPLITS, RunConfig
from metricpipe.context import StageContext
from metricpipe.sources import fingerprint, open_source
from metricpipe.stages.common import TEST, TRAIN, VAL, DataInfo, commit_timed, under, write_template
from metricpipe.store import chunk_rows_for, create_array, hash_key, stored_rows, write_rows
from metricpipe.tasks import madds, registry, splits, stream
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.normalize import normalize_rows
from metricpipe.tasks.validate import (
    check_feature_block,
    check_normalized_block,
    check_split,
    class_codes,
    encode_labels,
)

# ---- 1. stage ----------------------------------------------------------------------------------------
# The staged split is the user's: the validation rows a selection borrows from train are drawn later,
# per repeat (metricpipe.folds), so that everything a run makes from "train" uses every train row.


def _split_codes(cfg: RunConfig, src, codes: np.ndarray, classes: list, labels_file: str) -> np.ndarray:
    return _given_or_random_split(cfg, src, codes, classes, labels_file)


def _hold_out(cfg: RunConfig, split: np.ndarray, codes: np.ndarray, classes: list, where: str) -> np.ndarray:
    """The split with the classes data.split.classes holds out recoded (:func:`splits.hold_out`): at
    least two classes on either side, and every held-out class with a test row to score."""
    asked = cfg.data.split.classes
    if asked is None:
        return split
    key = f"{cfg.source_file}: data.split.classes"
    if isinstance(asked, float):
        held = splits.draw_unseen(len(classes), asked, cfg.data.split.seed)
    else:
        held = class_codes(asked, classes, key)
    n_seen = len(classes) - len(held)
    if len(held) < 2 or n_seen < 2:
        raise InputError(
            f"{key}: {asked!r} holds out {len(held)} and keeps {n_seen} of the {len(classes)} "
            f"classes of {where}; each side needs at least 2 classes: "
            + ("change the fraction" if isinstance(asked, float) else f"list between 2 and {len(classes) - 2} labels")
        )
    out = splits.hold_out(split, codes, held)
    untested = np.setdiff1d(held, codes[out == splits.UNSEEN_TEST])
    if len(untested):
        raise InputError(
            f"{key}: held-out class {classes[int(untested[0])]!r} has no test row in {where}, so "
            f"nothing of it would be scored; hold out classes with test rows"
        )
    return out


def _given_or_random_split(cfg: RunConfig, src, codes: np.ndarray, classes: list, labels_file: str) -> np.ndarray:
    n = len(codes)
    if src.split is not None:
        if len(src.split) != n:
            raise InputError(
                f"{src.name}: the split column {cfg.data.split.column!r} has {len(src.split)} values "
                f"for {n} rows (data.split.column); give one split name per feature row"
            )
        unknown = sorted(str(v) for v in set(np.unique(src.split).tolist()) - set(USER_SPLITS))
        if unknown:
            raise InputError(
                f"{src.name}: split column holds {unknown[:3]} (data.split.column); "
                f"allowed values are {', '.join(USER_SPLITS)}"
                + (
                    " (hold classes out with data.split.classes)"
                    if any(u.startswith("unseen") for u in unknown)
                    else ""
                )
            )
        if cfg.data.split.val not in ("auto", 0, 0.0):
            raise InputError(
                f"{src.name}: this source comes with its own split, whose val rows data.split.val: "
                f"{cfg.data.split.val} cannot set; use val: auto (a tenth of its train split) or 0"
            )
        if "test" in ((cfg.raw.get("data") or {}).get("split") or {}):
            raise InputError(
                f"{src.name}: this source comes with its own train/test split, which "
                f"data.split.test would not change; drop data.split.test (or give the rows "
                f"as an array file to split them by a fraction)"
            )
        lookup = {name: i for i, name in enumerate(SPLIT_NAMES)}
        return (
            np.array([lookup[s] for s in src.split], np.int8)
            if n < 1000
            else np.select([src.split == s for s in SPLIT_NAMES], range(len(SPLIT_NAMES)), TRAIN).astype(np.int8)
        )
    if cfg.data.split.column:
        raise InputError(
            f"{src.name}: this source has no split column {cfg.data.split.column!r} "
            f"(data.split.column); use data.split.test instead"
        )
    from sklearn.model_selection import train_test_split

    s = cfg.data.split
    val_share = 0.0 if s.val == "auto" else s.val
    split = np.full(n, TRAIN, np.int8)
    counts = np.bincount(codes)
    if counts.min() < 2:
        raise InputError(
            f"{labels_file}: class {classes[int(np.argmin(counts))]!r} has {counts.min()} sample(s); a stratified "
            f"split needs at least two per class (data.labels); drop or merge that class"
        )
    held = s.test + val_share
    try:
        _, rest = train_test_split(np.arange(n), test_size=held, stratify=codes, random_state=s.seed)
        if val_share > 0:
            test, val = train_test_split(rest, test_size=val_share / held, stratify=codes[rest], random_state=s.seed)
            split[val] = VAL
        else:
            test = rest
    except ValueError as e:
        raise InputError(
            f"{src.name}: cannot split {n} samples of {len(counts)} classes with "
            f"data.split.test={s.test}: {e}".splitlines()[0]
        ) from None
    split[test] = TEST
    return split


def _stored_sample(reader, info, normalize: str, where: str, rows: int = 4096) -> np.ndarray:
    """The first rows as they will be stored, to decide the features' compression (checked like
    every block first, so bad input is the same one-line error here as in the stage's tasks)."""
    X = np.asarray(reader.read(0, min(rows, info.n_samples)))
    check_feature_block(X, 0, where)
    X = normalize_rows(X.astype(np.float32), normalize)
    check_normalized_block(X, 0, normalize, where)
    return X


def _stage_block(reader, start: int, stop: int, normalize: str, url: str, name: str) -> tuple:
    """Stage rows start:stop; returns ((their least stored value, its row and column in the source),
    the checksums of the chunk files written)."""
    X = np.asarray(reader.read(start, stop))
    check_feature_block(X, start, name)
    X = normalize_rows(X, normalize)
    check_normalized_block(X, start, normalize, name)
    written = under("features", write_rows(f"{url}/features", start, X))
    # each row's content key: the SGD learners' layout follows the rows, not where they are stored
    written.update(under("row_key", write_rows(f"{url}/row_key", start, stream.row_keys(X))))
    r, c = np.unravel_index(int(np.argmin(X)), X.shape)
    return (float(X[r, c]), start + int(r), int(c)), written


@dataclass(frozen=True)
class DataPlan:
    """Everything about the staged data that can be known and checked before any task runs."""

    source: object
    info: DataInfo
    coords: dict
    attrs: dict
    pairs: dict | None = None  # user pairs for NML / linear ML (pair_i, pair_j, pair_y)


def check_store_outside_data(cfg: RunConfig, store) -> None:
    """Refuse a store inside the folder it stages (a Zarr source; an IDX folder is read file by file):
    the data's key holds a fingerprint of every file in that folder, the store's among them, so each
    run found new data and staged it again; and every command on the store would write into the
    dataset. Refused, not left out of the fingerprint: a dataset is no place for results
    (``data.verify_source`` would hash them too)."""
    data = Path(cfg.data.path) if cfg.data.path else None
    if (
        data is None
        or not data.is_dir()
        or not ((data / "zarr.json").exists() or data.suffix.lower() == ".zarr")
        or not getattr(store, "local", False)
    ):
        return
    data, root = data.resolve(), Path(store.root).resolve()
    if root == data or data in root.parents:
        raise InputError(
            f"{cfg.source_file}: store: {store.url} is inside data.path {data}, the folder it stages (its "
            f"files would change the data's fingerprint, so every run would stage it again); choose a "
            f"store outside {data}"
        )


def prepare_data(cfg: RunConfig, store) -> DataPlan:
    """Open the source lazily and check labels, splits, groups and ids on the client (cheap, 1-D)."""
    check_store_outside_data(cfg, store)
    src = open_source(cfg.data)
    n, D = int(src.reader.shape[0]), int(np.prod(src.reader.shape[1:]))
    if n == 0 or D == 0:
        raise InputError(f"{src.name}: features are empty (shape {tuple(src.reader.shape)}); check data.features")
    labels_file = cfg.data.labels if (cfg.data.labels or "").endswith(".npy") else src.name  # where they were read
    codes, classes = encode_labels(src.labels, n, f"{labels_file} (data.labels)")
    d = cfg.data
    pairs = _load_pairs(d.pairs) if d.pairs else None
    split = _split_codes(cfg, src, codes, classes, labels_file)
    check_split(codes, split, SPLIT_NAMES, classes, src.name, given=src.split is not None)
    split = _hold_out(cfg, split, codes, classes, src.name)
    coords = {"label": codes, "split": split}
    for key in ("groups", "ids"):  # a source of one array has no column to read them from
        if getattr(d, key) and getattr(src, key) is None:
            raise InputError(
                f"{src.name}: data.{key} names an array beside the features, and this format holds "
                f"the features alone; save features, labels and {key} together in an .npz, HDF5, "
                f"Zarr or Parquet file"
            )
    groups = None
    if src.groups is not None:
        groups = (
            encode_labels(src.groups, n, f"{src.name} (data.groups)", "groups")[0]
            if len(np.unique(src.groups)) > 1
            else np.zeros(n, np.int32)
        )
        coords["group"] = groups
    if src.ids is not None:
        ids = np.asarray(src.ids)
        if not np.issubdtype(ids.dtype, np.integer) or len(ids) != n:
            raise InputError(f"{src.name}: data.ids must be {n} integers; got dtype {ids.dtype}, length {len(ids)}")
        coords["id"] = ids
    pairs_fp = None
    if d.pairs:
        coords_pairs = _check_pairs(d.pairs, *pairs, split, random_split=src.split is None)
    by_bytes = d.verify_source  # the fingerprint holds the files' bytes: their paths are not the data
    if d.pairs:
        pairs_fp = fingerprint(d.pairs, contents=by_bytes)
    chunk_rows = chunk_rows_for(D, d.chunk_mb)
    key = hash_key(
        {
            "stage": "data",
            "layout": "user-split",
            "source": src.fingerprint,
            "name": _key_path(src.name, by_bytes),
            "features": d.features,
            "labels": _key_path(d.labels, by_bytes),
            "groups": _key_path(d.groups, by_bytes),
            "normalize": d.normalize,
            "split": _split_key(d.split),
            "chunk_rows": chunk_rows,
            **({"pairs": pairs_fp} if pairs_fp else {}),
            **({"ids": d.ids} if d.ids else {}),
        }
    )
    info = DataInfo(store.unit("data", key), n, D, chunk_rows, classes, codes, split, groups)
    attrs = {
        "source": src.name,
        "normalize": d.normalize,
        "classes": [str(c) for c in classes],
        "split_flag_meanings": " ".join(SPLIT_NAMES),
    }
    return DataPlan(src, info, coords, attrs, coords_pairs if d.pairs else None)


def _split_key(s) -> dict:
    """The split settings as the staged data depends on them: val auto and 0 stage the same rows (the
    borrowed validation rows are not staged)."""
    out = {**s.__dict__, "val": s.val if isinstance(s.val, float) and s.val > 0 else None}
    if s.classes is None:  # (no classes held out: the key data staged before the setting existed had)
        del out["classes"]
    else:
        out["classes"] = s.classes if isinstance(s.classes, float) else list(s.classes)
    return out


def _key_path(value, by_bytes: bool = False):
    """A file's path as the staged data's key holds it: resolved, so ``cfg/../X.npy``, ``X.npy`` from
    another folder and a symlink name one file (one staged copy); an array name as given. With
    ``by_bytes`` (the fingerprint hashed the files' bytes) a path is only "a file": where it is no
    longer matters."""
    if isinstance(value, str) and "/" in value and os.path.exists(value):
        return "a file" if by_bytes else str(Path(value).resolve())
    return value


def _load_pairs(path: str) -> tuple:
    """User pairs (data.pairs: an npz with arrays i, j, y) as read: (i, j, y)."""
    if not str(path).endswith(".npz"):
        raise InputError(
            f"{path}: data.pairs must be an .npz file with arrays i, j, y (np.savez(path, i=..., j=..., y=...))"
        )
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in ("i", "j", "y") if k not in z.files]
            if missing:
                raise InputError(
                    f"{path}: data.pairs needs arrays i, j, y; missing {missing} (it holds {sorted(z.files)})"
                )
            i, j, y = z["i"], z["j"], z["y"]
    except InputError:
        raise
    except FileNotFoundError:
        raise InputError(
            f"{path}: file not found (data.pairs); check the path (a config's relative paths are read from its folder)"
        ) from None
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot read data.pairs: {type(e).__name__}: {e}".splitlines()[0]) from None
    return i, j, y


def _check_pairs(path: str, i, j, y, split: np.ndarray, random_split: bool) -> dict:
    """The pairs checked against the staged rows, as the staged unit stores them."""
    splits.check_pairs(i, j, y, split, f"{path} (data.pairs)", random_split)
    return {"pair_i": i.astype(np.int64), "pair_j": j.astype(np.int64), "pair_y": y.astype(np.int8)}


def run_stage(ctx: StageContext, plan: DataPlan | None = None) -> DataInfo:
    """Read the source in row-blocks, validate, normalise, write features (sample, feature) + coords."""
    plan = plan or prepare_data(ctx.config, ctx.store)
    info, src, unit = plan.info, plan.source, plan.info.unit
    if ctx.reuse(unit, "stage"):
        ctx.log(f"  stage: reusing {unit.rel}")
        return info
    budget.check_disk(ctx.store, ctx.config, stored_bytes(info), who="staging")
    t0 = time.perf_counter()
    unit.begin()
    try:
        write_template(
            unit.url,
            {
                "features": (("sample", "feature"), (info.n_samples, info.n_features), np.float32, np.nan),
                "row_key": (("sample",), (info.n_samples,), np.uint64, 0),
            },
            plan.coords,
            plan.attrs,
            info.chunk_rows,
            samples={"features": _stored_sample(src.reader, info, ctx.config.data.normalize, src.name)},
        )
        for name, values in (plan.pairs or {}).items():  # user pairs (NML), beside the rows
            create_array(f"{unit.url}/{name}", values.shape, (max(1, min(len(values), 1 << 20)),), values.dtype)[:] = (
                values
            )
        normalize = ctx.config.data.normalize
        futures = [
            ctx.submit(_stage_block, src.reader, a, b, normalize, unit.url, src.name, name="stage-block")
            for a, b in info.chunks
        ]
        done = ctx.gather(futures, "stage", [f"rows {a}..{b - 1}" for a, b in info.chunks])
        least = min(block[0] for block in done)
    except InputError:
        unit.discard()  # values refused block by block (NaN, inf, ...): no half-staged unit is left behind
        raise
    commit_timed(
        ctx,
        unit,
        t0,
        {"n_samples": info.n_samples, "n_features": info.n_features, "source": src.name, "min": list(least)},
        {k: v for block in done for k, v in block[1].items()},
    )  # [value, row, column]: learners that need x >= 0 check it
    return info


def check_nonnegative_for(cfg, info: DataInfo) -> None:
    """Refuse, right after staging, a learner that needs non-negative features (NML's chi2 kernel) on
    staged features with a negative value: found by its fit after the statistics and neighbours
    otherwise (or by its encode, for a negative test row), naming neither the file nor the row."""
    least = info.unit.meta().get("min")
    if least is None or least[0] >= 0:
        return
    for n, spec in enumerate(cfg.methods):
        if getattr(registry.estimator_class(spec["method"], spec), "requires_nonnegative", False):
            value, row, col = least
            source = info.unit.meta().get("source", "the data")
            staged = f" after data.normalize: {cfg.data.normalize}" if cfg.data.normalize != "none" else ""
            field, fix = (
                ("data.synthetic", "set data.synthetic.nonnegative: true")
                if cfg.data.source == "synthetic" and not cfg.data.path
                else ("data.path", "use non-negative descriptors (histograms, ReLU activations)")
            )
            raise InputError(
                f"{source}: {cfg.entry(n)} ({spec['method']}) needs non-negative features (its chi2 "
                f"kernel), but row {row}, column {col} is {value:g}{staged} ({field}); {fix} or drop "
                f"{spec['method']}"
            )


def stored_bytes(info) -> list:
    """What staging writes at the most (the disk rule): the features as float32 (LZ4 may store less)."""
    return [
        (
            f"the staged features ({info.n_samples:,} x {info.n_features:,} float32)",
            4.0 * stored_rows(info.n_samples, info.chunk_rows) * info.n_features,
            "",
        )
    ]


def work(info, cfg, specs: list) -> float:
    """Multiply-adds of staging (:mod:`metricpipe.tasks.madds`'s unit): each value read (decompressed),
    checked, normalised, keyed and written (compressed): about 40 passes, measured on Fashion-MNIST."""
    return madds.passes(info.n_samples * info.n_features, 40)
