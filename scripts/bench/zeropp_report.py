"""What scripts/bench/bench_zeropp.py's runs say: the configurations it runs (data), the bytes
each should put on the link between the two hosts (our formula, and the paper's), the
loss summary, issue 24's targets and the tables.

Pure functions of the recorded rows: no MPI, no namespaces.

The link formula (ranks in blocks on 2 hosts of L ranks each, W = 2L, MPICH's flat
collectives over the world, as docs/overlap_bench.md measured them): every world
all-gather, reduce-scatter and all-to-all spreads a rank's ledger bytes evenly over its
W - 1 peers (recursive doubling / halving: at W = 4, a quarter of the buffer to the
neighbour on its host, half across; the all-to-all: one row to each peer), so L/(W-1)
of them cross, and the L ranks of a host put L^2/(W-1) x the ledger's per-rank bytes on
the link each way: at W = 4, 4/3 x, the whole buffer, twice the least (each host needs
only the other host's half). An all-reduce (ch4's node-aware composition) puts the whole
buffer each way: W/(2(W-1)) x the ledger's 2(W-1)/W x N. hpZ's gathers run in the host
group: nothing crosses. qgZ in two hops with the hosts as groups: the first hop
(reduce_scatter_int*_local) stays in the host, and every byte of the second (_cross)
crosses: L x the ledger's per-rank bytes each way.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

RATES_MBIT = (100.0, 30.0, 10.0)  # besides the unlimited link
PER_HOST, HOSTS = 2, 2
LOSS_TAIL = 50  # final loss: the mean of the last this many steps
BYTES_TARGET = 0.3  # all three's link bytes <= this x plain stage 3's
TIME_TARGET = 0.6  # all three's step time at a comm-bound rate <= this x plain's
LOSS_TARGET = 0.02  # each configuration's final loss within this of plain's
BASE_FLAGS = ("--stage", "3", "--precision", "bf16")
QUANTIZED = ("--quantized-weights", "--quantized-gradients")
INT4 = ("--quantized-gradients", "--quantized-gradient-bits", "4")  # the paper's qgZ
ONE_HOP = ("--quantized-gradient-local-size", "world")  # qgZ's one Alltoall over the world
# DeepSpeed's two hops in groups of 2: the hosts in the link part (ranks in blocks), and
# still two groups on one host in the loss part (where "host" would make one: one hop)
TWO_HOPS = ("--quantized-gradient-local-size", str(PER_HOST))


@dataclass(frozen=True)
class Setup:
    """One configuration: its flags (added to BASE_FLAGS) and the paper's cross-node
    volume of each of stage 3's three collectives, in M (the model's 16-bit bytes):
    forward all-gather, backward all-gather, gradient reduce-scatter (None: the paper
    has no figure for it)."""

    name: str
    flags: tuple[str, ...]
    paper_m: tuple[float, float, float] | None
    groups_in_host: bool = False  # hybrid sharding's shard groups are the hosts

    @property
    def quantized(self) -> bool:
        return any(f in self.flags for f in QUANTIZED)


# The rows, in order. Add one line per configuration: a row whose flags zero_ref.train
# does not know is recorded as skipped, with the reason (hybrid sharding and int4 qgZ
# are other helpers' items; when they land, their rows run).
SETUPS: tuple[Setup, ...] = (
    Setup("stage 3", (), (1.0, 1.0, 1.0)),
    Setup("+qwZ", ("--quantized-weights",), (0.5, 1.0, 1.0)),
    Setup("+hpZ", ("--hpz-partition-size", "host"), (1.0, 0.0, 1.0)),
    Setup("+qgZ", ("--quantized-gradients", *ONE_HOP), (1.0, 1.0, 0.5)),  # int8: 0.5 M
    Setup(
        "all three",
        (
            "--quantized-weights",
            "--hpz-partition-size",
            "host",
            "--quantized-gradients",
            *ONE_HOP,
        ),
        (0.5, 0.0, 0.5),
    ),  # fmt: skip
    # groups of 2: the hosts, with ranks in blocks on two hosts of 2 (the link part), and
    # still two groups on one host (the loss part, where `host` would make one group)
    Setup("hybrid (2)", ("--hybrid-shard-size", "2"), None, groups_in_host=True),
    Setup("+qgZ int4", (*INT4, *ONE_HOP), (1.0, 1.0, 0.25)),
    Setup(
        "all three (int4 qgZ)",
        ("--quantized-weights", "--hpz-partition-size", "host", *INT4, *ONE_HOP),
        (0.5, 0.0, 0.25),  # the paper's ZeRO++: 0.75 M
    ),
    Setup("+qgZ int4 2-hop", (*INT4, *TWO_HOPS), (1.0, 1.0, 0.25)),
    Setup(
        "all three (2-hop int4 qgZ)",
        ("--quantized-weights", "--hpz-partition-size", "host", *INT4, *TWO_HOPS),
        (0.5, 0.0, 0.25),  # the paper's ZeRO++ in DeepSpeed's schedule
    ),
)
PLAIN = SETUPS[0].name


def setups_named(text: str) -> list[Setup]:
    """--configs: comma-separated names of SETUPS (all of them: 'all'), in SETUPS' order;
    plain stage 3 always runs (every ratio is to it)."""
    by = {s.name: s for s in SETUPS}
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return list(SETUPS)
    unknown = [n for n in names if n not in by]
    if not names or unknown:
        allowed = ", ".join(repr(s.name) for s in SETUPS)
        raise ValueError(f"--configs {text!r}: unknown {unknown or 'empty'}; allowed: {allowed}")
    return [s for s in SETUPS if s.name in names or s.name == PLAIN]


def train_flags(setup: Setup, block: int) -> list[str]:
    """zero_ref.train's flags for a configuration (the quantize block with qwZ or qgZ)."""
    block_flags = ["--quantize-block", str(block)] if setup.quantized else []
    return [*BASE_FLAGS, *setup.flags, *block_flags]


