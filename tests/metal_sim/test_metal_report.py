"""python -m mlx_fp4.bench metal-report: without Metal it writes a report saying nothing ran (exit
0); the Markdown renders every kind of row a Mac produces."""

import json

import mlx.core as mx
import pytest

from mlx_fp4.bench import metal_report


@pytest.mark.skipif(mx.metal.is_available(), reason="the Mac path runs in the macOS CI job")
def test_without_metal_the_report_says_nothing_ran(tmp_path):
    assert metal_report.main(["--out", str(tmp_path), "--quick"]) == 0
    doc = json.loads((tmp_path / "metal_report.json").read_text())
    assert doc["gpu"] == {"metal": False} and "nothing ran on a GPU" in doc["note"]
    assert "nothing ran on a GPU" in (tmp_path / "metal_report.md").read_text()


def test_markdown_renders_gpu_rows():
    doc = {"command": "python -m mlx_fp4.bench metal-report", "versions": {"mlx": "0.32.4", "mlx_fp4": "x"},
           "gpu": {"metal": True, "device_name": "Apple M4 Max", "architecture": "applegpu_g16s",
                   "macos": "15.5", "kernels_run": True},
           "correctness": [{"config": "gemv1", "m": 1, "n": 70, "k": 37, "dtype": "bfloat16",
                            "error_over_bound": 0.1, "ok": True},
                           {"config": "gemm64", "m": 70, "n": 65, "k": 37, "dtype": "float16",
                            "ok": False, "error": "RuntimeError: x"}],
           "speed": [{"m": 1, "n": 4096, "k": 4096, "mlx_fp4_us": 20.0, "mlx_nvfp4_us": 30.0,
                      "speedup_vs_mlx": 1.5, "weight_gbps": 400.0},
                     {"m": 2, "n": 4096, "k": 4096, "error": "RuntimeError: y"}]}
    md = metal_report.markdown(doc)
    assert "1 of 2 checks pass" in md and "FAIL" in md and "| 4096x4096 | 1 | 20.0 | 30.0 | 1.50 | 400 |" in md
    assert "RuntimeError: y" in md


def test_gathered_check_compares_against_an_independent_bound():
    """The gathered check's plumbing on any machine: the CPU against itself is within the bound
    (error 0), NaNs agree; the bound's magnitude is the sum |x| |w| of each pair's own expert."""
    ratio, nan_ok = metal_report.check_gather_one(None, mx.bfloat16, stream=mx.cpu)
    assert ratio == 0.0 and nan_ok
    assert [k for k in metal_report.GATHER_KERNELS if k] == ["pairs", "runs", "gemm"]
