"""The communication ledger: what each rank really hands to MPI, per step.

Byte counts follow the logical point-to-point exchange of each collective, from
the actual buffers and counts of the call (not from a formula of the model
size): `sent_bytes` is the data of this rank that other ranks receive, and
`recv_bytes` is the data this rank receives from others. For a reduce-scatter
of N bytes over W ranks that is (W-1)/W * N each way; for an all-gather
producing N bytes, also (W-1)/W * N. The paper's volumes (Sec. 7: 2 Psi for
data parallel and stages 1-2, 3 Psi for stage 3) are the sums of these.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class KindTotals:
    """Totals for one collective kind within one step."""

    calls: int = 0
    sent_bytes: int = 0
    recv_bytes: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "calls": self.calls,
            "sent_bytes": self.sent_bytes,
            "recv_bytes": self.recv_bytes,
            "seconds": self.seconds,
        }


@dataclass
class CommLedger:
    """Per-kind totals for the step in progress, and the finished steps' totals."""

    current: dict[str, KindTotals] = field(default_factory=lambda: defaultdict(KindTotals))
    history: list[dict[str, dict[str, float]]] = field(default_factory=list)

    def record(self, kind: str, sent_bytes: int, recv_bytes: int, seconds: float) -> None:
        t = self.current[kind]
        t.calls += 1
        t.sent_bytes += int(sent_bytes)
        t.recv_bytes += int(recv_bytes)
        t.seconds += seconds

    def end_step(self) -> dict[str, dict[str, float]]:
        """Close the step: move its totals to history and return them."""
        totals = {k: v.as_dict() for k, v in sorted(self.current.items())}
        self.history.append(totals)
        self.current = defaultdict(KindTotals)
        return totals

    def last_step(self) -> dict[str, dict[str, float]]:
        return self.history[-1] if self.history else {}

    def last_step_sent_bytes(self) -> int:
        return self.step_sent_bytes(self.last_step())

    @staticmethod
    def step_sent_bytes(totals: dict[str, dict[str, float]]) -> int:
        return int(sum(v["sent_bytes"] for v in totals.values()))


def paper_sent_bytes(stage: int, numel: int, world_size: int, grad_accum: int) -> int:
    """Bytes one rank sends per step for parameters and gradients (Sec. 7 of the paper).

    Each reduce-scatter or all-gather of Psi elements moves (W-1)/W * Psi per
    rank. Stage 0 all-reduces (= reduce-scatter + all-gather) every micro-step;
    stages 1-2 reduce-scatter every micro-step and all-gather once; stage 3
    gathers twice (forward, backward) and reduce-scatters every micro-step."""
    per_collective = 4 * numel * (world_size - 1) // world_size
    k = grad_accum
    return per_collective * {0: 2 * k, 1: k + 1, 2: k + 1, 3: 3 * k}[stage]
