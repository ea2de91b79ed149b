#!/usr/bin/env bash
# Build mlx_fp4 against MLX's CUDA build on an NVIDIA GPU machine and check it there.
#
#   bash scripts/gpu_check.sh [STEP ...]       (run from anywhere; default steps: build harness tests bench)
#
# Steps:
#   build      configure + build the extension with nvcc into build/gpu, copy it into python/mlx_fp4/
#   harness    build and run csrc/cuda/kernel_harness.cu "check" (every kernel path vs a float64
#              reference, no MLX involved)
#   tests      pytest on the GPU only (MLX_FP4_TEST_DEVICES=gpu): the whole w4a16/epilogue suite on
#              the automatic dispatch, then the matmul tests again with each path forced
#              (MLX_FP4_CUDA_PATH=tc|simt|dequant|wgmma, and tc-unstaged = tc with MLX_FP4_CUDA_STAGED=0);
#              TEST_PATHS="auto tc" limits that list
#   bench      python -m mlx_fp4.bench --device gpu on 8192x8192, M in {1, 8, 16, 64, 256, 2048, 8192}
#   kbench     the harness's timing sweep (kernel time per path and tile configuration); KBENCH_ARGS
#              passes --quick (fewer M, planned tiles only) or --small (M <= 32, every tile)
#   fullbench  python -m mlx_fp4.bench --device gpu on 8192x8192, 14336x4096, 4096x14336, M = 1..8192
#              (JSON + PNG + table in $OUT/bench; BENCH_ARGS adds options)
#   sanitizer  compute-sanitizer memcheck over the kernel harness checks and the GPU matmul tests
#   ncu        Nsight Compute (full set) on the harness's "profile" launches of the wgmma kernel
#              (8192^2, M = 64 and 128, planned tiles): details ($OUT/ncu_wgmma.txt), per-instruction
#              source counters and stall samples by region (scripts/ncu_regions.py); needs hardware
#              counters: the Firecracker machines, not gVisor
#   moe        csrc/cuda/gather_kernel_harness.cu (check, kernel-time bench), the gathered (MoE) tests
#              on the GPU (automatic kernel choice, then each kernel forced) and
#              python -m mlx_fp4.bench moe (BENCH_MOE_ARGS)
#   decode     python -m mlx_fp4.bench decode (Llama-3-8B shapes; DECODE_ARGS replaces the defaults
#              --preset llama3-8b --layers 8 16 32), JSON + PNG + table in $OUT/decode
#   m1split    the M = 1 split per shape (benchmarks/notes/cuda.md, stop 45): kernel_harness bench
#              --decode, the fastest tile per shape (scripts/m1_best_tiles.py), then the decode bench
#              (Llama-3-8B shapes, 32 layers, interleaved with MLX nvfp4 and the floor) with the plan
#              and with that per-shape list in MLX_FP4_CUDA_TC ($OUT/m1split_{plan,best}); needs mlx-lm
#   suite      every tests/test_*.py (SUITE_FILES: a subset) in its own pytest on the GPU, one line
#              per file with its exit code, so a crash (a fatal signal ends pytest) names its file;
#              a failing file's log in $OUT/suite_<file>.log
#   planab     per product through MLX, the automatic plan against one forced path (PLANAB_PATH,
#              default wgmma) on PLANAB_SHAPES (default 1024x4096), JSON + table in $OUT/planab_*
#   overhead   scripts/gpu_op_overhead.py: host cost per call and chained products through MLX
#   stress     scripts/gpu_stress.py (threads x streams x compile x grads; STRESS_ARGS), then the same
#              with fewer iterations under compute-sanitizer memcheck, racecheck and synccheck
#
# Environment: PY (python with mlx[cuda13]==0.32.4 and nanobind 3.x, default python3),
# OUT (logs, default ./gpu-check-out), ARCHS (CUDA_ARCHITECTURES; default: this GPU's, e.g. 90-real),
# CUDNN_ROOT (folder with include/cudnn.h and lib/libcudnn.so.9; default: pip's nvidia-cudnn or the
# system's). Every step writes $OUT/<step>.log; the exit code is 1 when any step failed.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PY:-python3}"
OUT="${OUT:-$ROOT/gpu-check-out}"
mkdir -p "$OUT"
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(build harness tests bench)
command -v nvcc >/dev/null 2>&1 || export PATH="/usr/local/cuda/bin:$PATH"
FAILED=()

