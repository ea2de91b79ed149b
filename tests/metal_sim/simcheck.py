"""Shared helpers of the metal_sim tests: random problems, epilogue chains, and `check`, which
runs one problem through the runner and compares with the float64 reference (tests/reference.py)
within the tolerance table (tests/common.py)."""

import os
import shutil
import sys

import ml_dtypes
import mlx.core as mx
import numpy as np
import pytest

import common
import reference as ref
import simcase as sc


def require_toolchain():
    """Skip without clang++-19 and cmake, except on a Linux CI machine (CI set): fail there."""
    cxx = os.environ.get("METAL_SIM_CXX") or "clang++-19"
    missing = [t for t in (cxx, "cmake") if shutil.which(t) is None]
    if missing:
        msg = (f"metal_sim needs {' and '.join(missing)} "
               "(Debian/Ubuntu: apt-get install -y clang-19 cmake)")
        if os.environ.get("CI") and sys.platform.startswith("linux"):
            pytest.fail(msg)
        pytest.skip(msg)


GEMM_CONFIGS = ["gemm64", "gemm64s", "gemm128", "gemm128s"]
ALL_CONFIGS = ["gemv"] + GEMM_CONFIGS
MX_DTYPE = {sc.F32: mx.float32, sc.F16: mx.float16, sc.BF16: mx.bfloat16}
DTYPES = [sc.F32, sc.F16, sc.BF16]


# fp4::Mode codes of the runner's spec, by MLX's mode name.
MODE_CODE = {"nvfp4": 0, "mxfp4": 1}


def make_problem(m, n, k, x_dtype, key, row_bytes=None, garbage_padding=False, x_scale=1.0,
                 mode="nvfp4"):
    extra = () if mode == "nvfp4" else (mode,)  # NVFP4 keeps its historical seeds
    g = common.rng("metal_sim", m, n, k, x_dtype, key, *extra)
    row_bytes = row_bytes or -(-k // 2)
    codes = np.zeros((n, 2 * row_bytes), np.uint8)
    if garbage_padding:
        codes[:] = g.integers(1, 16, size=codes.shape, dtype=np.uint8)
    codes[:, :k] = g.integers(0, 16, size=(n, k), dtype=np.uint8)
    packed = ref.pack_nibbles(codes)
    block, codes_used = ((ref.MX_BLOCK, common.DEFAULT_E8M0_CODES) if mode == "mxfp4"
                         else (ref.BLOCK, common.DEFAULT_SCALE_CODES))
    scales = g.choice(codes_used, size=(n, -(-k // block))).astype(np.uint8)
    x = (g.standard_normal((m, k)) * x_scale).astype(np.float32)
    x = x.astype(sc.NP_DTYPE[x_dtype]).astype(np.float64)
    return x, packed, scales, g


def operand(g, shape, dtype):
    v = g.uniform(-1.5, 1.5, size=shape).astype(np.float32)
    return np.asarray(v.astype(dtype))


def epilogue_chain(name, m, n, g):
    """(sim ops, reference ops, global scale) of one named chain. Together the chains use every
    op code, every operand kind (scalar, col, row, full) and dtype, and up to 4 operands."""
    f64 = lambda a: np.asarray(a).astype(np.float64)  # noqa: E731
    if name == "none":
        return [], [], None
    if name == "bias_silu":
        b = operand(g, (n,), np.float32)
        return [("add", b, None), ("silu", None, None)], [("add", f64(b)), "silu"], None
    if name == "gate_gelu_clamp_gs":
        t = operand(g, (m, n), np.float16)
        return ([("mul", t, None), ("gelu", None, None), ("clamp", -0.5, 2.0)],
                [("mul", f64(t)), "gelu", ("clamp", -0.5, 2.0)], 0.375)
    if name == "scale_row_gelu_approx_scalar_sigmoid":
        r = operand(g, (m, 1), ml_dtypes.bfloat16)
        s = operand(g, (), np.float32)
        return ([("scale", 0.5, None), ("add", r, None), ("gelu_approx", None, None),
                 ("add", s, None), ("sigmoid", None, None)],
                [("scale", 0.5), ("add", f64(r)), "gelu_approx", ("add", f64(s)), "sigmoid"], None)
    if name == "relu_float_tanh_gs":
        return ([("relu", None, None), ("add", 0.25, None), ("tanh", None, None),
                 ("mul", 1.5, None)], ["relu", ("add", 0.25), "tanh", ("mul", 1.5)], 7.5)
    if name == "four_operands":
        c = operand(g, (n,), ml_dtypes.bfloat16)
        r = operand(g, (m, 1), np.float32)
        f = operand(g, (m, n), np.float32)
        s = operand(g, (), np.float16)
        return ([("add", c, None), ("mul", r, None), ("add", f, None), ("mul", s, None)],
                [("add", f64(c)), ("mul", f64(r)), ("add", f64(f)), ("mul", f64(s))], None)
    raise ValueError(name)


EPILOGUES = ["none", "bias_silu", "gate_gelu_clamp_gs", "scale_row_gelu_approx_scalar_sigmoid",
             "relu_float_tanh_gs", "four_operands"]


def check(runner, tmp_path, m, n, k, *, x_dtype=sc.BF16, out_dtype=sc.F32, force="auto",
          guard="end", epilogue="none", row_bytes=None, garbage_padding=False, key=0,
          mutate=None, schedule="forward", mode="nvfp4"):
    x, packed, scales, g = make_problem(m, n, k, x_dtype, (key, epilogue), row_bytes,
                                        garbage_padding, mode=mode)
    if mutate is not None:
        mutate(x, packed, scales)
    sim_ops, ref_ops, gs = epilogue_chain(epilogue, m, n, g)
    out, plan = sc.run_case(runner, tmp_path / "case", m=m, n=n, k=k, x=x, w_packed=packed,
                            scales=scales, x_dtype=x_dtype, out_dtype=out_dtype, global_scale=gs,
                            epilogue=sim_ops, force=force, guard=guard, schedule=schedule,
                            mode=MODE_CODE[mode])
    gs32 = None if gs is None else ref.multiplier(gs)  # the kernel takes the amax, as MLX's do
    _, acc, mag = ref.w4a16_matmul_with_magnitude(x, packed, scales, k, gs32, mode=mode)
    tol = common.TOLERANCES[(MX_DTYPE[x_dtype], MX_DTYPE[out_dtype])]
    y, bound = common.error_bound(acc, mag, k, tol, ref_ops, gs32)
    common.assert_close(out, y, bound, what=f"{plan.get('kernel')} {mode} m={m} n={n} k={k}")
    return plan
