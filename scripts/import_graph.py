"""zero_ref's import graph: which module imports which, and the cycles in it.

Every `import zero_ref...` / `from zero_ref... import ...` in the package counts, at module
level or inside a function (a local import that breaks a cycle at run time still ties the
two modules together), except under `if TYPE_CHECKING:`. A cycle is a strongly connected
component of more than one module (Tarjan). Prints each cycle's modules and a JSON line last:

    python scripts/import_graph.py [--package zero_ref]
"""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path


def module_name(path: Path, root: Path) -> str:
    """`zero_ref/engine/stage0.py` -> `zero_ref.engine.stage0`; a package is its `__init__`."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_names(tree: ast.AST, this: str, is_package: bool) -> set[str]:
    """Every dotted name this module imports (relative imports resolved), TYPE_CHECKING aside."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking_only(node):
            for child in node.orelse:
                visit(child)
            return
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
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--package", default=str(Path(__file__).resolve().parents[1] / "zero_ref"))
    args = ap.parse_args()
    graph = import_graph(Path(args.package))
    found = report(Path(args.package))
    for kind, key, g in (("module", "module_cycles", graph), ("folder", "folder_cycles", None)):
        g = g if g is not None else folder_graph(graph)
        for component in found[key]:
            inner = [f"{a} -> {b}" for a in component for b in sorted(g[a]) if b in component]
            print(f"{kind} cycle of {len(component)}: " + ", ".join(inner))
    summary = {k: (len(v) if isinstance(v, list) else v) for k, v in found.items()}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