if [ -z "${ARCHS:-}" ]; then
  cc="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')"
  ARCHS="${cc:-90}-real"
  # Hopper: the arch-specific target, which the wgmma kernel needs (wgmma, setmaxnreg).
  [ "$ARCHS" = "90-real" ] && ARCHS="90a-real"
fi
SM="${ARCHS%%-*}"
SM="${SM%%;*}"
# The harness: sm_90a as -gencode (the -arch shorthand also runs a plain sm_90 pass), and the
# define that tells the host code the wgmma kernel is in the binary.
HARNESS_ARCH=(-arch="sm_$SM")
[ "$SM" = "90a" ] && HARNESS_ARCH=(-gencode=arch=compute_90a,code=sm_90a -DMLX_FP4_WGMMA_BUILT=1)

find_cudnn() {
  if [ -n "${CUDNN_ROOT:-}" ]; then echo "$CUDNN_ROOT"; return; fi
  local d
  d="$("$PY" -c 'import nvidia.cudnn as c; print(list(c.__path__)[0])' 2>/dev/null)"
  if [ -n "$d" ] && [ -f "$d/include/cudnn.h" ]; then echo "$d"; return; fi
  if [ -f /usr/include/cudnn.h ]; then echo "/usr"; return; fi
  if [ -f /usr/include/x86_64-linux-gnu/cudnn.h ]; then echo "/usr/include/x86_64-linux-gnu/.."; return; fi
}

