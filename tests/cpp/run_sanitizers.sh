#!/usr/bin/env bash
# Builds tests/cpp/test_cpu_kernel.cpp (and tests/cpp/test_index_helpers.cpp) with the CPU kernel sources (csrc/cpu/*.cpp that do not
# need MLX's runtime; MLX headers only for half_types.h) three times and runs each:
#   plain   -O2
#   tsan    -O1 -g -fsanitize=thread
#   asan    -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all
# Usage: tests/cpp/run_sanitizers.sh [quick] [plain|tsan|asan ...]
#   quick: fewer shapes (what CI may run); default variants: plain tsan asan.
# Env: CXX (default g++), MLX_INCLUDE (default: from the python in PYTHON or /work/venv),
#      MLX_FP4_NUM_THREADS (default 4 here, so the pool has workers even on 2 cores).
# Exit status: 0 only if every variant built and passed.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
CXX=${CXX:-g++}
PY=${PYTHON:-}
if [[ -z "$PY" ]]; then
  if [[ -x /work/venv/bin/python ]]; then PY=/work/venv/bin/python; else PY=python3; fi
fi
MLX_INCLUDE=${MLX_INCLUDE:-$("$PY" -c "import importlib.util, os; s = importlib.util.find_spec('mlx'); print(os.path.join(list(s.submodule_search_locations)[0], 'include'))")}
export MLX_FP4_NUM_THREADS=${MLX_FP4_NUM_THREADS:-4}

MODE=full
VARIANTS=()
for a in "$@"; do
  case "$a" in
    quick) MODE=quick ;;
    plain|tsan|asan) VARIANTS+=("$a") ;;
    *) echo "unknown argument $a" >&2; exit 2 ;;
  esac
done
[[ ${#VARIANTS[@]} -eq 0 ]] && VARIANTS=(plain tsan asan)

# Kernel sources: every csrc/cpu/*.cpp that does not include MLX's runtime (primitives, encoder).
SOURCES=()
for f in csrc/cpu/*.cpp; do
  if grep -qE '#include "(\.\./primitives\.h|mlx/(allocator|array|backend/[^"]*))"' "$f"; then continue; fi
  SOURCES+=("$f")
done
# Per-file ISA flags, read from CMakeLists.txt (set_source_files_properties(... COMPILE_OPTIONS "a;b")).
isa_flags() {
  local line
  line=$(grep -E "set_source_files_properties\($1 " CMakeLists.txt || true)
  if [[ -n "$line" ]]; then
    sed -E 's/.*COMPILE_OPTIONS "([^"]*)".*/\1/' <<<"$line" | tr ';' ' '
  fi
}

COMMON="-std=c++17 -Wall -Wno-unused-function -I$ROOT/csrc -isystem $MLX_INCLUDE"
declare -A FLAGS=(
  [plain]="-O2"
  [tsan]="-O1 -g -fno-omit-frame-pointer -fsanitize=thread"
  [asan]="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all"
)
export TSAN_OPTIONS=${TSAN_OPTIONS:-"halt_on_error=1 second_deadlock_stack=1"}
# detect_stack_use_after_return stays off: libasan's fake stack frames (GCC 12) are not 64-byte
# aligned, and GCC spills AVX-512 locals with aligned vmovaps -> a SEGV inside ASan, not a bug.
export ASAN_OPTIONS=${ASAN_OPTIONS:-"detect_leaks=1:halt_on_error=1:detect_stack_use_after_return=0"}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-"print_stacktrace=1:halt_on_error=1"}

# The file that picks the hot-loop build at run time; rebuilt with __builtin_cpu_supports forced
# so the avx2-fma and generic-128 builds are exercised too (plain and asan variants).
DISPATCH=$(grep -l "__builtin_cpu_supports" "${SOURCES[@]}" | head -1 || true)
FORCE_AVX2='-D__builtin_cpu_supports(f)=(__builtin_strcmp((f),"avx512f")!=0)'
FORCE_GENERIC='-D__builtin_cpu_supports(f)=0'
cpu_has() { grep -qw "$1" /proc/cpuinfo 2>/dev/null; }

run_binary() {  # name binary expected-hot-loops
  local t1 rc=0
  t1=$(date +%s)
  echo "== $1: running ($MODE, MLX_FP4_NUM_THREADS=$MLX_FP4_NUM_THREADS${3:+, expect $3})"
  MLX_FP4_EXPECT_HOT_LOOPS="$3" "$2" "$MODE" || rc=$?
  if [[ $rc -eq 0 ]]; then
    echo "== $1: PASS ($(( $(date +%s) - t1 )) s)"
  else
    echo "== $1: FAIL (exit $rc)" >&2
    status=1
  fi
}

status=0
for v in "${VARIANTS[@]}"; do
  out="build/sanitizers/$v"
  mkdir -p "$out"
  objs=()
  pids=()
  t0=$(date +%s)
  for f in "${SOURCES[@]}" tests/cpp/test_cpu_kernel.cpp; do
    o="$out/$(basename "${f%.cpp}").o"
    extra=""
    # A file whose hot loops opt out of ASan (no_sanitize_address) while GCC inlines instrumented
    # helpers into them is left with stale use-after-scope poison on the stack (a false report in
    # the next instrumented frame, e.g. avx512::hsum): compile such files without scope checks.
    if [[ $v == asan ]] && grep -q "no_sanitize_address" "$f"; then extra="-fno-sanitize-address-use-after-scope"; fi
    # shellcheck disable=SC2046
    $CXX $COMMON ${FLAGS[$v]} $extra $(isa_flags "$f") -c "$f" -o "$o" &
    pids+=($!)
    objs+=("$o")
  done
  for p in "${pids[@]}"; do wait "$p"; done  # set -e: a failed compile stops here
  $CXX ${FLAGS[$v]} "${objs[@]}" -o "$out/test_cpu_kernel" -pthread
  echo "== $v: built from ${SOURCES[*]} in $(( $(date +%s) - t0 )) s"
  run_binary "$v" "$out/test_cpu_kernel" ""
  $CXX $COMMON ${FLAGS[$v]} tests/cpp/test_index_helpers.cpp -o "$out/test_index_helpers"
  run_binary "$v/index-helpers" "$out/test_index_helpers" ""
  if [[ "$v" != tsan && -n "$DISPATCH" ]]; then
    forced=()
    cpu_has avx2 && cpu_has fma && cpu_has avx512f && forced+=(avx2)
    forced+=(generic)
    for isa in "${forced[@]}"; do
      if [[ $isa == avx2 ]]; then def=$FORCE_AVX2; name=avx2-fma; else def=$FORCE_GENERIC; name=generic-128; fi
      d_obj="$out/dispatch_$isa.o"
      $CXX $COMMON ${FLAGS[$v]} "$def" -c "$DISPATCH" -o "$d_obj"
      alt=()
      for o in "${objs[@]}"; do
        [[ "$o" == "$out/$(basename "${DISPATCH%.cpp}").o" ]] && alt+=("$d_obj") || alt+=("$o")
      done
      $CXX ${FLAGS[$v]} "${alt[@]}" -o "$out/test_cpu_kernel_$isa" -pthread
      run_binary "$v/$name" "$out/test_cpu_kernel_$isa" "$name"
    done
  fi
done
exit $status
