"""The generic section parser: a config section is a frozen dataclass whose fields are its keys.

Each key is declared once, by :func:`setting`: its default (stated there only), a one-line
description (the config reference, :func:`reference`), and what the parser checks (a kind with
bounds or choices, or a hook for what no rule says). :func:`parse_section` walks the fields of a
section: unknown keys (with a "did you mean"), then each key, then the section's own
:meth:`Section.rules` across its keys. Every error found is one line ``FILE: KEY: what was expected,
what arrived, the fix``, and a section reports all of its errors in one :class:`ConfigError`.
"""

import difflib
import json
import math
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import NamedTuple

import yaml

from metricpipe.config.checks import absolute_path, check_no_nul
from metricpipe.errors import ConfigError
from metricpipe.tasks.validate import whole_number


def setting(
    default,
    doc: str,
    *,
    kind: type | None = None,
    minimum=None,
    maximum=None,
    choices=None,
    section: type | None = None,
    parse=None,
    check=None,
    path=None,
    absent=MISSING,
    shown: str = "",
):
    """A config key, as a dataclass field: its default and what the parser checks.

    Parameters
    ----------
    default : the key's value when the config leaves it out (or sets it to null).
    doc : one line for the config reference.
    kind, minimum, maximum, choices : the rule of a plain key (int, float, str or bool), its bounds
        (inclusive) and allowed values.
    section : the dataclass of a nested mapping (read by :func:`parse_section`).
    parse : ``hook(value, reading, key) -> value`` instead of the rules above, for what they cannot say;
        it gets the value as written (null included), or ``absent`` when the key is left out.
    check : ``hook(value, reading, key)``, after the rules, on a value the config gives.
    path : given values are paths, read against the config's folder (a predicate: the values it accepts).
    absent : what a left-out key stands for, read by ``parse``, where that is not simply the default (a
        required section: None; the methods: the registry's default entries).
    shown : the type as the reference prints it, where kind does not say it.
    """
    meta = {
        "doc": doc,
        "kind": kind,
        "minimum": minimum,
        "maximum": maximum,
        "choices": choices,
        "section": section,
        "parse": parse,
        "check": check,
        "path": path,
        "absent": absent,
        "shown": shown,
    }
    return field(default=default, metadata=meta)


class Section:
    """A config section: a frozen dataclass of :func:`setting` fields."""

    @classmethod
    def rules(cls, values: dict, given: dict, reading: "Reading") -> dict:
        """Checks across the section's keys, made once each key is valid (``given``: the mapping as
        written); returns the values the section is made of."""
        return values


@dataclass(frozen=True)
class Reading:
    """What a hook needs to know of the file being read."""

    where: str  # the config file (or a command's name), first on every error line
    base_dir: Path | None = None  # relative paths are read against it (None: left as given)

    def fail(self, key: str, msg: str):
        raise ConfigError(f"{self.where}: {key}: {msg}")

    def resolve(self, p: str | None) -> str | None:
        return p if self.base_dir is None else absolute_path(p, self.base_dir)


def settings(cls) -> list:
    """The fields of ``cls`` that are config keys, in the order the config reference lists them."""
    return [f for f in fields(cls) if "doc" in f.metadata]


def parse_section(cls, given: dict, reading: Reading, prefix: str = ""):
    """``given`` (a mapping) read as the section ``cls``; ``prefix`` names its keys (``data.split.``).
    Raises one ConfigError with a line per unknown key, per bad value and for the section's rules."""
    keys = [f.name for f in settings(cls)]
    errors = []
    for key in given:
        if key not in keys:
            near = difflib.get_close_matches(str(key), keys, n=1)
            hint = f"did you mean '{prefix}{near[0]}'?" if near else f"allowed keys: {', '.join(keys)}"
            errors.append(f"{reading.where}: {prefix}{key}: unknown key; {hint}")
    values = {}
    for f in settings(cls):
        try:
            values[f.name] = read_key(f, given, reading, prefix + f.name)
        except ConfigError as e:
            errors += str(e).splitlines()
    if not errors:
        try:
            return cls(**cls.rules(values, given, reading))
        except ConfigError as e:
            errors += str(e).splitlines()
    raise ConfigError("\n".join(errors))


