"""The one place a learner is named: ``method:`` names in configs -> estimator classes.

A line says which class a method is; everything else a learner is lives on its class: its parameters,
their defaults and constraints (``__init__``, ``_parameter_constraints``), what the pipeline feeds it
(``feeds``), its selection grid, its memory, its export (:class:`~metricpipe.tasks.base.Learner`). So
a YAML config and a Python user get the same names and checks, and the pipeline asks the class.

Adding a learner: its module in ``tasks/``, one line here, its tests. A learner of another package is
registered by that package's entry point in the group ``metricpipe.learners`` (name = the method, value
= the class, e.g. ``toy = mypkg.learners:Toy``); it is then a method of configs and of :func:`make`
as the built-in ones are.
"""

import difflib
import functools
import itertools
import math
from importlib import metadata
from numbers import Real

from sklearn.utils._param_validation import InvalidParameterError

from metricpipe.tasks.base import Learner
from metricpipe.tasks.baselines import LDA, PCA, Identity, PCAWhitening, RandomProjection
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.ncmml import KNNML, NCMC, NCMML
from metricpipe.tasks.nml import NML, LinearML
from metricpipe.tasks.slem import ESVM, SLEM, KernelSLEM
from metricpipe.tasks.slne import SLDE, SLNE
from metricpipe.tasks.sparse import SparseProjector
from metricpipe.tasks.validate import whole_number

BUILTIN = {
    "identity": Identity,
    "pca": PCA,
    "pcaw": PCAWhitening,
    "lda": LDA,
    "random": RandomProjection,
    "slne": SLNE,
    "slde": SLDE,
    "sparse": SparseProjector,
    "ncmml": NCMML,
    "ncmc": NCMC,
    "knnml": KNNML,
    "nml": NML,
    "linear-ml": LinearML,
    "slem": SLEM,
    "esvm": ESVM,
}

#: A parameter whose value picks another class of the same method: {method: (parameter, {value: class})}
VARIANTS = {"slem": ("kernel", {"gaussian": KernelSLEM, "poly": KernelSLEM})}

#: The methods learned models are judged against (the report's "best baseline"): no metric learning.
BASELINES = ("identity", "pca", "pcaw", "lda", "random")
#: Raw features, the baseline a learned model has to beat to win an objective (the report's verdict).
RAW = "identity"

#: The methods a config without ``methods:`` trains: the features as they are.
DEFAULT_METHODS = ({"method": "identity"},)

PLUGINS = "metricpipe.learners"  # the entry-point group of other packages' learners


@functools.lru_cache(maxsize=1)
def methods() -> dict:
    """Every method: the built-in ones, then those other installed packages register (entry points of
    :data:`PLUGINS`; a plugin may not take a built-in name)."""
    out = dict(BUILTIN)
    for ep in metadata.entry_points(group=PLUGINS):
        if ep.name in out:
            raise InputError(
                f"the learner plugin {ep.value!r} registers method {ep.name!r}, a name metricpipe "
                f"already has; register it under another name"
            )
        try:
            cls = ep.load()
        except Exception as e:  # noqa: BLE001 - a broken plugin is named, not a traceback
            raise InputError(
                f"the learner plugin {ep.name} = {ep.value} cannot be imported: {type(e).__name__}: {e}".splitlines()[0]
            ) from None
        if not (isinstance(cls, type) and issubclass(cls, Learner)):
            raise InputError(
                f"the learner plugin {ep.name} = {ep.value} is not a metricpipe.tasks.base.Learner subclass"
            )
        out[ep.name] = cls
    return out


def __getattr__(name: str):
    if name == "METHODS":  # (read when asked, so that plugins load after their package is installed)
        return methods()
    raise AttributeError(name)


#: Every estimator class metricpipe exports.
ESTIMATORS = (
    Identity,
    PCA,
    PCAWhitening,
    LDA,
    RandomProjection,
    SLNE,
    SLDE,
    SparseProjector,
    NCMML,
    NCMC,
    KNNML,
    NML,
    LinearML,
    SLEM,
    KernelSLEM,
    ESVM,
)


