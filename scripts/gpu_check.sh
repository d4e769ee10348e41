#!/usr/bin/env bash
# Everything zero_ref can check on a machine with an NVIDIA GPU, offline, in one short
# window, into at most 8 files (docs/gpu.md, "On a lent machine"):
#
#   bash scripts/gpu_check.sh [--rehearse] [RESULTS]
#
# RESULTS defaults to $OUT when set (the device tool's folder), else gpu_check_out/.
# Phases, each under its own time limit; one that fails or runs out of time is recorded
# and the next one runs:
#   env         the machine (env.txt): the packages the GPU path needs, an MPI that runs
#               2 ranks; only what is missing is installed, from the wheels that
#               scripts/gpu_wheels.sh put in .whl/ (pip --no-index; no venv, no registry)
#   tests       the GPU-marked tests on the device (tests.txt): the kernels bitwise their
#               NumPy twins, the staged collectives (test_gpu_engine.py: simulator only)
#   oracle_*    deterministic runs whose every step --check-oracle requires bitwise
#               (oracle.txt): stage 3 in bf16; stage 2 in fp16 with ZeRO-Offload
#   checkpoint  a save, a resume at half the ranks, an export and a sample (checkpoint.txt)
#   bench       scripts/bench_gpu.py: the kernels' bandwidth beside a device copy's
#   bench_train scripts/bench_gpu.py --train: training step times at 4 ranks (bench.txt)
# then summary.json, written last: each phase's pass/fail/timeout, seconds and figures
# (scripts/gpu_check_report.py). On the GPU all limits together are 7 min 45 s.
#
# --rehearse (or GPU_CHECK_REHEARSE=1) runs the same phases in numba-cuda's simulator
# (NUMBA_ENABLE_CUDASIM=1, NumPy as the array module, no CuPy) at tiny sizes and never
# installs anything: tests/test_gpu_check.py runs it in CI so that the check cannot rot
# before a GPU is lent. PYTHON names the interpreter (default python3: on the lent
# machine the one that holds torch, CuPy and numba-cuda). GPU_CHECK_PHASES="bench ..."
# runs only those of tests, oracle, checkpoint and bench (env always runs: it sets up MPI).
set -uo pipefail
CALLER=$(pwd)
cd "$(dirname "$0")/.." || exit 2
REPO=$(pwd)

REHEARSE=${GPU_CHECK_REHEARSE:-0}
positional=()
for arg in "$@"; do
  case $arg in
    --rehearse) REHEARSE=1 ;;
    -h | --help)
      sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
      exit 0
      ;;
    -*)
      echo "gpu_check.sh: unknown option $arg (allowed: --rehearse, --help)" >&2
      exit 2
      ;;
    *) positional+=("$arg") ;;
  esac
