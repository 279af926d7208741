"""Validators for user data: each raises InputError with a one-line message naming the fix."""

import numbers
import re

import numpy as np

from metricpipe.tasks.errors import InputError


def whole_number(v):
    """A float that is a whole number (YAML's 1e6) as the int it means; anything else as it is."""
    return int(v) if isinstance(v, float) and v.is_integer() and abs(v) < 2**53 else v


def check_feature_block(X: np.ndarray, start: int, where: str) -> None:
    """Check a block of rows ``start:start+len(X)`` is 2-D, numeric and finite."""
    if X.ndim != 2:
        raise InputError(
            f"{where}: features must be a 2-D (sample, feature) array; got {X.ndim}-D "
            f"shape {X.shape}; reshape to (n_samples, n_features)"
        )
    if not (np.issubdtype(X.dtype, np.number) or X.dtype == np.bool_):
        raise InputError(f"{where}: features must be numeric; got dtype {X.dtype}; convert to float32")
    if X.dtype.kind == "c":
        raise InputError(
            f"{where}: features must be real numbers; got dtype {X.dtype}; take the magnitude "
            f"or split real and imaginary parts into columns"
        )
    if not np.issubdtype(X.dtype, np.floating):
        return
    if not all_finite(X):
        bad = ~np.isfinite(X)
        r, c = np.argwhere(bad)[0]
        raise InputError(
            f"{where}: features contain {int(bad.sum())} non-finite value(s) (NaN or inf) "
            f"in rows {start}..{start + len(X) - 1}, first at row {start + r}, column {c}; "
            f"clean or impute them in the input file"
        )
    check_float32_range(
        X, start, where, "features are stored as float32: rescale them (e.g. divide by a constant or take logs)"
    )


def all_finite(X: np.ndarray) -> bool:
    """Whether every value of float array X is finite, with no temporary of X's size (two bool arrays
    of a 64 MB block are page-faulted in afresh in a Dask worker): min and max propagate NaN and an
    infinity is the least or the greatest value."""
    return X.size == 0 or bool(np.isfinite(np.min(X)) and np.isfinite(np.max(X)))


def check_float32_range(X: np.ndarray, start: int, where: str, fix: str) -> None:
    """A finite float64 beyond float32's range would become inf where it is stored or computed as float32."""
    if X.dtype.itemsize <= 4 or not X.size:
        return
    big = np.abs(X) > np.finfo(np.float32).max
    if big.any():
        r, c = np.argwhere(big)[0] if X.ndim == 2 else (np.flatnonzero(big)[0], 0)
        raise InputError(
            f"{where}: features hold {int(big.sum())} value(s) beyond float32's range (+-3.4e38), "
            f"first {X[big][0]:.3g} at row {start + r}, column {c}; {fix}"
        )


def assume_finite() -> bool:
    """Whether scikit-learn's ``assume_finite`` is set (the pipeline sets it: it checked the data when staging)."""
    import sklearn  # deferred: the validators load without scikit-learn

    return bool(sklearn.get_config()["assume_finite"])


def check_finite_float32(X, where: str = "X") -> None:
    """Finite, and within float32's range: codes are float32 and several learners compute in it, so a
    finite float64 value beyond its range would come out as inf or NaN codes (the command line
    refuses such files when it stages them). One line naming the first bad row and column."""
    X = np.asarray(X)
    if np.issubdtype(X.dtype, np.floating) and not assume_finite():
        bad = ~np.isfinite(X)
        if bad.any():
            r, c = np.argwhere(bad)[0] if X.ndim == 2 else (np.flatnonzero(bad)[0], 0)
            raise InputError(
                f"{where}: Input contains {int(bad.sum())} non-finite value(s) (NaN or inf), first "
                f"{X[r, c] if X.ndim == 2 else X.flat[r]} at row {r}, column {c}; drop or impute those "
                f"rows (e.g. sklearn.impute.SimpleImputer in a Pipeline before this step)"
            )
        check_float32_range(X, 0, where, "metricpipe computes in float32: scale the features")


def beyond_float32(A: np.ndarray) -> bool:
    """Whether A holds a value that is not finite or that float32 cannot hold (a diverging SGD
    iterate: the model is stored, and its codes computed, in float32)."""
    return not np.all(np.isfinite(A)) or float(np.abs(A).max(initial=0.0)) > float(np.finfo(np.float32).max)


