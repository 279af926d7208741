"""The shape of the code, checked on the source: one-way imports (no cycle, no private name taken from
another module, no import inside a function unless a comment says why), learners named only by the
registry and asked, never probed, and modules and functions short enough to read at once."""

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGES = {"pipeline": "metricpipe", "tasks": "metricpipe.tasks"}
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 600, 80


def _modules() -> dict:
    """{dotted name: path} of every module of the two layers."""
    out = {}
    for folder, package in PACKAGES.items():
        for path in sorted(ROOT.joinpath(folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


MODULES = _modules()


def _resolve(name: str, current: str, level: int, is_package: bool) -> str:
    if not level:
        return name
    base = current.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - level + 1]
    return ".".join(base + ([name] if name else []))


def _imports(module: str, path: Path):
    """(imported module, name or None, the import node, inside a function) for each import of ``module``."""
    tree = ast.parse(path.read_text())
    # an import in a function, or under ``if TYPE_CHECKING:`` (annotations only), is not one the module
    # runs when it is imported
    functions = {
        id(n)
        for f in ast.walk(tree)
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
        or (isinstance(f, ast.If) and ast.unparse(f.test).endswith("TYPE_CHECKING"))
        for n in ast.walk(f)
    }
    for node in ast.walk(tree):
        inner = id(node) in functions
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, None, node, inner
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(node.module or "", module, node.level, path.name == "__init__.py")
            for a in node.names:
                # "from package import module" imports that module
                yield (f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target), a.name, node, inner


def _graph() -> dict:
    graph = {}
    for module, path in MODULES.items():
        deps = set()
        for target, _, _, inner in _imports(module, path):
            if not inner and target in MODULES and target != module:
                deps.add(target)
            elif not inner and target.startswith("metricpipe"):  # a name from a package's __init__
                parent = target
                while parent and parent not in MODULES:
                    parent = parent.rpartition(".")[0]
                if parent and parent != module:
                    deps.add(parent)
        graph[module] = deps
    return graph


def _cycles(graph: dict) -> list:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_among_the_modules():
    # a package's __init__ importing its own submodules is how a package exposes them, not a cycle
    graph = {
        m: {d for d in deps if not (MODULES[m].name == "__init__.py" and d.startswith(m + "."))}
        for m, deps in _graph().items()
    }
    assert _cycles(graph) == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_takes_another_module_s_private_names(module):
    bad = [
        f"{name} from {target}"
        for target, name, _, _ in _imports(module, MODULES[module])
        if name
        and name.startswith("_")
        and target.startswith("metricpipe")
        and target != module
        and not name.startswith("__")
    ]
    assert not bad, f"{module} imports {bad}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_an_import_inside_a_function_says_why(module):
    """A metricpipe module imported inside a function needs a comment on that line (a measured import
    cost, a command that starts without scikit-learn); the layering needs none."""
    lines = MODULES[module].read_text().splitlines()
    bad = [
        f"line {node.lineno}"
        for target, _, node, inner in _imports(module, MODULES[module])
        if inner
        and target.startswith("metricpipe")
        and "#" not in lines[node.lineno - 1]
        and "TYPE_CHECKING" not in "".join(lines[max(0, node.lineno - 4) : node.lineno])
    ]
    assert not bad, f"{module}: imports inside functions without a comment saying why: {sorted(set(bad))}"


def _method_names() -> set:
    from metricpipe.tasks.registry import BUILTIN

    return set(BUILTIN)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if not m.startswith("metricpipe.tasks")))
def test_the_pipeline_names_no_learner_and_probes_no_estimator(module):
    """The registry is the one place a learner is named: a method name as a string in pipeline/ is a
    special case of one learner; so is ``hasattr``, which asks an object what it is instead of
    reading what its class declares."""
    tree = ast.parse(MODULES[module].read_text())
    names = _method_names()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            raise AssertionError(f"{module} line {node.lineno} names the learner {node.value!r}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "hasattr":
            raise AssertionError(f"{module} line {node.lineno} probes an object with hasattr")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_and_functions_are_short_enough_to_read(module):
    text = MODULES[module].read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{module}: {len(text.splitlines())} lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            assert n <= MAX_FUNCTION_LINES, f"{module}: {node.name}() is {n} lines"


@pytest.mark.parametrize(
    "source, message",
    [
        ('def f(x):\n    return hasattr(x, "kmeans")\n', "probes an object with hasattr"),
        ('KIND = "ncmml"\n', "names the learner 'ncmml'"),
    ],
)
def test_the_naming_check_catches_a_special_case(tmp_path, monkeypatch, source, message):
    bad = tmp_path / "bad.py"
    bad.write_text(source)
    monkeypatch.setitem(MODULES, "metricpipe.bad", bad)
    with pytest.raises(AssertionError, match=re.escape(message)):
        test_the_pipeline_names_no_learner_and_probes_no_estimator("metricpipe.bad")


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize(
    "source, check, message",
    [
        (
            "from metricpipe.tasks.ncmml.objectives import _helper\n",
            test_no_module_takes_another_module_s_private_names,
            "_helper from metricpipe.tasks.ncmml.objectives",
        ),
        (
            "def f():\n    from metricpipe.tasks import knn\n    return knn\n",
            test_an_import_inside_a_function_says_why,
            "line 2",
        ),
        ("def f():\n" + "    x = 1\n" * 80, test_modules_and_functions_are_short_enough_to_read, "f() is 81 lines"),
    ],
)
def test_the_import_and_size_checks_catch_what_they_forbid(tmp_path, monkeypatch, source, check, message):
    """Each rule is not vacuous: a source that breaks it fails, the same source within it passes."""
    bad = tmp_path / "bad.py"
    bad.write_text(source)
    monkeypatch.setitem(MODULES, "metricpipe.tasks.bad", bad)
    with pytest.raises(AssertionError, match=re.escape(message)):
        check("metricpipe.tasks.bad")
    bad.write_text(
        source.replace("_helper", "helper")
        .replace("knn\n    return", "knn  # numba: 0.3 s\n    return")
        .replace("    x = 1\n" * 80, "    x = 1\n" * 79)
    )
    check("metricpipe.tasks.bad")


def _lint_imports(tree: Path) -> subprocess.CompletedProcess:
    """import-linter's contracts (pyproject.toml) on a copy of the source laid out as installed
    (pipeline/ as metricpipe/, tasks/ inside it): the copy, not an installed package, is what it reads."""
    pkg = tree / "metricpipe"
    if not pkg.exists():
        shutil.copytree(ROOT / "pipeline", pkg, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(ROOT / "tasks", pkg / "tasks", ignore=shutil.ignore_patterns("__pycache__"))
    code = "import sys; from importlinter.cli import lint_imports_command; sys.argv[1:] = [sys.argv[1]]; lint_imports_command()"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [sys.executable, "-c", code, str(ROOT / "pyproject.toml")],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_import_contracts_hold_and_catch_an_upward_import(tmp_path):
    """The layers of pyproject.toml's import-linter contracts hold on the tree; a store module that
    imports the runner (a lower layer importing a higher one) breaks them."""
    kept = _lint_imports(tmp_path)
    assert kept.returncode == 0 and "3 kept, 0 broken" in kept.stdout, kept.stdout[-2000:] + kept.stderr[-2000:]
    with open(tmp_path / "metricpipe" / "store" / "keys.py", "a") as f:
        f.write("\nimport metricpipe.runner\n")
    broken = _lint_imports(tmp_path)
    assert broken.returncode != 0 and "metricpipe.store.keys -> metricpipe.runner" in broken.stdout
