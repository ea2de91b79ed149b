"""On a Mac (the macOS CI job): every Metal kernel config on the real GPU, forced one at a time
through MLX_FP4_METAL_KERNEL, against the float64 reference (tests/reference.py) within the
tolerance table (tests/common.py). The simulator proves the same MSL on Linux; this proves what
the simulator cannot (the Metal compiler, the hardware, the MLX integration). Skipped without
an Apple GPU.
"""

import mlx.core as mx
import numpy as np
import pytest

import common
from simcheck import ALL_CONFIGS

pytestmark = pytest.mark.skipif(not mx.metal.is_available(), reason="needs an Apple GPU (Metal)")


def gpu_generation():
    """Architecture generation from MLX ("applegpu_g15s" -> 15; 0 for anything else), as the
    route in csrc/ops.cpp reads it."""
    arch = str(mx.device_info(mx.gpu).get("architecture", "")) if mx.metal.is_available() else ""
    digits = arch[len("applegpu_g"):] if arch.startswith("applegpu_g") else ""
    num = "".join(ch for ch in digits if ch.isdigit())
    return int(num) if num else 0


# Before Apple7 (M1 = generation 13) the kernels cannot compile (no simdgroup_matrix, no bfloat):
# the op runs on the CPU there (a paravirtual CI GPU); forcing a kernel would prove nothing.
KERNELS_RUN = mx.metal.is_available() and gpu_generation() >= 13
needs_kernels = pytest.mark.skipif(
    not KERNELS_RUN,
    reason="GPU before Apple7: the op runs on the CPU here (test_old_gpu_falls_back_to_the_cpu)"
    if mx.metal.is_available() else "needs an Apple GPU (Metal)")

SHAPES = {
    # (M, N, K): ragged (odd K, K % BK != 0, K < 16) and tile-aligned
    "gemv": [(1, 70, 37), (3, 65, 7), (4, 256, 512), (8, 33, 100), (13, 70, 64)],
    "gemm": [(70, 65, 37), (5, 9, 1), (133, 130, 200), (256, 256, 512)],
}
EPILOGUES = {
    "none": lambda m, n, g: None,
    "bias_silu": lambda m, n, g: [("add", mx.array(g.standard_normal(n).astype(np.float32))),
                                  "silu"],
    "gate_gelu_clamp": lambda m, n, g: [
        ("mul", mx.array(g.standard_normal((m, n)).astype(np.float16))), "gelu",
        ("clamp", -0.5, 2.0)],
    "row_tanh_scale": lambda m, n, g: [
        ("add", mx.array(g.standard_normal((m, 1)).astype(np.float32)).astype(mx.bfloat16)),
        "tanh", ("scale", 0.5), "relu", "sigmoid", "gelu_approx"],
}


def cases():
    for force in ALL_CONFIGS:
        for m, n, k in SHAPES["gemv" if force.startswith("gemv") else "gemm"]:
            for dtype in common.DTYPES:
                for epi in EPILOGUES:
                    yield force, m, n, k, dtype, epi


@needs_kernels
@pytest.mark.parametrize(
    "force,m,n,k,dtype,epi", list(cases()),
    ids=lambda v: common.dname(v) if isinstance(v, mx.Dtype) else str(v))
def test_forced_kernel_on_gpu(monkeypatch, force, m, n, k, dtype, epi):
    import mlx_fp4

    monkeypatch.setenv("MLX_FP4_METAL_KERNEL", force)
    g = common.rng("metal_gpu", force, m, n, k, common.dname(dtype), epi)
    x = common.rand_x((m, k), dtype, g)
    w, scales, _ = common.rand_weights(n, k, g)
    epilogue = EPILOGUES[epi](m, n, g)
    gs = 0.375 if epi == "gate_gelu_clamp" else None
    out = mlx_fp4.w4a16_matmul(x, w, scales, global_scale=gs, epilogue=epilogue, stream=mx.gpu)
    mx.eval(out)
    common.check_matmul(out, x, w, scales, k=k, global_scale=gs, epilogue=epilogue)


@needs_kernels
@pytest.mark.parametrize("m", [1, 4, 8, 9, 255, 256, 300])
def test_auto_choice_on_gpu(monkeypatch, m):
    import mlx_fp4

    monkeypatch.delenv("MLX_FP4_METAL_KERNEL", raising=False)
    g = common.rng("metal_gpu_auto", m)
    x = common.rand_x((m, 96), mx.bfloat16, g)
    w, scales, _ = common.rand_weights(200, 96, g, layout="uint32")
    out = mlx_fp4.w4a16_matmul(x, w, scales, stream=mx.gpu)
    mx.eval(out)
    common.check_matmul(out, x, w, scales, k=96)


@pytest.mark.parametrize("m", [1, 64])
def test_old_gpu_falls_back_to_the_cpu(monkeypatch, m):
    """The route `cpu` (automatic before Apple7, forced here on any Mac) gives the reference's
    result through the CPU kernels, with the GPU stream requested."""
    import mlx_fp4

    monkeypatch.setenv("MLX_FP4_METAL_ROUTE", "auto" if not KERNELS_RUN else "cpu")
    g = common.rng("metal_gpu_fallback", m)
    x = common.rand_x((m, 80), mx.bfloat16, g)
    w, scales, _ = common.rand_weights(96, 80, g)
    out = mlx_fp4.w4a16_matmul(x, w, scales, stream=mx.gpu)
    mx.eval(out)
    common.check_matmul(out, x, w, scales, k=80)


