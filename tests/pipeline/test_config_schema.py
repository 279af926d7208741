"""The config's keys are declared once, on the dataclasses: what the parser accepts, the defaults it
uses and the reference the docs show all come from those fields."""

import ast
import re
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from metricpipe.config import (
    ConfigError,
    EvaluateConfig,
    RunConfig,
    SplitConfig,
    SyntheticConfig,
    parse_config,
    reference,
    reference_markdown,
)

BASE = {"data": {"source": "synthetic"}}
SECTIONS = [r.key for r in reference() if r.type.startswith("mapping")]


def _nested(path: str, value) -> dict:
    """``{a: {b: value}}`` for ``a.b``, merged into BASE."""
    raw = {**BASE, "data": dict(BASE["data"])}
    *parents, last = path.split(".")
    d = raw
    for p in parents:
        d = d.setdefault(p, {})
    d[last] = value
    return raw


def _children(prefix: str) -> list[str]:
    depth = prefix.count(".") + (1 if prefix else 0)
    return [
        r.key.split(".")[-1]
        for r in reference()
        if r.key.startswith(prefix + "." if prefix else "") and r.key.count(".") == depth
    ]


@pytest.mark.parametrize("section", [""] + SECTIONS)
def test_every_key_the_parser_accepts_is_a_described_field(section):
    """The parser's own list of allowed keys in each section is the reference's, whose rows are the
    dataclass fields with their descriptions."""
    raw = {**BASE, "zzzz": 1} if not section else _nested(f"{section}.zzzz", 1)
    with pytest.raises(ConfigError) as e:
        parse_config(raw, where="c.yaml")
    prefix = f"{section}." if section else ""
    [line] = str(e.value).splitlines()
    m = re.fullmatch(rf"c\.yaml: {re.escape(prefix)}zzzz: unknown key; allowed keys: (.*)", line)
    assert m, line
    assert m.group(1).split(", ") == _children(section)


def test_every_key_has_a_one_line_description_and_a_type():
    rows = reference()
    assert len({r.key for r in rows}) == len(rows) > 50
    for r in rows:
        assert r.description and "\n" not in r.description and len(r.description) < 200, r
        assert r.type, r


# sections off unless given (tls, neighbours): giving one of their keys turns them on
OFF = [r.key for r in reference() if r.type.startswith("mapping") and r.default == "null"]


@pytest.mark.parametrize(
    "row",
    [
        r
        for r in reference()
        if r.default
        and not r.type.startswith("mapping")
        and r.key != "data.source"
        and not r.key.startswith(tuple(s + "." for s in OFF))
    ],
    ids=lambda r: r.key,
)
def test_the_reference_s_defaults_are_what_the_parser_uses(row):
    """Giving a key its documented default changes nothing."""
    assert parse_config(_nested(row.key, yaml.safe_load(row.default))) == parse_config(BASE)


def test_sections_that_are_off_unless_given_take_their_documented_defaults():
    nb = {r.key.split(".")[-1]: yaml.safe_load(r.default) for r in reference() if r.key.startswith("neighbours.")}
    assert parse_config({**BASE, "neighbours": nb}) == parse_config({**BASE, "neighbours": {}})


def test_keyed_sections_keep_their_fields():
    """EvaluateConfig, SplitConfig and SyntheticConfig go into unit keys field by field: their fields
    are the keys of stored results."""
    assert [f.name for f in fields(EvaluateConfig)] == [
        "retrieval_k",
        "classifiers",
        "retrieval",
        "queries",
        "classify_queries",
    ]
    assert [f.name for f in fields(SplitConfig)] == ["test", "val", "seed", "column", "classes"]
    assert [f.name for f in fields(SyntheticConfig)] == [
        "samples",
        "dim",
        "classes",
        "seed",
        "separation",
        "nonnegative",
        "nuisance",
        "overlap",
    ]
    assert (
        parse_config(BASE).evaluate.__dict__
        == EvaluateConfig().__dict__
        == {
            "retrieval_k": (1, 10, 100),
            "classifiers": ("knn1", "knn10", "ncm"),
            "retrieval": True,
            "queries": None,
            "classify_queries": None,
        }
    )


def test_the_reference_renders_as_a_markdown_table():
    """What the docs' config reference is made from: one row per key, four cells each."""
    lines = reference_markdown().splitlines()
    assert lines[:2] == ["| key | type | default | description |", "| --- | --- | --- | --- |"]
    assert len(lines) == len(reference()) + 2
    for line in lines:
        assert len(re.split(r"(?<!\\)\|", line)) == 6, line  # the types' own | are escaped
    assert "| `data.normalize` | none \\| l1 \\| l2 \\| power | `none` |" in reference_markdown()
    assert "| `methods` | " in reference_markdown() and "`[{method: identity}]`" in reference_markdown()


