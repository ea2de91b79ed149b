"""python -m mlx_fp4.bench --quick --out DIR on a plain install (no matplotlib): JSON and
Markdown are written, one line says how to get the plot, exit status 0. matplotlib is made
unimportable for the subprocess by a stub package earlier on its path."""

import os
import subprocess
import sys

from common import package_pythonpath
from mlx_fp4.bench import plot


def test_quick_bench_without_matplotlib(tmp_path):
    stub = tmp_path / "stub" / "matplotlib"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text('raise ImportError("No module named \'matplotlib\' (test stub)")\n')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "stub"), package_pythonpath()]))
    out = tmp_path / "out"
    # --quick, made smaller still so CI stays fast: one small shape, one M, one repeat
    cmd = [sys.executable, "-m", "mlx_fp4.bench", "--quick", "--device", "cpu", "--shapes", "64x256", "--m", "1",
           "--repeats", "1", "--rotate-mb", "0", "--no-progress", "--out", str(out)]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert plot.INSTALL_HINT in run.stdout and "pip install matplotlib" in plot.INSTALL_HINT
    assert sorted(p.name for p in out.iterdir()) == ["w4a16_matmul_cpu.json", "w4a16_matmul_cpu.md"]
