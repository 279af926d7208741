"""Reading YAML: configs, cluster specs and hierarchies alike, with one line for what cannot be read."""

import re
from pathlib import Path

import yaml

from metricpipe.errors import ConfigError


class YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's floats: ``1e-6`` and ``3E2`` are numbers (YAML 1.1, which
    PyYAML follows, needs a dot, ``1.0e-6``, and reads ``1e-6`` as text)."""


def _mapping_without_duplicates(loader, node, deep=False):
    """A mapping whose keys are unique: YAML says so, and PyYAML keeps the last of two silently (a
    second ``seed:`` or ``methods:`` further down a config replaced the first)."""
    seen = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *alias`: its keys may be overridden
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (also at line {seen[key] + 1}); keep one", key_node.start_mark
                )
            seen[key] = key_node.start_mark.line
        except TypeError:  # an unhashable key: PyYAML's own error follows
            pass
    return loader.construct_mapping(node, deep=deep)


YamlLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)
YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\.[0-9]+|[0-9][0-9_]*(?:\.[0-9_]*)?)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


# Alias expansion a config may imply (a 471-byte YAML alias bomb expands to billions of nodes).
MAX_CONFIG_NODES = 100_000


def _expanded_size(node, memo: dict) -> int:
    """Nodes of a composed YAML tree once aliases are expanded, without expanding them."""
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = 1  # a recursive alias counts once (safe_load refuses what it cannot build)
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
                raise ConfigError(
                    f"{path}: YAML nested more than {MAX_CONFIG_DEPTH} levels deep at line "
                    f"{event.start_mark.line + 1}; {what} is a few levels of key: value maps and "
                    f"lists: flatten it"
                )
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
            raise ConfigError(
                f"{path}: YAML aliases expand to more than {MAX_CONFIG_NODES:,} values; {what} "
                f"cannot be that large (an alias bomb?): write it out without nested aliases"
            )
        return yaml.load(text, Loader=YamlLoader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{at}: {getattr(e, 'problem', None) or e}") from None