def unknown_flags(setup: Setup, train_help: str) -> str | None:
    """Why zero_ref.train cannot run this configuration yet, or None."""
    missing = [f for f in setup.flags if f.startswith("--") and f not in train_help]
    return f"zero_ref.train does not know {', '.join(missing)} yet" if missing else None


# ---- bytes


# The ledger's kinds over the whole world (a group's kinds carry its suffix, e.g. _hpz).
WORLD_FLAT = (
    "allgather",
    "allgather_int8",
    "reduce_scatter",
    "reduce_scatter_int8",
    "reduce_scatter_int4",
    "alltoall",
)
WORLD_ALLREDUCE = ("allreduce", "allreduce_min", "allreduce_max", "loss", "norm")


def link_factor(kind: str, world: int = PER_HOST * HOSTS, groups_in_host: bool = False) -> float:
    """Bytes on the link each way per ledger byte of one rank, for one collective kind
    (the module docstring's model: ranks in blocks on two hosts). groups_in_host: hybrid
    sharding with the hosts as shard groups, whose ZeRO collectives (the plain kinds)
    stay in the host, and whose replica all-reduce joins the two ranks at the same place
    on either host: each of a host's L pairs sends its whole buffer across, each way,
    L x the ledger's 2 (R - 1) / R x n = n per rank."""
    per_host = world // HOSTS
    if kind.endswith(("_hpz", "_local")):
        return 0.0  # in the host group (hpZ's gathers, qgZ's first hop): shared memory
    if kind.endswith("_cross"):
        return float(per_host)  # qgZ's second hop: each of a host's L ranks, all across
    if kind in WORLD_ALLREDUCE:
        return world / (2 * (world - 1))
    if groups_in_host and kind in WORLD_FLAT:
        return 0.0
    if groups_in_host and kind == "allreduce_hybrid":
        return float(per_host)
    if kind in WORLD_FLAT:
        return per_host**2 / (world - 1)
    raise KeyError(f"no link formula for ledger kind {kind!r}")