@needs_kernels
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float32], ids=common.dname)
def test_route_to_mlx(monkeypatch, dtype):
    """MLX_FP4_METAL_ROUTE=mlx: mx.quantized_matmul(mode="nvfp4") + the global scale in fp32. With
    the output in x's dtype and no epilogue, MLX's one rounding is the output rounding."""
    import mlx_fp4

    monkeypatch.setenv("MLX_FP4_METAL_ROUTE", "mlx")
    g = common.rng("metal_gpu_route", common.dname(dtype))
    x = common.rand_x((40, 128), dtype, g)
    w, scales, _ = common.rand_weights(72, 128, g)
    out = mlx_fp4.w4a16_matmul(x, w, scales, stream=mx.gpu)
    mx.eval(out)
    common.check_matmul(out, x, w, scales, k=128)


@needs_kernels
@pytest.mark.parametrize("force,m,n,k", [("gemm64k3", 40, 130, 300), ("gemm128sk2", 129, 128, 512),
                                         ("gemm64", 16, 4096, 1024)])
def test_split_k_on_gpu(monkeypatch, force, m, n, k):
    """Forced and automatic split-K (the last: 4 partitions of 8 strips) against the reference,
    with the global scale and an epilogue applied by the reduction."""
    import mlx_fp4

    monkeypatch.setenv("MLX_FP4_METAL_KERNEL", force)
    g = common.rng("metal_gpu_split", force, m, n, k)
    x = common.rand_x((m, k), mx.bfloat16, g)
    w, scales, _ = common.rand_weights(n, k, g)
    epilogue = EPILOGUES["bias_silu"](m, n, g)
    out = mlx_fp4.w4a16_matmul(x, w, scales, global_scale=0.375, epilogue=epilogue, stream=mx.gpu)
    mx.eval(out)
    common.check_matmul(out, x, w, scales, k=k, global_scale=0.375, epilogue=epilogue)


MX_SHAPES = {"gemv": [(1, 70, 37), (4, 256, 512), (13, 70, 100)],
             "gemm": [(70, 65, 37), (133, 130, 200), (256, 256, 512)]}


@needs_kernels
@pytest.mark.parametrize("force", ALL_CONFIGS)
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16], ids=common.dname)
def test_forced_kernel_on_gpu_mxfp4(monkeypatch, force, dtype):
    """MXFP4 (E8M0 per 32, K % 32 != 0 tails) through every kernel config on the GPU (our
    kernels: MLX_FP4_METAL_ROUTE=ours, also on an M5)."""
    import mlx_fp4

    monkeypatch.setenv("MLX_FP4_METAL_KERNEL", force)
    monkeypatch.setenv("MLX_FP4_METAL_ROUTE", "ours")
    for m, n, k in MX_SHAPES["gemv" if force.startswith("gemv") else "gemm"]:
        g = common.rng("metal_gpu_mxfp4", force, m, n, k, common.dname(dtype))
        x = common.rand_x((m, k), dtype, g)
        w, scales, _ = common.rand_weights(n, k, g, mode="mxfp4")
        epilogue = EPILOGUES["bias_silu"](m, n, g)
        out = mlx_fp4.w4a16_matmul(x, w, scales, epilogue=epilogue, mode="mxfp4", stream=mx.gpu)
        mx.eval(out)
        common.check_matmul(out, x, w, scales, k=k, epilogue=epilogue, mode="mxfp4")


@needs_kernels
def test_tuner_measures_and_persists_on_gpu(monkeypatch, tmp_path):
    """On an Apple GPU the tuner times both routes of a new bucket, hands the faster to the op and
    writes it to the cache file; a second process-level tuner loads it without timing."""
    import json

    import mlx_fp4
    from mlx_fp4 import _ext, tuning

    monkeypatch.setenv(tuning.ENV_TUNE, "1")
    monkeypatch.setenv(tuning.ENV_CACHE_DIR, str(tmp_path))
    monkeypatch.setattr(tuning, "_tuner", None)
    monkeypatch.setattr(tuning, "_ACTIVE", None)
    monkeypatch.setattr(tuning, "TIMED_RUNS", 2)
    _ext._metal_route_clear()
    try:
        g = common.rng("metal_gpu_tuner")
        x = common.rand_x((12, 256), mx.bfloat16, g)
        w, scales, _ = common.rand_weights(512, 256, g)
        out = mlx_fp4.w4a16_matmul(x, w, scales, stream=mx.gpu)
        mx.eval(out)
        common.check_matmul(out, x, w, scales, k=256)
        (e,) = mlx_fp4.metal_tuning()["decisions"]
        assert (e["bucket"], e["n"], e["k"], e["dtype"]) == (12, 512, 256, "bfloat16")
        assert e["route"] == ("ours" if e["ours_s"] <= e["mlx_s"] else "mlx")
        assert _ext._metal_route_get(12, 512, 256, mx.bfloat16, "nvfp4") == e["route"]
        doc = json.loads((tmp_path / tuning.CACHE_FILE).read_text())
        assert doc["environment"] == tuning.environment() and doc["decisions"] == [e]
    finally:
        _ext._metal_route_clear()
