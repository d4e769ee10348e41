#!/usr/bin/env bash
# Everything zero_ref can check on a machine with an NVIDIA GPU, offline, in one short
# window, into at most 8 files (docs/gpu.md, "On a machine with a GPU"):
#
#   bash scripts/tools/gpu_check.sh [--rehearse] [RESULTS]
#
# RESULTS defaults to $OUT when set (the device tool's folder), else gpu_check_out/.
# Phases, each under its own time limit; one that fails or runs out of time is recorded
# and the next one runs. Each phase's output goes into its file as it is printed, and
# summary.json is rewritten after every phase, so a check cut short keeps what it did:
#   env         the machine (env.txt): the packages, an MPI that runs 2 ranks (only what
#               is missing is installed, from the wheels scripts/tools/gpu_wheels.sh put in
#               .whl/: pip --no-index, no venv, no registry), and zero_ref's kernels
#               compiled for the real target with one run on the GPU (tests/gpu_ptx_check.py
#               --launch), so that a broken compiler fails here, in seconds, with its cause
#   tests       the GPU-marked kernel and staging tests on the device (tests.txt)
#   oracle_*    deterministic runs whose every step --check-oracle requires bitwise
#               (oracle.txt): stage 3 in bf16 (exported: the uninterrupted run the
#               checkpoint phase is compared with); stage 2 in fp16 with ZeRO-Offload
#   gpu_vs_cpu  scripts/tools/gpu_step_check.py: stage-3 steps on the GPU bitwise the same steps
#               on the CPU, and the device memory held beside the ledger's (oracle.txt)
#   checkpoint  a save halfway, the resume to the end bitwise the uninterrupted oracle
#               run, and a resume at half the ranks checked by the oracle (checkpoint.txt)
#   bench       scripts/bench/bench_gpu.py: the kernels' bandwidth beside a device copy's
#   bench_train scripts/bench/bench_gpu.py --train-only: step times, a 1-rank baseline, 4 ranks,
#               and a 28M-parameter GPT, each run under its own limit (bench.txt)
# The runs' JSONL logs go into runs.jsonl (oracle, gpu_vs_cpu, checkpoint) and
# bench_runs.jsonl, each line tagged with its run. summary.json: each phase's
# pass/fail/timeout, seconds and figures (scripts/tools/gpu_check_report.py). On the GPU all
# limits together, with 3 s each to end, are 539 s, 8 min 59 s (docs/gpu.md has each).
#
# --rehearse (or GPU_CHECK_REHEARSE=1) runs the same phases in numba-cuda's simulator
# (NUMBA_ENABLE_CUDASIM=1, NumPy as the array module, no CuPy) at tiny sizes and never
# installs anything: tests/test_gpu_check.py runs it in CI so that the check cannot rot
# before a GPU is lent. PYTHON names the interpreter (default python3: on the lent
# machine the one that holds torch, CuPy and numba-cuda). GPU_CHECK_PHASES="bench ..."
# runs only those of tests, oracle, gpu, checkpoint and bench (env always runs: it sets
# up MPI).
set -uo pipefail
CALLER=$(pwd)
cd "$(dirname "$0")/../.." || exit 2
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

# Sizes and limits (seconds). On the GPU: the default GPT at 4 ranks, and a 28M-parameter
# GPT in bench_train. Rehearsed: a 742-parameter MLP at 2 ranks (the simulator runs each
# CUDA thread as a Python thread: a stage-3 bf16 step of the 6,736-parameter GPT takes
# 9 s there), and a 1,386-parameter one as bench_train's big model.
TESTS=(tests/test_gpu_kernels.py tests/test_gpu_staging.py) # the engine: phases below
# the simulator-only check of the CUDA-aware path (42 s) and bench_gpu (its own phase)
TESTS_DESELECT="not cuda_aware_path and not bench_gpu_runs"
if [[ $REHEARSE == 1 ]]; then
  MODE=rehearse SIM=1 REQUIRE=simulator
  RANKS=2 RESUME_RANKS=1 ORACLE_STEPS=2 SAVE_STEPS=1 STEP_CHECK_STEPS=1
  MODEL="--model mlp --d-embed 2 --d-hidden 4 --context 2 --batch-size 4"
  BENCH=(--repeats 1)
  TRAIN_MODEL=$MODEL
  TRAIN_BIG="--model mlp --d-embed 2 --d-hidden 8 --context 2 --batch-size 4"
  TRAIN=(--train-steps 1 --warmup 0 --train-ranks 2 --run-limit 120)
  LIMIT_ENV=90 LIMIT_TESTS=240 LIMIT_ORACLE=150 LIMIT_GPU=150 LIMIT_CHECKPOINT=240
  LIMIT_BENCH=120 LIMIT_TRAIN=400
