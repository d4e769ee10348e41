"""A helper has one home: no module-level function of the package is written out twice,
and no public function name means two things.

Two modules that each define the same body (the same statements on the same argument
names, docstrings and annotations aside) hold a copy that can drift from its original:
the oracle's bucket plan copied the engine's, two `disk_free_bytes` measured the same
disk. Two public functions of one name with different bodies make a reader guess which
one a caller got: there were two `quantized_gather_bytes`, one a qwZ buffer's bytes, the
other a gather's (issue 32). Kernel twins share a name on purpose: a NumPy function and
its Numba or CUDA twin have one signature and one meaning, not one body.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "zero_ref"


def _body_key(fn: ast.FunctionDef) -> str:
    """The function's statements (its docstring left out) and its argument names."""
    body = fn.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return ast.dump(ast.Module(body=body, type_ignores=[])) + repr([a.arg for a in fn.args.args])


def copies(sources: dict[str, str]) -> list[list[str]]:
    """Groups of module-level functions (module:name) whose bodies are the same."""
    by_body: dict[str, list[str]] = defaultdict(list)
    for module, text in sorted(sources.items()):
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef):
                by_body[_body_key(node)].append(f"{module}:{node.name}")
    return [group for group in by_body.values() if len(group) > 1]


# Public names defined in more than one module on purpose, each with its reason.
SHARED_NAMES = {
    "main": "each command's entry point (train, estimate, consolidate, check)",
    "build_parser": "each command's argument parser",
    "embedding_backward": "a kernel and its CUDA twin (models/layers*.py)",
    "first_nonfinite": "a kernel and its CUDA twin (optim/nonfinite*.py)",
    "sumsq_bins": "a kernel and its CUDA twin (optim/gradnorm*.py)",
    "unscale_and_clip": "a kernel and its CUDA twin (optim/gradnorm*.py)",
    "round_into": "the rounding and its CUDA twin (numerics/dtypes.py, numerics/rounding_cuda.py)",
    "default_text": "two meanings (the corpus, a setting's default): the names engineer's",
    "initial_state": "two meanings (loss scale, check's oracle): the names engineer's",
}


def names_defined_twice(sources: dict[str, str]) -> dict[str, list[str]]:
    """Public module-level function name -> the modules defining it, where more than one."""
    where: dict[str, list[str]] = defaultdict(list)
    for module, text in sorted(sources.items()):
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                where[node.name].append(module)
    return {name: modules for name, modules in where.items() if len(modules) > 1}


def _package_sources() -> dict[str, str]:
    return {str(p.relative_to(PACKAGE)): p.read_text() for p in PACKAGE.rglob("*.py")}


def test_copies_finds_a_body_written_twice_under_another_name():
    one = 'def free(folder):\n    """Free bytes."""\n    return shutil.disk_usage(folder).free\n'
    two = "def _free(folder: Path) -> int:\n    return shutil.disk_usage(folder).free\n"
    other = "def free(folder):\n    return shutil.disk_usage(folder).total\n"
    assert copies({"a": one, "b": two, "c": other}) == [["a:free", "b:_free"]]
    assert copies({"a": one, "c": other}) == []


def test_no_function_of_the_package_is_a_copy_of_another():
    assert copies(_package_sources()) == []


def test_names_defined_twice_finds_one_name_with_two_bodies():
    one = "def size(n, block):\n    return n + 4 * (n // block)\n"
    two = "def size(shard, world, lanes, block):\n    return {'send': shard}\n"
    assert names_defined_twice({"a": one, "b": two, "c": "def _size(): pass\n"}) == {
        "size": ["a", "b"]
    }


def test_no_public_function_name_means_two_things():
    twice = names_defined_twice(_package_sources())
    assert sorted(set(twice) - set(SHARED_NAMES)) == []


def test_each_shared_name_is_still_shared():
    """An entry of SHARED_NAMES no longer defined twice is stale: delete it."""
    assert sorted(set(SHARED_NAMES) - set(names_defined_twice(_package_sources()))) == []
