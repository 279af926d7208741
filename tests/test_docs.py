"""The docs' references cover the code: every config key, learner parameter, command, option and public
name is on its page, and the examples of the API docstrings run. No Sphinx build is needed: the
config reference is the text the build inserts (docs/_ext/metricpipe_docs.py), the CLI page is
sphinx-click over the whole command group, the API page lists names this test compares with the code."""

import doctest
import importlib
import re
import sys
from pathlib import Path

import click
import pytest

import metricpipe
from metricpipe.cli import main
from metricpipe.config import reference
from metricpipe.tasks import registry

DOCS = Path(__file__).parents[1] / "docs"
sys.path.insert(0, str(DOCS / "_ext"))
import metricpipe_docs  # noqa: E402 - the docs' own extension, from docs/_ext

CONFIG_TEXT = metricpipe_docs.config_reference()
KEYS = [r.key for r in reference()]
LEARNERS = metricpipe_docs.learners()


def test_the_config_page_is_the_generated_reference():
    page = (DOCS / "reference" / "config.md").read_text()
    assert metricpipe_docs.MARKER in page.splitlines()
    assert "metricpipe_docs" in (DOCS / "conf.py").read_text()


@pytest.mark.parametrize("key", KEYS)
def test_every_config_key_is_in_the_reference(key):
    assert f"\n| `{key}` |" in CONFIG_TEXT


def _section(method: str, cls: type) -> str:
    """The config reference's section of one learner: from its heading to the next one."""
    start = CONFIG_TEXT.index(f"### `{method}`: {cls.__name__}\n")
    end = CONFIG_TEXT.find("\n### ", start + 1)
    return CONFIG_TEXT[start : end if end > 0 else None]


def test_every_method_has_a_section():
    assert set(registry.BUILTIN) <= {m.split(" ")[0] for m, _ in LEARNERS}
    assert {cls for _, cls in LEARNERS} == set(registry.ESTIMATORS)


@pytest.mark.parametrize(
    "method, cls, name",
    [(m, cls, name) for m, cls in LEARNERS for name in cls().get_params(deep=False)],
    ids=lambda v: v if isinstance(v, str) else getattr(v, "__name__", None),
)
def test_every_learner_parameter_is_described_in_the_reference(method, cls, name):
    row = next((line for line in _section(method, cls).splitlines() if line.startswith(f"| `{name}` |")), None)
    assert row is not None, f"{cls.__name__}.{name} is not in the config reference"
    cells = re.split(r"(?<!\\)\|", row)[1:-1]  # | parameter | accepts | default | description |
    assert len(cells) == 4 and cells[3].strip(), f"{cls.__name__}'s docstring does not describe {name!r}"


def test_a_learner_entry_may_point_to_another_class_for_its_description():
    """``a, b : as :class:`NCMML``` takes NCMML's descriptions (NCMC documents its SGD parameters so)."""
    docs = metricpipe_docs.parameter_docs(registry.NCMC)
    assert docs["lr"].startswith("As NCMML's.") and "rows of unit RMS norm" in docs["lr"]


def _commands(group: click.Group, path: str = "metricpipe"):
    """(path, command) of every command under ``group``, nested groups included."""
    for name in group.list_commands(click.Context(group)):
        cmd = group.get_command(click.Context(group), name)
        yield f"{path} {name}", cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, f"{path} {name}")


COMMANDS = list(_commands(main))


def test_the_cli_page_is_sphinx_click_over_every_command():
    """sphinx-click documents a group with ``:nested: full`` down to every option of every command,
    unless the directive names a subset (``:commands:``) or a command or option is hidden."""
    page = (DOCS / "reference" / "cli.md").read_text()
    directives = re.findall(r"^\.\. click:: (\S+)\n((?:   :.*\n)*)", page, re.M)
    assert [d[0] for d in directives] == ["metricpipe.cli:main"]
    options = dict(re.findall(r"   :([\w-]+):\s*(.*)", directives[0][1]))
    assert options.get("nested") == "full" and "commands" not in options
    assert "sphinx_click" in (DOCS / "conf.py").read_text()
    assert len(COMMANDS) >= 14  # run, demo, stage, inspect, models, ... (the walk reaches them all)


@pytest.mark.parametrize("path, cmd", COMMANDS, ids=[p for p, _ in COMMANDS])
def test_every_command_and_option_is_shown_in_the_cli_reference(path, cmd):
    assert not cmd.hidden, f"{path} is hidden: sphinx-click leaves it out of the reference"
    hidden = [p.name for p in cmd.params if getattr(p, "hidden", False)]
    assert not hidden, f"{path}: option(s) {hidden} are hidden: sphinx-click leaves them out of the reference"


API_PAGE = (DOCS / "reference" / "api.md").read_text()
API_NAMES = re.findall(r"^   ((?:\w+\.)*\w+)$", API_PAGE, re.M)


@pytest.mark.parametrize("name", metricpipe.__all__)
def test_every_public_name_is_on_the_api_page(name):
    assert name in API_NAMES


def _api_object(name: str):
    module, _, attr = f"metricpipe.{name}".rpartition(".")
    return getattr(importlib.import_module(module), attr)


def test_the_api_page_names_objects_that_exist():
    assert len(API_NAMES) >= len(metricpipe.__all__)
    for name in API_NAMES:
        assert _api_object(name) is not None


def test_the_examples_of_the_api_docstrings_run():
    """The ``Examples`` sections of what the API page lists, run as doctests: a stale example fails."""
    finder, runner = doctest.DocTestFinder(recurse=False), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    tried = set()
    for name in API_NAMES:
        obj = _api_object(name)
        for test in finder.find(obj, name, globs={}):
            if test.examples and id(test.docstring) not in tried:
                tried.add(id(test.docstring))
                runner.run(test)
    assert runner.summarize(verbose=False).failed == 0
    assert len(tried) >= 3  # PCA, NCMML, config.reference at least