else
  MODE=gpu SIM=0 REQUIRE=gpu
  RANKS=4 RESUME_RANKS=2 ORACLE_STEPS=10 SAVE_STEPS=5 STEP_CHECK_STEPS=2
  MODEL=""
  BENCH=(--numel 100000000 --repeats 10)
  TRAIN_MODEL=""
  # 28,560,384 parameters on pydoc_data.topics (its 103 characters)
  TRAIN_BIG="--d-model 768 --n-layer 4 --n-head 12 --batch-size 64"
  TRAIN=(--train-steps 10 --warmup 2 --run-limit 22 --big-limit 40) # 4 x 22 + 40 = 128 s
  LIMIT_ENV=60 LIMIT_TESTS=75 LIMIT_ORACLE=50 LIMIT_GPU=40 LIMIT_CHECKPOINT=75
  LIMIT_BENCH=30 LIMIT_TRAIN=135
fi
# Each limit can be set (GPU_CHECK_LIMIT_BENCH=200, say); each phase also gets 3 s to end
# after its limit's SIGTERM.
LIMIT_ENV=${GPU_CHECK_LIMIT_ENV:-$LIMIT_ENV} LIMIT_TESTS=${GPU_CHECK_LIMIT_TESTS:-$LIMIT_TESTS}
LIMIT_ORACLE=${GPU_CHECK_LIMIT_ORACLE:-$LIMIT_ORACLE} LIMIT_GPU=${GPU_CHECK_LIMIT_GPU:-$LIMIT_GPU}
LIMIT_CHECKPOINT=${GPU_CHECK_LIMIT_CHECKPOINT:-$LIMIT_CHECKPOINT}
LIMIT_BENCH=${GPU_CHECK_LIMIT_BENCH:-$LIMIT_BENCH} LIMIT_TRAIN=${GPU_CHECK_LIMIT_TRAIN:-$LIMIT_TRAIN}
FILES=(env.txt tests.txt oracle.txt checkpoint.txt bench.txt runs.jsonl bench_runs.jsonl
  summary.json)

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
export REPO PY WORK WHEELS REHEARSE REQUIRE RESULTS MODE STARTED ORACLE_STEPS SAVE_STEPS
export GPU_CHECK_MPIRUN=mpirun # until env has chosen the MPI

summarize() { # summary.json from the phases so far (the last call's is the final one)
  local expect="{\"oracle_stage3_bf16\": $ORACLE_STEPS, \"oracle_stage2_fp16_offload\":"
  expect+=" $ORACLE_STEPS, \"checkpoint\": $ORACLE_STEPS}"
  timeout 30 "$PY" scripts/tools/gpu_check_report.py summary "$WORK" "$RESULTS" --mode "$MODE" \
    --started "$STARTED" --expect "$expect" --save-steps "$SAVE_STEPS" > /dev/null && return 0
  echo "{\"mode\": \"$MODE\", \"all_passed\": false, \"why\": \"gpu_check_report.py failed\"," \
    "\"phases_tsv\": \"$(tr '\t\n' ' ;' < "$WORK/phases.tsv")\"}" > "$RESULTS/summary.json"
}

