"""zero_ref's import graph: which module imports which, and the cycles in it.

Every `import zero_ref...` / `from zero_ref... import ...` in the package counts: at module
level, inside a function (a local import that breaks a cycle at run time still ties the two
modules together) and under `if TYPE_CHECKING:` (it never runs, but a type named from a
module above still sends the reader, and the dependency, upward). A cycle is a strongly
connected component of more than one module (Tarjan). tests/test_import_graph.py checks the
graph; scripts/import_graph.py prints it.
"""

from __future__ import annotations

import ast
from pathlib import Path


def module_name(path: Path, root: Path) -> str:
    """`zero_ref/engine/stage0.py` -> `zero_ref.engine.stage0`; a package is its `__init__`."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_names(tree: ast.AST, this: str, is_package: bool) -> set[str]:
    """Every dotted name this module imports, wherever the import sits (relative ones resolved)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = this.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """module -> the package's modules it imports (a name resolves to the longest module)."""
    root = package_dir.parent
    paths = sorted(package_dir.rglob("*.py"))
    modules = {module_name(p, root): p for p in paths}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        targets = set()
        for dotted in imported_names(tree, name, path.name == "__init__.py"):
            parts = dotted.split(".")
            for n in range(len(parts), 0, -1):
                candidate = ".".join(parts[:n])
                if candidate in modules:
                    targets.add(candidate)
                    break
        # importing a.b.c runs a/__init__ and a/b/__init__ first: those are edges too (the
        # root package's own __init__ runs before anything and is left out)
        for target in list(targets):
            parts = target.split(".")
            targets.update(".".join(parts[:n]) for n in range(2, len(parts)))
        targets.discard(name)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def connect(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(found)


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The same arrows between layers: a module counts as its folder (`zero_ref.engine`), a
    top-level module as itself (`zero_ref.config`)."""

    def layer(module: str) -> str:
        return ".".join(module.split(".")[:2])

    layers: dict[str, set[str]] = {}
    for module, targets in graph.items():
        here = layer(module)
        layers.setdefault(here, set()).update(layer(t) for t in targets if layer(t) != here)
    return layers


def report(package_dir: Path) -> dict:
    """Cycles between modules (what Python runs into) and between folders (the layering)."""
    graph = import_graph(package_dir)
    layers = folder_graph(graph)
    return {
        "modules": len(graph),
        "edges": sum(len(v) for v in graph.values()),
        "module_cycles": cycles(graph),
        "folder_cycles": cycles(layers),
    }
