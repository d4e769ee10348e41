"""How the engine reads: lines per stage file, and the `if`s in stage code that ask which
precision, store or device they run under, or which ZeRO++ or hybrid option is on (what
a policy chosen once should answer: engine/precision.py, stores.py, unit_gather.py, ...).

A branch counts as a policy if when its test names a policy word: precision, mixed,
fp16/bf16/half, a dtype, the loss scale or scaler, master weights, a 16-bit scratch or
wire buffer, offload, NVMe, swap, a device, host or GPU; as a ZeRO++ if when it names
qwZ, hpZ, qgZ, quantized, a secondary copy, a partition size, hybrid sharding or its
replicas, or qgZ's hops. `if`, `elif`, `while` and conditional expressions all count.
JSON line last:

    python scripts/engine_shape.py [--engine zero_ref/engine]
"""

from __future__ import annotations

import argparse
import ast
import json
import re
from pathlib import Path

POLICY_WORDS = re.compile(
    r"precision|mixed|fp16|bf16|half|dtype|scale|master|scratch|wire|offload|nvme|swap|device|host|gpu",
    re.IGNORECASE,
)
ZEROPP_WORDS = re.compile(
    r"qwz|hpz|qgz|zeropp|quantiz|secondary|partition_size|hybrid|replica|hops", re.IGNORECASE
)


def _names(node: ast.AST) -> list[str]:
    """Every identifier and attribute name in an expression, and its string constants."""
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.append(n.id)
        elif isinstance(n, ast.Attribute):
            out.append(n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            out.append(n.value)
    return out


def policy_branches(source: str, words: re.Pattern = POLICY_WORDS) -> list[tuple[int, str]]:
    """(line, test) of each branch whose test names one of `words`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        branch = isinstance(node, (ast.If, ast.While, ast.IfExp))
        if branch and any(words.search(name) for name in _names(node.test)):
            found.append((node.lineno, ast.unparse(node.test)))
    return sorted(found)


def stage_files(engine: Path) -> list[Path]:
    return sorted(engine.glob("stage*.py"))


def shape(engine: Path) -> dict:
    files = {}
    for path in stage_files(engine):
        source = path.read_text()
        files[path.name] = {
            "lines": len(source.splitlines()),
            "policy_ifs": [f"{line}: {test}" for line, test in policy_branches(source)],
            "zeropp_ifs": [
                f"{line}: {test}" for line, test in policy_branches(source, ZEROPP_WORDS)
            ],
        }
    return {
        "stage_lines": {name: f["lines"] for name, f in files.items()},
        "policy_ifs": sum(len(f["policy_ifs"]) for f in files.values()),
        "zeropp_ifs": sum(len(f["zeropp_ifs"]) for f in files.values()),
        "branches": {name: f["policy_ifs"] + f["zeropp_ifs"] for name, f in files.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(__file__).resolve().parents[1] / "zero_ref" / "engine"
    ap.add_argument("--engine", default=str(default))
    result = shape(Path(ap.parse_args().engine))
    for name, branches in result["branches"].items():
        print(f"{name}: {result['stage_lines'][name]} lines, {len(branches)} policy/ZeRO++ ifs")
        for b in branches:
            print(f"    {b}")
    print(json.dumps({k: v for k, v in result.items() if k != "branches"}))


if __name__ == "__main__":
    main()
