#!/usr/bin/env bash
# Everything zero_ref can check on a machine with an NVIDIA GPU, from a fresh copy of the
# repository, into one folder (default gpu_check_out/), the last line of each file JSON
# where the step prints JSON:
#
#   bash scripts/gpu_check.sh [OUT]
#
# 1. a fresh venv with '.[mpich,gpu,test]'; 2. the GPU (nvidia-smi, numba's view of it);
# 3. the GPU-marked tests on the real device (NUMBA_ENABLE_CUDASIM=0): the kernels
# bitwise against their NumPy twins, the staged collectives; 4. scripts/bench_gpu.py.
# What the GPU path does not do yet (training with --device gpu, ZeRO-Offload) is listed
# in docs/gpu.md; this script grows with it.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu_check_out}
mkdir -p "$OUT"
export NUMBA_ENABLE_CUDASIM=0 PYTHONUNBUFFERED=1
start=$(date +%s)

python3 -m venv "$OUT/venv"
# shellcheck disable=SC1091
. "$OUT/venv/bin/activate"
pip install -q -e '.[mpich,gpu,test]' > "$OUT/install.txt" 2>&1

{ nvidia-smi || true; python -c "from numba import cuda; cuda.detect()"; } > "$OUT/gpu.txt" 2>&1
python -m pytest -m gpu -q -p no:cacheprovider > "$OUT/tests.txt" 2>&1 || echo "GPU tests FAILED: $OUT/tests.txt"
python scripts/bench_gpu.py > "$OUT/bench_gpu.txt" 2>&1 || echo "bench_gpu FAILED: $OUT/bench_gpu.txt"

echo "{\"seconds\": $(( $(date +%s) - start )), \"out\": \"$OUT\"}" | tee "$OUT/done.json"
