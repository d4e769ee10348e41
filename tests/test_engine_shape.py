"""The stages ask no policy question (issue 32 item 3): no `if` on precision, store or
device, none on ZeRO++ (qwZ, hpZ, qgZ) or hybrid sharding, and stage 3 at most 150 lines.
The counter is scripts/engine_shape.py's; the mutants below show it sees a new branch."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _engine_shape():
    spec = importlib.util.spec_from_file_location("engine_shape", ROOT / "scripts/engine_shape.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SHAPE = _engine_shape()


def test_the_stages_have_no_policy_or_zeropp_branches_and_stage3_fits():
    result = SHAPE.shape(ROOT / "zero_ref" / "engine")
    assert result["branches"] == {name: [] for name in result["stage_lines"]}
    assert result["policy_ifs"] == 0 and result["zeropp_ifs"] == 0
    assert result["stage_lines"]["stage3.py"] <= 150


ZEROPP_TESTS = [
    "self.hpz is not None",  # the branches stage 3 had before the gather policy
    "not self.cfg.quantized_weights",
    "self.cfg.hpz_partition_size == 1",
    "self.qwz",
    "self.cfg.quantized_gradients",  # stage 1's qgZ
    "self.qgz_hops is None",
    "self.cfg.hybrid_shard_size is not None",  # hybrid sharding
    "self.replicas.replicas > 1",
    "self.copy.serves(i) and secondary",
]
FORMS = ["if {}:\n    pass\n", "x = 1 if {} else 2\n", "while {}:\n    pass\n"]


@pytest.mark.parametrize("test", ZEROPP_TESTS)
@pytest.mark.parametrize("form", FORMS)
def test_a_zeropp_or_hybrid_branch_is_counted_in_every_form(test, form):
    source = form.format(test)
    found = SHAPE.policy_branches(source, SHAPE.ZEROPP_WORDS)
    assert found == [(1, test)]
    assert SHAPE.policy_branches(source) == []  # not a precision/store/device question


def test_a_branch_on_neither_is_not_counted():
    source = "if self.trace is not None:\n    pass\nelif not out.size:\n    pass\n"
    assert SHAPE.policy_branches(source, SHAPE.ZEROPP_WORDS) == []


def test_a_new_branch_in_a_stage_file_fails_the_count(tmp_path):
    for path in (ROOT / "zero_ref" / "engine").glob("stage*.py"):
        (tmp_path / path.name).write_text(path.read_text())
    stage3 = tmp_path / "stage3.py"
    stage3.write_text(stage3.read_text() + "\nif cfg.hpz_partition_size != 1:\n    pass\n")
    result = SHAPE.shape(tmp_path)
    assert result["zeropp_ifs"] == 1
    assert result["branches"]["stage3.py"][-1].endswith("cfg.hpz_partition_size != 1")