def link_formula(
    ledger: dict[str, int], world: int = PER_HOST * HOSTS, groups_in_host: bool = False
) -> float | None:
    """Bytes per step on the link each way, from one rank's ledger by kind; None where a
    kind has no formula yet."""
    try:
        return sum(link_factor(k, world, groups_in_host) * b for k, b in ledger.items())
    except KeyError:
        return None


def paper_bytes(setup: Setup, numel_padded: int) -> float | None:
    """The paper's cross-node bytes per rank per step: its volume in M = 2 x Psi."""
    return None if setup.paper_m is None else sum(setup.paper_m) * 2 * numel_padded


def both_ways(run: dict) -> float:
    return run["link_rx_bytes"] + run["link_tx_bytes"]


def rate_key(rate: float | None) -> str:
    return "unlimited" if rate is None else f"{rate:g}"


def rate_text(key: str) -> str:
    return key if key == "unlimited" else f"{key} Mbit/s"


# ---- loss


def final_loss(losses: list[float], tail: int = LOSS_TAIL) -> float:
    """The mean of the last `tail` steps' losses."""
    if len(losses) < tail:
        raise ValueError(f"{len(losses)} losses: need at least {tail} for the final loss")
    return statistics.fmean(losses[-tail:])


def loss_summary(finals: list[float]) -> dict:
    """Mean over seeds, and the spread (max - min; the sample stdev where 2+ seeds)."""
    return {
        "mean": statistics.fmean(finals),
        "spread": max(finals) - min(finals),
        "stdev": statistics.stdev(finals) if len(finals) > 1 else 0.0,
    }


# ---- targets


def check(target: str, value: float | None, bound: float) -> dict:
    return {"target": target, "value": value, "holds": None if value is None else value <= bound}


# the paper's ZeRO++ in DeepSpeed's two hops first, then in one hop, then with int8
ALL_THREE = ("all three (2-hop int4 qgZ)", "all three (int4 qgZ)", "all three")


def link_targets(rows: list[dict], links: list[dict]) -> list[dict]:
    """All three's link bytes against plain's; its step time at each comm-bound rate.
    All three: with int4 qgZ (the paper's) where that row ran, else with int8."""
    by = {r["config"]: r for r in rows if not r.get("skipped")}
    name = next((n for n in ALL_THREE if n in by), ALL_THREE[-1])
    plain, three = by.get(PLAIN), by.get(name)
    if not (plain and three):
        return []
    ratio = both_ways(three["runs"]["unlimited"]) / both_ways(plain["runs"]["unlimited"])
    out = [check(f"{name}: link bytes <= {BYTES_TARGET} x stage 3's", ratio, BYTES_TARGET)]
    compute = plain["runs"]["unlimited"]["step_s"]
    for link in links:
        key = rate_key(link["rate_mbit"])
        if key == "unlimited" or key not in plain["runs"] or key not in three["runs"]:
            continue
        run = plain["runs"][key]
        comm = max(run["link_rx_bytes"], run["link_tx_bytes"]) / link["link_bytes_s"]
        c = check(
            f"at {rate_text(key)} (stage 3's communication {comm / compute:.1f} x its compute): "
            f"{name}: step time <= {TIME_TARGET} x stage 3's",
            three["runs"][key]["step_s"] / run["step_s"],
            TIME_TARGET,
        )
        c["comm_bound"] = comm > compute
        out.append(c)
    return out


def loss_targets(rows: list[dict]) -> list[dict]:
    by = {r["config"]: r for r in rows if not r.get("skipped")}
    if PLAIN not in by:
        return []
    plain = by[PLAIN]["mean"]
    return [
        check(
            f"{r['config']}: final loss within {100 * LOSS_TARGET:g} % of stage 3's",
            abs(r["mean"] / plain - 1),
            LOSS_TARGET,
        )
        for name, r in by.items()
        if name != PLAIN
    ]


# ---- tables


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in rows)])


