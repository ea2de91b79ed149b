#!/usr/bin/env bash
# The arm64 (NEON) build, run under emulation on an x86-64 Linux host: cross-compiles the
# extension with Debian's aarch64 g++ against the arm64 mlx / mlx-cpu wheels from PyPI, then runs
# the CPU test subset with Debian's arm64 Python under qemu-user. Everything comes from Debian's
# and PyPI's packages; downloads are cached in build/arm64/.
#   bash tools/test_arm64.sh [pytest args]     (default: the subset in ARM64_TESTS below)
# Outside CI a host without the tools skips with a message (exit 0); with CI set the tools are
# installed (apt-get, as root) and a failure to do so fails the job.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
WORK="$ROOT/build/arm64"
MLX_VERSION=0.32.4
PY_MINOR=3.11
# The CPU test subset (about 2.5 minutes emulated on 2 cores): every kernel path, formats, the op
# and its epilogues, errors, transforms, threads and memory. Left out: test_properties (5 minutes
# emulated), files that need packages not fetched here (mlx-lm, safetensors) or a GPU, the one
# test that runs a natively built C++ binary (no binfmt handler for arm64 in CI), and two tests
# shaped for CUDA's wgmma paths (51 s of the 190 emulated here; the CPU kernels they reach are
# covered by the rest). A CI machine once ran this subset 7.5x slower than that.
# The real-model tests (test_gguf.py, test_smollm2.py: mlx-lm and a 135M model, minutes natively
# on 2 cores) stay out: they would take hours under qemu.
ARM64_TESTS=(tests/test_cpu_kernel_paths.py tests/test_format.py tests/test_quantize.py tests/test_w4a16_matmul.py
             tests/test_epilogue.py tests/test_errors.py tests/test_adversarial.py tests/test_transforms.py
             tests/test_concurrency.py tests/test_memory.py tests/test_gather.py tests/test_gather_errors.py
             tests/test_mxfp4.py
             --deselect tests/test_adversarial.py::test_index_helpers_int64
             --deselect tests/test_w4a16_matmul.py::test_products_sharing_x_each_correct
             --deselect tests/test_w4a16_matmul.py::test_alternating_paths_each_correct)
DEBS=(libc6 libgcc-s1 libstdc++6 "python$PY_MINOR-minimal" "libpython$PY_MINOR-minimal" "libpython$PY_MINOR-stdlib"
      "libpython$PY_MINOR-dev" libexpat1 zlib1g libffi8 libssl3 libbz2-1.0 liblzma5 libsqlite3-0 libuuid1
      libncursesw6 libtinfo6 libreadline8 libcrypt1 libnsl2 libtirpc3 libdb5.3 libgomp1)
WHEELS=("mlx==$MLX_VERSION" "mlx-cpu==$MLX_VERSION" numpy ml_dtypes pytest hypothesis)

say() { echo "== arm64: $*"; }
have_tools() {
  command -v qemu-aarch64-static >/dev/null && command -v aarch64-linux-gnu-g++ >/dev/null \
    && dpkg --print-foreign-architectures 2>/dev/null | grep -qx arm64
}
if ! have_tools; then
  if [[ -z "${CI:-}" ]]; then
    say "SKIPPED: needs qemu-user-static, g++-aarch64-linux-gnu and dpkg's arm64 architecture (as root:"
    say "  dpkg --add-architecture arm64 && apt-get update && apt-get install qemu-user-static g++-aarch64-linux-gnu)"
    exit 0
  fi
  say "installing qemu-user-static, g++-aarch64-linux-gnu (CI)"
  SUDO=""; [[ "$(id -u)" == 0 ]] || SUDO="sudo"
  $SUDO dpkg --add-architecture arm64
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq qemu-user-static g++-aarch64-linux-gnu >/dev/null
  have_tools || { echo "arm64: tools still missing after apt-get" >&2; exit 1; }
fi

HOSTPY="$ROOT/.venv/bin/python"
[[ -x "$HOSTPY" ]] || HOSTPY=python3
SYSROOT="$WORK/sysroot"
SITE="$WORK/site"
t0=$(date +%s)

