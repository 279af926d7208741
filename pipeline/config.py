"""Run configuration: YAML in, frozen dataclasses out, every key checked before any work starts."""
import json
import math
import re
import difflib
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from metricpipe.tasks.errors import InputError
from metricpipe.tasks.normalize import NORMALIZATIONS
from metricpipe.tasks.validate import whole_number
from metricpipe.tasks.registry import MAX_MODELS, expand_method
from metricpipe.tasks.slem import check_negatives

BUILTINS = ("digits", "fashion-mnist", "synthetic")
# What only a file has, with the values that say nothing: a built-in source would silently ignore any
# other (a groups: the user believes is scored), so configs and command lines refuse them alike.
FILE_ONLY = {"features": ("X",), "labels": ("y",), "groups": (), "ids": (), "pairs": ()}


def file_only_given(values: dict) -> str | None:
    """The first of ``values``'s FILE_ONLY keys set to something a built-in source would ignore."""
    for key, quiet in FILE_ONLY.items():
        if values.get(key) is not None and values[key] not in quiet:
            return key
    return None


from metricpipe.tasks.splits import SPLIT_NAMES, USER_SPLITS  # noqa: E402,F401 - code = position; stored as int8


@dataclass(frozen=True)
class SplitConfig:
    test: float | None = 0.2
    val: float | str = "auto"   # a fraction, or auto: a stratified share of train (stages.data.auto_val_size)
    seed: int = 0
    column: str | None = None
    classes: float | tuple | None = None   # held-out classes: a fraction drawn with seed, or their labels


@dataclass(frozen=True)
class SyntheticConfig:
    samples: int = 20000
    dim: int = 128
    classes: int = 10
    seed: int = 0
    separation: float = 1.0
    nonnegative: bool = False
    nuisance: float = 1.7


@dataclass(frozen=True)
class DataConfig:
    source: str | None = None
    path: str | None = None
    root: str | None = None
    features: str = "X"
    labels: str = "y"
    groups: str | None = None
    ids: str | None = None
    normalize: str = "none"
    split: SplitConfig = SplitConfig()
    chunk_mb: float = 64.0
    synthetic: SyntheticConfig = SyntheticConfig()
    pairs: str | None = None   # npz of similar/dissimilar pairs (arrays i, j, y) for NML / linear ML
    verify_source: bool = False   # key the source files (and pairs) by their bytes, not paths, sizes and mtimes


@dataclass(frozen=True)
class StatisticsConfig:
    max_dense_dim: int = 8192  # above this, PCA is randomized and LDA / linear SLEM are refused
    components: int = 256      # components kept by the randomized method


@dataclass(frozen=True)
class NeighboursConfig:
    k: int = 50
    method: str = "auto"        # exact | ivf | auto (exact up to EXACT_MAX_TRAIN train rows, else ivf)
    nlist: int | None = None    # IVF lists (None: about 2 sqrt(n_train), see pipeline/ivf.py)
    nprobe: int = 16            # lists searched per query
    rerank: int = 4             # a PQ index returns rerank x k candidates, re-scored exactly (1: off)
    queries: int | None = None  # a seeded, class-stratified sample of train rows gets a neighbourhood
                                # (all rows when None); SL-NE/SL-DE then train on it and its neighbours


@dataclass(frozen=True)
class EvaluateConfig:
    retrieval_k: tuple = (1, 10, 100)
    classifiers: tuple = ("knn1", "knn10", "ncm")
    retrieval: bool = True
    queries: int | None = None   # a seeded sample of this many test images query the whole test set
    classify_queries: int | None = None   # a seeded, class-stratified sample of test images classified


