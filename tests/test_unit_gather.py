"""Stage 3's gather policies (zero_ref/engine/unit_gather.py), one rank: which one a
config picks, and what each read holds (its key), which decides when a held buffer
serves the next read. Their collectives are test_hpz.py's and test_parity.py's."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from zero_ref.comm.collectives import Comm
from zero_ref.config import ZeroConfig, ZeroPPConfig
from zero_ref.engine.gathered_unit import gathers_by_kind
from zero_ref.engine.memory import MemoryLedger
from zero_ref.engine.placement import HostPlacement
from zero_ref.engine.quantized_gather import QuantizedGather
from zero_ref.engine.secondary_copy import SecondaryCopy
from zero_ref.engine.unit_gather import (
    QuantizedForward,
    SecondaryPartition,
    WorldGather,
    unit_gather_for,
)
from zero_ref.formulas.memory import prefetch_plan
from zero_ref.formulas.unit_order import step_reads
from zero_ref.layout.flat import model_layout
from zero_ref.models.mlp import CharMLP, MLPConfig


def _policy(qwz: bool, hpz: bool):
    place = HostPlacement(MemoryLedger())
    primary = QuantizedForward(QuantizedGather(place, 1, 8, 1, 4)) if qwz else WorldGather()
    if not hpz:
        return primary
    return SecondaryPartition(primary, SecondaryCopy(place, Comm(MPI.COMM_SELF), [8], np.float32))


# (qwZ, hpZ) -> what forward's and backward's reads hold: quantized (True) or full
HOLDS = {
    (False, False): (False, False),
    (True, False): (True, False),  # qwZ: forward's copy is dequantized, backward's full
    (False, True): (False, False),
    (True, True): (True, True),  # hpZ's copy holds forward's dequantized values
}


@pytest.mark.parametrize("qwz, hpz", sorted(HOLDS))
def test_each_read_holds_what_its_policy_gathers(qwz, hpz):
    policy = _policy(qwz, hpz)
    for i in (0, 1, 6):
        assert (policy.key(i, True), policy.key(i, False)) == (
            (i, HOLDS[qwz, hpz][0]),
            (i, HOLDS[qwz, hpz][1]),
        )


@pytest.mark.parametrize("qwz, hpz", sorted(HOLDS))
@pytest.mark.parametrize("grad_accum", [1, 3])
def test_the_count_of_gathers_reads_the_keys_the_policy_gives(qwz, hpz, grad_accum):
    """gathers_by_kind replays the step with the keys its flags give; the same replay
    with the policy's keys counts the same world gathers of each kind."""
    plan = prefetch_plan([8, 8, 8], False, None, None, 0)  # one buffer
    counted = gathers_by_kind(plan, [8, 8, 8], grad_accum, qwz, hpz=hpz)
    policy, held, by_kind = _policy(qwz, hpz), None, {True: [0] * 3, False: [0] * 3}
    copy = set()  # hpZ: the units the secondary copy holds
    for (i, forward), _ in step_reads(3, grad_accum):
        key = policy.key(i, forward)
        if key != held and not (hpz and i in copy):
            by_kind[key[1]][i] += 1
            copy.add(i)
        held = key
    assert (list(counted[0]), list(counted[1])) == (by_kind[False], by_kind[True])


def test_the_config_picks_the_gather_and_only_qwz_allocates_byte_buffers():
    layout = model_layout(CharMLP(MLPConfig(vocab_size=5, context=3, d_embed=4, d_hidden=3)), 1, 4)
    ledger = MemoryLedger()
    place = HostPlacement(ledger)
    plain = unit_gather_for(ZeroConfig(stage=3), place, None, layout, np.float32, 2, 1)
    assert type(plain) is WorldGather and plain.group is None
    assert "buffers" not in ledger.held or not ledger.held["buffers"]
    cfg = ZeroConfig(stage=3, zeropp=ZeroPPConfig(quantized_weights=True, quantize_block=4))
    qwz = unit_gather_for(cfg, place, None, layout, np.float32, 2, 1)
    assert type(qwz) is QuantizedForward and qwz.block == 4 and qwz.quantizes
    assert {"qwZ send 0", "qwZ send 1", "qwZ recv 1"} <= set(ledger.held["buffers"])
