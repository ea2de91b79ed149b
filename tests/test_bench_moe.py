"""Smoke test of the MoE benchmark (python -m mlx_fp4.bench moe) on a small layer. No timing
assertions: it checks that every implementation ran and the JSON holds what the README quotes."""

import json

from mlx_fp4.bench import __main__ as bench_main

SMALL = ["--experts", "8", "--top-k", "2", "--hidden", "64", "--moe-intermediate", "32"]


def test_moe_cli(tmp_path):
    # 40 tokens x top-2 = 80 pairs: mlx-lm's sorted path; 3 tokens: the unsorted decode path.
    rc = bench_main.main(["moe", "--device", "cpu", "--tokens", "3", "40", "--repeats", "1", "--budget", "5",
                          "--out", str(tmp_path), *SMALL])
    assert rc == 0
    doc = json.loads((tmp_path / "moe_cpu.json").read_text())
    assert doc["layer"] == {"experts": 8, "top_k": 2, "hidden": 64, "moe_intermediate": 32}
    assert [p["phase"] for p in doc["points"]] == ["decode, unsorted", "prefill, sorted"]
    for p in doc["points"]:
        assert set(p["results"]) == {"mlx_fp4", "mlx_nvfp4", "dense"}
        assert all(r["status"] == "ok" and r["ms"] > 0 for r in p["results"].values())
        assert p["speedup"]["mlx_nvfp4"] > 0 and p["ours_active_gbps"] > 0
    assert "| 40 | prefill, sorted |" in (tmp_path / "moe_cpu.md").read_text()


def test_moe_one_matmul_host_routing(tmp_path):
    """--op matmul times the gate projection alone (one matrix's active bytes), --routing host the
    numpy indices."""
    rc = bench_main.main(["moe", "--device", "cpu", "--tokens", "2", "--repeats", "1", "--budget", "5",
                          "--op", "matmul", "--routing", "host", "--impls", "mlx_fp4", "mlx_nvfp4",
                          "--out", str(tmp_path)] + SMALL)
    assert rc == 0
    doc = json.loads((tmp_path / "moe_cpu_matmul.json").read_text())
    assert (doc["op"], doc["routing"]) == ("matmul", "host")
    (p,) = doc["points"]
    one_expert = 32 * 64 // 2 + 32 * 64 // 16  # gate: [32, 64] nibbles + one E4M3 scale per 16
    assert 0 < p["active_weight_bytes"] <= 2 * 2 * one_expert  # at most top-2 x 2 tokens distinct experts
    assert all(r["status"] == "ok" for r in p["results"].values())


def test_moe_decode_preset(tmp_path):
    """The decode benchmark's MoE preset runs: the experts of both quantized variants are the same
    bytes (MLX's QuantizedSwitchLinear, wrapped by FP4SwitchLinear). Tokens are not compared with
    MLX's: its CPU gather_qmm accumulates in bf16 (test_moe_e2e checks ours against fp32)."""
    import pytest

    pytest.importorskip("mlx_lm")
    from mlx_fp4.bench import decode

    rc = decode.main(["--preset", "tiny-moe", "--layers", "2", "--prompt", "6", "--tokens", "6", "--repeats", "1",
                      "--variants", "mlx_nvfp4", "fp4_same_bytes", "--device", "cpu", "--out", str(tmp_path), "--no-plot"])
    assert rc == 0
    (point,) = json.loads((tmp_path / "decode_tiny-moe_cpu.json").read_text())["points"]
    ours, mlx = point["variants"]["fp4_same_bytes"], point["variants"]["mlx_nvfp4"]
    assert ours["decode_tok_s"]["median"] > 0 and ours["weight_bytes_per_step"] == mlx["weight_bytes_per_step"]


def test_moe_host_floor_and_fused(tmp_path):
    """--host-floor: every implementation's node count for one layer call, times MLX's measured
    eval cost per node; the fused FP4SwitchGLU has the MLP's elementwise nodes (sigmoid, two
    multiplies) in its epilogues, so fewer nodes than the unfused gathered matmuls."""
    rc = bench_main.main(["moe", "--device", "cpu", "--tokens", "2", "--repeats", "1", "--budget", "5",
                          "--impls", "mlx_fp4", "mlx_fp4_fused", "mlx_nvfp4", "--host-floor",
                          "--out", str(tmp_path)] + SMALL)
    assert rc == 0
    doc = json.loads((tmp_path / "moe_cpu.json").read_text())
    assert doc["node_cost_kernel"]["eval_us_per_node_min"] > 0
    (p,) = doc["points"]
    r = p["results"]
    assert all(v["status"] == "ok" and v["host_floor_ms"] > 0 for v in r.values())
    assert r["mlx_fp4_fused"]["nodes"] < r["mlx_fp4"]["nodes"]
    assert "nodes, host floor ms" in (tmp_path / "moe_cpu.md").read_text()


def test_moe_expert_floor(tmp_path):
    """The floor implementation (one trivial kernel for the experts, the routing still consumed):
    fewer nodes than any real implementation, the right output shape, and the bound column
    (gather_qmm's time over the floor's) in the table."""
    import mlx.core as mx

    from mlx_fp4.bench import moe

    cfg = {"experts": 8, "top_k": 2, "hidden": 64, "moe_intermediate": 32}
    x = mx.ones((3, 64), mx.bfloat16)
    idx = mx.argpartition(-mx.arange(24, dtype=mx.float32).reshape(3, 8), kth=1, axis=-1)[:, :2]
    out = moe.floor_layer(cfg)(x, idx)
    assert out.shape == (3, 2, 64) and out.dtype == mx.bfloat16
    rc = bench_main.main(["moe", "--device", "cpu", "--tokens", "2", "--repeats", "1", "--budget", "5",
                          "--impls", "mlx_fp4", "mlx_nvfp4", "floor", "--host-floor", "--out", str(tmp_path)] + SMALL)
    assert rc == 0
    (p,) = json.loads((tmp_path / "moe_cpu.json").read_text())["points"]
    r = p["results"]
    assert r["floor"]["status"] == "ok" and r["floor"]["nodes"] < r["mlx_fp4"]["nodes"]
    # the routing's argpartition is still in the floor's graph
    assert r["floor"]["nodes"] >= 3
    assert p["floor_x_mlx_nvfp4"] > 0
    assert "bound: mlx_nvfp4 / floor" in (tmp_path / "moe_cpu.md").read_text()
