#!/usr/bin/env bash
# Builds tests/cpp/bench_cpu_kernel.cpp with the CPU kernel sources (as the extension compiles
# them: -O3, per-file ISA flags from CMakeLists.txt) into build/cpu-bench/, then runs it.
# Usage: tests/cpp/bench_cpu_kernel.sh M N K [reps]       (env: CXX, PYTHON, MLX_FP4_CPU_ISA, ...)
#        CALLGRIND=1 tests/cpp/bench_cpu_kernel.sh M N K   (instruction counts of run_w4a16, one thread)
set -euo pipefail
cd "$(dirname "$0")/../.."
CXX=${CXX:-g++}
PY=${PYTHON:-python3}
[[ -x .venv/bin/python && -z "${PYTHON:-}" ]] && PY=.venv/bin/python
MLX_INCLUDE=$("$PY" -c "import importlib.util, os; s = importlib.util.find_spec('mlx'); print(os.path.join(list(s.submodule_search_locations)[0], 'include'))")
out=build/cpu-bench
mkdir -p "$out"
objs=()
for f in csrc/cpu/*.cpp tests/cpp/bench_cpu_kernel.cpp; do
  grep -qE '#include "(\.\./primitives\.h|mlx/(allocator|array|backend/[^"]*))"' "$f" && continue
  flags=$(grep -E "set_source_files_properties\($f " CMakeLists.txt | sed -E 's/.*COMPILE_OPTIONS "([^"]*)".*/\1/' | tr ';' ' ' || true)
  o="$out/$(basename "${f%.cpp}").o"
  if [[ ! -f "$o" || "$f" -nt "$o" || csrc/cpu/microkernel.inc -nt "$o" || csrc/cpu/tiling_cpu.h -nt "$o" ]]; then
    # shellcheck disable=SC2086
    $CXX -std=c++17 -O3 -g -Wall -Wno-unused-function -Icsrc -isystem "$MLX_INCLUDE" $flags -c "$f" -o "$o"
  fi
  objs+=("$o")
done
$CXX "${objs[@]}" -o "$out/bench_cpu_kernel" -pthread
if [[ -n "${CALLGRIND:-}" ]]; then
  MLX_FP4_NUM_THREADS=1 valgrind --tool=callgrind --callgrind-out-file="$out/callgrind.out" --collect-atstart=no \
    --toggle-collect='mlx_fp4::cpu::run_w4a16*' "$out/bench_cpu_kernel" "$1" "$2" "$3" 1 2>&1 | grep -E "Collected|avx|generic|M="
else
  "$out/bench_cpu_kernel" "$@"
fi
