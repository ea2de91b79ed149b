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
           "speed": [{"m": 1, "n": 4096, "k": 4096, "route": "ours", "kernel": "mlx_fp4_w4a16_gemv_mt1",
                      "mlx_fp4_us": 20.0, "kernel_us": 20.5, "mlx_nvfp4_us": 30.0,
                      "speedup_vs_mlx": 1.5, "kernel_speedup_vs_mlx": 1.46, "weight_gbps": 400.0},
                     {"m": 2, "n": 4096, "k": 4096, "error": "RuntimeError: y"}],
           "tuning": {"enabled": True, "state": "new", "path": "/c/metal_tuning.json",
                      "decisions": [{"bucket": 32, "n": 4096, "k": 4096, "dtype": "bfloat16",
                                     "mode": "nvfp4", "route": "mlx", "ours_s": 2e-5, "mlx_s": 1e-5}]}}
    md = metal_report.markdown(doc)
    assert "1 of 2 checks pass" in md and "FAIL" in md
    assert "| 4096x4096 | 1 | ours | mlx_fp4_w4a16_gemv_mt1 | 20.0 | 20.5 | 30.0 | 1.50 | 1.46 | 400 |" in md
    assert "RuntimeError: y" in md
    assert "| 32 | 4096 | 4096 | bfloat16 | nvfp4 | mlx | 20.0 | 10.0 |" in md
    doc["configs"] = [{"m": 16, "n": 4096, "k": 4096, "config": "gemv16", "us": 12.34},
                      {"m": 16, "n": 4096, "k": 4096, "config": "gemm64", "error": "RuntimeError: z"}]
    md = metal_report.markdown(doc)
    assert "| 16 | gemv16 | 12.3 |" in md and "| 16 | gemm64 | RuntimeError: z |" in md


def test_paravirtual_gpu_gets_no_speed_table(monkeypatch):
    """A macOS VM's paravirtual GPU (or any non-Apple7 GPU) runs the op on the CPU: the report
    says why and prints no table against MLX's GPU kernel."""
    monkeypatch.setattr(metal_report.mx.metal, "is_available", lambda: True)
    monkeypatch.setattr(metal_report.mx, "device_info",
                        lambda *a: {"architecture": "Apple Paravirtual device", "device_name": "VM"})
    g = metal_report.gpu_info()
    assert g["kernels_run"] is False and "paravirtual" in g["no_speed_table"]
    doc = {"command": "c", "versions": {"mlx": "0.32.4", "mlx_fp4": "x"}, "gpu": g, "correctness": []}
    md = metal_report.markdown(doc)
    assert "No speed table" in md and "Speed vs" not in md


def test_grid_covers_every_vector_path_row():
    assert metal_report.GRID_M[:16] == list(range(1, 17)) and metal_report.GRID_M[-1] == 1024


def test_gathered_check_compares_against_an_independent_bound():
    """The gathered check's plumbing on any machine: the CPU against itself is within the bound
    (error 0), NaNs agree; the bound's magnitude is the sum |x| |w| of each pair's own expert."""
    ratio, nan_ok = metal_report.check_gather_one(None, mx.bfloat16, stream=mx.cpu)
    assert ratio == 0.0 and nan_ok
    assert [k for k in metal_report.GATHER_KERNELS if k] == ["pairs", "runs", "gemm"]
