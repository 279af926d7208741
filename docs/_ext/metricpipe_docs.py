"""The docs' generated parts, read from the code when the site is built so that they cannot drift.

The config reference (``reference/config.md``): every config key and every learner's parameters.

- the keys: :func:`metricpipe.config.reference` (each section's dataclass fields: key, type, default,
  description);
- the learners: each method of :data:`metricpipe.tasks.registry.BUILTIN` (and the classes a parameter
  switches to, :data:`~metricpipe.tasks.registry.VARIANTS`): its parameters from ``get_params()``, what
  each accepts from ``_parameter_constraints`` (the checks ``fit`` and a config run), its default, and
  its description from the class's numpydoc ``Parameters`` section.

The layers (``contributing.md``): the import-linter contracts of ``pyproject.toml``, which
``lint-imports`` enforces.

Each is a function returning Markdown (:func:`config_reference`, :func:`layers`); the Sphinx extension
puts it in place of its marker line (:data:`GENERATED`). ``tests/test_docs.py`` checks the text
without Sphinx.
"""

import inspect
import re
from pathlib import Path

import tomllib

from metricpipe import config
from metricpipe.tasks import registry

MARKER = "% metricpipe-docs: config-reference"
PAGE = "reference/config"
LAYERS_MARKER = "% metricpipe-docs: layers"
PYPROJECT = Path(__file__).parents[2] / "pyproject.toml"


def _cell(text: str) -> str:
    """Text for a Markdown table cell: one line, ``|`` escaped, reST roles (:class:`X`) as MyST's."""
    text = re.sub(r":(class|func|meth|attr|data|mod):`", r"{py:\1}`", " ".join(str(text).split()))
    return text.replace("|", "\\|")


def allowed(constraints: list) -> str:
    """What a parameter accepts, in words, from its scikit-learn constraints (``_parameter_constraints``)."""
    from sklearn.utils._param_validation import make_constraint  # deferred: the words scikit-learn's errors use

    words = []
    for c in constraints:
        if c is None:
            words.append("None")
        elif c == "boolean":
            words.append("bool")
        elif c == "random_state":
            words.append("int, RandomState or None")
        elif isinstance(c, type):
            words.append(c.__name__)
        elif hasattr(c, "options"):  # StrOptions / Options: sorted, so the page is the same every build
            words.append("{" + ", ".join(repr(o) for o in sorted(c.options, key=str)) + "}")
        else:
            words.append(str(make_constraint(c)).removeprefix("an ").removeprefix("a "))
    return " or ".join(words)


def parameter_docs(cls: type) -> dict:
    """{name: one-paragraph description} from the ``Parameters`` section of ``cls``'s numpydoc docstring.

    An entry may name several parameters (``a, b : type``); one whose type is ``as :class:`Other```
    (``dim, lr : as :class:`NCMML`.``) takes ``Other``'s descriptions of them, with what follows.
    """
    doc = (cls.__doc__ or "").expandtabs()
    m = re.search(r"^( *)Parameters\n *-{3,}\n(.*?)(?=^ *\w[\w ]*\n *-{3,}\n|\Z)", doc, re.M | re.S)
    if not m:
        return {}
    indent = len(m.group(1))
    entries = []  # (names, type, description lines)
    for line in m.group(2).splitlines():
        body = line[indent:] if not line[:indent].strip() else line.strip()
        if body and not body[0].isspace():  # "name : type" opens an entry
            head, _, kind = body.partition(" : ")
            entries.append(([n.strip() for n in head.split(",")], kind.strip(), []))
        elif body.strip() and entries:
            entries[-1][2].append(body.strip())
    out = {}
    for names, kind, lines in entries:
        text = " ".join(lines)
        other = re.match(r"as (?:in )?:class:`~?([\w.]+)`'?s?[.:,]?\s*(.*)", kind)
        for name in names:
            if other:
                source = _class_named(other.group(1).rpartition(".")[2])
                inherited = parameter_docs(source).get(name, "") if source is not None else ""
                rest = other.group(2).rstrip(".")
                note = f"As {other.group(1)}'s" + (f" ({rest})." if rest else ".")
                out[name] = " ".join(f"{note} {inherited} {text}".split())
            else:
                out[name] = " ".join(text.split())
    return out


def _class_named(name: str) -> type | None:
    return next((cls for cls in registry.ESTIMATORS if cls.__name__ == name), None)