def check_normalized_block(X: np.ndarray, start: int, normalize: str, where: str) -> None:
    """Check a block after normalisation is still finite (an l1 norm of huge values can overflow)."""
    if all_finite(X):
        return
    bad = ~np.isfinite(X)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise InputError(
            f"{where}: normalize: {normalize} overflows float32 at row {start + r}, column {c}; "
            f"rescale the features (e.g. divide by a constant) or use normalize: l2"
        )


def as_integer_labels(y: np.ndarray, where: str, what: str = "labels") -> np.ndarray:
    """Float labels as int64 when every one is an exact integer (below 2^53, where floats hold integers
    exactly); anything else is refused: casting would merge classes (1e19 and 2e19 overflow alike)."""
    y = np.asarray(y)
    bad = ~np.isfinite(y) | (y != np.round(y))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(
            f"{where}: {what} must be integers or strings; got {int(bad.sum())} non-integral {y.dtype} "
            f"value(s), first {y[i].item()!r} at row {i}; store {'class labels' if what == 'labels' else what} "
            f"as integers or strings"
        )
    big = np.abs(y) >= 2.0**53
    if big.any():
        i = int(np.flatnonzero(big)[0])
        raise InputError(
            f"{where}: {y.dtype} labels beyond 2^53 are not exact integers (first {y[i]:.6g} at row "
            f"{i}: classes would merge); store class labels as int64 or strings"
        )
    return y.astype(np.int64)


def label_values(y, where: str) -> np.ndarray:
    """Labels as values: int64 for integers, booleans and float labels that are exact integers; str
    otherwise (so 3, 3.0 and np.int8(3) are one class, and "3" another)."""
    y = np.asarray(y)
    if np.issubdtype(y.dtype, np.floating):
        return as_integer_labels(y, where)
    if np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_:
        return y.astype(np.int64)
    return y.astype(str)


def encode_labels(y: np.ndarray, n_samples: int, where: str, what: str = "labels") -> tuple[np.ndarray, list]:
    """Check labels (or other per-row keys, ``what``: "groups") and return (codes int32 in 0..C-1,
    class names)."""
    y = np.asarray(y)
    one = what[:-1] if what.endswith("s") else what
    if y.ndim != 1:
        y = y.reshape(-1) if y.ndim == 2 and 1 in y.shape else y
    if y.ndim != 1:
        raise InputError(f"{where}: {what} must be a 1-D array; got shape {y.shape}")
    if len(y) != n_samples:
        raise InputError(
            f"{where}: {what} have length {len(y)} but features have {n_samples} rows; give one {one} per feature row"
        )
    if np.issubdtype(y.dtype, np.floating):
        y = as_integer_labels(y, where, what)
    elif not (np.issubdtype(y.dtype, np.integer) or y.dtype.kind in "USO"):
        raise InputError(f"{where}: {what} must be integers or strings; got dtype {y.dtype}")
    if y.dtype.kind == "O":
        y = y.astype(str)
    classes, codes = np.unique(y, return_inverse=True)
    names = [c.item() if hasattr(c, "item") else c for c in classes]
    if len(names) < 2:
        raise InputError(
            f"{where}: labels hold only one class ({names[0]!r}); supervised learning needs at least two classes"
        )
    return codes.astype(np.int32), names


def check_split(
    codes: np.ndarray, split: np.ndarray, split_names: tuple, classes: list, where: str, given: bool = False
) -> None:
    """Check the train and test splits are non-empty and every class has >= 2 train members (``given``:
    the split came with the data, a column, rather than from data.split.test)."""
    train = split == split_names.index("train")
    test = split == split_names.index("test")
    if not train.any():
        raise InputError(
            f"{where}: the train split is empty; "
            + ("mark some samples 'train' in its split column" if given else "lower data.split.test")
        )
    if not test.any():
        raise InputError(
            f"{where}: the test split is empty; "
            + ("mark some samples 'test' in its split column" if given else "raise data.split.test")
        )
    counts = np.bincount(codes[train], minlength=len(classes))
    small = np.flatnonzero(counts < 2)
    if len(small):
        names = ", ".join(repr(classes[c]) for c in small[:5])
        raise InputError(
            f"{where}: class(es) {names} have fewer than two training samples "
            f"({int(counts[small[0]])}); give every class at least two, or drop those classes"
        )


