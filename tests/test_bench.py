"""Smoke tests of the benchmark harness (python -m mlx_fp4.bench). No timing assertions."""

import importlib.util
import json
import math
import os
import subprocess
import sys

import mlx.core as mx
import pytest

import mlx_fp4

from mlx_fp4.bench import __main__ as bench_main
from mlx_fp4.bench import plot, shapes, timing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULT_KEYS = {"label", "status", "weight_bytes", "us", "us_min", "gbps_weights", "tflops", "seconds", "seconds_min",
               "repeats", "products_per_eval", "warmup_evals", "weight_copies", "first_call_s"}
POINT_KEYS = {"shape", "n", "k", "m", "flops", "weight_bytes", "traffic_bytes", "weights_fit_llc", "results",
              "roofline", "speedup"}


def _positive(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _check_doc(doc, device="cpu"):
    for key in ("schema", "command", "device", "config", "timing_method", "rooflines", "implementations", "checks",
                "points"):
        assert key in doc, key
    dev = doc["device"]
    assert dev["device"] == device
    for key in ("device_name", "cpu_model", "threads", "versions", "git", "os"):
        assert key in dev, key
    assert dev["versions"]["mlx"] == mx.__version__
    assert _positive(dev["threads"]["cpus"])
    assert dev["cpu"]["machine"] and "numpy_blas" in dev  # CPU ratios name their machine and BLAS
    assert "git" in dev and "commit" in dev["git"]
    assert doc["timing_method"]["description"] and doc["timing_method"]["launch_overhead"]
    assert doc["points"], "no points"
    for p in doc["points"]:
        assert POINT_KEYS <= set(p), POINT_KEYS - set(p)
        assert set(p["results"]) == set(doc["implementations"])
        for name, r in p["results"].items():
            assert RESULT_KEYS <= set(r), (name, RESULT_KEYS - set(r))
            if r["status"] == timing.OK:
                for key in ("us", "us_min", "gbps_weights", "tflops", "repeats", "products_per_eval"):
                    assert _positive(r[key]), (p["shape"], p["m"], name, key, r[key])
            else:
                assert r["status"] == timing.SKIPPED_BUDGET, (name, r["status"])
                assert r["us"] is None and r["tflops"] is None
        assert p["results"]["mlx_fp4"]["status"] == timing.OK
        roof = p["roofline"]
        assert _positive(roof["bandwidth_gbps"]) and _positive(roof["pct_bandwidth"])
        for name, s in p["speedup"].items():
            assert s is None or _positive(s), (name, s)
            assert (s is None) == (p["results"][name]["us"] is None)
    for name, c in doc["checks"].items():
        assert c["ok"], (name, c)


def test_quick_cli(tmp_path):
    """The documented CI command runs and writes a complete JSON, the table and the PNG."""
    env = dict(os.environ)
    # The subprocess must import the same mlx_fp4 as this process (installed or python/ dev tree).
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(mlx_fp4.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [pkg_parent, env.get("PYTHONPATH")]))
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "mlx_fp4.bench", "--quick", "--device", "cpu", "--no-progress", "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ours us" in r.stdout and "timing:" in r.stdout
    doc = json.loads((out / "w4a16_matmul_cpu.json").read_text())
    _check_doc(doc)
    assert doc["config"]["quick"] is True
    assert {p["m"] for p in doc["points"]} == set(shapes.QUICK_M)
    assert {"mlx_fp4", "mlx_nvfp4", "mlx_dense_bf16", "numpy_fp32"} == set(doc["implementations"])
    assert doc["rooflines"]["bandwidth_per_shape"]
    png = out / "w4a16_matmul_cpu.png"
    if importlib.util.find_spec("matplotlib") is not None:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:  # the plot is optional: one line saying how to get it, the JSON and table still written
        assert not png.exists() and plot.INSTALL_HINT in r.stdout + r.stderr
    assert (out / "w4a16_matmul_cpu.md").read_text().count("\n") > 3


