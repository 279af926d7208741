"""The layer contract of STYLE.md, checked on the source (an import-linter contract would cover only
the imports; the second half needs the AST):

1. tasks/ is pure: it never imports the orchestration layer (metricpipe outside metricpipe.tasks),
   Dask, Zarr, fsspec, xarray, click, h5py or logging, and does no file I/O.
   Inside tasks/, no module imports another's private (``_name``) names, no import of a metricpipe
   module hides in a function unless its line says why (a measured import cost), and the modules'
   imports form no cycle.
2. pipeline/ holds no learning: it defines no function whose name speaks of a gradient, a loss, a
   step or an SGD; it calls no ``.step(``/``.partial_fit(``-style update of a learner's internal
   state; and from the learners' modules (baselines, ncmml, nml, slne, slem, sparse) it uses only
   the exported estimator classes and data-selection or validation helpers (``check_*``,
   ``sample_*``, ``stratified_*``, ``training_*``, ``negative_*``, ``pool_*``) and module-level
   ``fit_*`` entry points (an SL-DE member), never their kernels
   (MetricSGD, PairSGD, triplet_update, class_kmeans, ...). Learning maths and loops therefore
   live in tasks/.
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
FORBIDDEN = {"dask", "distributed", "zarr", "fsspec", "xarray", "click", "h5py", "logging", "pipeline"}
TASKS = sorted(ROOT.joinpath("tasks").rglob("*.py"))   # the learner packages (ncmml/, nml/, ...) too
PIPELINE = sorted(ROOT.joinpath("pipeline").rglob("*.py"))
LEARNER_MODULES = {"baselines", "ncmml", "nml", "slne", "slem", "sparse"}
LEARNING_WORDS = ("grad", "loss", "sgd", "step", "epoch")
HELPERS = ("check_", "sample_", "stratified_", "training_", "negative_", "pool_", "fit_")


def _allowed(name: str) -> bool:
    from metricpipe.tasks.registry import ESTIMATORS
    return name in {c.__name__ for c in ESTIMATORS} or name.startswith(HELPERS)


def _imports(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, None
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                yield node.module, a.name


def _module_name(path: Path) -> str:
    """metricpipe.tasks.ncmml.sgd for tasks/ncmml/sgd.py, metricpipe.tasks.ncmml for its __init__.py."""
    parts = path.relative_to(ROOT / "tasks").with_suffix("").parts
    return ".".join(("metricpipe", "tasks", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def _imports_by_scope(tree):
    """(import node, inside a function) for every import of the module."""
    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_function
            yield from visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))
    yield from visit(tree, False)


def _tasks_edges(path: Path, modules: set) -> set:
    """The tasks modules ``path`` imports at its top level (``from metricpipe.tasks import knn``: the module
    knn; ``from metricpipe.tasks.ncmml import NCMML``: the package ncmml)."""
    out = set()
    for node, in_function in _imports_by_scope(ast.parse(path.read_text())):
        if in_function:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in modules}
        elif node.module and node.level == 0 and node.module in modules:
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules
            out |= subs or {node.module}
    return out


def _cycle(graph: dict) -> list | None:
    """One import cycle of ``graph`` (module -> the modules it imports) as a list of modules, or None."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        state[m] = "done"
        stack.pop()
        return None

    return next((c for m in sorted(graph) if m not in state and (c := visit(m))), None)