# 1. arm64 Python (Debian packages unpacked into a sysroot; nothing is installed on the host).
if [[ ! -x "$SYSROOT/usr/bin/python$PY_MINOR" ]]; then
  say "fetching Debian arm64 Python $PY_MINOR"
  rm -rf "$WORK/debs" "$SYSROOT" && mkdir -p "$WORK/debs" "$SYSROOT"
  (cd "$WORK/debs" && apt-get download -qq "${DEBS[@]/%/:arm64}" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
  for f in "$WORK"/debs/*.deb; do dpkg-deb -x "$f" "$SYSROOT"; done
fi
# A launcher next to the real binary (so Python finds its prefix) that is also sys.executable:
# tests that start a child Python (thread-count and ISA checks) then run it under qemu too.
EMU="$SYSROOT/usr/bin/python-emu"
cat > "$EMU" <<EOF
#!/bin/sh
QEMU_LD_PREFIX="$SYSROOT" exec qemu-aarch64-static -0 "\$0" "$SYSROOT/usr/bin/python$PY_MINOR" "\$@"
EOF
chmod +x "$EMU"
# mx.compile's CPU kernels are C++ that MLX builds with the `g++` on PATH and caches under
# $TMPDIR/mlx: give the emulated process the aarch64 g++ and a cache of its own.
mkdir -p "$WORK/bin" "$WORK/tmp"
ln -sf "$(command -v aarch64-linux-gnu-g++)" "$WORK/bin/g++"
emu() { PATH="$WORK/bin:$PATH" TMPDIR="$WORK/tmp" PYTHONPATH="$SITE" "$EMU" "$@"; }

# 2. arm64 wheels (host pip, --platform: no pip runs under emulation).
if [[ ! -d "$SITE/mlx" ]]; then
  say "fetching arm64 wheels: ${WHEELS[*]}"
  rm -rf "$WORK/wheels" "$SITE"
  plat=(--platform manylinux_2_35_aarch64 --platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64)
  "$HOSTPY" -m pip download -q --only-binary=:all: "${plat[@]}" --python-version "$PY_MINOR" --implementation cp \
    -d "$WORK/wheels" "${WHEELS[@]}" 2>&1 | grep -v "^WARNING: Location" || true
  "$HOSTPY" -m pip install -q --no-deps --only-binary=:all: "${plat[@]}" --python-version "$PY_MINOR" \
    --implementation cp --target "$SITE" "$WORK"/wheels/*.whl 2>&1 | grep -v "^WARNING" || true
  [[ -d "$SITE/mlx" ]] || { echo "arm64: mlx wheel not installed into $SITE" >&2; exit 1; }
fi

# 3. Cross-compile the extension (host Python only finds MLX's CMake files and nanobind).
"$HOSTPY" -c "import nanobind" 2>/dev/null || "$HOSTPY" -m pip install -q 'nanobind>=3,<4'
command -v cmake >/dev/null || "$HOSTPY" -m pip install -q cmake
cat > "$WORK/toolchain.cmake" <<EOF
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static)
EOF
say "cross-compiling the extension"
PYTHONPATH="$SITE" cmake -S "$ROOT" -B "$WORK/cmake" -DCMAKE_TOOLCHAIN_FILE="$WORK/toolchain.cmake" \
  -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$HOSTPY" -DPython_INCLUDE_DIR="$SYSROOT/usr/include/python$PY_MINOR" \
  -DSKBUILD_SOABI="cpython-${PY_MINOR/./}-aarch64-linux-gnu" -DCMAKE_CXX_FLAGS="-isystem $SYSROOT/usr/include -Wno-psabi" \
  -DCMAKE_INSTALL_PREFIX="$WORK/install" >"$WORK/cmake.log" 2>&1 || { cat "$WORK/cmake.log"; exit 1; }
cmake --build "$WORK/cmake" -j "$(nproc)" >"$WORK/build.log" 2>&1 || { tail -50 "$WORK/build.log"; exit 1; }
# The package as users get it: python/mlx_fp4 plus the built module, next to mlx in the site.
rm -rf "$SITE/mlx_fp4"
cp -r "$ROOT/python/mlx_fp4" "$SITE/mlx_fp4"
cp "$WORK"/cmake/_ext*.so "$WORK/cmake/_build_info.py" "$SITE/mlx_fp4/"
say "built in $(( $(date +%s) - t0 )) s; $(emu -c 'import mlx_fp4, platform; print(platform.machine(), mlx_fp4.cpu_info())')"

# 4. The tests, from tests/ so that mlx_fp4 is the package in the site.
args=("$@")
[[ ${#args[@]} -gt 0 ]] || args=("${ARM64_TESTS[@]}")
say "pytest ${args[*]}"
t1=$(date +%s)
rc=0
(cd "$ROOT" && MLX_FP4_TEST_DEVICES=cpu emu -m pytest -q -p no:cacheprovider "${args[@]}") || rc=$?
say "tests took $(( $(date +%s) - t1 )) s (exit $rc)"
exit $rc