def test_budget_skip_is_reported(tmp_path, capsys):
    """A point over the time budget is reported as 'skipped (budget)', never silently dropped."""
    old = mx.default_device()
    try:
        rc = bench_main.main(["--device", "cpu", "--shapes", "64x256", "--m", "1", "64", "--budget", "1e-7",
                              "--repeats", "1", "--rotate-mb", "0", "--no-progress", "--no-plot", "--out", str(tmp_path)])
    finally:
        mx.set_default_device(old)
    assert rc == 0
    doc = json.loads((tmp_path / "w4a16_matmul_cpu.json").read_text())
    first, second = sorted(doc["points"], key=lambda p: p["m"])
    assert all(r["status"] == timing.OK for r in first["results"].values())
    assert all(r["status"] == timing.SKIPPED_BUDGET for r in second["results"].values())
    assert all(s is None for s in second["speedup"].values())
    assert "skip" in capsys.readouterr().out


def test_parse_shape():
    assert shapes.parse_shape("14336x4096") == shapes.Shape(14336, 4096)
    s = shapes.parse_shape("4096x4096")
    assert s.weight_bytes == 4096 * 2048 + 4096 * 256
    with pytest.raises(ValueError, match=r"\[bench\] --shapes expected NxK"):
        shapes.parse_shape("4096")
    with pytest.raises(ValueError, match="multiple of 16"):
        shapes.parse_shape("4096x100")


def test_measure_budget_logic():
    calls = []

    def run(count):
        calls.append(count)
        return 1e-3 * count

    cfg = timing.TimingConfig(repeats=4, budget_s=1.0, target_eval_s=0.005, max_products=8, warmup_s=0.0)
    m = timing.measure(run, cfg)
    assert m.status == timing.OK and m.repeats == 4 and m.products_per_eval == 5 and m.warmup_evals == 2
    assert math.isclose(m.seconds, 1e-3) and calls == [1, 1, 5, 5, 5, 5]
    calls.clear()
    m = timing.measure(run, timing.TimingConfig(repeats=2, budget_s=1.0, max_products=8, warmup_s=0.05))
    assert m.warmup_evals >= 3 and calls[:2] == [1, 1] and set(calls[2:]) == {5}  # batched warm-up
    calls.clear()
    assert timing.measure(run, cfg, predicted_s=2.0).status == timing.SKIPPED_BUDGET and not calls
    one = timing.measure(run, cfg, predicted_s=0.7)  # room for one product only: no warm-up
    assert one.status == timing.OK and calls == [1] and one.warmup_evals == 0
    calls.clear()
    built = timing.measure(lambda c: calls.append(c) or (40.0 if len(calls) == 1 else 0.6), cfg, predicted_s=0.7)
    assert built.seconds == 0.6 and built.first_call_s == 40.0 and calls == [1, 1]  # a kernel built at this M
    calls.clear()
    assert timing.seed_seconds(lambda c: calls.append(c) or (0.026 if len(calls) == 1 else 4e-5)) == 4e-5
    assert calls == [1, 1]  # the seed of a prediction is a second product, never the first
    ex = timing.Extrapolator()
    ex.record("k", 4, 2.0)
    assert ex.predict("k", 16) == 8.0 and ex.predict("other", 16) is None


def test_measure_one_time_cost_is_not_planned_from():
    """A slow first product (JIT, kernel load) neither eats the budget nor sets products per eval."""
    calls = []

    def run(count):
        calls.append(count)
        return 3.0 if len(calls) == 1 else 1e-4 * count

    m = timing.measure(run, timing.TimingConfig(repeats=3, budget_s=4.0, max_products=32, warmup_s=0.0))
    assert m.status == timing.OK and m.products_per_eval == 32 and m.repeats == 3
    assert math.isclose(m.seconds, 1e-4) and m.first_call_s == 3.0


def test_measure_first_product_over_budget_is_not_the_time():
    """A first product longer than the whole budget (seen: a 31-47 s kernel build) is not reported."""
    calls = []

    def run(count):
        calls.append(count)
        return 40.0 if len(calls) == 1 else 1e-4 * count

    m = timing.measure(run, timing.TimingConfig(repeats=3, budget_s=10.0, max_products=32, warmup_s=0.0))
    assert m.status == timing.OK and math.isclose(m.seconds, 1e-4) and m.repeats == 3
    assert m.first_call_s == 40.0

    calls.clear()

    def slow(count):  # slow every time: the second product is the single sample
        calls.append(count)
        return 12.0 * count

    m = timing.measure(slow, timing.TimingConfig(repeats=3, budget_s=10.0, max_products=32, warmup_s=0.0))
    assert m.status == timing.OK and m.seconds == 12.0 and m.repeats == 1 and calls == [1, 1]