def kinds_text(ledger: dict[str, int]) -> str:
    shown = {k: b for k, b in sorted(ledger.items()) if k not in ("loss", "norm")}
    return "<br>".join(f"{k} {b:,}" for k, b in shown.items())


def bytes_table(rows: list[dict]) -> str:
    """Per configuration: the ledger by kind, the paper's bytes, our formula each way,
    the link measured each way, and both ways against plain stage 3's."""
    plain = next(r for r in rows if r["config"] == PLAIN)
    base = both_ways(plain["runs"]["unlimited"])
    out = []
    for r in rows:
        if r.get("skipped"):
            out.append([r["config"], *["-"] * 6, f"not run: {r['skipped']}"])
            continue
        run = r["runs"]["unlimited"]
        formula, paper = r["link_formula"], r["paper_bytes"]
        busier = max(run["link_rx_bytes"], run["link_tx_bytes"])
        out.append(
            [
                r["config"],
                kinds_text(r["ledger"]),
                f"{sum(r['ledger'].values()):,}",
                "-" if paper is None else f"{paper:,.0f}",
                "-" if formula is None else f"{formula:,.0f}",
                f"{run['link_rx_bytes']:,.0f} / {run['link_tx_bytes']:,.0f}",
                "-" if formula is None else f"{busier / formula:.2f}",
                f"{both_ways(run) / base:.2f}",
            ]
        )  # fmt: skip
    header = [
        "config",
        "ledger, bytes per rank per step by kind",
        "ledger total",
        "paper: cross-node bytes per rank",
        "formula: link bytes each way",
        "measured: link bytes in / out",
        "measured / formula",
        "link bytes vs stage 3",
    ]
    return table(header, out)


def times_table(rows: list[dict], links: list[dict]) -> str:
    """Step time (ms) per configuration on each link, and against plain stage 3's."""
    keys = [rate_key(link["rate_mbit"]) for link in links]
    plain = next(r for r in rows if r["config"] == PLAIN)
    out = []
    for r in rows:
        if r.get("skipped"):
            out.append([r["config"], *(["-"] * len(keys))])
            continue
        cells = [r["config"]]
        for k in keys:
            s, p = r["runs"][k]["step_s"], plain["runs"][k]["step_s"]
            cells.append(f"{1e3 * s:.1f}" if r is plain else f"{1e3 * s:.1f} ({s / p:.2f}x)")
        out.append(cells)
    header = ["config", *(f"ms per step, {rate_text(k)}" for k in keys)]
    rates = "; ".join(
        f"{rate_text(rate_key(x['rate_mbit']))}: {x['link_bytes_s'] / 1e6:.1f} MB/s" for x in links
    )
    return f"{table(header, out)}\n\nThe links' rates (one TCP stream): {rates}."


def loss_table(rows: list[dict]) -> str:
    """Final loss per configuration: mean over seeds, spread, and against plain's."""
    plain = next(r for r in rows if r["config"] == PLAIN)
    out = []
    for r in rows:
        if r.get("skipped"):
            out.append([r["config"], "-", "-", "-", f"not run: {r['skipped']}"])
            continue
        finals = ", ".join(f"{x:.4f}" for x in r["final_loss"])
        moved = r["mean"] / plain["mean"] - 1
        out.append(
            [
                r["config"],
                f"{r['mean']:.4f}",
                f"{r['spread']:.4f}",
                "-" if r is plain else f"{100 * moved:+.2f} %",
                finals,
            ]
        )
    header = ["config", "final loss, mean", "spread (max - min)", "vs stage 3", "per seed"]
    return table(header, out)


def checks_text(checks: list[dict]) -> str:
    def verdict(c: dict) -> str:
        if c["holds"] is None:
            return "not measured"
        return "holds" if c["holds"] else "fails"

    lines = []
    for c in checks:
        value = "-" if c["value"] is None else f"{c['value']:.3g}"
        lines.append(f"- {c['target']}: {value}, {verdict(c)}")
    return "\n".join(lines)