run_phase() { # NAME FILE LIMIT COMMAND...: output into FILE as printed (and WORK/NAME.log)
  local name=$1 file=$2 limit=$3 start end rc status offset
  shift 3
  if [[ $name != env && -n ${GPU_CHECK_PHASES:-} && " $GPU_CHECK_PHASES " != *" ${name%%_*} "* ]]; then
    return 0
  fi
  echo "=== $name (limit $limit s): $*" >> "$RESULTS/$file"
  offset=$(stat -c %s "$RESULTS/$file")
  start=$(date +%s.%N)
  # straight into the file, no pipe: a rank that outlives its killed mpirun cannot hold
  # the phase open, and what it printed is there even if the whole check is cut short
  timeout -k 3 "$limit" "$@" >> "$RESULTS/$file" 2>&1
  rc=$?
  end=$(date +%s.%N)
  tail -c +$((offset + 1)) "$RESULTS/$file" > "$WORK/$name.log"
  case $rc in
    0) status=pass ;;
    124 | 137) status=timeout ;;
    *) status=fail ;;
  esac
  echo "=== $name: $status (exit $rc)" >> "$RESULTS/$file"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$file" "$status" "$rc" "$start" "$end" \
    "$limit" >> "$WORK/phases.tsv"
  summarize
  echo "$name: $status (exit $rc, $(awk "BEGIN {printf \"%.0f\", $end - $start}") s of $limit)"
}

keep_jsonl() { # FILE LOG...: each log's lines into RESULTS/FILE, tagged with the log's name
  local file=$1 log
  shift
  for log in "$@"; do
    [[ -f $log ]] && "$PY" -c 'import json, sys
run = sys.argv[1]
for line in open(sys.argv[2], errors="replace"):
    try:
        print(json.dumps({"run": run} | json.loads(line)))
    except ValueError:  # a line the run did not finish writing
        print(json.dumps({"run": run, "unreadable_line": line.rstrip()[:200]}))
' "$(basename "$log" .jsonl)" "$log" >> "$RESULTS/$file"
  done
}