done
RESULTS=${positional[0]:-${OUT:-$REPO/gpu_check_out}}
[[ $RESULTS == /* ]] || RESULTS=$CALLER/$RESULTS # a relative path is the caller's
PY=${PYTHON:-python3}
WHEELS=${GPU_CHECK_WHEELS:-$REPO/.whl}
STARTED=$(date +%s.%N)

# Sizes and limits (seconds). On the GPU: the default GPT at 4 ranks. Rehearsed: the
# oracle runs on a 6,736-parameter GPT at 2 ranks (the size docs/gpu.md runs in the
# simulator), the checkpoint and bench_gpu's four training runs on a 742-parameter MLP.
if [[ $REHEARSE == 1 ]]; then
  MODE=rehearse SIM=1 REQUIRE=simulator
  RANKS=2 RESUME_RANKS=1 ORACLE_STEPS=2 SAVE_STEPS=2 RESUME_STEPS=3
  MODEL="--d-model 16 --n-layer 1 --context 8 --batch-size 4"
  CKPT_MODEL="--model mlp --d-embed 2 --d-hidden 4 --context 2 --batch-size 4"
  TESTS=(tests/test_gpu_kernels.py tests/test_gpu_staging.py -k "not cuda_aware_path")
  BENCH=(--repeats 1)
  TRAIN_MODEL="--model mlp --d-embed 2 --d-hidden 4 --context 2 --batch-size 4"
  TRAIN=(--train-steps 2 --warmup 1 --train-ranks 2)
  LIMIT_ENV=60 LIMIT_TESTS=180 LIMIT_ORACLE=150 LIMIT_CHECKPOINT=150 LIMIT_BENCH=120
  LIMIT_TRAIN=180
else
  MODE=gpu SIM=0 REQUIRE=gpu
  RANKS=4 RESUME_RANKS=2 ORACLE_STEPS=10 SAVE_STEPS=4 RESUME_STEPS=6
  MODEL="" CKPT_MODEL=""
  TESTS=(tests/test_gpu_kernels.py tests/test_gpu_staging.py tests/test_gpu_engine.py)
  BENCH=(--numel 100000000 --repeats 10)
  TRAIN_MODEL=""
  TRAIN=(--train-steps 15 --warmup 3)
  LIMIT_ENV=30 LIMIT_TESTS=100 LIMIT_ORACLE=60 LIMIT_CHECKPOINT=55 LIMIT_BENCH=35
  LIMIT_TRAIN=90
fi
# Each limit can be set (GPU_CHECK_LIMIT_BENCH=200, say); each phase also gets 5 s to end
# after its limit's SIGTERM, so on the GPU all of them together stay under 8 minutes.
LIMIT_ENV=${GPU_CHECK_LIMIT_ENV:-$LIMIT_ENV} LIMIT_TESTS=${GPU_CHECK_LIMIT_TESTS:-$LIMIT_TESTS}
LIMIT_ORACLE=${GPU_CHECK_LIMIT_ORACLE:-$LIMIT_ORACLE}
LIMIT_CHECKPOINT=${GPU_CHECK_LIMIT_CHECKPOINT:-$LIMIT_CHECKPOINT}
LIMIT_BENCH=${GPU_CHECK_LIMIT_BENCH:-$LIMIT_BENCH} LIMIT_TRAIN=${GPU_CHECK_LIMIT_TRAIN:-$LIMIT_TRAIN}
FILES=(env.txt tests.txt oracle.txt checkpoint.txt bench.txt summary.json)

mkdir -p "$RESULTS" || exit 2
RESULTS=$(cd "$RESULTS" && pwd)
for f in "${FILES[@]}"; do rm -f "${RESULTS:?}/$f"; done
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX") || exit 2
[[ ${GPU_CHECK_KEEP_WORK:-0} == 1 ]] || trap 'rm -rf "$WORK"' EXIT
# Everything any phase runs sees these: the tree's zero_ref first, the simulator or not,
# ranks that print at once, and an Open MPI mpirun (if that is the machine's) allowed
# to run as root, as commands on the lent machine do.
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" NUMBA_ENABLE_CUDASIM=$SIM
export PYTHONUNBUFFERED=1 PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset MPIR_CVAR_ENABLE_HEAVY_YIELD
export PY WORK WHEELS REHEARSE REQUIRE

run_phase() { # NAME FILE LIMIT COMMAND...: the command's output into WORK/NAME.log, then FILE
  local name=$1 file=$2 limit=$3 start end rc status
  shift 3
  if [[ $name != env && -n ${GPU_CHECK_PHASES:-} && " $GPU_CHECK_PHASES " != *" ${name%%_*} "* ]]; then
    return 0
  fi
  start=$(date +%s.%N)
  timeout -k 5 "$limit" "$@" > "$WORK/$name.log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  case $rc in
    0) status=pass ;;
    124 | 137) status=timeout ;;
    *) status=fail ;;
  esac
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$file" "$status" "$rc" "$start" "$end" \
    "$limit" >> "$WORK/phases.tsv"
  {
    echo "=== $name (limit $limit s): $*"
    cat "$WORK/$name.log"
    echo "=== $name: $status (exit $rc)"
  } >> "$RESULTS/$file"
  echo "$name: $status (exit $rc, $(awk "BEGIN {printf \"%.0f\", $end - $start}") s of $limit)"
}

# ---- env: an MPI that runs 2 ranks, installed from the carried wheels only if missing
mpi_runs() { # 2 ranks of mpi4py, each seeing both
  command -v mpirun > /dev/null || {
    echo "no mpirun on PATH"
    return 1
  }
  timeout 20 mpirun -n 2 "$PY" -c \
    "from mpi4py import MPI; assert MPI.COMM_WORLD.Get_size() == 2, 'ranks see 1 rank'" \
    && echo "MPI: $(command -v mpirun) runs 2 ranks of mpi4py"
}

install_wheels() { # PREFIX NAME...: the carried wheels of these names, with no index
  local prefix=$1 files=() name
  shift
  for name in "$@"; do
    files+=("$(ls "$WHEELS/$name"-*.whl 2> /dev/null | head -1)")
    [[ -n ${files[-1]} ]] || {
      echo "no $name wheel in $WHEELS (run scripts/gpu_wheels.sh here and carry .whl)"
      return 1
    }
  done
  echo "installing from $WHEELS, no index: ${files[*]##*/}"
  "$PY" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir \
    --disable-pip-version-check --prefix "$prefix" "${files[@]}"
}

