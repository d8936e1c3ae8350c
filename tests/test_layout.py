"""The package is a graph of packages: no import circle, a package imports only the packages
:data:`ALLOWED_IMPORTS` allows it, nothing inside the package imports the top-level ``gpuml``,
no private name crosses a package, no module is longer than :data:`MAX_LINES`
(:data:`MAX_LINES_IN` its package).

Every ``import`` of every module under gpuml/ counts, the lazy ones inside functions
included (they are circles all the same, only deferred).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpuml"

#: What every part of the library may use: the array seam, input checks, progress, errors.
_BASE = {"gpuml._backend", "gpuml._validation", "gpuml._progress", "gpuml.errors"}
#: The kernel methods' computation, below the partitioned fit.
_COMPUTE = {"gpuml.kernels", "gpuml.partition", "gpuml.routing"}

#: Which packages (or top-level modules) each may import besides itself. A module belongs to
#: the longest entry its dotted name equals or starts with (``gpuml`` alone: its
#: ``__init__``, the public front). ``optim`` and ``training`` stand beside the kernel
#: methods: PyTorch tools that use none of their packages (and none of theirs use them).
ALLOWED_IMPORTS = {
    "gpuml._backend": set(),
    "gpuml._progress": set(),
    "gpuml.errors": set(),
    "gpuml._validation": {"gpuml._backend"},
    # the kernel functions (kernels.pairwise) and the solvers that evaluate them
    "gpuml.kernels": _BASE,
    "gpuml.partition": _BASE | {"gpuml.kernels"},
    "gpuml.routing": _BASE | {"gpuml.kernels", "gpuml.partition"},
    "gpuml.distributed": _BASE | _COMPUTE,
    "gpuml.pipeline": _BASE | _COMPUTE | {"gpuml.distributed"},
    "gpuml.estimators": _BASE | _COMPUTE | {"gpuml.distributed", "gpuml.pipeline"},
    "gpuml.optim": {"gpuml.errors"},
    "gpuml.training": {"gpuml.errors", "gpuml.optim"},
    # the install-time compiler warms every package that compiles
    "gpuml.precompile": {"gpuml.kernels", "gpuml.estimators", "gpuml.optim"},
    "gpuml": {"gpuml.errors", "gpuml.estimators"},
}

#: The most lines a module may have: a longer one holds more than one idea.
MAX_LINES = 800
#: ... and in the packages of the estimators and of their fit, which read as the papers do.
MAX_LINES_IN = {"estimators": 600, "pipeline": 600}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _imports(path: Path):
    """``(module imported, names taken from it, line)`` for every import of gpuml code."""
    name = _module_name(path)
    package = _package_of(name, path)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("gpuml"):
                    yield alias.name, [], node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("gpuml"):
                continue
            names = []
            for n in (a.name for a in node.names):
                # ``from package import module``: an import of the submodule alone
                sub = PACKAGE.parent / (target.replace(".", "/") + "/" + n)
                if sub.with_suffix(".py").exists() or (sub / "__init__.py").exists():
                    yield f"{target}.{n}", [], node.lineno
                else:
                    names.append(n)
            if names:
                yield target, names, node.lineno


def _modules():
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(target: str, modules) -> str:
    """The module of ``target`` (a module or a name inside one)."""
    while target not in modules and "." in target:
        target = target.rpartition(".")[0]
    return target


def _graph():
    modules = _modules()
    edges = {}
    for name, path in modules.items():
        for target, _, line in _imports(path):
            target = _resolve(target, modules)
            if target != name and target in modules:
                edges.setdefault(name, {}).setdefault(target, line)
    return modules, edges


def _package(name: str) -> str:
    """The entry of :data:`ALLOWED_IMPORTS` that module ``name`` belongs to."""
    matches = [p for p in ALLOWED_IMPORTS if name == p or name.startswith(p + ".")]
    if not matches:
        raise AssertionError(f"{name}: in no package of ALLOWED_IMPORTS (tests/test_layout.py)")
    return max(matches, key=len)


def _top_package(name: str) -> str:
    """The package a module belongs to for privacy: gpuml.<first part>."""
    parts = name.split(".")
    return ".".join(parts[:2])


def test_no_import_circle():
    modules, edges = _graph()
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in modules:
        if v not in index:
            visit(v)
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_allowed_imports_name_the_packages_there_are():
    modules = _modules()
    named = set(ALLOWED_IMPORTS).union(*ALLOWED_IMPORTS.values())
    assert named <= set(modules), f"not in gpuml/: {sorted(named - set(modules))}"


def test_every_import_is_one_the_graph_allows():
    modules, edges = _graph()
    forbidden = [f"{a} -> {b} (line {line})" for a, targets in edges.items()
                 for b, line in targets.items()
                 if _package(b) != _package(a) and _package(b) not in ALLOWED_IMPORTS[_package(a)]]
    assert not forbidden, "imports ALLOWED_IMPORTS does not allow:\n" + "\n".join(forbidden)


def test_nothing_inside_the_package_imports_the_top_level_gpuml():
    """``gpuml/__init__.py`` is the public front: it imports every estimator, so a module
    that took a name from it (``import gpuml``, ``from gpuml import X`` or ``from .. import X``
    with X not a submodule) would depend on all of them and on the order of imports.
    Submodules are imported by name (``from gpuml.optim import _common``,
    ``from gpuml import errors``, ``import gpuml.errors``)."""
    found = [f"{name}:{line} imports gpuml {names or ''}"
             for name, path in _modules().items() if name != "gpuml"
             for target, names, line in _imports(path) if target == "gpuml"]
    assert not found, "imports of the top-level package:\n" + "\n".join(found)


def test_no_private_name_crosses_a_package():
    modules = _modules()
    crossing = []
    for name, path in modules.items():
        for target, names, line in _imports(path):
            target_module = _resolve(target, modules)
            if _top_package(target_module) == _top_package(name):
                continue
            # gpuml._backend, _validation, _progress: the whole library's own seams
            private_module = any(part.startswith("_") for part in target.split(".")[2:])
            private_names = [n for n in names if n.startswith("_")]
            if private_module or private_names:
                crossing.append(f"{name}:{line} imports {target} {private_names or ''}")
    assert not crossing, "private names across packages:\n" + "\n".join(crossing)


def _max_lines(path: Path) -> int:
    return MAX_LINES_IN.get(path.relative_to(PACKAGE).parts[0], MAX_LINES)


def test_no_module_is_too_long():
    long = [f"{path.relative_to(ROOT)}: {n} lines, more than {_max_lines(path)}"
            for path in sorted(PACKAGE.rglob("*.py"))
            if (n := len(path.read_text().splitlines())) > _max_lines(path)]
    assert not long, "modules too long:\n" + "\n".join(long)
