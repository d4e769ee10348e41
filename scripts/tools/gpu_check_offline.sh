#!/usr/bin/env bash
# The GPU check's MPI set-up as the lent machine most likely meets it, rehearsed here
# (docs/gpu.md, "MPI"): a Python environment with no MPI (no mpirun, no libmpi), once
# with mpi4py installed and once without, the carried wheels (.whl), pip with no index,
# in a network namespace with no route (only loopback) whose host name is in no
# /etc/hosts and no DNS. Each runs scripts/tools/gpu_check.sh's env phase in GPU mode (it
# fails there only for the GPU this machine lacks) and must end with MPICH from the
# carried wheels running 2 ranks. Needs user namespaces (unshare -rnu) and the wheels:
#
#   bash scripts/tools/gpu_wheels.sh                                   # .whl, for the GPU machine
#   GPU_WHEELS_PYTHON=3.11 bash scripts/tools/gpu_wheels.sh /tmp/whl311  # this Python's mpi4py
#   bash scripts/tools/gpu_check_offline.sh /tmp/whl311 [OUT]
#
# JSON last: per case, how MPI was set up, the library mpi4py loaded, what env found
# missing, and the seconds 2 ranks of mpi4py took there launched by a plain mpirun and
# by the check's (-hosts localhost).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
REPO=$(pwd)
WHEELS=${1:?usage: gpu_check_offline.sh WHEELS [OUT]}
OUT=${2:-$(mktemp -d /tmp/gpu_offline.XXXXXX)}
WHEELS=$(cd "$WHEELS" && pwd) || exit 2
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
PYTHON_BASE=${PYTHON:-python3}
SITE=$("$PYTHON_BASE" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")

no_mpi_python() { # DIR WITH_MPI4PY: a venv seeing this one's packages, less MPI (and zero_ref)
  local dir=$1 with_mpi4py=$2 site entry name
  rm -rf "$dir"
  "$PYTHON_BASE" -m venv --without-pip "$dir" || return 1
  site=$("$dir/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  for entry in "$SITE"/*; do
    name=${entry##*/}
    case $name in
      mpich* | __editable__* | zero_ref* | _zero_ref* | *.pth) continue ;;
      mpi4py*) [[ $with_mpi4py == 1 ]] || continue ;;
    esac
    ln -s "$entry" "$site/$name"
  done
}

run_case() { # NAME WITH_MPI4PY
  local name=$1 with_mpi4py=$2 py=$OUT/$1/venv/bin/python
  no_mpi_python "$OUT/$name/venv" "$with_mpi4py" || return 1
  # the namespace: loopback up, no other link, no route, a host name nothing resolves
  PATH="$OUT/$name/venv/bin:/usr/bin:/bin" PYTHON=$py GPU_CHECK_WHEELS=$WHEELS \
    GPU_CHECK_PHASES=none PYTHONPATH="" TMPDIR="$OUT/$name" GPU_CHECK_KEEP_WORK=1 \
    unshare -rnu bash -c '
      ip link set lo up && hostname lent-gpu-machine || exit 3
      # a default route into a link nobody answers on: a DNS query waits out its timeout,
      # as on a machine whose resolver is configured but unreachable (no route at all
      # fails at once, and hides the wait)
      ip link add v0 type veth peer name v1 && ip addr add 10.1.2.3/24 dev v0 \
        && ip link set v0 up && ip link set v1 up && ip route add default via 10.1.2.4 || exit 3
      bash scripts/tools/gpu_check.sh "$0" > "$0/check.log" 2>&1
      # a plain mpirun (no -hosts, no host file) beside the check'"'"'s, with the carried MPICH
      . "$(ls -d "$0"/gpu_check.*)/env.sh"
      for how in plain check; do
        if [[ $how == plain ]]; then launch="mpirun"; saved=$RES_OPTIONS; unset HYDRA_HOST_FILE RES_OPTIONS; fi
        if [[ $how == check ]]; then launch=$GPU_CHECK_MPIRUN; export RES_OPTIONS=$saved; . "$(ls -d "$0"/gpu_check.*)/env.sh"; fi
        start=$(date +%s.%N)
        timeout 40 $launch -n 2 "$PYTHON" -c "from mpi4py import MPI" > "$0/$how.log" 2>&1
        echo "$? $(date +%s.%N) $start" > "$0/$how.rc"
      done
    ' "$OUT/$name"
}

for case in "mpi4py_no_mpi:1" "no_mpi4py:0"; do
  run_case "${case%%:*}" "${case##*:}"
done
"$PYTHON_BASE" - "$OUT" << 'EOF'
import json, sys
from pathlib import Path

out, result = Path(sys.argv[1]), {}
for case in ("mpi4py_no_mpi", "no_mpi4py"):
    folder = out / case
    env = (folder / "env.txt").read_text() if (folder / "env.txt").exists() else ""
    facts = next((json.loads(x) for x in reversed(env.splitlines()) if x.startswith("{")), {})
    result[case] = {
        "mpi_lines": [x for x in env.splitlines() if x.startswith(("MPI:", "installing"))],
        "mpi_library": facts.get("mpi", {}).get("library"),
        "missing": facts.get("missing"),
    }
    for how in ("plain", "check"):  # mpirun as is, and as the check launches it
        if (folder / f"{how}.rc").exists():
            rc, end, start = (folder / f"{how}.rc").read_text().split()
            result[case][f"{how}_mpirun"] = {"exit": int(rc), "seconds": round(float(end) - float(start), 1)}
ok = all(
    (r["mpi_library"] or "").startswith("MPICH")
    and not [m for m in r["missing"] or ["no facts"] if m.startswith(("mpi4py", "no facts"))]
    for r in result.values()
)
print(json.dumps({"carried_mpi_runs_offline": ok, "out": str(out), "cases": result}))
sys.exit(0 if ok else 1)
EOF