# ---- env: the machine, an MPI that runs 2 ranks, and the real CUDA target
# shellcheck source=scripts/tools/gpu_check_mpi.sh
. "$REPO/scripts/tools/gpu_check_mpi.sh"
real_target() { # zero_ref's kernels compiled for a GPU (NVVM), and on one, run through libdevice
  local launch=()
  [[ $REQUIRE == gpu ]] && launch=(--launch)
  NUMBA_ENABLE_CUDASIM=0 timeout 40 "$PY" tests/gpu_ptx_check.py "${launch[@]}" \
    > "$WORK/probe.json" 2> "$WORK/probe.err"
  echo $? > "$WORK/probe.rc"
  echo "real target (NUMBA_ENABLE_CUDASIM=0, tests/gpu_ptx_check.py ${launch[*]}):" \
    "exit $(cat "$WORK/probe.rc"); $(tail -c 600 "$WORK/probe.json")"
  tail -n 3 "$WORK/probe.err"
}
env_phase() {
  echo "date: $(date -u +%FT%TZ); host: $(uname -srm); python: $(command -v "$PY")"
  if [[ $REQUIRE == gpu ]]; then
    timeout 10 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv \
      || echo "nvidia-smi: not usable"
  fi
  mpi_setup || echo "MPI: none that runs 2 ranks"
  real_target
  "$PY" scripts/tools/gpu_check_env.py --require "$REQUIRE" --probe "$WORK/probe"
}
export -f env_phase real_target mpi_env mpi_is_hydra mpi_launcher mpi_runs install_wheels
export -f use_prefix mpi_setup
run_phase env env.txt "$LIMIT_ENV" bash -c env_phase
# shellcheck disable=SC1091
[[ -f $WORK/env.sh ]] && . "$WORK/env.sh" # what env chose, for every later phase
# The runs train on Python's own pydoc_data.topics (zero_ref.train's default); a Python
# built without it trains on these docs instead.
DATA=""
if ! "$PY" -c "import pydoc_data.topics" 2> /dev/null; then
  cat "$REPO"/docs/*.md > "$WORK/corpus.txt"
  DATA="--data $WORK/corpus.txt"
fi

# ---- tests: the GPU-marked tests on the device (the simulator when rehearsed)
run_phase tests tests.txt "$LIMIT_TESTS" \
  "$PY" -m pytest -m gpu -v -p no:cacheprovider "${TESTS[@]}" -k "$TESTS_DESELECT"

# ---- oracle: every step bitwise the single-rank oracle
train() { # RANKS FLAGS...: zero_ref.train on the device, the sizes of this mode
  local ranks=$1
  shift
  # shellcheck disable=SC2086
  $GPU_CHECK_MPIRUN -n "$ranks" "$PY" -m zero_ref.train --device gpu $MODEL $DATA "$@"
}
STAGE3="--stage 3 --precision bf16 --deterministic --steps $ORACLE_STEPS --sample-chars 0"
oracle_run() { # NAME FLAGS...
  local name=$1
  shift
  # shellcheck disable=SC2086
  train "$RANKS" $* --check-oracle --quiet --log-jsonl "$WORK/$name.jsonl"
}
export -f train oracle_run
export MODEL DATA RANKS RESUME_RANKS STAGE3 STEP_CHECK_STEPS
run_phase oracle_stage3_bf16 oracle.txt "$LIMIT_ORACLE" \
  bash -c 'oracle_run oracle_stage3_bf16 $STAGE3 --export $WORK/oracle_stage3_bf16.safetensors'
run_phase oracle_stage2_fp16_offload oracle.txt "$LIMIT_ORACLE" bash -c 'oracle_run \
  oracle_stage2_fp16_offload --stage 2 --precision fp16 --offload-optimizer cpu \
  --deterministic --steps $ORACLE_STEPS --sample-chars 0'
keep_jsonl runs.jsonl "$WORK"/oracle_stage3_bf16.jsonl "$WORK"/oracle_stage2_fp16_offload.jsonl

# ---- gpu_vs_cpu: the same stage-3 steps on both devices, and the device's memory
# shellcheck disable=SC2086
run_phase gpu_vs_cpu oracle.txt "$LIMIT_GPU" $GPU_CHECK_MPIRUN -n "$RANKS" "$PY" \
  scripts/tools/gpu_step_check.py --steps "$STEP_CHECK_STEPS" -- --stage 3 --precision bf16 \
  $MODEL $DATA --sample-chars 0

# ---- checkpoint: saved halfway, resumed bitwise, resharded under the oracle
checkpoint_phase() {
  # shellcheck disable=SC2086
  train "$RANKS" $STAGE3 --quiet --stop-at-step "$SAVE_STEPS" --save-dir "$WORK/ckpt" \
    --log-jsonl "$WORK/checkpoint_first.jsonl" \
    && train "$RANKS" $STAGE3 --quiet --resume "$WORK/ckpt" \
      --export "$WORK/resumed.safetensors" --log-jsonl "$WORK/checkpoint_resumed.jsonl" \
    && train "$RESUME_RANKS" $STAGE3 --quiet --resume "$WORK/ckpt" --check-oracle \
      --sample-chars 20 --export "$WORK/resharded.safetensors" \
      --log-jsonl "$WORK/checkpoint_resharded.jsonl"
}
export -f checkpoint_phase
run_phase checkpoint checkpoint.txt "$LIMIT_CHECKPOINT" bash -c checkpoint_phase
keep_jsonl runs.jsonl "$WORK"/checkpoint_*.jsonl

# ---- bench: the kernels' bandwidth, then (apart, so that a slow start-up cannot lose
# them) the training runs, each printing its JSON line as it ends
run_phase bench bench.txt "$LIMIT_BENCH" "$PY" scripts/bench/bench_gpu.py "${BENCH[@]}"
run_phase bench_train bench.txt "$LIMIT_TRAIN" "$PY" scripts/bench/bench_gpu.py --train-only \
  --train "$WORK/train" --train-args "$TRAIN_MODEL $DATA" --big-args "$TRAIN_BIG $DATA" \
  --mpirun "$GPU_CHECK_MPIRUN" "${TRAIN[@]}"
keep_jsonl bench_runs.jsonl "$WORK"/train/*.jsonl

summarize # the final summary.json, the last file written
echo "results: $RESULTS ($(ls "$RESULTS" | wc -l) files), $(awk "BEGIN {printf \"%.0f\", \
  $(date +%s.%N) - $STARTED}") s"
grep -q '"all_passed": true' "$RESULTS/summary.json"