def learners() -> list[tuple[str, type]]:
    """(method, class) of every built-in learner, a variant class after its method's (``slem`` with a
    ``kernel``: :class:`~metricpipe.tasks.slem.KernelSLEM`)."""
    out = []
    for method, cls in registry.BUILTIN.items():
        out.append((method, cls))
        if method in registry.VARIANTS:
            key, classes = registry.VARIANTS[method]
            for variant in dict.fromkeys(classes.values()):
                values = ", ".join(v for v, c in classes.items() if c is variant)
                out.append((f"{method} ({key}: {values})", variant))
    return out


def learner_table(cls: type) -> str:
    """A learner's parameters: name, what it accepts, default, description."""
    docs = parameter_docs(cls)
    rows = ["| parameter | accepts | default | description |", "| --- | --- | --- | --- |"]
    defaults = cls().get_params(deep=False)
    params = {n: defaults[n] for n in inspect.signature(cls.__init__).parameters if n in defaults}  # as written
    if not params:
        return "No parameters.\n"
    for name, default in params.items():
        accepts = allowed(cls._parameter_constraints.get(name, []))
        rows.append(f"| `{name}` | {_cell(accepts)} | `{_cell(repr(default))}` | {_cell(docs.get(name, ''))} |")
    return "\n".join(rows) + "\n"


def _summary(cls: type) -> str:
    return " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())


def config_reference() -> str:
    """The generated part of the config reference page, in Markdown."""
    parts = [
        "## Keys\n",
        "Every key of a run config, section by section (`data.split.test` is `test:` under `split:` "
        "under `data:`). A key left out, or set to `null`, takes its default.\n",
        config.reference_markdown(),
        "## Learner parameters\n",
        "The keys of a `methods:` entry besides `method:` (and `select:`, see "
        "[selection and validation](../guide/selection.md)) are the parameters of its estimator class, "
        "with the same names, defaults and checks in a config and in Python (`{method: ncmml, dim: 32}` "
        "is `NCMML(dim=32)`). A list value trains one model per value, except for a parameter that "
        "takes a list.\n",
    ]
    for method, cls in learners():
        space = cls.search_grid({})
        searched = (
            f" Chosen on the validation split when left unset: {', '.join(f'`{k}`' for k in space)}." if space else ""
        )
        parts += [
            f"### `{method}`: {cls.__name__}\n",
            f"{_summary(cls)} ({{py:class}}`metricpipe.{cls.__name__}`).{searched}\n",
            learner_table(cls),
        ]
    return "\n".join(parts)


def layers(pyproject: Path = PYPROJECT) -> str:
    """The import-linter contracts of ``pyproject.toml`` in words, in Markdown."""
    contracts = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]["contracts"]
    out = []
    for c in contracts:
        if c["type"] == "layers":
            rows = "\n".join(f"{i}. {', '.join(f'`{m.strip()}`' for m in layer.split('|'))}"
                             for i, layer in enumerate(c["layers"], 1))  # fmt: skip
            out.append(f"**{c['name']}** (each layer imports only the layers below it, in `metricpipe`):\n\n{rows}\n")
        elif c["type"] == "forbidden":
            names = ", ".join(f"`{m}`" for m in c["forbidden_modules"])
            sources = ", ".join(f"`{m}`" for m in c["source_modules"])
            out.append(f"**{c['name']}**: {sources} never imports {names}.\n")
        else:
            names = ", ".join(f"`{m}`" for m in c["modules"])
            out.append(f"**{c['name']}** ({c['type']}): {names}.\n")
    return "\n".join(out)


#: {docname: (marker line, the function whose Markdown replaces it)}
GENERATED = {PAGE: (MARKER, config_reference), "contributing": (LAYERS_MARKER, layers)}


def _insert_generated(app, docname: str, source: list) -> None:
    if docname in GENERATED:
        marker, make = GENERATED[docname]
        source[0] = source[0].replace(marker, make())


def _always_outdated(app, env, added, changed, removed) -> list:
    return [d for d in GENERATED if d in env.found_docs]  # the code may have changed: regenerate every build


def _skip_data(app, what, name, obj, skip, options):
    """A class page lists methods; its data attributes are in its docstring's Attributes section."""
    if what == "class" and not (callable(obj) or isinstance(obj, (property, classmethod, staticmethod))):
        return True
    return None


def setup(app):
    app.connect("source-read", _insert_generated)
    app.connect("autodoc-skip-member", _skip_data)
    app.connect("env-get-outdated", _always_outdated)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
