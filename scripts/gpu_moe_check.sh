#!/usr/bin/env bash
# The gathered (MoE) op on an NVIDIA GPU machine: build (scripts/gpu_check.sh build), the MoE
# tests on the GPU with the automatic kernel choice and each kernel forced, then the MoE bench.
#   bash scripts/gpu_moe_check.sh            (OUT: logs, default ./gpu-check-out; PY as gpu_check.sh)
# TEST_TIMEOUT / BENCH_TIMEOUT (seconds) bound the steps; BENCH_ARGS go to `bench moe`.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PY:-python3}"
OUT="${OUT:-$ROOT/gpu-check-out}"
mkdir -p "$OUT"
rc=0
bash scripts/gpu_check.sh build || { echo "build failed"; tail -40 "$OUT/build.log"; exit 1; }
export PYTHONPATH=python MLX_FP4_TEST_DEVICES=gpu MLX_ENABLE_TF32=0
echo "== MoE tests, automatic kernel choice"
timeout "${TEST_TIMEOUT:-150}" "$PY" -m pytest -q -p no:cacheprovider --capture=sys --tb=short -rf \
  tests/test_gather.py tests/test_gather_transforms.py tests/test_moe_e2e.py 2>&1 | tail -30 || rc=1
for path in simt tc; do
  echo "== MLX_FP4_CUDA_GATHER_PATH=$path"
  MLX_FP4_CUDA_GATHER_PATH=$path timeout "${TEST_TIMEOUT:-150}" "$PY" -m pytest -q -p no:cacheprovider \
    --capture=sys --tb=short -rf tests/test_gather.py 2>&1 | tail -15 || rc=1
done
echo "== bench moe"
timeout "${BENCH_TIMEOUT:-120}" "$PY" -m mlx_fp4.bench moe --device gpu ${BENCH_ARGS:---budget 5 --repeats 10} \
  --out "$OUT/moe" 2>&1 | tail -15 || rc=1
exit $rc
