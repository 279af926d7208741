"""The run's config: the top-level keys, the statistics and neighbours sections, the cross-section
rules, and :func:`parse_config` / :func:`load_config`."""

import os
from dataclasses import astuple, dataclass, field, replace
from pathlib import Path

from metricpipe.config.checks import (
    check_cluster,
    check_local_memory,
    check_memory_limit,
    check_store_url,
    dashboard_address,
)
from metricpipe.config.data import DataConfig, read_data
from metricpipe.config.encode import EncodeConfig
from metricpipe.config.evaluate import EvaluateConfig, EvaluateSettings, classifiers_given, read_evaluate
from metricpipe.config.files import read_yaml
from metricpipe.config.methods import check_served, read_methods
from metricpipe.config.schema import Reading, Section, parse_section, read_section, setting, typed
from metricpipe.errors import ConfigError
from metricpipe.tasks.registry import DEFAULT_METHODS

MAX_REPEATS = 100  # seeds per learned model: every repeat trains every candidate again


@dataclass(frozen=True)
class StatisticsConfig(Section):
    max_dense_dim: int = setting(
        8192,
        "Above this many features PCA is randomized (dask's SVD), and LDA and linear SLEM are refused",
        kind=int,
        minimum=1,
    )
    components: int = setting(256, "Components kept by the randomized PCA", kind=int, minimum=1)


@dataclass(frozen=True)
class NeighboursConfig(Section):
    k: int = setting(50, "Neighbours per row in the graph", kind=int, minimum=1)
    method: str = setting(
        "auto",
        "exact, a faiss IVF index, or auto: exact up to 200,000 train rows, else ivf",
        kind=str,
        choices=("auto", "exact", "ivf"),
    )
    nlist: int | None = setting(
        None, "IVF lists (unset: about 2 sqrt(n_train), see pipeline/ivf.py)", kind=int, minimum=1
    )
    nprobe: int = setting(16, "IVF lists searched per query", kind=int, minimum=1)
    rerank: int = setting(
        4, "An IVF-PQ index returns rerank x k candidates, re-scored exactly (1: off)", kind=int, minimum=1
    )
    queries: int | None = setting(
        None,
        "A seeded, class-stratified sample of this many train rows gets a "
        "neighbourhood (unset: all); SL-NE/SL-DE train on it and its neighbours",
        kind=int,
        minimum=1,
    )


@dataclass(frozen=True)
class TLSFiles(Section):
    ca_file: str | None = setting(
        None, "PEM file of the CA that signed the scheduler's certificate", kind=str, path=True
    )
    cert: str | None = setting(None, "PEM file of this client's certificate", kind=str, path=True)
    key: str | None = setting(None, "PEM file of this client's private key", kind=str, path=True)

    @classmethod
    def rules(cls, values: dict, given: dict, rd: Reading) -> dict:
        if None in values.values():
            rd.fail(
                "tls",
                "give ca_file, cert and key (PEM files: the CA that signed the scheduler's certificate, "
                "and this client's certificate and key)",
            )
        return values


def _tls(v, rd: Reading, key: str) -> tuple | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        rd.fail(key, f"expected a mapping {{ca_file, cert, key}}, got {v!r}")
    return astuple(parse_section(TLSFiles, v, rd, f"{key}."))


def _cluster(v, rd: Reading, key: str) -> str:
    if isinstance(v, dict):  # e.g. {n_workers: 2}: the local cluster's size is top-level
        rd.fail(
            key,
            f"expected local, tcp://HOST:PORT, tls://HOST:PORT or a cluster spec .yaml, got {v!r}; the "
            f"local cluster's size is set by workers, threads_per_worker and memory_limit at the config's "
            f"top level",
        )
    cluster = RunConfig.cluster if v is None else typed(v, key, rd, str)
    check_cluster(cluster, f"{rd.where}: {key}")
    return rd.resolve(cluster) if cluster.endswith((".yaml", ".yml")) else cluster


def _statistics(v, rd: Reading, key: str) -> StatisticsConfig:
    return read_section(StatisticsConfig, None if v in (None, False) else v, rd, key)  # false or 0: defaults


def _neighbours(v, rd: Reading, key: str) -> NeighboursConfig | None:
    return None if v is None else read_section(NeighboursConfig, v, rd, key)


