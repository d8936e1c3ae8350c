"""Sphinx configuration of gpuml's HTML documentation (``make docs``).

The source folder is the repository root (``sphinx-build -c docs . build/docs``), so that
the pages in ``docs/``, the README and the benchmark results under ``bench/results/`` are
one site: a link from a page to ``../bench/results/<machine>/<table>.md`` is a link to that
table's page, a link to a ``.json``, ``.txt`` or ``.png`` file there a download, exactly
as the same Markdown reads on a repository browser. ``include_patterns`` keeps everything
else (code, tests, build output) out.

Warnings are errors (``-W --keep-going``) and every cross-reference is checked (``-n``).
A reference must name an object that exists; where that object has no entry in the API
reference, it is rendered as code instead of a link (:func:`resolve_as_code`). Those are
gpuml's internals that public docstrings name (a private module, a tuning constant, the
CPU half of a solver) and other projects' objects (NumPy, PyTorch, ...), whose
inventories intersphinx would have to fetch over the network at build time. A reference
to a name that exists nowhere still fails the build.
"""

import importlib
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

project = "gpuml"
author = "the gpuml developers"
copyright = "gpuml developers, BSD-3-Clause"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "numpydoc",
    "myst_parser",
]

root_doc = "docs/index"
include_patterns = ["README.md", "docs/**", "bench/README.md", "bench/results/**"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}

# Markdown: GitHub's heading anchors, so that links such as ``training.md#lamb-and-lars``
# resolve here as they do on a repository browser.
myst_heading_anchors = 4
myst_enable_extensions = ["dollarmath"]

# Docstrings: numpydoc (scikit-learn's convention); types are documented in the docstrings,
# so signatures carry no annotations; `text` in a docstring is inline code.
default_role = "literal"
autodoc_typehints = "none"
autodoc_member_order = "bysource"
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False

nitpicky = True

html_theme = "alabaster"
html_title = "gpuml"


def has_path(obj, parts) -> bool:
    """Whether ``obj.<parts[0]>.<parts[1]>...`` exists (a class's annotated fields count)."""
    for part in parts:
        if hasattr(obj, part):
            obj = getattr(obj, part)
        elif part == parts[-1] and part in getattr(obj, "__annotations__", {}):
            return True
        else:
            return False
    return True


def exists(target: str, module: str | None, cls: str | None) -> bool:
    """Whether ``target`` names an object: by its full name (``numpy.ndarray``,
    ``gpuml.kernels.krr.Tridiagonal``), as a member of the class whose docstring names it
    (``_auto_lam_losses``), or as a name or dotted tail inside one of gpuml's modules,
    which autodoc has imported by then (``POTRF_BATCHED_MAX``, ``algorithms``)."""
    parts = target.split(".")
    if module and cls and has_path(sys.modules.get(module), [*cls.split("."), *parts]):
        return True
    for cut in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        if has_path(module, parts[cut:]):
            return True
        break
    gpuml_modules = [m for name, m in list(sys.modules.items())
                     if m is not None and (name == "gpuml" or name.startswith("gpuml."))]
    return any(has_path(m, parts) or m.__name__.endswith("." + target) for m in gpuml_modules)


def resolve_as_code(app, env, node, contnode):
    """A Python reference that Sphinx cannot link: rendered as code where the object exists
    (:func:`exists`); left unresolved, so that the build fails, where it does not."""
    if node.get("refdomain") != "py":
        return None
    found = exists(node["reftarget"].lstrip(".~"), node.get("py:module"), node.get("py:class"))
    return contnode if found else None


#: scikit-learn generates a ``set_<method>_request`` method on every estimator (metadata
#: routing); scikit-learn's documentation describes them, and their docstrings link into it.
SKLEARN_REQUEST_SETTER = re.compile(r"set_\w+_request")


def skip_sklearn_request_setters(app, what, name, obj, skip, options):
    return True if SKLEARN_REQUEST_SETTER.fullmatch(name) else None


def setup(app):
    app.connect("missing-reference", resolve_as_code)
    app.connect("autodoc-skip-member", skip_sklearn_request_setters)
