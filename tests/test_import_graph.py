"""Imports run downward only: the package's import graph has no cycle, between modules or
between folders, and every import goes down the declared layers (docs/architecture.md).

The graph is tests/import_graph.py's (scripts/import_graph.py prints it): every
`import zero_ref...` at module level, in a function (a local import still ties two modules
together) or under `if TYPE_CHECKING:` (a type named from above is a dependency upward too),
and the package __init__s that importing a submodule runs.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from tests import import_graph as GRAPH_SCRIPT

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "zero_ref"

# The layers, bottom to top. A layer is a folder of the package or a module at its root
# (tests/import_graph.py's folder_graph). A module may import its own layer and the
# layers below it, never one above, nor one beside it in the same tier.
LAYERS: list[tuple[str, ...]] = [
    ("layout",),  # who owns which bytes: pure integer math
    # each imports nothing of the package outside itself:
    ("runtime", "io", "numerics"),
    ("zero_ref",),  # the package __init__: __version__, the thread budget (runtime.threads)
    ("config",),  # every frozen config, validated once
    ("formulas",),  # closed forms from integers: bytes held, bytes moved, a step's time
    ("optim",),  # the update phase's kernels, each beside its NumPy twin (and CUDA's)
    ("gpu",),  # device arrays and copies, the device's placement and compute policies
    ("comm",),  # the only mpi4py importer: host and device (staged) collectives
    ("models",),  # units with hand-written backward, on NumPy or the device's module
    ("oracle",),  # what one process holding everything computes, and fast mode's bound
    ("check",),  # another framework's run against the single-rank math (no MPI, torch optional)
    ("offload",),  # ZeRO-Infinity's NVMe tier
    ("engine",),  # the stage ladder and the policies it plugs in
    ("checkpoint",),  # save, resume, reshard, consolidate
    ("app",),  # the command line, what a run needs around the engine, estimate, consolidate
    ("train",),  # the training command: `python -m zero_ref.train` (app/ does the work)
    ("testing",),  # test and script helpers: nothing above imports them
]

# Edges in files of helper `engine` (issue 22), which removes them; each is xfail(strict)
# below, so the lead deletes its entry here once that branch is merged.
# Edges known to break the rules, each with its reason, while a change that removes them is
# under way; empty now (the last, engine/__init__ re-exporting the stages, went when
# make_engine moved to engine/ladder.py).
LEFT_FOR_ENGINE: dict[tuple[str, str], str] = {}


@functools.cache
def _full_graph() -> dict[str, frozenset[str]]:
    return {m: frozenset(t) for m, t in GRAPH_SCRIPT.import_graph(PACKAGE).items()}


def _graph(leave_out=LEFT_FOR_ENGINE) -> dict[str, set[str]]:
    """module -> the package modules it imports, the edges in leave_out removed."""
    graph = _full_graph()
    return {m: {t for t in targets if (m, t) not in leave_out} for m, targets in graph.items()}


def _layer(module: str) -> str:
    """zero_ref.engine.stage0 -> "engine"; zero_ref.config -> "config"; the root -> "zero_ref"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _tier() -> dict[str, int]:
    return {layer: i for i, tier in enumerate(LAYERS) for layer in tier}


def _upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import into a layer above its module's, or into another layer of its tier."""
    tier = _tier()
    return sorted(
        f"{module} -> {target} ({_layer(module)} imports {_layer(target)})"
        for module, targets in graph.items()
        for target in targets
        if _layer(target) != _layer(module) and tier[_layer(target)] >= tier[_layer(module)]
    )


def test_every_layer_of_the_package_is_declared_once():
    declared = [layer for tier in LAYERS for layer in tier]
    assert len(declared) == len(set(declared))
    assert set(declared) == {_layer(m) for m in _graph()}


def test_docs_architecture_lists_the_same_layers_in_the_same_order():
    text = (ROOT / "docs/architecture.md").read_text()
    table = text[text.index("## Layers") :].split("\n## ")[0]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    rows.insert(2, "`zero_ref`")  # the row "the package `__init__`"
    listed = [name for row in rows for name in re.findall(r"`(\w+)`", row)]
    assert listed == [layer for tier in LAYERS for layer in tier]


def test_an_import_counts_wherever_it_sits():
    """At module level, in a function, under TYPE_CHECKING, relative: each is an edge."""
    source = """
from typing import TYPE_CHECKING
import zero_ref.layout.flat
if TYPE_CHECKING:
    from zero_ref.engine.memory import MemoryLedger
def late():
    from zero_ref.gpu import cpu_offload
    from ..comm.ledger import CommLedger
"""
    names = GRAPH_SCRIPT.imported_names(ast.parse(source), "zero_ref.offload.nvme", False)
    for name in ("zero_ref.layout.flat", "zero_ref.engine.memory", "zero_ref.gpu.cpu_offload"):
        assert name in names
    assert "zero_ref.comm.ledger.CommLedger" in names


def test_no_module_imports_itself_in_a_circle():
    assert GRAPH_SCRIPT.cycles(_graph()) == []


def test_no_folder_imports_itself_in_a_circle():
    assert GRAPH_SCRIPT.cycles(GRAPH_SCRIPT.folder_graph(_graph())) == []


def test_every_import_runs_down_the_layers():
    assert _upward_imports(_graph()) == []


def test_nothing_outside_testing_imports_testing():
    importers = [
        f"{module} -> {target}"
        for module, targets in _graph().items()
        for target in targets
        if _layer(target) == "testing" and _layer(module) != "testing"
    ]
    assert importers == []


def test_the_edges_left_for_engine_still_exist():
    """An entry of LEFT_FOR_ENGINE that no longer is an edge is stale: delete it."""
    full = _graph(leave_out={})
    assert [edge for edge in LEFT_FOR_ENGINE if edge[1] not in full[edge[0]]] == []


def _left_for_engine_params():
    for edge, why in sorted(LEFT_FOR_ENGINE.items()):
        xfail = pytest.mark.xfail(strict=True, reason=why)
        yield pytest.param(edge, id=f"{edge[0]}->{edge[1]}", marks=xfail)


@pytest.mark.parametrize("edge", list(_left_for_engine_params()))
def test_an_edge_left_for_engine_is_gone(edge):
    """Fails (as expected) while helper engine's branch is not merged; once it is, each
    passes, strict xfail turns that into a failure, and the lead deletes the entry."""
    graph = _graph(leave_out={})
    assert edge[1] not in graph[edge[0]]
