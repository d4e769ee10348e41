#!/usr/bin/env bash
# docs/stages.md's overlap figure: one stage-3 step of the same two-host run, blocking and
# with --overlap-comm, traced (root needed: network namespaces):
#
#   bash scripts/bench/overlap_timeline.sh [RATE] [OUT.png]   # as root; default 100mbit, runs/
#
# Two namespace hosts joined by a veth limited by tbf to RATE on both ends, 2 ranks on
# each, UCX over TCP on the link (scripts/bench/netns_hosts.sh); the default GPT at stage 3,
# 30 steps, --trace, once blocking and once with --overlap-comm; then
# scripts/docs/plot_trace.py draws rank 0's median step of each on one time axis: in the
# blocking run compute waits for every gather, in the overlapped one the gathers and
# reduce-scatters sit in lane "in flight" under the units' compute. Prints each run's
# median step time and the bytes its drawn step gathered, one JSON line last: the
# overlapped run gathers less (its prefetch's second buffer still holds a unit when
# backward asks for it), so the JSON says how many bytes fewer and what they take on
# the link at RATE, the part of the gain that is not overlap.
set -euo pipefail
cd "$(dirname "$0")/../.."
RATE=${1:-100mbit}
OUT=${2:-runs/overlap_timeline.png}  # docs/img/overlap_timeline.png redraws the docs' copy
PY=${PYTHON:-$(command -v python)}
export PYTHON=$PY PYTHONUNBUFFERED=1 PATH="$(dirname "$PY"):$PATH"
source scripts/bench/netns_hosts.sh
nh_available >&2 || exit 2
P=zrt
if [ -n "${KEEP_RUNS:-}" ]; then  # KEEP_RUNS=DIR: the runs' traces and logs stay there
    WORK=$KEEP_RUNS && mkdir -p "$WORK" && trap 'nh_cleanup $P' EXIT
else
    WORK=$(mktemp -d /tmp/zrt_timeline.XXXXXX) && trap 'nh_cleanup $P; rm -rf "$WORK"' EXIT
fi
nh_make $P 10.85.0 >/dev/null
nh_rate $P "$RATE" 1600 50ms
JOB=(-m zero_ref.train --stage 3 --steps 30 --quiet --sample-chars 0)
for mode in blocking overlapped; do
    flags=()
    [ $mode = overlapped ] && flags=(--overlap-comm)
    nh_mpiexec $P ${P}h1:2,${P}h2:2 -n 4 "$PY" "${JOB[@]}" "${flags[@]}" \
        --trace "$WORK/$mode.json" --log-jsonl "$WORK/$mode.jsonl" > "$WORK/$mode.txt" 2>&1 \
        || { echo "the $mode run failed:" >&2; tail -20 "$WORK/$mode.txt" >&2; exit 1; }
done
"$PY" scripts/docs/plot_trace.py "$WORK/blocking.json" "$WORK/overlapped.json" --median --out "$OUT" \
    > "$WORK/plot.json"
"$PY" - "$WORK" "$RATE" "$OUT" <<'PY'
import json, re, statistics, sys
from pathlib import Path
work, rate, out = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
result = {"rate": rate, "figure": out}
drawn = json.loads((work / "plot.json").read_text().splitlines()[-1])["bytes"]
for mode in ("blocking", "overlapped"):
    rows = [json.loads(line) for line in (work / f"{mode}.jsonl").read_text().splitlines()]
    steps = [r["step_time_s"] for r in rows if not r.get("final")][5:]
    result[f"{mode}_median_ms"] = round(1000 * statistics.median(steps), 1)
    result[f"{mode}_gathered_bytes"] = drawn[f"{mode}:median"]["sent"]["allgather"]
fewer = result["blocking_gathered_bytes"] - result["overlapped_gathered_bytes"]
bits_per_s = float(re.match(r"[\d.]+", rate)[0]) * {"k": 1e3, "m": 1e6, "g": 1e9}[
    re.search(r"([kmg])bit", rate)[1]
]
result["fewer_gathered_bytes"] = fewer  # by rank 0 (each rank sends as many)
result["fewer_bytes_link_ms"] = round(1000 * 8 * fewer / bits_per_s, 1)  # had they crossed alone
print(f"median step at {rate}: blocking {result['blocking_median_ms']} ms, "
      f"overlapped {result['overlapped_median_ms']} ms; the overlapped step gathered "
      f"{fewer:,} B fewer ({result['fewer_bytes_link_ms']} ms at {rate}); figure {out}")
print(json.dumps(result))
PY
