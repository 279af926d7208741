"""The layer contract of STYLE.md, checked on the source (the import-linter contracts in pyproject.toml
cover the imports; the second half needs the AST). The shape of the modules (no cycle, no private
import, short functions) is tests/test_structure.py's:

1. tasks/ is pure: it never imports the orchestration layer (metricpipe outside metricpipe.tasks),
   Dask, Zarr, fsspec, xarray, click, h5py or logging, and does no file I/O.
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
TASKS = sorted(ROOT.joinpath("tasks").rglob("*.py"))  # the learner packages (ncmml/, nml/, ...) too
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


@pytest.mark.parametrize("path", PIPELINE, ids=lambda p: str(p.relative_to(ROOT)))
def test_pipeline_modules_hold_no_training_loop_or_gradient(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert not any(w in node.name.lower() for w in LEARNING_WORDS), (
                f"{path.name} defines {node.name}(): learning belongs to an estimator in tasks/"
            )
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            assert node.func.attr not in ("step", "partial_fit"), (
                f"{path.name} line {node.lineno} drives a learner's update itself"
            )
    learner_aliases = set()
    for module, name in _imports(tree):
        parts = module.split(".")
        if parts[:2] == ["metricpipe", "tasks"] and len(parts) >= 3 and parts[2] in LEARNER_MODULES:
            assert name is None or _allowed(name), f"{path.name} imports {name} from {module}: use the estimator class"
        if module == "metricpipe.tasks" and name in LEARNER_MODULES:
            learner_aliases.add(name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in learner_aliases:
            assert _allowed(node.attr), (
                f"{path.name} line {node.lineno} uses {node.value.id}.{node.attr}: use the estimator class"
            )


def test_the_contracts_see_every_module():
    assert len(TASKS) >= 15 and len(PIPELINE) >= 20


@pytest.mark.parametrize(
    "source, message",
    [
        ("from metricpipe.tasks.ncmml import MetricSGD\n", "imports MetricSGD"),
        ("from metricpipe.tasks.ncmml.sgd import MetricSGD\n", "imports MetricSGD"),
        ("from metricpipe.tasks import nml\n\ndef f(L):\n    return nml.PairSGD(L)\n", "uses nml.PairSGD"),
        ("def train(sgd, X):\n    sgd.step(X)\n", "drives a learner's update"),
        ("def gradient(W):\n    return W\n", "defines gradient"),
    ],
)
def test_the_learning_check_catches_a_training_loop(tmp_path, source, message):
    """The rule is not vacuous: a pipeline module with a kernel, an update or a gradient fails it."""
    bad = tmp_path / "bad_train.py"
    bad.write_text(source)
    with pytest.raises(AssertionError, match=message):
        test_pipeline_modules_hold_no_training_loop_or_gradient(bad)