def test_all_errors_of_a_config_come_together_one_line_each():
    raw = {
        "data": {"source": "digits", "normalize": "l3", "split": {"test": 2}},
        "workers": 0,
        "wrokers": 1,
        "methods": [{"method": "pca", "dim": -1}, {"method": "lda"}, {"dim": 3}],
        "neighbours": {"k": 0},
        "encode": {"pq": [8, 8]},
        "evaluate": {"classification": {"classifiers": ["svm"]}},
    }
    with pytest.raises(ConfigError) as e:
        parse_config(raw, where="c.yaml")
    lines = str(e.value).splitlines()
    assert [ln.split(": ")[1] for ln in lines] == [
        "wrokers",
        "workers",
        "data.normalize",
        "data.split.test",
        "methods[0]",
        "methods[2]",
        "neighbours.k",
        "encode.pq",
        "evaluate.classification.classifiers",
    ], lines
    assert all(ln.startswith("c.yaml: ") for ln in lines)
    # rules across keys wait for the keys they read: one line for the mistake, not a cascade
    with pytest.raises(ConfigError) as e:
        parse_config({"data": {"source": "mnist"}}, where="c.yaml")
    assert str(e.value) == "c.yaml: data.source: must be one of digits, fashion-mnist, synthetic, got 'mnist'"


def test_every_mistake_of_one_methods_entry_comes_in_the_same_run():
    """A methods entry stopped at its first mistake: a second run found the next one (a new user's
    first hour). Each unknown key, each bad value of each parameter (of a sweep too) and the
    selection's mistake now come together, a line each naming the entry."""
    raw = {
        "data": {"source": "digits"},
        "methods": [
            {"method": "ncmml", "dim": 0, "lr": -1, "itres": 10, "batch": 0, "iters": 2.5},
            {"method": "pca", "dim": [8, 0, -2], "whiten": True},
            {"method": "sparse", "dim": 8, "sparsity": 2, "select": {"metric": "knn0"}},
            {"method": "slem", "kernel": ["linear", "gaussian"], "lam": -1},
            {"method": "ncmml", "select": {"lr": [-1, 3]}},
        ],
    }
    with pytest.raises(ConfigError) as e:
        parse_config(raw, where="c.yaml")
    lines = str(e.value).splitlines()

    def what(line):  # (entry, the mistake, the bad value)
        mistake = re.search(r"unknown parameter '\w+'|The '\w+' parameter|select\.metric", line).group(0)
        value = re.search(r"Got (\S+) instead", line)
        return line.split(": ")[1], mistake, value.group(1) if value else None

    got = [what(ln) for ln in lines]
    assert got == [
        ("methods[0]", "unknown parameter 'itres'", None),
        ("methods[0]", "The 'dim' parameter", "0"),
        ("methods[0]", "The 'lr' parameter", "-1.0"),
        ("methods[0]", "The 'batch' parameter", "0"),
        ("methods[0]", "The 'iters' parameter", "2.5"),
        ("methods[1]", "unknown parameter 'whiten'", None),
        ("methods[1]", "The 'dim' parameter", "0"),
        ("methods[1]", "The 'dim' parameter", "-2"),
        ("methods[2]", "The 'sparsity' parameter", "2.0"),
        ("methods[2]", "select.metric", None),
        ("methods[3]", "The 'lam' parameter", "-1.0"),  # linear SLEM's
        ("methods[3]", "The 'lam' parameter", "-1.0"),  # kernel SLEM's (> 0)
        ("methods[4]", "The 'lr' parameter", "-1.0"),  # a selection candidate's
    ], lines
    assert all(ln.startswith("c.yaml: methods[") for ln in lines)


CONFIG = Path(__file__).parents[2] / "pipeline" / "config"


def test_the_config_package_names_no_learner_and_probes_nothing():
    """Learners' names and what they can do belong to the learners (the registry, ``serves``,
    ``_validate_params``), not to the config: no method name as a literal, no hasattr, and no
    other module's private names."""
    from metricpipe.tasks.registry import methods

    names = set(methods())
    for path in CONFIG.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert node.value not in names, f"{path.name} line {node.lineno}: {node.value!r}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id != "hasattr", f"{path.name} line {node.lineno}"
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("metricpipe"):
                assert not any(a.name.startswith("_") for a in node.names), f"{path.name} line {node.lineno}"


def test_modules_and_functions_stay_short():
    for path in CONFIG.glob("*.py"):
        text = path.read_text()
        assert text.count("\n") <= 600, path.name
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef):
                assert node.end_lineno - node.lineno < 80, f"{path.name}: {node.name}"


def test_run_config_defaults_are_the_fields():
    """The defaults are stated once: a config that says nothing gets the dataclasses' own."""
    cfg = parse_config({"data": {"source": "digits"}})
    for f in fields(RunConfig):
        if f.metadata.get("section") is None and f.name not in ("methods", "method_entries", "source_file", "raw"):
            assert getattr(cfg, f.name) == f.default, f.name


def test_the_command_line_prints_every_error_of_a_config(tmp_path):
    """Issue 47: all config errors of a file in one run, an `error:` line each, exit 2, nothing made."""
    from click.testing import CliRunner

    from metricpipe.cli import main

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"store: {tmp_path / 's'}\nworkers: 0\ndata: {{source: digits, normalise: l2}}\n"
        f"methods: [{{method: pca, dim: -1}}]\n"
    )
    res = CliRunner().invoke(main, ["run", str(cfg)])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert res.output.splitlines() == [
        f"error: {cfg}: workers: must be >= 1, got 0",
        f"error: {cfg}: data.normalise: unknown key; did you mean 'data.normalize'?",
        f"error: {cfg}: methods[0]: The 'dim' parameter of PCA must be an int in the range [1, inf) or None. Got -1 "
        f"instead.",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.yaml"]