_NUMBER = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*")  # a decimal literal: not "1_0", "nan", "inf"


def _number(v, who: str):
    """A number as an exact key: integral values as int (so 3, 3.0 and np.int64(3) are one key); a
    float of 2^53 or more holds no exact integer, so it cannot name one label."""
    if isinstance(v, (bool, np.bool_, numbers.Integral)):
        return int(v)
    f = float(v)
    if abs(f) >= 2.0**53 and np.isfinite(f):
        raise InputError(
            f"{who} lists {v!r}, a number beyond 2^53 written as a float, which names no label exactly; "
            f"write it as an integer"
        )
    return int(f) if f.is_integer() else f


def _label_keys(v, numeric: bool, who: str) -> list:
    """What ``v`` may name, in order, among labels that are numbers (``numeric``) or text: numbers
    compare by value (3, 3.0, np.int64(3), and "3" or "03" where the labels are numbers); text labels
    compare as text, a number naming the text of its value ("2.0" for 2.0, else "2"; "5" for 5, never
    "05"; YAML reads unquoted 2.0 as a number)."""
    if isinstance(v, (bool, np.bool_, numbers.Number)) and not isinstance(v, complex):
        if numeric:
            return [_number(v, who)]
        if isinstance(v, (bool, np.bool_, numbers.Integral)):
            return [str(v)]
        return [str(float(v))] + ([str(int(v))] if float(v).is_integer() else [])
    v = str(v)
    if numeric and _NUMBER.fullmatch(v):
        v = v.strip()
        return [int(v) if v.lstrip("+-").isdigit() else _number(v, who)]
    return [v]


def class_codes(classes, labels, who: str = "classes") -> np.ndarray:
    """Sorted positions in ``labels`` (class labels in code order, all numbers or all text) of the
    labels ``classes`` lists (:func:`_label_keys`); one InputError line naming those that are not labels."""
    labels = list(labels)
    numeric = all(isinstance(v, (bool, np.bool_, numbers.Number)) for v in labels)
    code = {_label_keys(v, numeric, "the data's labels")[0]: i for i, v in enumerate(labels)}
    found = {}
    for v in classes:
        hit = next((code[k] for k in _label_keys(v, numeric, who) if k in code), None)
        found[repr(v)] = (v, hit)
    missing = [v for v, hit in found.values() if hit is None]
    if missing:
        shown = ", ".join(str(v) for v in labels[:5]) + (", ..." if len(labels) > 5 else "")
        raise InputError(
            f"{who} lists {missing[:5]}, which {'is' if len(missing) == 1 else 'are'} not among the "
            f"class labels ({shown}); list labels as the data holds them"
            + ("" if numeric else " (quote text labels in YAML: '2.0')")
        )
    return np.array(sorted({hit for _, hit in found.values()}), np.int64)


def check_pair_indices(i, j, y, n_rows: int, where: str) -> None:
    """Pairs given by the user: integer row indices in 0..n_rows-1 of one equal length, y in {-1, +1}."""
    i, j, y = np.asarray(i), np.asarray(j), np.asarray(y)
    if not (len(i) == len(j) == len(y)) or len(i) == 0:
        raise InputError(
            f"{where}: pairs need arrays i, j, y of one equal, non-zero length; got {len(i)}, {len(j)}, {len(y)}"
        )
    for name, a in (("i", i), ("j", j)):
        if not np.issubdtype(a.dtype, np.integer):
            raise InputError(f"{where}: pairs '{name}' must hold integer row indices; got {a.dtype}")
        bad = (a < 0) | (a >= n_rows)
        if bad.any():
            raise InputError(
                f"{where}: pair index {name}={int(a[bad][0])} is out of range 0..{n_rows - 1} "
                f"(pair {int(np.flatnonzero(bad)[0])}); fix or drop it"
            )
    if not np.isin(y, (-1, 1)).all():
        raise InputError(
            f"{where}: pair labels y must be +1 (similar) or -1 (dissimilar); got "
            f"{sorted(set(np.unique(y).tolist()) - {-1, 1})[:3]}"
        )
