"""zero_ref's import graph: which module imports which, and the cycles in it.

The graph is tests/import_graph.py's (what tests/test_import_graph.py checks): every
`import zero_ref...` in the package, at module level, in a function or under
`if TYPE_CHECKING:`. Prints each cycle's modules and a JSON line last:

    python scripts/import_graph.py [--package zero_ref]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
sys.path.insert(0, str(REPO))  # tests/ is a package of the repository, not of zero_ref

from tests.import_graph import folder_graph, import_graph, report  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--package", default=str(REPO / "zero_ref"))
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
