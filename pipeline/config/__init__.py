"""Run configuration: YAML in, frozen dataclasses out, every key checked before any work starts.

Each section is a frozen dataclass whose fields are its keys, each declared once with its default,
a one-line description and its checks (:mod:`.schema`); one generic parser reads every section, and
a config's errors come back together, one line each. :func:`reference` lists every key for the docs.

- :mod:`.schema`    the generic section parser and the key reference
- :mod:`.run`       the top-level keys, statistics, neighbours, tls; parse_config, load_config
- :mod:`.data`      data, data.split, data.synthetic
- :mod:`.encode`    encode (pq: the encoded databases)
- :mod:`.evaluate`  evaluate (retrieval, classification, objective) and EvaluateConfig
- :mod:`.methods`   methods: expanded by the registry; what a model can serve, asked of its learner
- :mod:`.checks`    single settings shared with the command line (store, cluster, memory, dashboard)
- :mod:`.files`     reading YAML (configs, cluster specs, hierarchies)
"""

from metricpipe.config import schema
from metricpipe.config.checks import (
    MIN_MEMORY_LIMIT,
    STORE_SCHEMES,
    absolute_path,
    check_cluster,
    check_local_memory,
    check_memory_limit,
    check_no_nul,
    check_store_url,
    dashboard_address,
)
from metricpipe.config.data import (
    BUILTINS,
    FILE_ONLY,
    SPLIT_NAMES,
    USER_SPLITS,
    DataConfig,
    SplitConfig,
    SyntheticConfig,
    file_only_given,
)
from metricpipe.config.encode import MAX_PQ_BYTES, EncodeConfig
from metricpipe.config.evaluate import (
    OBJECTIVES,
    ClassificationSettings,
    EvaluateConfig,
    EvaluateSettings,
    RetrievalSettings,
    classifiers_given,
)
from metricpipe.config.files import MAX_CONFIG_DEPTH, MAX_CONFIG_NODES, YamlLoader, read_yaml
from metricpipe.config.methods import unserved
from metricpipe.config.run import (
    MAX_REPEATS,
    NeighboursConfig,
    RunConfig,
    StatisticsConfig,
    TLSFiles,
    load_config,
    parse_config,
)
from metricpipe.config.schema import Key
from metricpipe.errors import ConfigError


def reference() -> list[Key]:
    """Every config key, section by section, for the config reference of the docs.

    Returns
    -------
    list of Key
        One row per key, in file order: ``key`` (dotted, ``data.split.test``), ``type``, ``default``
        (as YAML) and ``description``; :func:`reference_markdown` is one way to show them.

    Examples
    --------
    >>> from metricpipe.config import reference
    >>> row = next(r for r in reference() if r.key == "data.split.test")
    >>> row.type, row.default
    ('float in (0, 1)', '0.2')
    """
    return schema.reference(RunConfig)


def reference_markdown() -> str:
    """The config reference as a markdown table, one row per key."""

    def cell(text: str, code: bool = False) -> str:
        text = text.replace("|", "\\|")  # the types' alternatives (none | l1 | l2) inside a cell
        return f"`{text}`" if code and text else text

    rows = ["| key | type | default | description |", "| --- | --- | --- | --- |"]
    rows += [
        f"| {cell(r.key, True)} | {cell(r.type)} | {cell(r.default, True)} | {cell(r.description)} |"
        for r in reference()
    ]
    return "\n".join(rows) + "\n"


__all__ = [
    "BUILTINS",
    "FILE_ONLY",
    "MAX_CONFIG_DEPTH",
    "MAX_CONFIG_NODES",
    "MAX_PQ_BYTES",
    "MAX_REPEATS",
    "MIN_MEMORY_LIMIT",
    "OBJECTIVES",
    "SPLIT_NAMES",
    "STORE_SCHEMES",
    "USER_SPLITS",
    "ClassificationSettings",
    "ConfigError",
    "DataConfig",
    "EncodeConfig",
    "EvaluateConfig",
    "EvaluateSettings",
    "Key",
    "NeighboursConfig",
    "RetrievalSettings",
    "RunConfig",
    "SplitConfig",
    "StatisticsConfig",
    "SyntheticConfig",
    "TLSFiles",
    "YamlLoader",
    "absolute_path",
    "check_cluster",
    "check_local_memory",
    "check_memory_limit",
    "check_no_nul",
    "check_store_url",
    "classifiers_given",
    "dashboard_address",
    "file_only_given",
    "load_config",
    "parse_config",
    "read_yaml",
    "reference",
    "reference_markdown",
    "unserved",
]