use_prefix() { # PREFIX: its mpirun, libmpi and Python packages first, here and later
  local prefix=$1 site
  site=$(find "$prefix" -type d -name site-packages | head -1)
  cat > "$WORK/env.sh" << EOF
export PATH="$prefix/bin:\$PATH"
export MPI4PY_LIBMPI="$prefix/lib/libmpi.so.12"
export LD_LIBRARY_PATH="$prefix/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PYTHONPATH="$REPO:$site\${PYTHONPATH:+:\$PYTHONPATH}"
EOF
  # shellcheck disable=SC1091
  . "$WORK/env.sh"
}

env_phase() {
  echo "date: $(date -u +%FT%TZ); host: $(uname -srm); python: $(command -v "$PY")"
  if [[ $REQUIRE == gpu ]]; then
    timeout 10 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv \
      || echo "nvidia-smi: not usable"
  fi
  echo "mpirun: $(command -v mpirun || echo none)"
  if mpi_runs; then
    echo "MPI: the machine's own runs 2 ranks; nothing installed"
  elif [[ $REHEARSE == 1 ]]; then
    echo "MPI: does not run 2 ranks, and a rehearsal installs nothing"
  else
    echo "MPI: the machine's does not run 2 ranks; the carried MPICH, mpi4py's libmpi"
    install_wheels "$WORK/site" mpich && use_prefix "$WORK/site"
    if ! mpi_runs; then # the machine's mpi4py is tied to another library: carry ours
      echo "MPI: the machine's mpi4py cannot load it; the carried mpi4py too"
      install_wheels "$WORK/site" mpi4py && use_prefix "$WORK/site" && mpi_runs \
        && echo "MPI: the carried MPICH and mpi4py run 2 ranks"
    fi
  fi
  "$PY" scripts/gpu_check_report.py env --require "$REQUIRE"
}
export -f mpi_runs install_wheels use_prefix env_phase
run_phase env env.txt "$LIMIT_ENV" bash -c env_phase
# shellcheck disable=SC1091
[[ -f $WORK/env.sh ]] && . "$WORK/env.sh" # what env installed, for every later phase
# The runs train on Python's own pydoc_data.topics (zero_ref.train's default); a Python
# built without it trains on these docs instead.
DATA=""
if ! "$PY" -c "import pydoc_data.topics" 2> /dev/null; then
  cat "$REPO"/docs/*.md > "$WORK/corpus.txt"
  DATA="--data $WORK/corpus.txt"
fi

# ---- tests: the GPU-marked tests on the device (the simulator when rehearsed)
run_phase tests tests.txt "$LIMIT_TESTS" \
  "$PY" -m pytest -m gpu -v -p no:cacheprovider "${TESTS[@]}"

# ---- oracle: every step bitwise the single-rank oracle
train() { # RANKS FLAGS...: zero_ref.train on the device, the sizes of this mode
  local ranks=$1
  shift
  # shellcheck disable=SC2086
  mpirun -n "$ranks" "$PY" -m zero_ref.train --device gpu $MODEL $DATA "$@"
}
oracle_run() { # NAME FLAGS...
  local name=$1
  shift
  # shellcheck disable=SC2086
  train "$RANKS" $* --deterministic --check-oracle --steps "$ORACLE_STEPS" --quiet \
    --sample-chars 0 --log-jsonl "$WORK/$name.jsonl"
}
export -f train oracle_run
export MODEL DATA RANKS ORACLE_STEPS
run_phase oracle_stage3_bf16 oracle.txt "$LIMIT_ORACLE" \
  bash -c 'oracle_run oracle_stage3_bf16 --stage 3 --precision bf16'
run_phase oracle_stage2_fp16_offload oracle.txt "$LIMIT_ORACLE" \
  bash -c 'oracle_run oracle_stage2_fp16_offload --stage 2 --precision fp16 --offload-optimizer cpu'

# ---- checkpoint: the device's arrays read back (save, export) and written (resume)
checkpoint_phase() {
  MODEL=$CKPT_MODEL
  train "$RANKS" --stage 3 --precision bf16 --steps "$SAVE_STEPS" --quiet --sample-chars 0 \
    --save-dir "$WORK/ckpt" --save-every "$SAVE_STEPS" \
    && train "$RESUME_RANKS" --stage 3 --precision bf16 --steps "$RESUME_STEPS" \
      --resume "$WORK/ckpt" --quiet --sample-chars 20 --export "$WORK/resumed.safetensors" \
      --log-jsonl "$WORK/resume.jsonl"
}
export -f checkpoint_phase
export CKPT_MODEL RESUME_RANKS SAVE_STEPS RESUME_STEPS
run_phase checkpoint checkpoint.txt "$LIMIT_CHECKPOINT" bash -c checkpoint_phase

# ---- bench: the kernels' bandwidth, then (apart, so that a slow start-up cannot lose
# them) the training runs: bench_gpu.py's JSON line last; the runs' own logs after them
run_phase bench bench.txt "$LIMIT_BENCH" "$PY" scripts/bench_gpu.py "${BENCH[@]}"
run_phase bench_train bench.txt "$LIMIT_TRAIN" "$PY" scripts/bench_gpu.py --numel 4096 \
  --repeats 1 --train "$WORK/train" --train-args "$TRAIN_MODEL $DATA" "${TRAIN[@]}"
for log in "$WORK"/train/*.txt; do
  [[ -f $log ]] && { echo "=== ${log##*/}" && cat "$log"; } >> "$RESULTS/bench.txt"
done

# ---- summary.json, the last file written
expect="{\"oracle_stage3_bf16\": $ORACLE_STEPS, \"oracle_stage2_fp16_offload\": $ORACLE_STEPS,"
expect+=" \"checkpoint\": $RESUME_STEPS}"
if ! timeout 30 "$PY" scripts/gpu_check_report.py summary "$WORK" "$RESULTS" --mode "$MODE" \
  --started "$STARTED" --expect "$expect"; then
  echo "{\"mode\": \"$MODE\", \"all_passed\": false, \"why\": \"gpu_check_report.py failed\"," \
    "\"phases_tsv\": \"$(tr '\t\n' ' ;' < "$WORK/phases.tsv")\"}" > "$RESULTS/summary.json"
fi
echo "results: $RESULTS ($(ls "$RESULTS" | wc -l) files), $(awk "BEGIN {printf \"%.0f\", \
  $(date +%s.%N) - $STARTED}") s"
grep -q '"all_passed": true' "$RESULTS/summary.json"
