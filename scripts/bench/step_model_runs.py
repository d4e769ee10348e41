"""The measured half of scripts/bench/step_model_check.py: the default GPT's step on the two
namespace hosts (scripts/bench/netns_pair.py, 2 x 2 ranks, tbf on the veth), per link rate,
rank placement and configuration, one `python -m zero_ref.train` each
(scripts/bench/overlap_runs.py's run_train: median step time after the first steps, the
veth's bytes per step, the ledger's last step per collective kind).
"""

from __future__ import annotations

import json
from pathlib import Path

from scripts.bench.netns_pair import NetnsPair
from scripts.bench.overlap_runs import PER_HOST, link_probe, link_rate, rank_env, run_train

# name -> (stage, flags): the configurations a check runs, ZeRO++ as its paper's three
# parts together (qwZ int8 forward gathers, hpZ's host-wide secondary copy, qgZ's int8
# two-hop gradients) on stage 3.
ZEROPP = ("--quantized-weights", "--hpz-partition-size", str(PER_HOST), "--quantized-gradients")
# With ranks cyclic a host's ranks are not consecutive: hpZ's group is then the host's
# ranks ("host", MPI's shared-memory split), and qgZ goes in one hop ("world"), as
# zero_ref.train's refusal of the default two hops there tells a user to do.
ZEROPP_CYCLIC = (
    "--quantized-weights",
    "--hpz-partition-size",
    "host",
    "--quantized-gradients",
    "--quantized-gradient-local-size",
    "world",
)
CONFIGS: dict[str, tuple[int, tuple[str, ...]]] = {
    "s0": (0, ()),
    "s1": (1, ()),
    "s2": (2, ()),
    "s3": (3, ()),
    "s1_overlap": (1, ("--overlap-comm",)),
    "s2_overlap": (2, ("--overlap-comm",)),
    "s3_overlap": (3, ("--overlap-comm",)),
    "s3_zeropp": (3, ZEROPP),
    "s3_zeropp_overlap": (3, (*ZEROPP, "--overlap-comm")),
    # the two-level collectives (zero_ref/comm/hierarchical.py, `auto`'s choice across
    # hosts): every other configuration runs flat, as the check was first recorded
    "s1_hier": (1, ("--collectives", "hierarchical")),
    "s3_hier": (3, ("--collectives", "hierarchical")),
    "s3_overlap_hier": (3, ("--overlap-comm", "--collectives", "hierarchical")),
}  # ZeRO++'s group collectives stay flat: ZeroConfig refuses them with "hierarchical"
FLAT = ("--collectives", "flat")  # a configuration that names no collectives runs flat


def one_case(
    pair: NetnsPair,
    config: str,
    placement: str,
    steps: int,
    log: Path,
    more: tuple = (),
) -> dict:
    """One configuration's run on the current link (`more`: flags added after the
    configuration's, so theirs win; flat collectives unless the configuration or `more`
    names others, as the check was first recorded before the two-level ones existed):
    the run's summary and its ledger."""
    stage, extra = CONFIGS[config]
    if placement == "cyclic" and extra[: len(ZEROPP)] == ZEROPP:
        extra = (*ZEROPP_CYCLIC, *extra[len(ZEROPP) :])
    extra = (*extra, *more)
    if "--collectives" not in extra:
        extra = (*extra, *FLAT)
    flags = ["--stage", str(stage), "--steps", str(steps), "--sample-chars", "0", "--quiet"]
    summary = run_train(pair, [*flags, *extra], log, 300.0, placement)
    final = [json.loads(x) for x in log.read_text().splitlines() if x.strip()][-1]
    kinds = final["ranks"][0]["comm_last_step"]
    summary["kinds"] = {
        k: {"calls": v["calls"], "sent_bytes": v["sent_bytes"], "seconds": v["seconds"]}
        for k, v in kinds.items()
    }
    return {
        "config": config,
        "stage": stage,
        "flags": list(extra),
        "placement": placement,
        **summary,
    }


def measure(
    prefix: str,
    subnet: str,
    rates: list[float | None],
    placements: list[str],
    configs: list[str],
    steps: int,
    burst: int,
    progress: Path,
) -> tuple[list[dict], list[dict]]:
    """Every (rate, placement, config): (links, cases). Each case is also appended to
    `progress` as it ends, so an interrupted sweep leaves what it measured."""
    links, cases = [], []
    log = progress.with_suffix(".log.jsonl")
    with NetnsPair(prefix, subnet) as pair:
        for rate in rates:
            pair.set_rate(rate, burst)
            link = {"rate_mbit": rate, "link_bytes_s": link_rate(pair)}
            probe = link_probe(pair, rank_env(), 1, "block")
            link["allgather_tiny_s"] = probe["allgather_tiny_s"]
            links.append(link)
            print(f"link {rate or 'unlimited'}: {link['link_bytes_s'] / 1e6:.2f} MB/s", flush=True)
            for config in configs:  # the placements side by side, so drift hits both
                for placement in placements:
                    try:
                        case = one_case(pair, config, placement, steps, log)
                    except SystemExit as exc:  # one failed run is recorded, not fatal
                        if not isinstance(exc.code, str):  # a signal (bench_overlap.stop)
                            raise
                        case = {"config": config, "placement": placement, "error": str(exc)[-500:]}
                    case |= {"rate_mbit": rate, "link_bytes_s": link["link_bytes_s"]}
                    cases.append(case)
                    with open(progress, "a", encoding="utf-8") as f:
                        f.write(json.dumps(case) + "\n")
                    step = case.get("step_s")
                    shown = f"{step * 1e3:.1f} ms" if step else case.get("error", "")[:200]
                    print(f"  {placement} {config}: {shown}", flush=True)
    return links, cases
