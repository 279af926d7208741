"""The import contract of STYLE.md: tasks/ is pure (NumPy/SciPy in, NumPy out) and never reaches for
the orchestration layer, Dask, storage or the CLI."""
import ast
from pathlib import Path

import pytest

FORBIDDEN = {"pipeline", "dask", "distributed", "zarr", "fsspec", "xarray", "click", "h5py", "logging"}
TASKS = sorted(Path(__file__).parents[1].joinpath("tasks").glob("*.py"))


@pytest.mark.parametrize("path", TASKS, ids=lambda p: p.name)
def test_tasks_modules_import_nothing_from_the_orchestration_layer(path):
    tree = ast.parse(path.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert not imported & FORBIDDEN, f"{path.name} imports {sorted(imported & FORBIDDEN)}"
    assert "open(" not in path.read_text(), f"{path.name} does I/O"


def test_the_contract_sees_every_module():
    assert len(TASKS) >= 10