@dataclass(frozen=True)
class RunConfig:
    store: str = "runs/metricpipe"
    cluster: str = "local"
    workers: int = 2
    threads_per_worker: int = 1
    memory_limit: str = "auto"
    dashboard: str | None = ":8787"
    # seconds a run waits on the cluster before stopping with one line: for a first worker to join a
    # scheduler, for a worker while it has none (all killed mid-run); a scheduler's answer, at most 10 s
    wait_timeout: float = 60.0
    data: DataConfig = DataConfig()
    methods: tuple = ()            # expanded model specs: dicts {"method", "dim", ...params}
    method_entries: tuple = ()     # the index in the config's methods list of each expanded spec
    statistics: StatisticsConfig = StatisticsConfig()
    neighbours: NeighboursConfig | None = None
    evaluate: EvaluateConfig = EvaluateConfig()
    seed: int = 0
    repeats: int = 1               # every learned model trained with this many seeds (and borrowed validation rows)
    objective: str | None = None   # evaluate.objective: the objective the closing line reports (None: both); the
                                   # report's only, so not in EvaluateConfig (whose fields key the evaluation)
    tls: tuple | None = None       # (ca_file, cert, key) for a tls:// scheduler
    source_file: str = "<config>"
    raw: dict = field(default_factory=dict, compare=False)
    overridden: frozenset = frozenset()   # settings given on the command line (--memory-limit, ...), not the file

    def entry(self, n: int) -> str:
        """``methods[i]``: the user's config entry that expanded spec ``n`` came from (a sweep expands one
        entry into several specs)."""
        return f"methods[{self.method_entries[n] if n < len(self.method_entries) else n}]"

    def with_overrides(self, **kw) -> "RunConfig":
        return replace(self, **{k: v for k, v in kw.items() if v is not None})

    def from_command_line(self, **kw) -> "RunConfig":
        """:meth:`with_overrides` for settings the user gave as options, so messages name the option."""
        given = {k: v for k, v in kw.items() if v is not None}
        return replace(self, **given, overridden=self.overridden | frozenset(given))

    def setting(self, name: str) -> str:
        """How the user gave setting ``name``: ``--memory-limit`` from the command line, else ``memory_limit``."""
        return f"--{name.replace('_', '-')}" if name in self.overridden else name

    def __post_init__(self):
        check_local_memory(self)


class ConfigError(InputError):
    pass


def _fail(where: str, key: str, msg: str):
    raise ConfigError(f"{where}: {key}: {msg}")


def _check_negatives(neg: dict | None, where: str, key: str) -> dict:
    """SLEM's negative pool, defaults filled in: a split of the data other than test (the evaluation
    images), count >= 2 or null, seed >= 0."""
    try:
        neg = check_negatives(neg)
    except InputError as e:
        _fail(where, key, str(e))
    if neg["split"] not in USER_SPLITS:
        _fail(where, f"{key}.split", f"must name the split of the negative images, one of "
              f"{', '.join(n for n in USER_SPLITS if n != 'test')} (never test: those are the queries); "
              f"got {neg['split']!r}")
    return neg


def unserved(spec: dict, classifier: str) -> str | None:
    """Why the model of ``spec`` cannot serve ``classifier`` (None: it can). Kernel SLEM codes are
    compared by Eq. 16 only, which no vector-space classifier (ncm, ncmc, softvote) can use."""
    if spec["method"] == "slem" and spec.get("kernel", "linear") != "linear" and not classifier.startswith("knn"):
        return (f"kernel SLEM ({spec['kernel']}) compares images by Eq. 16 only; {classifier} needs codes in a "
                f"vector space")
    return None


def classifiers_given(raw: dict) -> bool:
    """Whether the config lists evaluate.classification.classifiers, or turns classification off (else
    they are the defaults, which a model that cannot serve one skips; a classifier the user lists is
    refused instead)."""
    ev = (raw or {}).get("evaluate")
    cls = ev.get("classification") if isinstance(ev, dict) else None
    return cls is False or "classifiers" in (cls if isinstance(cls, dict) else {})


def _check_kernel_slem(methods: list, evaluate, where: str, given: bool) -> None:
    """Kernel SLEM combinations refused before any work: a Cholesky factor is always full rank, and a
    classifier the user lists must be one its codes can serve (``unserved``)."""
    for spec in methods:
        if spec["method"] != "slem" or spec["kernel"] == "linear":
            continue
        if spec["decomposition"] == "cholesky" and spec["rank"] != "full":
            _fail(where, "methods", f"slem decomposition cholesky is full rank, but rank is {spec['rank']}; use "
                  f"decomposition kpca or icd for a low rank, or rank full")
        odd = [c for c in evaluate.classifiers if unserved(spec, c)] if given else []
        if odd:
            _fail(where, "evaluate.classification.classifiers", f"{', '.join(odd)} need codes in a vector space; "
                  f"kernel SLEM ({spec['kernel']}) compares images by Eq. 16 only: use knnK classifiers or retrieval "
                  f"(or leave classifiers unset: the defaults skip what a model cannot serve)")


def _check_keys(d: dict, allowed, where: str, prefix: str):
    if not isinstance(d, dict):
        _fail(where, prefix.rstrip(".") or "config", f"expected a mapping, got {type(d).__name__} {d!r}")
    for key in d:
        if key not in allowed:
            near = difflib.get_close_matches(str(key), list(allowed), n=1)
            hint = f"did you mean '{prefix}{near[0]}'?" if near else f"allowed keys: {', '.join(allowed)}"
            _fail(where, f"{prefix}{key}", f"unknown key; {hint}")


