"""The README's Python examples run as written (doctest of every ``>>>`` line)."""

import doctest
from pathlib import Path


def test_readme_python_api_examples_run():
    failures, tried = doctest.testfile(
        str(Path(__file__).parents[1] / "README.md"),
        module_relative=False,
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
    )
    assert tried >= 10 and failures == 0
