"""The committed type stub python/mlx_fp4/_ext.pyi matches the extension (regenerate with
`python -m nanobind.stubgen -m mlx_fp4._ext -o python/mlx_fp4/_ext.pyi`)."""

import os
import subprocess
import sys

import pytest

import mlx_fp4
from common import package_pythonpath

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ext_stub_is_current(tmp_path):
    pytest.importorskip("nanobind.stubgen")
    out = tmp_path / "_ext.pyi"
    env = dict(os.environ, PYTHONPATH=package_pythonpath())
    subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-q", "-m", "mlx_fp4._ext", "-o", str(out)],
                   check=True, env=env, timeout=120)
    committed = os.path.join(ROOT, "python", "mlx_fp4", "_ext.pyi")
    with open(committed) as f:
        assert out.read_text() == f.read(), "regenerate python/mlx_fp4/_ext.pyi (see the module docstring)"
    assert mlx_fp4.w4a16_matmul.__doc__