def _typed(d: dict, key: str, kind, where: str, prefix: str, default=None, minimum=None, maximum=None,
           choices=None):
    if key not in d or d[key] is None:
        return default
    v = d[key]
    name = f"{prefix}{key}"
    if kind is float and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    v = whole_number(v) if kind is int else v
    if kind is int and isinstance(v, bool) or not isinstance(v, kind):
        _fail(where, name, f"expected {getattr(kind, '__name__', kind)}, got {v!r}")
    if kind is str:
        check_no_nul(v, f"{where}: {name}")
    if kind is float and not math.isfinite(v):
        _fail(where, name, f"expected a finite number, got {v!r}")
    if minimum is not None and v < minimum:
        _fail(where, name, f"must be >= {minimum}, got {v!r}")
    if maximum is not None and v > maximum:
        _fail(where, name, f"must be <= {maximum}, got {v!r}")
    if choices is not None and v not in choices:
        _fail(where, name, f"must be one of {', '.join(map(str, choices))}, got {v!r}")
    return v


def _val_fraction(split_raw: dict, where: str):
    v = split_raw.get("val", "auto")
    if v == "auto":
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v < 1.0:
        _fail(where, "data.split.val", f"expected auto or a fraction in [0, 1), got {v!r}")
    return float(v)


def _held_out_classes(split_raw: dict, where: str):
    """data.split.classes: a fraction in (0, 1) of the classes, or a list of labels (checked against the
    data's labels when it is staged)."""
    v = split_raw.get("classes")
    if v is None:
        return None
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if not (math.isfinite(v) and 0.0 < v < 1.0):
            _fail(where, "data.split.classes", f"a fraction of the classes to hold out must be in (0, 1), got {v!r}; "
                  f"or give a list of class labels")
        return float(v)
    if not isinstance(v, list) or not v or not all(isinstance(c, (int, float, str)) and not isinstance(c, bool)
                                                   for c in v):
        _fail(where, "data.split.classes", f"expected a fraction in (0, 1) of the classes or a list of class labels "
              f"to hold out, got {v!r}")
    return tuple(v)


def _int_list(d, key, where, prefix, default, minimum=1):
    if key not in d:
        return default
    v = d[key]
    v = [whole_number(x) for x in v] if isinstance(v, list) else [whole_number(v)]
    if not v or not all(isinstance(x, int) and not isinstance(x, bool) and x >= minimum for x in v):
        _fail(where, prefix + key, f"expected integers >= {minimum} (one or a list), got {d[key]!r}")
    return tuple(v)


def absolute_path(p: str | None, base_dir: Path | None = None) -> str | None:
    """``p`` as workers open it: ``~`` expanded and, when relative, read against ``base_dir`` (a
    config's folder; default the working directory), since a worker runs in a folder of its own,
    perhaps on another machine. URLs (s3://...) and None are returned as they are."""
    if p is None or "://" in p:
        return p
    q = Path(os.path.expanduser(p))
    return str(q if q.is_absolute() else (base_dir or Path.cwd()) / q)