step_build() {
  local cudnn inc lib
  cudnn="$(find_cudnn)"
  inc="$cudnn/include"
  lib="$cudnn/lib"
  [ -d "$lib" ] || lib="/usr/lib/x86_64-linux-gnu"
  [ -f "$inc/cudnn.h" ] || inc="$(dirname "$(ls /usr/include/*/cudnn.h /usr/include/cudnn.h 2>/dev/null | head -1)")"
  echo "cuDNN: include $inc, lib $lib; CUDA archs: $ARCHS"
  cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$(command -v "$PY")" \
    -DMLX_FP4_CUDA_ARCHS="$ARCHS" -DCUDNN_INCLUDE_PATH="$inc" -DCUDNN_LIBRARY_PATH="$lib" || return 1
  cmake --build build/gpu -j"$(nproc)" || return 1
  local so
  so="$(ls build/gpu/_ext*.so | head -1)"
  cp "$so" python/mlx_fp4/.ext.tmp && mv -f python/mlx_fp4/.ext.tmp "python/mlx_fp4/$(basename "$so")"
  cp build/gpu/_build_info.py python/mlx_fp4/_build_info.py
  grep -q "GPU backend: cuda" build/gpu/CMakeCache.txt 2>/dev/null || true
  PYTHONPATH=python "$PY" - <<'EOF'
import mlx.core as mx, mlx_fp4 as f
assert mx.cuda.is_available(), "mx.cuda.is_available() is False"
w, s = f.quantize(mx.random.normal((256, 512)))
x = mx.random.normal((4, 512)).astype(mx.bfloat16)
y = f.w4a16_matmul(x, w, s, stream=mx.gpu)
r = f.w4a16_matmul(x, w, s, stream=mx.cpu)
err = mx.abs(y.astype(mx.float32) - r.astype(mx.float32)).max().item()
print("smoke: gpu vs cpu max abs diff", err)
assert err < 0.05 * mx.abs(r.astype(mx.float32)).max().item() + 1e-3
EOF
}

# The extension build's object of w4a16_matmul.cu when it is newer than the sources, else the source.
dense_kernels_obj() {
  local newest kobj
  newest="$(ls -t csrc/cuda/* csrc/shared/* | head -1)"
  kobj="$(find build/gpu -name 'w4a16_matmul.cu.o' 2>/dev/null | head -1)"
  if [ -n "$kobj" ] && [ "$kobj" -nt "$newest" ]; then echo "$kobj"; else echo csrc/cuda/w4a16_matmul.cu; fi
}

# cuBLASLt link flags: the toolkit's, else the nvidia-cublas wheel's (the copy libmlx loads).
cublaslt_flags() {
  local nv
  if [ ! -e /usr/local/cuda/lib64/libcublasLt.so ]; then
    nv="$("$PY" -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null)/cu13/lib"
    [ -e "$nv/libcublasLt.so.13" ] && { echo "-L$nv -Xlinker -rpath -Xlinker $nv -l:libcublasLt.so.13"; return; }
  fi
  echo "-lcublasLt"
}

build_harness() {
  # The kernels live in csrc/cuda/*.cuh (one translation unit) and read csrc/shared/*.h.
  local newest
  newest="$(ls -t csrc/cuda/* csrc/shared/* | head -1)"
  [ -x build/gpu/kernel_harness ] && [ build/gpu/kernel_harness -nt "$newest" ] && return 0
  mkdir -p build/gpu
  # shellcheck disable=SC2046
  nvcc -O3 -std=c++17 "${HARNESS_ARCH[@]}" -Icsrc csrc/cuda/kernel_harness.cu "$(dense_kernels_obj)" \
    csrc/cuda/w4a16_cublas.cpp $(cublaslt_flags) -lcuda -o build/gpu/kernel_harness
}

step_harness() { build_harness && build/gpu/kernel_harness check; }
step_kbench() { build_harness && build/gpu/kernel_harness bench ${KBENCH_ARGS:-}; }

step_tests() {
  local rc=0 f
  # MLX's CUDA matmul uses TF32 for float32 unless MLX_ENABLE_TF32=0; the tests compare float32
  # results (and the gradients, which MLX ops compute) against float64 with fp32 tolerances.
  export PYTHONPATH=python MLX_FP4_TEST_DEVICES=gpu MLX_ENABLE_TF32=0
  for path in ${TEST_PATHS:-auto tc tc-unstaged simt dequant wgmma}; do
    echo "== MLX_FP4_CUDA_PATH=$path"
    if [ "$path" = auto ]; then
      # One pytest per file, so that a crash in one file does not hide the others; --capture=sys
      # leaves file descriptor 2 alone, so a C++ abort message (terminate, CUDA) reaches the log.
      for f in tests/test_w4a16_matmul.py tests/test_epilogue.py tests/test_transforms.py tests/test_errors.py \
               tests/test_linkage.py tests/test_adversarial.py tests/test_properties.py tests/test_mxfp4.py; do
        "$PY" -m pytest -v -p no:cacheprovider --capture=sys --tb=line -rf "$f" || rc=1
      done
    elif [ "$path" = tc-unstaged ]; then
      # The register-prefetch tensor-core kernel (the staged kernel's fallback), forced everywhere.
      MLX_FP4_CUDA_PATH=tc MLX_FP4_CUDA_STAGED=0 "$PY" -m pytest -q -p no:cacheprovider --tb=line -rf \
        tests/test_w4a16_matmul.py tests/test_epilogue.py tests/test_mxfp4.py || rc=1
    else
      MLX_FP4_CUDA_PATH=$path "$PY" -m pytest -q -p no:cacheprovider --tb=line -rf \
        tests/test_w4a16_matmul.py tests/test_epilogue.py tests/test_mxfp4.py || rc=1
    fi
  done
  return $rc
}

# The gathered (MoE) op: its tests on the GPU with the automatic kernel choice and each CUDA kernel
# forced (MLX_FP4_CUDA_GATHER_PATH), then the MoE bench (BENCH_MOE_ARGS).
step_moe() {
  local rc=0 path kobj
  # The kernel harness (no MLX): checks, then kernel time vs a load-only read of the same experts.
  kobj="$(find build/gpu -name 'gather_w4a16_matmul.cu.o' 2>/dev/null | head -1)"
  [ -n "$kobj" ] || kobj=csrc/cuda/gather_w4a16_matmul.cu
  # The dense kernels too: the pair GEMV's batched staged tensor-core kernel lives there.
  # shellcheck disable=SC2046
  nvcc -O3 -std=c++17 "${HARNESS_ARCH[@]}" -Icsrc csrc/cuda/gather_kernel_harness.cu "$kobj" "$(dense_kernels_obj)" \
    csrc/cuda/w4a16_cublas.cpp $(cublaslt_flags) -lcuda -o build/gpu/gather_kernel_harness &&
    build/gpu/gather_kernel_harness check bench || rc=1
  export PYTHONPATH=python MLX_FP4_TEST_DEVICES=gpu MLX_ENABLE_TF32=0
  "$PY" -m pytest -q -p no:cacheprovider --capture=sys --tb=short -rf tests/test_gather.py \
    tests/test_gather_transforms.py tests/test_moe_e2e.py || rc=1
  for path in pairs simt tc; do
    echo "== MLX_FP4_CUDA_GATHER_PATH=$path"
    MLX_FP4_CUDA_GATHER_PATH=$path "$PY" -m pytest -q -p no:cacheprovider --tb=short -rf tests/test_gather.py || rc=1
  done
  for pairs in decode simt; do
    echo "== MLX_FP4_CUDA_GATHER_PATH=pairs MLX_FP4_CUDA_GATHER_PAIRS=$pairs"
    MLX_FP4_CUDA_GATHER_PATH=pairs MLX_FP4_CUDA_GATHER_PAIRS=$pairs "$PY" -m pytest -q -p no:cacheprovider --tb=short \
      -rf tests/test_gather.py || rc=1
  done
  "$PY" -m mlx_fp4.bench moe --device gpu ${BENCH_MOE_ARGS:---budget 5 --repeats 10} --out "$OUT/moe" || rc=1
  return $rc
}

step_bench() {
  PYTHONPATH=python "$PY" -m mlx_fp4.bench --device gpu --no-progress --no-plot --shapes 8192x8192 \
    --m 1 8 16 64 256 2048 8192 --out "$OUT/bench-quick"
}
# The issue's three shapes over the whole M sweep; BENCH_ARGS adds options (e.g. --repeats 5).
step_fullbench() {
  PYTHONPATH=python "$PY" -m mlx_fp4.bench --device gpu --no-progress --out "$OUT/bench" \
    --shapes 8192x8192 14336x4096 4096x14336 ${BENCH_ARGS:-}
}

step_ncu() {
  build_harness || return 1
  rm -f "$OUT/ncu_wgmma.ncu-rep"
  ncu --clock-control none --set full --import-source no -k regex:wgmma_kernel -o "$OUT/ncu_wgmma" \
    build/gpu/kernel_harness profile || return 1
  ncu --import "$OUT/ncu_wgmma.ncu-rep" --page details > "$OUT/ncu_wgmma.txt"
  ncu --import "$OUT/ncu_wgmma.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_wgmma_source.csv"
  ncu --import "$OUT/ncu_wgmma.ncu-rep" --page raw --csv > "$OUT/ncu_wgmma_raw.csv"
  "$PY" scripts/ncu_regions.py "$OUT/ncu_wgmma_source.csv" "$OUT/ncu_wgmma_raw.csv" | tee "$OUT/ncu_wgmma_regions.txt"
}

step_sanitizer() {
  local rc=0
  build_harness || return 1
  echo "== memcheck: kernel harness (every path, ragged shapes)"
  timeout "${SANITIZER_TIMEOUT:-300}" compute-sanitizer --tool memcheck --error-exitcode 9 \
    build/gpu/kernel_harness check --quick || rc=1
  echo "== memcheck: GPU matmul tests through MLX"
  PYTHONPATH=python MLX_FP4_TEST_DEVICES=gpu MLX_ENABLE_TF32=0 timeout "${SANITIZER_TIMEOUT:-300}" \
    compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$PY" -m pytest -q -p no:cacheprovider -x tests/test_w4a16_matmul.py || rc=1
  return $rc
}

step_decode() {
  PYTHONPATH=python "$PY" -m mlx_fp4.bench decode --out "$OUT/decode" ${DECODE_ARGS:---preset llama3-8b --layers 8 16 32}
}
step_suite() {
  local rc=0 f name code
  export PYTHONPATH=python MLX_FP4_TEST_DEVICES=gpu MLX_ENABLE_TF32=0
  for f in ${SUITE_FILES:-tests/test_*.py}; do
    name="$(basename "$f" .py)"
    "$PY" -m pytest -q -p no:cacheprovider --capture=sys --tb=short -rf "$f" > "/tmp/suite_$name.log" 2>&1
    code=$?
    # 5: no tests collected (e.g. a module skipped without a GPU or a package)
    echo "$name: exit $code, $(tail -n 1 "/tmp/suite_$name.log")"
    if [ "$code" -ne 0 ] && [ "$code" -ne 5 ]; then rc=1; cp "/tmp/suite_$name.log" "$OUT/"; fi
  done
  return $rc
}

step_m1split() {
  local best rc=0 tag
  build_harness || return 1
  build/gpu/kernel_harness bench --decode | tee "$OUT/m1split_kbench.txt" || return 1
  best="$("$PY" scripts/m1_best_tiles.py "$OUT/m1split_kbench.txt")" || return 1
  echo "per-shape tiles: $best"
  for tag in best plan; do
    # shellcheck disable=SC2046
    env $([ "$tag" = best ] && echo "MLX_FP4_CUDA_TC=$best") PYTHONPATH=python "$PY" -m mlx_fp4.bench decode \
      --preset llama3-8b --layers 32 --interleave --variants mlx_nvfp4 fp4 floor --tokens 64 --repeats 3 \
      --device gpu --out "$OUT/m1split_$tag" || rc=1
  done
  return $rc
}
# The plan against forcing one path, per product through MLX: the same bench twice, once with the
# automatic plan and once with MLX_FP4_CUDA_PATH=$PLANAB_PATH (default wgmma), on PLANAB_SHAPES
# (default: Llama-3-8B's k/v 1024x4096, which the plan keeps on the staged kernel up to M = 64) at M = 32..512.
step_planab() {
  local shapes="${PLANAB_SHAPES:-1024x4096}" rc=0
  for path in auto "${PLANAB_PATH:-wgmma}"; do
    echo "== MLX_FP4_CUDA_PATH=$path"
    # shellcheck disable=SC2086
    env $([ "$path" = auto ] || echo MLX_FP4_CUDA_PATH=$path) PYTHONPATH=python "$PY" -m mlx_fp4.bench --device gpu \
      --no-progress --no-plot --out "$OUT/planab_$path" --shapes $shapes --m 32 64 128 256 512 \
      --impls mlx_fp4 mlx_nvfp4 mlx_dense_bf16 --budget 2 --repeats 5 || rc=1
  done
  return $rc
}
step_overhead() { PYTHONPATH=python "$PY" scripts/gpu_op_overhead.py --out "$OUT" ${OVERHEAD_ARGS:-}; }

step_stress() {
  local rc=0 tool
  PYTHONPATH=python "$PY" scripts/gpu_stress.py ${STRESS_ARGS:---threads 8 --iterations 400} || rc=1
  for tool in memcheck racecheck synccheck; do
    echo "== compute-sanitizer --tool $tool"
    PYTHONPATH=python timeout "${SANITIZER_TIMEOUT:-300}" compute-sanitizer --tool "$tool" --error-exitcode 9 \
      "$PY" scripts/gpu_stress.py ${SANITIZER_STRESS_ARGS:---threads 4 --iterations 12} || rc=1
  done
  return $rc
}

for s in "${STEPS[@]}"; do
  echo "=== $s" | tee "$OUT/$s.log"
  start=$(date +%s)
  if ! "step_$s" >>"$OUT/$s.log" 2>&1; then FAILED+=("$s"); fi
  echo "=== $s: $(( $(date +%s) - start )) s, $([[ " ${FAILED[*]-} " == *" $s "* ]] && echo FAILED || echo ok)" | tee -a "$OUT/$s.log"
  tail -n 25 "$OUT/$s.log"
done
[ ${#FAILED[@]} -eq 0 ] || { echo "failed steps: ${FAILED[*]}"; exit 1; }
