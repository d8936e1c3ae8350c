"""The package is a tree of layers: no import circle, nothing imports a layer above it,
no private name crosses a package, no module is longer than :data:`MAX_LINES`
(:data:`MAX_LINES_IN` its package).

Every ``import`` of every module under gpuml/ counts, the lazy ones inside functions
included (they are circles all the same, only deferred). The layers, lowest first, are
:data:`LAYERS`; a module may import its own layer and those below.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpuml"

#: Lowest first. A module belongs to the first entry its dotted name starts with.
LAYERS = [
    ("gpuml._backend", "gpuml._validation", "gpuml._progress", "gpuml.errors"),
    ("gpuml.pairwise", "gpuml.kernels"),
    ("gpuml.partition", "gpuml.routing"),
    ("gpuml.distributed",),
    ("gpuml.pipeline",),
    ("gpuml.estimators",),
    ("gpuml.optim",),
    ("gpuml.training",),
    ("gpuml.precompile", "gpuml"),
]

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


def _layer(name: str) -> int:
    for k, prefixes in enumerate(LAYERS):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return k
    raise AssertionError(f"{name}: in no layer of tests/test_layout.py")


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


def test_no_module_imports_a_layer_above_it():
    modules, edges = _graph()
    upward = [f"{a} -> {b} (line {line})" for a, targets in edges.items()
              for b, line in targets.items()
              if b != "gpuml" and _layer(b) > _layer(a)]
    assert not upward, "imports of a higher layer:\n" + "\n".join(upward)


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
