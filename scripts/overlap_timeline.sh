#!/usr/bin/env bash
# docs/stages.md's overlap figure: one stage-3 step of the same two-host run, blocking and
# with --overlap-comm, traced (root needed: network namespaces):
#
#   sudo bash scripts/overlap_timeline.sh [RATE] [OUT.png]     # default 100mbit, docs/img/
#
# Two namespace hosts joined by a veth limited by tbf to RATE on both ends, 2 ranks on
# each, UCX over TCP on the link (scripts/netns_hosts.sh); the default GPT at stage 3,
# 30 steps, --trace, once blocking and once with --overlap-comm; then
# scripts/plot_trace.py draws rank 0's median step of each on one time axis: in the
# blocking run compute waits for every gather, in the overlapped one the gathers and
# reduce-scatters sit in lane "in flight" under the units' compute. Prints each run's
# median step time, one JSON line last.
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${1:-100mbit}
OUT=${2:-docs/img/overlap_timeline.png}
PY=${PYTHON:-$(command -v python)}
export PYTHON=$PY PYTHONUNBUFFERED=1 PATH="$(dirname "$PY"):$PATH"
source scripts/netns_hosts.sh
nh_available >&2 || exit 2
P=zrt
WORK=$(mktemp -d /tmp/zrt_timeline.XXXXXX)
trap 'nh_cleanup $P; rm -rf "$WORK"' EXIT
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
"$PY" scripts/plot_trace.py "$WORK/blocking.json" "$WORK/overlapped.json" --median --out "$OUT"
"$PY" - "$WORK" "$RATE" "$OUT" <<'PY'
import json, statistics, sys
from pathlib import Path
work, rate, out = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
result = {"rate": rate, "figure": out}
for mode in ("blocking", "overlapped"):
    rows = [json.loads(line) for line in (work / f"{mode}.jsonl").read_text().splitlines()]
    steps = [r["step_time_s"] for r in rows if not r.get("final")][5:]
    result[f"{mode}_median_ms"] = round(1000 * statistics.median(steps), 1)
print(f"median step at {rate}: blocking {result['blocking_median_ms']} ms, "
      f"overlapped {result['overlapped_median_ms']} ms; figure {out}")
print(json.dumps(result))
PY