def read_section(cls, value, reading: Reading, key: str):
    """A nested section's value: null is its defaults, a mapping its keys, anything else refused."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        reading.fail(key, f"expected a mapping (key: value), got {value!r}")
    return parse_section(cls, value, reading, f"{key}.")


def read_key(f, given: dict, reading: Reading, key: str):
    """One key's value: its hook's, its section's, or its kind's with bounds and choices."""
    m = f.metadata
    if f.name not in given and m["absent"] is MISSING:
        return f.default
    if m["parse"] is not None:
        return m["parse"](given.get(f.name, m["absent"]), reading, key)
    if m["section"] is not None:
        return read_section(m["section"], given.get(f.name), reading, key)
    if given.get(f.name) is None:
        return f.default
    value = typed(given[f.name], key, reading, m["kind"], m["minimum"], m["maximum"], m["choices"])
    if m["check"] is not None:
        m["check"](value, reading, key)
    if m["path"] is True or m["path"] is not None and m["path"](value):
        value = reading.resolve(value)
    return value


def typed(v, key: str, reading: Reading, kind: type, minimum=None, maximum=None, choices=None):
    """``v`` as a ``kind`` (an int for a whole float where a count goes, a float for an int), within
    the bounds and among the choices."""
    if kind is float and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    v = whole_number(v) if kind is int else v
    if kind is int and isinstance(v, bool) or not isinstance(v, kind):
        reading.fail(key, f"expected {kind.__name__}, got {v!r}")
    if kind is str:
        check_no_nul(v, f"{reading.where}: {key}")
    if kind is float and not math.isfinite(v):
        reading.fail(key, f"expected a finite number, got {v!r}")
    if minimum is not None and v < minimum:
        reading.fail(key, f"must be >= {minimum}, got {v!r}")
    if maximum is not None and v > maximum:
        reading.fail(key, f"must be <= {maximum}, got {v!r}")
    if choices is not None and v not in choices:
        reading.fail(key, f"must be one of {', '.join(map(str, choices))}, got {v!r}")
    return v


# ---- the config reference ---------------------------------------------------------------------------


class Key(NamedTuple):
    """A row of the config reference."""

    key: str  # dotted, as in the YAML: data.split.test
    type: str  # int >= 1, none | l1 | l2 | power, mapping, ...
    default: str  # as YAML writes it (empty for a section: see its keys)
    description: str


def reference(cls, prefix: str = "") -> list[Key]:
    """Every key of section ``cls`` and of its nested sections, in the order of the fields."""
    rows = []
    for f in settings(cls):
        m = f.metadata
        default = f.default if m["absent"] is MISSING or m["section"] is not None else m["absent"]
        shown = "" if is_dataclass(default) else yaml_text(default)
        rows.append(Key(prefix + f.name, m["shown"] or kind_text(m), shown, m["doc"]))
        if m["section"] is not None:
            rows += reference(m["section"], f"{prefix}{f.name}.")
    return rows


def kind_text(m) -> str:
    if m["section"] is not None:
        return "mapping"
    if m["choices"] is not None:
        return " | ".join(map(str, m["choices"]))
    text = m["kind"].__name__
    if m["minimum"] is not None and m["maximum"] is not None:
        return f"{text} in [{m['minimum']}, {m['maximum']}]"
    return text + (f" >= {m['minimum']}" if m["minimum"] is not None else "")


def yaml_text(v) -> str:
    """``v`` as a config writes it (flow style): null, true, [1, 10, 100], {method: identity}."""
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(map(yaml_text, v)) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {yaml_text(x)}" for k, x in v.items()) + "}"
    if v is None or isinstance(v, bool):
        return json.dumps(v)
    text = str(v)
    try:
        plain = yaml.safe_load(text) == v
    except yaml.YAMLError:
        plain = False
    return text if plain else json.dumps(v)  # quoted where YAML would read another value
