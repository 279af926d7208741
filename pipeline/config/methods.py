"""The ``methods:`` list: each entry checked and expanded by the registry (the learner's own
parameters and checks), and what a model's codes can serve asked of the learner."""

import json
from typing import NamedTuple

from metricpipe.config.schema import Reading
from metricpipe.errors import ConfigError
from metricpipe.tasks import registry
from metricpipe.tasks.errors import InputError
from metricpipe.tasks.slem import check_negatives
from metricpipe.tasks.splits import USER_SPLITS


class Methods(NamedTuple):
    specs: tuple  # one model spec per expanded entry: {"method", "dim", ...params}
    entries: tuple  # the index in the config's methods list of each spec


def unserved(spec: dict, classifier: str) -> str | None:
    """Why the model of ``spec`` cannot serve ``classifier`` (None: it can), as its learner says
    (:meth:`~metricpipe.tasks.base.Learner.serves`)."""
    return registry.make(spec).serves(classifier)


def _negatives(neg: dict | None, rd: Reading, key: str) -> dict:
    """A negative pool, defaults filled in: a split of the data other than test (the evaluation
    images), count >= 2 or null, seed >= 0."""
    try:
        neg = check_negatives(neg)
    except InputError as e:
        rd.fail(key, str(e))
    if neg["split"] not in USER_SPLITS:
        rd.fail(
            f"{key}.split",
            f"must name the split of the negative images, one of "
            f"{', '.join(n for n in USER_SPLITS if n != 'test')} (never test: those are the "
            f"queries); got {neg['split']!r}",
        )
    return neg


def _expanded(entry, rd: Reading, key: str) -> list[dict]:
    """The model specs of one methods entry (a sweep gives several)."""
    if not isinstance(entry, dict) or "method" not in entry:
        rd.fail(key, f"expected a mapping with a 'method' key, got {entry!r}")
    try:
        specs = registry.expand_method(entry)
    except InputError as e:  # a line per problem of the entry, each naming it
        raise ConfigError("\n".join(f"{rd.where}: {key}: {line}" for line in str(e).splitlines())) from None
    for spec in specs:
        if "negatives" in spec:
            spec["negatives"] = _negatives(spec["negatives"], rd, f"{key}.negatives")
    return specs


def read_methods(v, rd: Reading, key: str) -> Methods:
    """Every entry's specs, each model once; an error line per bad entry."""
    if not isinstance(v, list) or not v:
        rd.fail(
            key,
            f"expected a non-empty list of {{method: ...}} entries, got {v!r}; e.g. methods: "
            f"[{{method: identity}}, {{method: pca, dim: 32}}]",
        )
    specs, entries, seen, errors = [], [], set(), []
    for i, entry in enumerate(v):
        try:
            expanded = _expanded(entry, rd, f"{key}[{i}]")
        except ConfigError as e:
            errors += str(e).splitlines()
            continue
        for spec in expanded:
            ident = json.dumps(spec, sort_keys=True)
            if ident not in seen:
                seen.add(ident)
                specs.append(spec)
                entries.append(i)
        if len(specs) > registry.MAX_MODELS:
            errors.append(
                f"{rd.where}: {key}: {len(specs):,} models after methods[{i}], over the limit of "
                f"{registry.MAX_MODELS:,} per config; sweep fewer values, or split the sweep over several "
                f"configs"
            )
            break
    if errors:
        raise ConfigError("\n".join(errors))
    return Methods(tuple(specs), tuple(entries))


def check_served(methods: Methods, classifiers: tuple, rd: Reading) -> None:
    """A classifier the config lists must be one every model's codes can serve."""
    for spec, i in zip(*methods):
        odd = [c for c in classifiers if unserved(spec, c)]
        if odd:
            rd.fail(
                "evaluate.classification.classifiers",
                f"{', '.join(odd)} cannot be served by methods[{i}]: "
                f"{unserved(spec, odd[0])}; list only classifiers it serves, or leave classifiers unset (the "
                f"defaults skip what a model cannot serve)",
            )
