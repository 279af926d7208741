"""Every command's --help as a first-hour user reads it: each option described, an example that
parses, and no reST or markdown markup left raw."""

import re
import shlex

import click
import pytest
from click.testing import CliRunner

from metricpipe.cli import main

COMMANDS = sorted(main.commands)
# ``code``, `code`, **bold**, :role:`x`, a directive (.. note::)
MARKUP = re.compile(r"``|`|\*\*|:\w+:`|^\s*\.\. \w+::", re.M)


def test_the_tree_has_the_commands_the_readme_lists():
    assert {"run", "demo", "models", "evaluate", "synth"} <= set(COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_every_option_is_described(name):
    options = [p for p in main.commands[name].params if isinstance(p, click.Option)]
    assert [o.name for o in options if not (o.help or "").strip()] == []


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_shows_an_example_that_parses(name):
    cmd = main.commands[name]
    out = CliRunner().invoke(main, [name, "--help"]).output
    examples = [line.strip() for line in out.splitlines() if line.strip().startswith(f"metricpipe {name}")]
    assert examples, f"metricpipe {name} --help shows no example"
    for line in examples:
        cmd.make_context(name, shlex.split(line)[2:])  # a renamed or removed option fails here


@pytest.mark.parametrize("name", [None, *COMMANDS])
def test_help_has_no_raw_markup(name):
    out = CliRunner().invoke(main, ["--help"] if name is None else [name, "--help"]).output
    assert MARKUP.findall(out) == []
