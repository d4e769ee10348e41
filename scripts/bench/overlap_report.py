"""What scripts/bench/bench_overlap.py's runs say: compute, communication, the ratios to
max(compute, communication), issue 23's targets, and the tables (terminal, markdown).

Pure functions of the rows the bench recorded: no MPI, no namespaces.
"""

from __future__ import annotations

from scripts.bench.netns_pair import PLACEMENTS

REFERENCE_MBIT = 100.0  # the reference link: stage 3 vs stage 0 there
OVERLAP_TARGET = 1.15  # overlapped <= this x max(compute, comm) ...
BLOCKING_SLOW = 1.3  # ... wherever blocking >= this x max
STAGE3_VS_STAGE0 = 1.2  # at 100 Mbit/s, overlapped stage 3 <= this x stage 0


def derive(rows: list[dict]) -> None:
    """Compute, communication and the ratios, per row. Each mode's compute is the same
    run's step time on the unlimited link (overlap shortens it too: 4 ranks on 2 cores
    wait in blocking collectives even on a fast link)."""
    unlimited = {key(r): r for r in rows if r["rate_mbit"] is None}
    for r in rows:
        b, o, base = r["blocking"], r["overlapped"], unlimited[key(r)]
        r["compute_s"] = base["blocking"]["step_s"]
        r["compute_overlapped_s"] = base["overlapped"]["step_s"] if o else None
        r["comm_bytes_s"] = busier(b) / r["link_bytes_s"]
        r["messages_s"] = b["collectives"] * r["allgather_s"]
        r["comm_over_compute"] = r["comm_bytes_s"] / r["compute_s"]
        r["max_s"] = max(r["compute_s"], r["comm_bytes_s"])
        r["blocking_over_max"] = b["step_s"] / r["max_s"]
        r["overlapped_max_s"] = max(r["compute_overlapped_s"], r["comm_bytes_s"]) if o else None
        r["overlapped_over_max"] = o["step_s"] / r["overlapped_max_s"] if o else None


def key(r: dict) -> tuple[str, str, int]:
    return r["part"], r["placement"], r["stage"]


def targets(rows: list[dict]) -> list[dict]:
    """The issue's targets, each with whether it holds (None: overlapped not measured)."""
    out = []
    for r in rows:
        if r["stage"] == 0 or r["blocking_over_max"] < BLOCKING_SLOW:
            continue
        value = r["overlapped_over_max"]
        out.append(
            check(
                f"{r['part']} {r['placement']} stage {r['stage']} at {rate_text(r)}: "
                f"overlapped <= {OVERLAP_TARGET} x max (blocking "
                f"{r['blocking_over_max']:.2f} x)",
                value,
                OVERLAP_TARGET,
            )
        )
    at_ref = {
        (r["placement"], r["stage"]): r
        for r in rows
        if r["part"] == "reference" and r["rate_mbit"] == REFERENCE_MBIT
    }
    for placement in PLACEMENTS:
        s0, s3 = at_ref.get((placement, 0)), at_ref.get((placement, 3))
        if not (s0 and s3):
            continue
        stage0 = s0["blocking"]["step_s"]
        o = s3["overlapped"]
        c = check(
            f"reference {placement} at {REFERENCE_MBIT:g} Mbit/s: overlapped stage 3 <= "
            f"{STAGE3_VS_STAGE0} x stage 0",
            o["step_s"] / stage0 if o else None,
            STAGE3_VS_STAGE0,
        )
        c["blocking_value"] = s3["blocking"]["step_s"] / stage0
        out.append(c)
    return out


def check(target: str, value: float | None, bound: float) -> dict:
    return {"target": target, "value": value, "holds": None if value is None else value <= bound}


def busier(r: dict) -> float:
    """The busier direction's link bytes."""
    return max(r["link_rx_bytes"], r["link_tx_bytes"])


def rate_text(r: dict) -> str:
    return "unlimited" if r["rate_mbit"] is None else f"{r['rate_mbit']:g} Mbit/s"


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def print_table(rows: list[dict], checks: list[dict]) -> None:
    print(
        f"{'part':>9} {'place':>6} {'link':>10} {'stg':>3} {'block':>7} {'overl':>7} "
        f"{'compute':>7} {'comp ov':>7} {'comm':>7} {'c/c':>5} {'ledger':>7} {'calls':>5} "
        f"{'msgs':>6} "
        f"{'link MB':>7} {'blk/max':>7} {'ovl/max':>7}"
    )
    for r in rows:
        b, o, ovl = r["blocking"], r["overlapped"], r["overlapped_over_max"]
        print(
            f"{r['part']:>9} {r['placement']:>6} {rate_text(r):>10} {r['stage']:>3} "
            f"{ms(b['step_s']):>7} {ms(o and o['step_s']):>7} {ms(r['compute_s']):>7} "
            f"{ms(r.get('compute_overlapped_s')):>7} "
            f"{ms(r['comm_bytes_s']):>7} {r['comm_over_compute']:>5.2f} "
            f"{ms(b['ledger_comm_s']):>7} {b['collectives']:>5} {ms(r['messages_s']):>6} "
            f"{busier(b) / 1e6:>7.3f} "
            f"{r['blocking_over_max']:>7.2f} {'-' if ovl is None else f'{ovl:.2f}':>7}"
        )
    print(
        "(ms per step; compute: the run on the unlimited link, blocking and overlapped; comm: "
        "the busier direction's link bytes / the measured rate; ledger: seconds in "
        "collectives, last step; msgs: calls x one tiny all-gather)"
    )
    state = {True: "holds", False: "FAILS", None: "not measured (overlapped is null)"}
    for c in checks:
        value = "-" if c["value"] is None else f"{c['value']:.2f}"
        print(f"target {c['target']}: {value} -> {state[c['holds']]}")


def markdown(rows: list[dict]) -> str:
    """The rows as a docs table (docs/overlap_bench.md), ms per step."""
    out = [
        "| part | ranks | link | stage | blocking | overlapped | compute | compute overlapped "
        "| comm (bytes) | comm / compute | ledger comm | collectives | link MB | blocking / max "
        "| overlapped / max |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        b, o, ovl = r["blocking"], r["overlapped"], r["overlapped_over_max"]
        out.append(
            f"| {r['part']} | {r['placement']} | {rate_text(r)} | {r['stage']} "
            f"| {ms(b['step_s'])} | {ms(o and o['step_s'])} | {ms(r['compute_s'])} "
            f"| {ms(r.get('compute_overlapped_s'))} "
            f"| {ms(r['comm_bytes_s'])} | {r['comm_over_compute']:.2f} "
            f"| {ms(b['ledger_comm_s'])} | {b['collectives']} | {busier(b) / 1e6:.3f} "
            f"| {r['blocking_over_max']:.2f} | {'-' if ovl is None else f'{ovl:.2f}'} |"
        )
    return "\n".join(out)
