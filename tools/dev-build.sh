#!/usr/bin/env bash
# Development build: compiles the extension into python/mlx_fp4/ (git-ignored) so that
# PYTHONPATH=python works without reinstalling. Usage: tools/dev-build.sh [python]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-${PYTHON:-python3}}"
# An absolute path: CMake runs the interpreter from the build folder (a relative .venv/bin/python
# failed there), and not resolved through symlinks, so a venv's python keeps its packages.
PY_PATH="$(command -v "$PY")" || { echo "dev-build: no python at '$PY'" >&2; exit 1; }
PY_PATH="$(cd "$(dirname "$PY_PATH")" && pwd)/$(basename "$PY_PATH")"
BUILD=build/dev
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$PY_PATH" >/dev/null
cmake --build "$BUILD" -j"$(nproc 2>/dev/null || echo 2)"
so=$(ls "$BUILD"/_ext*.so)
# Replace atomically: processes that already loaded the old file keep working.
cp "$so" python/mlx_fp4/.ext.tmp && mv -f python/mlx_fp4/.ext.tmp "python/mlx_fp4/$(basename "$so")"
cp "$BUILD/_build_info.py" python/mlx_fp4/_build_info.py
echo "built python/mlx_fp4/$(basename "$so")"
