"""Sphinx configuration of metricpipe's docs site.

Built by ``.ci/run`` (and by hand) with warnings as errors:
``sphinx-build -W --keep-going -b html docs docs/_build/html``. The references are generated from
the code at build time: the config keys and the learners' parameters (``_ext/metricpipe_docs.py``),
the CLI (sphinx-click over ``metricpipe.cli:main``) and the API (autosummary + numpydoc); the gallery
(``examples/gallery/plot_*.py``) is executed by sphinx-gallery.
"""

import os
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "_ext"))  # the project's own extension: the generated config reference

import metricpipe  # noqa: E402 - after the path above

os.environ.setdefault("MPLBACKEND", "Agg")  # the gallery draws off screen

project = "metricpipe"
author = "metricpipe developers"
copyright = "metricpipe developers"
release = metricpipe.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "numpydoc",
    "sphinx_click",
    "sphinx_gallery.gen_gallery",
    "metricpipe_docs",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_templates", "**/sg_execution_times.rst", "sg_execution_times.rst"]
templates_path = ["_templates"]

# Markdown pages (MyST): ```{directive} fences, $math$, and anchors for the ## headings so that
# [text](page.md#a-heading) links resolve (and a broken one fails the build)
myst_enable_extensions = ["colon_fence", "deflist", "dollarmath"]
myst_heading_anchors = 3

# The API reference: one page per public object, numpydoc sections (Parameters, Returns, Attributes)
autosummary_generate = True
autosummary_imported_members = True
autodoc_default_options = {"member-order": "groupwise"}
autodoc_typehints = "none"  # numpydoc's sections say the types, with shapes
# the estimator pages list the scikit-learn API a user calls (templates/autosummary/estimator.rst), not
# the pipeline's protocol every learner shares (documented once, on Learner's page)
autosummary_context = {
    "user_methods": [
        "fit", "partial_fit", "fit_pairs", "transform", "predict", "predict_proba",
        "add_centroids", "get_metric",
    ]
}  # fmt: skip
numpydoc_show_class_members = False  # the class template lists the methods once
numpydoc_class_members_toctree = False
numpydoc_attributes_as_param_list = True
numpydoc_xref_param_type = False

# A cross-reference that does not resolve fails the build (with -W)
nitpicky = False

sphinx_gallery_conf = {
    "examples_dirs": str(HERE.parent / "examples" / "gallery"),
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",  # every plot_*.py runs at build time: a stale example fails the build
    "abort_on_example_error": True,
    "download_all_examples": False,
    "remove_config_comments": True,
    "within_subsection_order": "FileNameSortKey",
    "min_reported_time": 1,
    "show_memory": False,
    "matplotlib_animations": False,
    "image_scrapers": ("matplotlib",),
    "reset_modules": ("matplotlib",),
}

html_theme = "pydata_sphinx_theme"
html_title = f"metricpipe {release}"
html_theme_options = {
    "navbar_align": "left",
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
# pages without a section of their own to navigate get the width for their tables
html_sidebars = {
    page: [] for page in ("index", "changelog", "contributing", "benchmarks", "reference/config", "reference/cli")
}
html_static_path = ["_static"]
html_css_files = ["metricpipe.css"]
html_show_sourcelink = False

# numpydoc checks every documented object's docstring: each parameter described (PR01, PR02), a
# Returns section (RT01), a docstring at all (GL08); a failure is a warning, so -W fails the build.
numpydoc_validation_checks = {"GL08", "PR01", "PR02", "RT01"}