def parse_config(raw: dict, where: str = "<config>", base_dir: Path | None = None) -> RunConfig:
    """Validate a config mapping and return a RunConfig; raises ConfigError naming the key. Relative
    paths in ``raw`` resolve against ``base_dir`` (the config file's folder; None: left as given)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: a config is a YAML mapping (key: value lines), got a {type(raw).__name__}; "
                          f"see examples/ for the form")
    _check_keys(raw, ["store", "cluster", "tls", "workers", "threads_per_worker", "memory_limit", "dashboard",
                      "wait_timeout", "data", "methods", "statistics", "neighbours", "evaluate", "seed", "repeats"],
                where, "")
    data = raw.get("data")
    if data is None:
        _fail(where, "data", "missing; give data.source (digits | fashion-mnist | synthetic) or data.path")
    for key, section in [("data", data)] + [(k, raw[k]) for k in ("statistics", "neighbours", "evaluate")
                                            if raw.get(k) not in (None, False)]:
        if not isinstance(section, dict):
            _fail(where, key, f"expected a mapping (key: value), got {section!r}")
    _check_keys(data, ["source", "path", "root", "features", "labels", "groups", "ids", "normalize", "split",
                       "chunk_mb", "synthetic", "pairs", "verify_source"], where, "data.")
    source = _typed(data, "source", str, where, "data.", choices=BUILTINS)
    path = _typed(data, "path", str, where, "data.")
    if (source is None) == (path is None):
        _fail(where, "data", "give exactly one of data.source (digits | fashion-mnist | synthetic) and data.path")
    key = source and file_only_given(data)
    if key:
        _fail(where, f"data.{key}", f"names an array or column of a data.path file; data.source: {source} has "
                                    f"its own (remove it, or stage your file with data.path)")
    if data.get("synthetic") is not None and source != "synthetic":
        _fail(where, "data.synthetic", "is read only with data.source: synthetic; remove it or set that source")
    if data.get("root") is not None and source != "fashion-mnist":
        _fail(where, "data.root", "is read only with data.source: fashion-mnist (the folder of its IDX files); "
                                  "remove it")

    def resolve(p):
        return p if base_dir is None else absolute_path(p, base_dir)

    split_raw = data.get("split", {}) or {}
    _check_keys(split_raw, ["test", "val", "seed", "column", "classes"], where, "data.split.")
    column = _typed(split_raw, "column", str, where, "data.split.")
    split = SplitConfig(
        test=None if column else _typed(split_raw, "test", float, where, "data.split.", 0.2),   # (0, 1): below
        val=_val_fraction(split_raw, where),
        seed=_typed(split_raw, "seed", int, where, "data.split.", 0, 0),
        column=column,
        classes=_held_out_classes(split_raw, where),
    )
    if column and "test" in split_raw:
        _fail(where, "data.split", "give either column or a test fraction, not both")
    if column and split.val not in ("auto", 0.0):
        _fail(where, "data.split.val", "with data.split.column the val rows are the column's 'val' rows (or, when it "
              "has none, a stratified share of its train rows: val: auto); use auto or 0")
    if split.test is not None and not 0.0 < split.test < 1.0:   # both splits need rows
        _fail(where, "data.split.test", f"must be a share in (0, 1) of the rows (the test split), got {split.test}")
    if split.test is not None and split.val != "auto" and not 0.0 < split.test + split.val < 1.0:
        _fail(where, "data.split", f"test + val must be below 1, so that train rows remain; got {split.test} + "
              f"{split.val}; lower val or test")
    syn_raw = data.get("synthetic", {}) or {}
    _check_keys(syn_raw, ["samples", "dim", "classes", "seed", "separation", "nonnegative", "nuisance"], where,
                "data.synthetic.")
    synthetic = SyntheticConfig(
        samples=_typed(syn_raw, "samples", int, where, "data.synthetic.", 20000, 4),
        dim=_typed(syn_raw, "dim", int, where, "data.synthetic.", 128, 1),
        classes=_typed(syn_raw, "classes", int, where, "data.synthetic.", 10, 2),
        seed=_typed(syn_raw, "seed", int, where, "data.synthetic.", 0, 0),
        separation=_typed(syn_raw, "separation", float, where, "data.synthetic.", 1.0, 0.0),
        nonnegative=_typed(syn_raw, "nonnegative", bool, where, "data.synthetic.", False),
        nuisance=_typed(syn_raw, "nuisance", float, where, "data.synthetic.", 1.7, 0.0),
    )
    labels = _typed(data, "labels", str, where, "data.", "y")
    if labels.endswith(".npy"):
        labels = resolve(labels)
    data_cfg = DataConfig(
        source=source, path=resolve(path), root=resolve(_typed(data, "root", str, where, "data.")),
        features=_typed(data, "features", str, where, "data.", "X"), labels=labels,
        groups=_typed(data, "groups", str, where, "data."), ids=_typed(data, "ids", str, where, "data."),
        normalize=_typed(data, "normalize", str, where, "data.", "none", choices=NORMALIZATIONS),
        split=split, chunk_mb=_typed(data, "chunk_mb", float, where, "data.", 64.0, 0.001),
        synthetic=synthetic, pairs=resolve(_typed(data, "pairs", str, where, "data.")),
        verify_source=_typed(data, "verify_source", bool, where, "data.", False),
    )

    methods_raw = raw.get("methods", [{"method": "identity"}])
    if not isinstance(methods_raw, list) or not methods_raw:
        _fail(where, "methods", f"expected a non-empty list of {{method: ...}} entries, got {methods_raw!r}; "
              f"e.g. methods: [{{method: identity}}, {{method: pca, dim: 32}}]")
    methods, entries, seen = [], [], set()
    for i, entry in enumerate(methods_raw):
        if not isinstance(entry, dict) or "method" not in entry:
            _fail(where, f"methods[{i}]", f"expected a mapping with a 'method' key, got {entry!r}")
        try:
            for spec in expand_method(entry):
                if "negatives" in spec:
                    spec["negatives"] = _check_negatives(spec["negatives"], where, f"methods[{i}].negatives")
                ident = json.dumps(spec, sort_keys=True)
                if ident not in seen:
                    seen.add(ident)
                    methods.append(spec)
                    entries.append(i)
        except ConfigError:
            raise
        except InputError as e:
            _fail(where, f"methods[{i}]", str(e))
        if len(methods) > MAX_MODELS:
            _fail(where, "methods", f"{len(methods):,} models after methods[{i}], over the limit of {MAX_MODELS:,} per "
                  f"config; sweep fewer values, or split the sweep over several configs")

    st_raw = raw.get("statistics", {}) or {}
    _check_keys(st_raw, ["max_dense_dim", "components"], where, "statistics.")
    statistics = StatisticsConfig(
        max_dense_dim=_typed(st_raw, "max_dense_dim", int, where, "statistics.", 8192, 1),
        components=_typed(st_raw, "components", int, where, "statistics.", 256, 1))

    neighbours = None
    if raw.get("neighbours") is not None:
        nb = raw["neighbours"]
        _check_keys(nb, ["k", "method", "nlist", "nprobe", "rerank", "queries"], where, "neighbours.")
        neighbours = NeighboursConfig(k=_typed(nb, "k", int, where, "neighbours.", 50, 1),
                                      method=_typed(nb, "method", str, where, "neighbours.", "auto",
                                                    choices=("auto", "exact", "ivf")),
                                      nlist=_typed(nb, "nlist", int, where, "neighbours.", None, 1),
                                      nprobe=_typed(nb, "nprobe", int, where, "neighbours.", 16, 1),
                                      rerank=_typed(nb, "rerank", int, where, "neighbours.", 4, 1),
                                      queries=_typed(nb, "queries", int, where, "neighbours.", None, 1))

    ev = raw.get("evaluate", {})
    if ev is not None and not isinstance(ev, dict):   # the sections' check lets false (and 0) through as empty
        _fail(where, "evaluate", f"got {ev!r}; give a map (retrieval:, classification:), or leave a part out with "
                                 f"retrieval: false or classification: false (a run always evaluates)")
    ev = ev or {}
    _check_keys(ev, ["retrieval", "classification", "objective"], where, "evaluate.")
    objective = _typed(ev, "objective", str, where, "evaluate.", choices=OBJECTIVES)
    parts = {}
    for part in ("retrieval", "classification"):   # a map (true: its defaults), or false to leave it out
        value = ev.get(part, {})
        if not isinstance(value, (bool, dict)) and value is not None:
            _fail(where, f"evaluate.{part}", f"got {value!r}; give a map of its settings, or false to leave it out")
        parts[part] = {} if value is True else value
    ret = parts["retrieval"] or {}
    do_retrieval = parts["retrieval"] is not False
    _check_keys(ret, ["k", "queries"], where, "evaluate.retrieval.")
    cls = parts["classification"] or {}
    _check_keys(cls, ["classifiers", "queries"], where, "evaluate.classification.")
    classifiers = [] if parts["classification"] is False else cls.get("classifiers", ["knn1", "knn10", "ncm"])
    if not isinstance(classifiers, list):
        classifiers = [classifiers]
    if not do_retrieval and not classifiers:
        _fail(where, "evaluate", "retrieval is false and no classifier is left: nothing would be evaluated; keep one")
    if objective == "retrieval" and not do_retrieval or objective == "classification" and not classifiers:
        _fail(where, "evaluate.objective", f"{objective}, but evaluate.{objective} is off: nothing to report a "
              f"winner on; turn it on, or name the other objective")
    for c in classifiers:
        ok = isinstance(c, str) and (c in ("ncm", "ncmc") or any(c.startswith(p) and c[len(p):].isdigit() and int(c[len(p):]) > 0
                                                       for p in ("knn", "softvote")))
        if not ok:
            _fail(where, "evaluate.classification.classifiers",
                  f"unknown classifier {c!r}; use knnK (e.g. knn1, knn10), softvoteK (Eq. 9 of SL-NE), ncm or ncmc")
    evaluate = EvaluateConfig(retrieval_k=_int_list(ret, "k", where, "evaluate.retrieval.", (1, 10, 100)),
                              classifiers=tuple(classifiers), retrieval=do_retrieval,
                              queries=_typed(ret, "queries", int, where, "evaluate.retrieval.", None, 1),
                              classify_queries=_typed(cls, "queries", int, where, "evaluate.classification.", None, 1))
    _check_kernel_slem(methods, evaluate, where, classifiers_given(raw))
    k_graph = (neighbours or NeighboursConfig()).k
    too_many = [c for c in evaluate.classifiers if c.startswith("softvote") and int(c[8:]) > k_graph]
    if too_many:
        _fail(where, "evaluate.classification.classifiers", f"{too_many[0]} votes over more neighbours than the "
              f"graph keeps (neighbours.k = {k_graph}); use softvoteK with K <= {k_graph} or raise neighbours.k")
    if neighbours is not None and neighbours.queries is not None and \
            any(c.startswith("softvote") for c in evaluate.classifiers):
        _fail(where, "evaluate.classification.classifiers",
              "softvote votes over the test rows' neighbourhoods, which neighbours.queries leaves out; "
              "drop neighbours.queries or use knnK classifiers")

    if isinstance(raw.get("cluster"), dict):   # e.g. {n_workers: 2}: the local cluster's size is top-level
        _fail(where, "cluster", f"expected local, tcp://HOST:PORT, tls://HOST:PORT or a cluster spec .yaml, got "
                                f"{raw['cluster']!r}; the local cluster's size is set by workers, threads_per_worker "
                                f"and memory_limit at the config's top level")
    cluster = _typed(raw, "cluster", str, where, "", "local")
    check_cluster(cluster, f"{where}: cluster")
    tls_raw = raw.get("tls")
    tls = None
    if tls_raw is not None:
        if not isinstance(tls_raw, dict):
            _fail(where, "tls", f"expected a mapping {{ca_file, cert, key}}, got {tls_raw!r}")
        _check_keys(tls_raw, ["ca_file", "cert", "key"], where, "tls.")
        tls = tuple(resolve(_typed(tls_raw, k, str, where, "tls.")) for k in ("ca_file", "cert", "key"))
        if None in tls:
            _fail(where, "tls", "give ca_file, cert and key (PEM files: the CA that signed the scheduler's "
                  "certificate, and this client's certificate and key)")
    memory_limit = check_memory_limit(raw.get("memory_limit", "auto"), where)
    dashboard = raw.get("dashboard", ":8787")
    if dashboard is False or dashboard is None:
        dashboard = None     # no dashboard
    elif isinstance(dashboard, int) and not isinstance(dashboard, bool) and 0 <= dashboard < 65536:
        dashboard = f":{dashboard}"
    elif not isinstance(dashboard, str) or not re.fullmatch(r"[\w.\-\[\]:]*:\d{1,5}", dashboard) \
            or int(dashboard.rpartition(":")[2]) > 65535:
        _fail(where, "dashboard", f"expected [HOST]:PORT (e.g. :8787 or 127.0.0.1:0), a port number or false, "
              f"got {dashboard!r}")
    if dashboard is not None and any(c in dashboard.rpartition(":")[0] for c in "[]:"):   # Dask splits at every ':'
        _fail(where, "dashboard", f"an IPv6 host ({dashboard!r}) is not supported by Dask's dashboard address; give "
              f"0.0.0.0:PORT to open it to the network, 127.0.0.1:PORT or :PORT (this machine only), or false")
    store = _typed(raw, "store", str, where, "", "runs/metricpipe")
    check_store_url(store, f"{where}: store")
    return RunConfig(
        store=resolve(store) if raw.get("store") and base_dir is not None else store,
        cluster=resolve(cluster) if cluster.endswith((".yaml", ".yml")) else cluster,
        workers=_typed(raw, "workers", int, where, "", 2, 1),
        threads_per_worker=_typed(raw, "threads_per_worker", int, where, "", 1, 1),
        memory_limit=memory_limit, dashboard=dashboard,
        wait_timeout=_typed(raw, "wait_timeout", float, where, "", RunConfig.wait_timeout, 1.0),
        data=data_cfg, methods=tuple(methods), method_entries=tuple(entries), statistics=statistics,
        neighbours=neighbours,
        evaluate=evaluate, seed=_typed(raw, "seed", int, where, "", 0, 0),
        repeats=_typed(raw, "repeats", int, where, "", 1, 1, MAX_REPEATS), objective=objective, tls=tls,
        source_file=where, raw=raw)


MAX_REPEATS = 100   # seeds per learned model: every repeat trains every candidate again
OBJECTIVES = ("retrieval", "classification")   # what evaluate.objective may name


MIN_MEMORY_LIMIT = 400e6   # bytes: a worker holds ~250 MB after its imports, and Dask pauses it at 80%


def check_memory_limit(v, where: str):
    """'auto', a size string (2GB) or a positive byte count; anything else is refused here, not by Dask."""
    from dask.utils import parse_bytes
    v = whole_number(v)      # memory_limit: 2e9
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        _fail(where, "memory_limit", f"expected a size such as 2GB or 'auto', got {v!r}")
    if v == "auto":
        return v
    try:
        n = parse_bytes(v) if isinstance(v, str) else v
    except (ValueError, TypeError, OverflowError):   # OverflowError: 1e400GB, an infinite size
        n = None
    if n is None or n <= 0:
        _fail(where, "memory_limit", f"expected a positive size such as 2GB or 'auto', got {v!r}")
    if n < MIN_MEMORY_LIMIT:
        _fail(where, "memory_limit", f"expected at least {MIN_MEMORY_LIMIT / 1e6:.0f}MB per worker (a worker process "
              f"holds ~250 MB before any task, and Dask pauses it at 80% of its limit), got {v!r} ({n:,} bytes); "
              f"e.g. 2GB")
    return v


def check_local_memory(cfg: RunConfig) -> None:
    """A local cluster's memory_limit above this machine's memory is refused (Dask would silently use
    the machine's instead, and the memory rule would believe the larger figure). Checked whenever a
    RunConfig is made, so the config file and --memory-limit / --cluster local are checked alike."""
    if cfg.cluster != "local" or cfg.memory_limit == "auto":
        return
    from dask.utils import format_bytes, parse_bytes
    from distributed.system import MEMORY_LIMIT   # the machine's, or its cgroup's / rlimit's when lower
    n = parse_bytes(cfg.memory_limit) if isinstance(cfg.memory_limit, str) else cfg.memory_limit
    if n > MEMORY_LIMIT:
        where = cfg.setting("memory_limit")
        where = where if where.startswith("--") else f"{cfg.source_file}: {where}"
        raise ConfigError(f"{where}: {cfg.memory_limit} per worker is more than this machine's memory "
                          f"({format_bytes(MEMORY_LIMIT)}); give a smaller size (e.g. 2GB) or auto")


def check_cluster(cluster: str, where: str) -> None:
    """local, tcp:// or tls:// scheduler addresses, or a cluster spec .yaml; ucx:// is refused."""
    if cluster.startswith("ucx://"):
        raise ConfigError(f"{where}: ucx:// is not supported (metricpipe moves row-blocks through the store, "
                          f"not the comm); use tcp:// or tls://")
    if cluster != "local" and not cluster.startswith(("tcp://", "tls://")) and \
            not cluster.endswith((".yaml", ".yml")):
        raise ConfigError(f"{where}: expected local, tcp://HOST:PORT, tls://HOST:PORT or a cluster spec .yaml, "
                          f"got {cluster!r}")


# What a store can be besides a local directory: S3 (tested on moto), GCS and Azure (the same lock without
# conditional writes; see the README). Any other fsspec protocol is read-only (http, zip, github), has no
# lock (ftp, hdfs) or was never tried: refused.
STORE_SCHEMES = ("file", "s3", "gs", "gcs", "az", "abfs", "abfss")


def check_store_url(store: str, where: str) -> None:
    """Refuse store locations that would write somewhere the user did not mean: the one check of a
    store's name, made by :class:`metricpipe.store.Store` and for the config's ``store`` / --store."""
    check_no_nul(store, where)
    if not store.strip():
        raise ConfigError(f"{where}: empty; give a directory (e.g. runs/digits) or an fsspec URL (s3://bucket/run)")
    if "::" in store:
        raise ConfigError(f"{where}: {store!r} is a chained fsspec URL (::), which stores cannot use; give one "
                          f"directory or URL")
    if store.startswith("memory://"):
        raise ConfigError(f"{where}: {store!r} is in-memory, invisible to the workers (other processes); give a "
                          f"directory or a shared URL such as s3://bucket/run")
    _check_scheme(store, where)


def _check_scheme(store: str, where: str) -> None:
    from fsspec.registry import known_implementations
    m = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):(//)?(.*)", store, re.S)
    if not m or (not m.group(2) and m.group(1).lower() not in known_implementations):
        return   # a local path (one named run:1 included)
    scheme, slashes, rest = m.groups()
    fix = "give a local directory or s3://BUCKET/PREFIX"
    if scheme not in STORE_SCHEMES:
        if scheme.lower() in STORE_SCHEMES:
            raise ConfigError(f"{where}: {store!r}: URL schemes are lower case here; write "
                              f"{scheme.lower()}://{rest if slashes else rest.lstrip('/')}")
        raise ConfigError(f"{where}: {store!r}: {scheme}:// cannot hold a store (metricpipe keeps them in local "
                          f"folders, S3, GCS or Azure); {fix}")
    if not slashes:   # fsspec reads s3:/bucket/x as a local folder named s3:
        raise ConfigError(f"{where}: {store!r} is neither a URL ({scheme}: takes //) nor meant as a local folder; "
                          f"write {scheme}://{rest.lstrip('/')}")
    if scheme != "file" and not rest.split("/")[0]:
        raise ConfigError(f"{where}: {store!r} names no bucket; give {scheme}://BUCKET/PREFIX")


def check_no_nul(value: str, where: str) -> None:
    """A NUL byte ends a path for the operating system (Python refuses it with a ValueError)."""
    if "\0" in value:
        raise ConfigError(f"{where}: {value!r} holds a NUL byte (\\0), which no file name can; remove it")


class YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's floats: ``1e-6`` and ``3E2`` are numbers (YAML 1.1, which
    PyYAML follows, needs a dot, ``1.0e-6``, and reads ``1e-6`` as text)."""


def _mapping_without_duplicates(loader, node, deep=False):
    """A mapping whose keys are unique: YAML says so, and PyYAML keeps the last of two silently (a
    second ``seed:`` or ``methods:`` further down a config replaced the first)."""
    seen = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":   # `<<: *alias`: its keys may be overridden
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (also at line {seen[key] + 1}); keep one",
                    key_node.start_mark)
            seen[key] = key_node.start_mark.line
        except TypeError:    # an unhashable key: PyYAML's own error follows
            pass
    return loader.construct_mapping(node, deep=deep)


YamlLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)
YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:\.[0-9]+|[0-9][0-9_]*(?:\.[0-9_]*)?)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


# Alias expansion a config may imply (a 471-byte YAML alias bomb expands to billions of nodes).
MAX_CONFIG_NODES = 100_000


def _expanded_size(node, memo: dict) -> int:
    """Nodes of a composed YAML tree once aliases are expanded, without expanding them."""
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = 1        # a recursive alias counts once (safe_load refuses what it cannot build)
    if isinstance(node, yaml.SequenceNode):
        n = 1 + sum(_expanded_size(c, memo) for c in node.value)
    elif isinstance(node, yaml.MappingNode):
        n = 1 + sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    else:
        n = 1
    memo[key] = n
    return n


# Nesting a config may have (its deepest real section is ~4 levels); PyYAML builds nested collections
# by recursion, so ~300 levels raised RecursionError.
MAX_CONFIG_DEPTH = 50


def _check_depth(text: str, path, what: str) -> None:
    """Refuse YAML nested deeper than MAX_CONFIG_DEPTH, read from the parser's events (a flat loop)."""
    depth = 0
    for event in yaml.parse(text, Loader=YamlLoader):
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            depth += 1
            if depth > MAX_CONFIG_DEPTH:
                raise ConfigError(f"{path}: YAML nested more than {MAX_CONFIG_DEPTH} levels deep at line "
                                  f"{event.start_mark.line + 1}; {what} is a few levels of key: value maps and "
                                  f"lists: flatten it")
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            depth -= 1


def read_yaml(path: Path, what: str):
    """A YAML file's contents, refusing binary files and alias bombs with one line."""
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file; {what} must be YAML text") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read {what}: {e.strerror or e}") from None
    try:
        _check_depth(text, path, what)
        node = yaml.compose(text, Loader=YamlLoader)
        if node is not None and _expanded_size(node, {}) > MAX_CONFIG_NODES:
            raise ConfigError(f"{path}: YAML aliases expand to more than {MAX_CONFIG_NODES:,} values; {what} "
                              f"cannot be that large (an alias bomb?): write it out without nested aliases")
        return yaml.load(text, Loader=YamlLoader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{at}: {getattr(e, 'problem', None) or e}") from None


def load_config(path: str | os.PathLike) -> RunConfig:
    """Read and validate a YAML config; relative paths inside it (data.path, data.root, data.pairs,
    data.labels as a .npy, store, a cluster spec, tls files) resolve against the config file's folder,
    so a config means the same files from wherever it is run."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: config file not found; pass the path to a YAML config (see examples/)")
    raw = read_yaml(p, "a config")
    return parse_config(raw, where=str(p), base_dir=p.absolute().parent)