@pytest.mark.parametrize("path", TASKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_tasks_modules_import_nothing_from_the_orchestration_layer(path):
    tree = ast.parse(path.read_text())
    bad = set()
    for module, _ in _imports(tree):
        top = module.split(".")[0]
        if top in FORBIDDEN or (top == "metricpipe" and not module.startswith("metricpipe.tasks")):
            bad.add(module)
    assert not bad, f"{path.name} imports {sorted(bad)}"
    assert "open(" not in path.read_text(), f"{path.name} does I/O"


@pytest.mark.parametrize("path", TASKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_tasks_modules_import_no_private_name_and_import_metricpipe_at_their_top(path):
    lines = path.read_text().splitlines()
    for node, in_function in _imports_by_scope(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("metricpipe"):
            private = [a.name for a in node.names if a.name.startswith("_")]
            assert not private, f"{path.name} line {node.lineno} imports {private} from {node.module}: give it a public name"
        named = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
        if in_function and any(n.startswith("metricpipe") for n in named):
            assert "#" in lines[node.lineno - 1], \
                f"{path.name} line {node.lineno} imports {named[0]} in a function: move it to the top (or say why)"


def test_tasks_modules_import_no_cycle():
    modules = {_module_name(p): p for p in TASKS}
    graph = {m: _tasks_edges(p, set(modules)) for m, p in modules.items()}
    assert "metricpipe.tasks.ncmml.sgd" in graph["metricpipe.tasks.ncmml.estimators"] | graph[
        "metricpipe.tasks.ncmml.learner"]
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph))}"


@pytest.mark.parametrize("source, message", [
    ("from metricpipe.tasks.ncmml.objectives import _helper\n", r"imports \['_helper'\] from"),
    ("def f():\n    from metricpipe.tasks import knn\n    return knn\n", "imports metricpipe.tasks in a function"),
])
def test_the_tasks_import_checks_catch_a_private_or_hidden_import(tmp_path, source, message):
    bad = tmp_path / "bad_kernel.py"
    bad.write_text(source)
    with pytest.raises(AssertionError, match=message):
        test_tasks_modules_import_no_private_name_and_import_metricpipe_at_their_top(bad)
    bad.write_text(source.replace("_helper", "helper").replace("knn\n    return", "knn  # numba: 0.3 s\n    return"))
    test_tasks_modules_import_no_private_name_and_import_metricpipe_at_their_top(bad)


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize("path", PIPELINE, ids=lambda p: str(p.relative_to(ROOT)))
def test_pipeline_modules_hold_no_training_loop_or_gradient(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert not any(w in node.name.lower() for w in LEARNING_WORDS), \
                f"{path.name} defines {node.name}(): learning belongs to an estimator in tasks/"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            assert node.func.attr not in ("step", "partial_fit"), \
                f"{path.name} line {node.lineno} drives a learner's update itself"
    learner_aliases = set()
    for module, name in _imports(tree):
        parts = module.split(".")
        if parts[:2] == ["metricpipe", "tasks"] and len(parts) >= 3 and parts[2] in LEARNER_MODULES:
            assert name is None or _allowed(name), \
                f"{path.name} imports {name} from {module}: use the estimator class"
        if module == "metricpipe.tasks" and name in LEARNER_MODULES:
            learner_aliases.add(name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in learner_aliases:
            assert _allowed(node.attr), \
                f"{path.name} line {node.lineno} uses {node.value.id}.{node.attr}: use the estimator class"


def test_the_contracts_see_every_module():
    assert len(TASKS) >= 15 and len(PIPELINE) >= 20


@pytest.mark.parametrize("source, message", [
    ("from metricpipe.tasks.ncmml import MetricSGD\n", "imports MetricSGD"),
    ("from metricpipe.tasks.ncmml.sgd import MetricSGD\n", "imports MetricSGD"),
    ("from metricpipe.tasks import nml\n\ndef f(L):\n    return nml.PairSGD(L)\n", "uses nml.PairSGD"),
    ("def train(sgd, X):\n    sgd.step(X)\n", "drives a learner's update"),
    ("def gradient(W):\n    return W\n", "defines gradient"),
])
def test_the_learning_check_catches_a_training_loop(tmp_path, source, message):
    """The rule is not vacuous: a pipeline module with a kernel, an update or a gradient fails it."""
    bad = tmp_path / "bad_train.py"
    bad.write_text(source)
    with pytest.raises(AssertionError, match=message):
        test_pipeline_modules_hold_no_training_loop_or_gradient(bad)
