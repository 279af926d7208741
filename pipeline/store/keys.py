"""What names a unit: keys hashed from everything a result depends on, the release that made it, the
JSON the store writes, and the store's own names (kinds of units, the marker's suffix, the layout)."""

import functools
import hashlib
import json

import numpy as np

from metricpipe import __version__

MARKER_SUFFIX = ".committed.json"
REPLACED = ".replaced"  # STORE/.replaced/KIND/KEY: committed units a run is recomputing (Unit.begin)
# every kind of unit a run writes (shuffled: the SGD learners' copy of the training rows; selection: the
# validation scores of a spec's candidates and its choice; pq: an encoded database, encode.pq)
KINDS = ("data", "statistics", "neighbours", "shuffled", "models", "selection", "codes", "pq", "evaluation")
# what the store itself names below its folder (units are under KINDS): checked for links on opening
LAYOUT = {
    ".lock": (),
    REPLACED: (),
    "runs": ("latest.json", "forcing.json"),
    "report": ("metrics.json", "index.html"),
    "logs": (),
}


def is_key(name: str) -> bool:
    """Whether ``name`` is a unit key as :func:`hash_key` makes them (16 lower-case hex digits)."""
    return len(name) == 16 and all(c in "0123456789abcdef" for c in name)


# The libraries whose arithmetic is in a unit's numbers (BLAS and LAPACK come with numpy's and scipy's
# wheels; numba compiles the sparse kernel; faiss searches IVF graphs): their release (major.minor)
# is part of the code that made a result, as metricpipe's own is.
NUMERIC_LIBRARIES = ("numpy", "scipy", "scikit-learn", "numba", "faiss-cpu")


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """What made a result: metricpipe's release and its numerical libraries' major.minor releases,
    e.g. ``0.3.8 numpy-2.2 scipy-1.15 scikit-learn-1.7 numba-0.62 faiss-cpu-1.12``."""
    from importlib import metadata

    parts = [__version__]
    for name in NUMERIC_LIBRARIES:
        try:
            parts.append(f"{name}-{'.'.join(metadata.version(name).split('.')[:2])}")
        except metadata.PackageNotFoundError:
            parts.append(f"{name}-none")
    return " ".join(parts)


def hash_key(inputs: dict, version: str | None = None) -> str:
    """A short, stable key of a JSON-able description of a result's inputs and of the code that made
    it (:func:`code_version`: a result of another release, or made with another numpy, scipy, ... is
    never reused; bump ``version`` in pyproject.toml and ``metricpipe.__version__`` when a stage's
    output changes). ``version``: another :func:`code_version`'s key for the same inputs (the units it
    made, e.g. a model's codes)."""
    blob = json.dumps({"v": version or code_version(), **inputs}, sort_keys=True, default=_json_default)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


def to_json(obj) -> str:
    return json.dumps(obj, indent=1, sort_keys=True, default=_json_default)


def record_digest(meta: dict) -> str:
    """The digest a commit marker holds of its own fields (all but ``record``): the marker's metadata
    (a model's class names, its parameters) is checked as its files are, so an edited or bit-flipped
    record is a damaged unit, not a model that predicts other labels."""
    body = json.dumps({k: v for k, v in meta.items() if k != "record"}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def json_number(value) -> float | None:
    """``value`` as a finite float, or None when it is not a finite number (JSON's 1e400 is inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if np.isfinite(value) else None