def estimator_class(method: str, params: dict | None = None) -> type:
    """The class of ``method`` (``{method: slem, kernel: gaussian}`` is :class:`KernelSLEM`)."""
    known = methods()
    if method not in known:
        near = difflib.get_close_matches(str(method), known, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else f"; known methods: {', '.join(known)}"
        raise InputError(f"unknown method {method!r}{hint}")
    if method in VARIANTS:
        key, classes = VARIANTS[method]
        base = known[method]
        value = (params or {}).get(key, base().get_params()[key])
        allowed = [base().get_params()[key], *classes]
        if isinstance(value, str) and value not in allowed:
            raise InputError(
                f"The '{key}' parameter of {method} must be a str among "
                f"{{{', '.join(map(repr, allowed))}}}. Got {value!r} instead."
            )
        return classes.get(value, base)
    return known[method]


def feeds(method: str, params: dict | None = None) -> str:
    """What the pipeline hands the learner (:attr:`~metricpipe.tasks.base.Learner.feeds`)."""
    return estimator_class(method, params).feeds


def name_defaults(spec: dict) -> dict:
    """The parameters a model's name leaves out at these values: its class's defaults, with a variant
    parameter at its method's default (``kernel`` is named unless it is linear SLEM's)."""
    d = defaults(estimator_class(spec["method"], spec), spec)
    if spec["method"] in VARIANTS:
        key = VARIANTS[spec["method"]][0]
        d[key] = methods()[spec["method"]]().get_params()[key]
    return d


def defaults(cls: type, params: dict | None = None) -> dict:
    """The class's parameters with their default values; with ``params`` (an entry's), a searched
    parameter whose default is None (NCMML's lr) as the value it stands for there."""
    d = cls().get_params(deep=False)
    if params is not None:
        grid = cls.search_grid({**d, **params})
        d.update({k: v[0] for k, v in grid.items() if k in d and d[k] is None})
    return d


def model_name(spec: dict) -> str:
    """A model's short name (logs, selections, the report's labels): method, dim, then the parameters that
    differ from their defaults (:func:`name_defaults`), e.g. ``ncmml-32-lr3.0``."""
    defaults = name_defaults(spec)
    extra = "-".join(
        f"{k}{param_text(v)}"
        for k, v in sorted(params_of(spec).items())
        if k != "dim" and v is not None and (k not in defaults or v != defaults[k])
    )
    return "-".join(str(x) for x in (spec["method"], spec.get("dim") or "", extra) if x != "")


def params_of(spec: dict) -> dict:
    """The estimator parameters of a spec (without ``method`` and ``select``)."""
    return {k: v for k, v in spec.items() if k not in ("method", "select")}


def param_text(value) -> str:
    """A parameter's value as names and logs show it: a dict (SLEM's negatives) as (key=value,...) in key
    order, not Python's repr with its quotes (so a name is the same whether the spec came from a config
    or from a stored record, whose JSON sorts the keys)."""
    if isinstance(value, dict):
        return "(" + ",".join(f"{k}={param_text(v)}" for k, v in sorted(value.items())) + ")"
    return str(value)


def make(spec: dict):
    """The unfitted estimator of a config spec ``{"method": name, **params}``."""
    params = params_of(spec)
    return estimator_class(spec["method"], params)(**params)


def candidates(spec: dict) -> list[dict]:
    """The plain specs a spec's selection chooses among (its ``select.grid``, first values first);
    ``[spec]`` without ``select`` when nothing is searched."""
    plain = {k: v for k, v in spec.items() if k != "select"}
    sel = spec.get("select")
    if not sel:
        return [plain]
    grid = sel["grid"]
    return [{**plain, **dict(zip(grid, combo))} for combo in itertools.product(*grid.values())]


def _metric_ok(metric) -> bool:
    if not isinstance(metric, str):
        return False
    for prefix in ("knn", "softvote"):
        if metric.startswith(prefix):
            return metric[len(prefix) :].isdigit() and int(metric[len(prefix) :]) > 0
    return metric in ("ncm", "ncmc", "map")


def _selection(name: str, cls: type, entry: dict, select, allowed: dict) -> dict | None:
    """``select`` of a methods entry -> {"metric", "grid"} or None (nothing to choose).

    Absent or true: the class's ``search_space`` minus the parameters the entry sets (a parameter
    the user sets is never searched). False: no selection. A mapping: ``metric`` overrides the
    class's ``selection_metric``, other keys are the grid (parameter -> candidate values).
    """
    if select is False:
        return None
    if select is None or select is True:
        select = {}
    if not isinstance(select, dict):
        raise InputError(
            f"select must be true, false or a mapping such as {{metric: map, lr: [0.1, 1.0]}}; got {select!r}"
        )
    metric = select.get("metric", cls.selection_metric)
    if not _metric_ok(metric):
        raise InputError(f"select.metric {metric!r} is not a selection metric; use knnK, softvoteK, ncm, ncmc or map")
    refit = select.get("refit", True)
    if not isinstance(refit, bool):
        raise InputError(
            f"select.refit must be true (refit the chosen candidate on every train row) or false; got {refit!r}"
        )
    if metric == "ncmc" and not hasattr(cls, "kmeans"):
        raise InputError(f"select.metric ncmc needs an NCMC model (method ncmc); {name} has no class centroids")
    user_grid = {k: v for k, v in select.items() if k not in ("metric", "refit")}
    for key, values in user_grid.items():
        if key not in allowed:
            near = difflib.get_close_matches(key, allowed, n=1)
            raise InputError(
                f"select: unknown parameter {key!r} for method {name}{f'; did you mean {near[0]!r}?' if near else ''}"
            )
        if key in entry:
            raise InputError(f"select: {key!r} is both set ({entry[key]!r}) and searched; drop one of them")
        if not isinstance(values, list) or not values:
            raise InputError(f"select.{key} must be a non-empty list of candidate values, got {values!r}")
    user_grid = {k: _one_spelling(cls, allowed, k, v) for k, v in user_grid.items()}
    grid = user_grid or {k: list(v) for k, v in cls.search_grid(entry).items() if k not in entry}
    if not grid or all(len(v) == 1 for v in grid.values()):
        return None if refit else {"metric": metric, "grid": {}, "refit": False}
    return {"metric": metric, "grid": grid, **({} if refit else {"refit": False})}


def _sweeps(cls: type, key: str, value) -> bool:
    """A list value means one model per entry unless the parameter itself takes a list."""
    if not isinstance(value, list):
        return False
    return "array-like" not in cls._parameter_constraints.get(key, [])


def _counts_only(cls: type, key: str) -> bool:
    """Whether parameter ``key`` takes integers but no other numbers (an Interval of Integral only)."""
    from numbers import Integral

    kinds = [getattr(c, "type", None) for c in cls._parameter_constraints.get(key, [])]
    return Integral in kinds and not any(k is not None and k is not Integral for k in kinds)


def _whole_to_int(cls: type, key: str, value):
    """YAML's ``pairs: 1e6`` is the float 1000000.0: the count it means for a count parameter."""
    if not _counts_only(cls, key):
        return value
    if isinstance(value, list):
        return [_whole_to_int(cls, key, v) for v in value]
    return whole_number(value)


def _canonical(key: str, default, value):
    """One spelling per model, so that its key does not depend on how the user wrote the value: 30 for a
    float parameter is 30.0, and random_state: 0 is the default None (both seed 0, :func:`seed_of`)."""
    if isinstance(value, list):
        return [_canonical(key, default, v) for v in value]
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if key == "random_state" and default is None and type(value) is int and value == 0:
        return None
    return value


def _one_spelling(cls: type, allowed: dict, key: str, value):
    """Parameter ``key``'s value as one spelling: a whole float for a count is the int, and see
    :func:`_canonical` (``allowed``: the class's parameters and their defaults)."""
    default = allowed.get(key)
    if default is None and any(getattr(c, "type", None) is Real for c in cls._parameter_constraints.get(key, [])):
        default = 0.0  # a real parameter left None by default (NCMML's lr): 30 is 30.0 all the same
    return _canonical(key, default, _whole_to_int(cls, key, value))


# Models one config may train: a sweep beyond it is refused before anything is expanded.
MAX_MODELS = 1000


def expand_method(entry: dict) -> list[dict]:
    """Check one ``methods:`` entry and expand its swept parameters (list values) into one spec per
    model: ``{"method": name, **params}`` with every parameter of the class filled in, plus
    ``select: {metric, grid}`` when parameters are left to the validation split (:func:`_selection`).

    Unknown keys and bad values are refused with scikit-learn's wording ("The 'dim' parameter of
    NCMML must be an int in the range [1, inf). Got 0 instead."), all of an entry's in one
    InputError, a line each: every unknown key, every bad value of every parameter, ``select``'s.
    """
    name = entry.get("method")
    raw = {k: v for k, v in entry.items() if k not in ("method", "select")}
    kernels = raw.get("kernel", "linear") if name == "slem" else None
    out, problems = [], []
    for kernel in kernels if isinstance(kernels, list) else [kernels]:
        params = dict(raw, **({"kernel": kernel} if kernel is not None and "kernel" in raw else {}))
        cls = estimator_class(name, params)
        allowed = defaults(cls)
        found = _entry_problems(name, cls, allowed, params, entry.get("select"))
        problems += [p for p in found if p not in problems]
        if not found:
            params = {k: _one_spelling(cls, allowed, k, v) for k, v in params.items()}
            out += _expanded_specs(name, cls, allowed, params, entry.get("select"), problems)
    if problems:
        raise InputError("\n".join(problems))
    return out


def _unknown_key(name: str, key: str, allowed: dict) -> str:
    """Why ``key`` is not a parameter of method ``name`` (its near name, or the parameters it takes)."""
    if key == "lambda" and "lam" in allowed:
        return (
            f"unknown parameter 'lambda' for method {name}; it is called 'lam' (Python "
            f"reserves the word lambda, and configs use the Python names)"
        )
    if key == "seed" and "random_state" in allowed:
        return f"unknown parameter 'seed' for method {name}; it is called 'random_state', as in scikit-learn"
    near = difflib.get_close_matches(key, allowed, n=1)
    hint = f"; did you mean {near[0]!r}?" if near else f"; {name} takes {', '.join(allowed) or 'no parameters'}"
    return f"unknown parameter {key!r} for method {name}{hint}"


def _entry_problems(name: str, cls: type, allowed: dict, params: dict, select) -> list[str]:
    """Every problem of an entry, a line each: each unknown key, each bad value of each parameter
    (checked alone by the class: :meth:`~metricpipe.tasks.base.Learner.check_parameter`),
    ``select``'s first."""
    problems = [_unknown_key(name, key, allowed) for key in params if key not in allowed]
    first = {}
    for key, value in params.items():
        if key not in allowed:
            continue
        value = _one_spelling(cls, allowed, key, value)
        if _sweeps(cls, key, value) and not value:
            problems.append(f"The '{key}' parameter of {name} must not be an empty list.")
        for v in value if _sweeps(cls, key, value) else [value]:
            try:
                cls.check_parameter(key, v)
            except InvalidParameterError as e:
                msg = str(e).splitlines()[0]
                problems += [] if msg in problems else [msg]
        first[key] = value[0] if _sweeps(cls, key, value) and value else value
    try:
        _selection(name, cls, first, select, allowed)
    except InputError as e:
        problems.append(str(e))
    return problems


def _expanded_specs(name: str, cls: type, allowed: dict, params: dict, select, problems: list) -> list[dict]:
    """The specs of an entry whose parameters each passed their checks: one per combination of the
    swept values; a combination (or a selection candidate) the class refuses adds to ``problems``."""
    grids = {}
    for key, default in allowed.items():
        v = params.get(key, default)
        grids[key] = v if _sweeps(cls, key, v) else [v]
    n_models = math.prod(len(g) for g in grids.values())
    if n_models > MAX_MODELS:  # refuse before expanding (a 1.7 KB sweep made 1.7M models)
        sizes = " x ".join(f"{len(g)} {k}" for k, g in grids.items() if len(g) > 1)
        raise InputError(
            f"method {name} sweeps {sizes} = {n_models:,} models, over the limit of {MAX_MODELS:,} "
            f"per config; sweep fewer values, or split the sweep over several configs"
        )
    out = []
    for combo in itertools.product(*grids.values()):
        spec = {"method": name, **dict(zip(grids, combo))}
        # what is searched can depend on a swept value (a dense sparse projector has no anneal to
        # search): each model's own selection, from the entry with its values in place of the lists
        sel = _selection(name, cls, {k: spec[k] for k in params}, select, allowed)
        # a parameter left None (NCMML's lr) stays None unless the selection searches it: the learner
        # then starts at its grid's first value and backs off after a divergence, in the pipeline as
        # in memory (filled in, select: false trained at a fixed rate: k-NN ML's 0.1 diverged at
        # 4,096-d and stopped the run); a selection's candidates try their stated rates
        if sel:
            spec.update({k: v[0] for k, v in sel["grid"].items()}, select=sel)
        for cand in candidates(spec):
            try:
                make(cand)._validate_params()  # the class's own checks: the same for YAML and Python
            except (InvalidParameterError, InputError) as e:
                msg = str(e).splitlines()[0]
                problems += [] if msg in problems else [msg]
        out.append(spec)
    return out