@dataclass(frozen=True)
class RunConfig(Section):
    store: str = setting(
        "runs/metricpipe",
        "Directory or fsspec URL (s3://BUCKET/PREFIX, gs://, az://) holding every result",
        kind=str,
        path=True,
        check=lambda v, rd, key: check_store_url(v, f"{rd.where}: {key}"),
    )
    cluster: str = setting(
        "local",
        "Where the work runs: a local cluster, a scheduler's address, or a cluster spec YAML (cluster/*.yaml)",
        parse=_cluster,
        shown="local | tcp://HOST:PORT | tls://HOST:PORT | path of a .yaml",
    )
    tls: tuple | None = setting(
        None,
        "PEM files for a tls:// scheduler (or METRICPIPE_TLS_CA_FILE, _CERT, _KEY, or "
        "Dask's distributed.comm.tls); read as (ca_file, cert, key)",
        section=TLSFiles,
        parse=_tls,
    )
    workers: int = setting(
        2, "Local workers (one process each), or workers to request from SLURM/Kubernetes", kind=int, minimum=1
    )
    threads_per_worker: int = setting(1, "Threads per local worker", kind=int, minimum=1)
    memory_limit: str = setting(
        "auto",
        "Memory per local worker (at least 400MB, at most this machine's memory)",
        parse=lambda v, rd, key: check_memory_limit(v, rd.where),
        shown="size (e.g. 2GB), bytes or auto",
    )
    dashboard: str | None = setting(
        ":8787",
        "The local Dask dashboard's address (127.0.0.1 unless a host is given; a taken port is swapped for a free one)",
        parse=lambda v, rd, key: dashboard_address(v, rd.where),
        shown="[HOST]:PORT, a port number or false",
    )
    # for a first worker to join a scheduler, for a worker while it has none (all killed mid-run); a
    # scheduler's answer, at most 10 s
    wait_timeout: float = setting(
        60.0,
        "Seconds a run waits on the cluster (a first worker, or any worker once all "
        "are gone) before stopping with one line",
        kind=float,
        minimum=1.0,
    )
    data: DataConfig = setting(
        DataConfig(),
        "The data set (required): a built-in source or a file, its split and chunks",
        section=DataConfig,
        parse=read_data,
        absent=None,
    )
    methods: tuple = setting(
        (),
        "The models: one per entry and per value of a list parameter (dim: [16, 32]: 2); "
        "keys are the estimator's parameters",
        parse=read_methods,
        absent=list(DEFAULT_METHODS),
        shown="list of {method: NAME, ...parameters}",
    )
    statistics: StatisticsConfig = setting(
        StatisticsConfig(),
        "The statistics stage (mean, covariance, PCA of the train rows)",
        section=StatisticsConfig,
        parse=_statistics,
    )
    neighbours: NeighboursConfig | None = setting(
        None,
        "The k-NN graph of the train rows (made when given, when a method needs it, or for softvote classifiers)",
        section=NeighboursConfig,
        parse=_neighbours,
    )
    encode: EncodeConfig = setting(
        EncodeConfig(),
        "What the encode stage writes besides every model's float codes",
        section=EncodeConfig,
    )
    evaluate: EvaluateConfig = setting(
        EvaluateConfig(),
        "What the evaluation scores on the test split",
        section=EvaluateSettings,
        parse=read_evaluate,
        absent=None,
    )
    seed: int = setting(
        0,
        "Seed of the run's samples (queries, IVF k-means, selection's validation rows, "
        "randomized PCA); a learner's own is its random_state",
        kind=int,
        minimum=0,
    )
    repeats: int = setting(
        1,
        "Every learned model trained this many times (random_state + r, its own validation "
        "rows); the report gives mean +/- sd",
        kind=int,
        minimum=1,
        maximum=MAX_REPEATS,
    )
    method_entries: tuple = ()  # the index in the config's methods list of each expanded spec
    objective: str | None = None  # evaluate.objective: the objective the closing line reports (None: both); the
    # report's only, so not in EvaluateConfig (whose fields key the evaluation)
    source_file: str = "<config>"
    raw: dict = field(default_factory=dict, compare=False)
    overridden: frozenset = frozenset()  # settings given on the command line (--memory-limit, ...), not the file

    @classmethod
    def rules(cls, values: dict, given: dict, rd: Reading) -> dict:
        settings, methods, neighbours = values["evaluate"], values["methods"], values["neighbours"]
        evaluate = settings.config()
        if classifiers_given(given):
            check_served(methods, evaluate.classifiers, rd)
        k_graph = (neighbours or NeighboursConfig()).k
        too_many = [c for c in evaluate.classifiers if c.startswith("softvote") and int(c[8:]) > k_graph]
        if too_many:
            rd.fail(
                "evaluate.classification.classifiers",
                f"{too_many[0]} votes over more neighbours than the graph "
                f"keeps (neighbours.k = {k_graph}); use softvoteK with K <= {k_graph} or raise neighbours.k",
            )
        if (
            neighbours is not None
            and neighbours.queries is not None
            and any(c.startswith("softvote") for c in evaluate.classifiers)
        ):
            rd.fail(
                "evaluate.classification.classifiers",
                "softvote votes over the test rows' neighbourhoods, which "
                "neighbours.queries leaves out; drop neighbours.queries or use knnK classifiers",
            )
        return {
            **values,
            "methods": methods.specs,
            "method_entries": methods.entries,
            "evaluate": evaluate,
            "objective": settings.objective,
            "source_file": rd.where,
            "raw": given,
        }

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
        where = self.setting("memory_limit")
        check_local_memory(
            self.cluster, self.memory_limit, where if where.startswith("--") else f"{self.source_file}: {where}"
        )


def parse_config(raw: dict, where: str = "<config>", base_dir: Path | None = None) -> RunConfig:
    """Validate a config mapping and return a RunConfig; raises ConfigError with a line per error, each
    naming the key. Relative paths in ``raw`` resolve against ``base_dir`` (the config file's folder;
    None: left as given)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{where}: a config is a YAML mapping (key: value lines), got a {type(raw).__name__}; "
            f"see examples/ for the form"
        )
    return parse_section(RunConfig, raw, Reading(where, base_dir))


def load_config(path: str | os.PathLike) -> RunConfig:
    """Read and validate a YAML config; relative paths inside it (data.path, data.root, data.pairs,
    data.labels as a .npy, store, a cluster spec, tls files) resolve against the config file's folder,
    so a config means the same files from wherever it is run."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: config file not found; pass the path to a YAML config (see examples/)")
    return parse_config(read_yaml(p, "a config"), where=str(p), base_dir=p.absolute().parent)
