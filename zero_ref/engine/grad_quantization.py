"""What the gradient buckets' reduce-scatter sends (stages 1-3): a policy chosen once from
the config (`grad_quantization_for`), so stage 1 builds its buckets without asking.

  FullGradients       the paper's reduce-scatter (ZeRO, Sec. 5.2), in the gradients'
                      wire dtype (engine/precision.py)
  QuantizedGradients  qgZ (ZeRO++, Wang et al. 2023, Sec. 3.3): int8 or int4 values and
                      a float32 scale per block, in one hop or in DeepSpeed's two (inside
                      a group of L ranks, then across the groups: comm/groups.py
                      qgz_hops); engine/grad_buckets.py packs and sums them

Each holds what GradientBuckets takes (`block`: None without qgZ, `bits`, `hops`: None
for one hop), `local_size` (the first hop's ranks as MPI split them, for the oracle)
and `close` (the hop communicators freed).
"""

from __future__ import annotations

from zero_ref.comm.collectives import Comm
from zero_ref.comm.groups import QgzHops, free, qgz_hops


class FullGradients:
    """No qgZ: the buckets reduce-scatter the gradients as they are."""

    block = None  # no quantization block
    hops = None  # one hop, over the shard Comm
    local_size = None  # no first hop of its own

    def __init__(self, bits: int) -> None:
        self.bits = bits  # unused without a block (GradientBuckets' quantize_bits)

    def close(self) -> None:
        """Nothing was split."""


class QuantizedGradients:
    """qgZ: quantized reduce-scatters, over the hop groups split from the shard Comm."""

    def __init__(self, block: int, bits: int, comm: Comm, local_size: int | str) -> None:
        self.block, self.bits = block, bits
        self.hops: QgzHops | None = qgz_hops(comm, local_size)  # a collective; None: one hop

    @property
    def local_size(self) -> int | None:
        """The ranks of the first hop, as MPI split them (None: one hop)."""
        return None if self.hops is None else self.hops.local.size

    def close(self) -> None:
        """The hop communicators freed (every rank calls it; once)."""
        free(self.hops or ())
        self.hops = None


def grad_quantization_for(cfg, comm: Comm) -> FullGradients | QuantizedGradients:
    """The reduce-scatter cfg asks for, over comm (the shard Comm: the world, or hybrid
    sharding's group); with qgZ's hops a collective over comm."""
    pp = cfg.zeropp
    if not pp.quantized_gradients:
        return FullGradients(pp.quantized_gradient_bits)
    return QuantizedGradients(
        pp.quantize_block, pp.quantized_gradient_bits, comm, pp.quantized_gradient_local_size
    )
