"""Negative tests: metal_sim catches what real GPUs silently get wrong.

1. Planted bugs in the production kernels (a copy of the embedded MSL with one line changed):
   missing barriers give wrong or NaN outputs (threadgroup memory starts NaN-poisoned and fibers
   run ahead of each other), out-of-bounds reads hit a guard page.
2. Planted bugs in small kernels (negative/checks.metal) for every runtime check of the shim:
   missing barrier, out-of-bounds before/after a buffer, divergent barrier, early return before
   a barrier, deadlock, divergent simdgroup collective, threadgroup memory > 32 KiB, > 1024
   threads per threadgroup, misaligned typed loads. Controls show correct kernels pass.
3. Compile-time checks: MSL vector widths, the M5 16-bit vector limit, a > 32 KiB threadgroup
   array, C-style vector casts.
"""

import concurrent.futures
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import simbuild
import simcase as sc
from simcheck import check, require_toolchain

SIM = Path(__file__).resolve().parent

# (name, kernel built, original snippet, replacement, expectation)
MUTATIONS = {
    "gemm_loop_barrier": (
        "mlx_fp4_w4a16_gemm_bm128_bk64_s0_xbf16_of32",
        "    mma_strip_at<XT, BK, TT>(acc, src, x, a, s * BK, p.k, s < full_strips, x_vec, fm, fn, sg_n);\n"
        "    threadgroup_barrier(mem_flags::mem_threadgroup);\n",
        "    mma_strip_at<XT, BK, TT>(acc, src, x, a, s * BK, p.k, s < full_strips, x_vec, fm, fn, sg_n);\n"
        "    // planted: barrier removed\n",
    ),
    "gemm_prologue_barrier": (
        "mlx_fp4_w4a16_gemm_bm64_bk32_s0_xbf16_of32",
        "    decode_own_scale<false, MX>(bs + doff, w, scales, p, n0 + dn, s_begin * BK + dcol);\n"
        "  }\n"
        "  threadgroup_barrier(mem_flags::mem_threadgroup);\n",
        "    decode_own_scale<false, MX>(bs + doff, w, scales, p, n0 + dn, s_begin * BK + dcol);\n"
        "  }\n"
        "  // planted: barrier removed\n",
    ),
    "gemm_staged_scale_barrier": (
        "mlx_fp4_w4a16_gemm_bm128_bk64_s1_xbf16_of32",
        "        threadgroup_barrier(mem_flags::mem_threadgroup);\n"
        "        // this decode thread's block: dblk (NVFP4), dblk / 2 (MXFP4)\n",
        "        // planted: barrier removed\n"
        "        // this decode thread's block: dblk (NVFP4), dblk / 2 (MXFP4)\n",
    ),
    # MXFP4: the 16-value block assumptions the mode must not inherit.
    "gemm_mx_scale_per_16": (
        "mlx_fp4_w4a16_gemm_bm64_bk32_s0_xbf16_of32",
        "  return scale_to_float(kModeMxfp4, scales[long(n) * p.scale_row_bytes + kb / kMxfp4BlockSize]);\n",
        "  return scale_to_float(kModeMxfp4, scales[long(n) * p.scale_row_bytes + kb / kBlockSize]);"
        "  // planted\n",
    ),
    "gemm_mx_staged_block": (
        "mlx_fp4_w4a16_gemm_bm128_bk64_s1_xbf16_of32",
        "ss[dn * kMxBlocks + dblk / kMxDecodeThreads]",
        "ss[dn * kMxBlocks + dblk]  /* planted: one scale per 16 columns */",
    ),
    "gemm_mx_staged_word": (
        "mlx_fp4_w4a16_gemm_bm128_bk64_s1_xbf16_of32",
        "(device const MxScaleWordT*)(srow + s * kMxBlocks)",
        "(device const MxScaleWordT*)(srow + s * kBlocks)  /* planted: NVFP4 stride */",
    ),
    # The seed's K-tail hazard: A read unmasked past K (the next row, or past the end of x).
    "gemm_a_past_k": (
        "mlx_fp4_w4a16_gemm_bm64_bk32_s0_xbf16_of32",
        "        const int c0 = min(col, k_end - 1);\n"
        "        const int c1 = min(col + 1, k_end - 1);\n"
        "        const float v0 = float(x[a.off[i] + c0]);\n"
        "        const float v1 = float(x[a.off[i] + c1]);\n"
        "        e0 = col < k_end ? v0 : 0.0f;\n"
        "        e1 = col + 1 < k_end ? v1 : 0.0f;\n",
        "        e0 = float(x[a.off[i] + col]);  // planted: no K mask\n"
        "        e1 = float(x[a.off[i] + col + 1]);\n",
    ),
    "gemm_a_rows_past_m": (
        "mlx_fp4_w4a16_gemm_bm128_bk64_s0_xbf16_of32",
        "    const int r = min(m0 + sg_m * kMetalSgTile + i * kMetalFrag + fm, p.m - 1);\n",
        "    const int r = m0 + sg_m * kMetalSgTile + i * kMetalFrag + fm;  // planted: no clamp\n",
    ),
    "gemm_decode_past_k": (
        "mlx_fp4_w4a16_gemm_bm128_bk64_s1_xbf16_of32",
        "        if (row_ok && k < p.k) {\n",
        "        if (row_ok) {  // planted: decodes weight bytes past K\n",
    ),
    "gemv_no_column_guard": (
        "mlx_fp4_w4a16_gemv_mt2_xbf16_of32",
        "    const int n = min(n0 + r, p.n - 1);\n",
        "    const int n = n0 + r;  // planted: weight rows past N not clamped\n",
    ),
}


@pytest.fixture(scope="module")
def mutants(embedded_msl):
    """Runners built from the embedded MSL with one planted change each (built in parallel)."""

    def build(name):
        kernel, old, new = MUTATIONS[name]
        assert embedded_msl.count(old) == 1, (
            f"mutation {name}: the kernel source changed; update the snippet in this test")
        src = embedded_msl.replace(old, new)
        return simbuild.build_runner(name=f"mutant_{name}", source=src, only=[kernel], groups=1)

    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
        futs = {n: ex.submit(build, n) for n in MUTATIONS}
        return {n: f.result() for n, f in futs.items()}


def force_of(kernel):
    if "_gemv_" in kernel:
        return "gemv"
    return ("gemm128" if "_bm128_" in kernel else "gemm64") + ("s" if "_s1_" in kernel else "")


@pytest.mark.parametrize("schedule", ["forward", "reverse"])
@pytest.mark.parametrize(
    "name,m,n,k,guard,mode",
    [("gemm_loop_barrier", 150, 130, 200, "end", "nvfp4"),
     ("gemm_loop_barrier", 150, 130, 200, "end", "mxfp4"),
     ("gemm_prologue_barrier", 70, 65, 100, "end", "nvfp4"),
     ("gemm_prologue_barrier", 70, 65, 100, "end", "mxfp4"),
     ("gemm_staged_scale_barrier", 150, 128, 256, "aligned", "nvfp4"),
     ("gemm_staged_scale_barrier", 150, 128, 256, "aligned", "mxfp4")])
def test_missing_barrier_in_production_kernel_is_caught(mutants, tmp_path, name, m, n, k, guard,
                                                        mode, schedule):
    kernel = MUTATIONS[name][0]
    with pytest.raises(AssertionError, match="NaN mismatch|out of tolerance"):
        check(mutants[name], tmp_path, m, n, k, force=force_of(kernel), guard=guard,
              schedule=schedule, mode=mode)


@pytest.mark.parametrize(
    "name,m,n,k,guard",
    [("gemm_mx_scale_per_16", 70, 65, 200, "end"),
     ("gemm_mx_staged_block", 150, 128, 256, "aligned"),
     ("gemm_mx_staged_word", 150, 128, 256, "aligned")])
def test_mxfp4_block_mixups_are_caught(mutants, tmp_path, name, m, n, k, guard):
    """A 16-column (NVFP4) block assumption left in an MXFP4 path gives wrong outputs (or a
    read past the scales): the MXFP4 simulator cases can fail."""
    kernel = MUTATIONS[name][0]
    with pytest.raises(AssertionError):
        check(mutants[name], tmp_path, m, n, k, force=force_of(kernel), guard=guard, mode="mxfp4")


@pytest.mark.parametrize(
    "name,m,n,k,buffer",
    [("gemm_a_past_k", 70, 65, 37, "x"),
     ("gemm_a_rows_past_m", 70, 65, 64, "x"),
     ("gemm_decode_past_k", 150, 64, 37, "w"),
     ("gemv_no_column_guard", 2, 37, 40, "w")])
def test_out_of_bounds_read_in_production_kernel_is_caught(mutants, tmp_path, name, m, n, k,
                                                           buffer):
    kernel = MUTATIONS[name][0]
    with pytest.raises(sc.SimFailure) as e:
        check(mutants[name], tmp_path, m, n, k, force=force_of(kernel))
    assert f"buffer '{buffer}'" in e.value.stderr and "past the end" in e.value.stderr
    source = "w4a16_gemv.metal" if "_gemv_" in kernel else "w4a16_matmul.metal"
    assert source in e.value.stderr  # symbolized to the kernel source line


def test_unmutated_kernels_pass_the_same_cases(sim_runner, tmp_path):
    check(sim_runner, tmp_path, 150, 130, 200, force="gemm128")
    check(sim_runner, tmp_path, 70, 65, 100, force="gemm64")
    check(sim_runner, tmp_path, 150, 128, 256, force="gemm128s", guard="aligned")
    check(sim_runner, tmp_path, 70, 65, 37, force="gemm64")
    check(sim_runner, tmp_path, 70, 65, 64, force="gemm128")
    check(sim_runner, tmp_path, 150, 64, 37, force="gemm128s")
    check(sim_runner, tmp_path, 2, 37, 40, force="gemv")


# ---------------------------------------------------------------------------------------------
# Runtime checks on small kernels.


@pytest.fixture(scope="module")
def checks_runner():
    require_toolchain()
    runner, err = simbuild.build_raw("checks", SIM / "negative" / "checks.metal")
    assert runner is not None, err
    return runner


def raw(runner, kernel, groups, threads, *slots, guard="end"):
    env = dict(os.environ, MSIM_GUARD=guard)
    r = subprocess.run([str(runner), "raw", kernel, str(groups), str(threads),
                        *[f"{i}:{b}" for i, b in enumerate(slots)]],
                       capture_output=True, text=True, env=env, timeout=60)
    vals = np.array([float(v) for v in r.stdout.split()]) if r.returncode == 0 else None
    return r.returncode, vals, sc.symbolize(runner, r.stderr)


def test_control_kernels_pass(checks_runner):
    rc, v, err = raw(checks_runner, "reverse_ok", 1, 64, 256)
    assert rc == 0, err
    assert np.array_equal(v, 63 - np.arange(64))
    rc, v, err = raw(checks_runner, "simd_ok", 1, 64, 256)
    assert rc == 0, err
    lane = np.arange(64) % 32
    assert np.array_equal(v, 496 + (lane ^ 1))
    rc, v, err = raw(checks_runner, "uniform_early_return", 2, 64, 256)
    assert rc == 0, err


def test_missing_barrier_shows_as_nan(checks_runner):
    rc, v, err = raw(checks_runner, "reverse_missing_barrier", 1, 64, 256)
    assert rc == 0, err
    assert np.isnan(v).sum() >= 32


@pytest.mark.parametrize(
    "kernel,slots,guard,expected",
    [("read_past_end", (256, 256), "end", "byte 256 of buffer 'slot1', which has 256 bytes"),
     ("read_before_start", (256, 256), "start", "4 byte(s) before the start of buffer 'slot1'"),
     ("divergent_barrier", (256,), "end", "divergent barrier"),
     ("early_return", (256,), "end", "early return before a barrier"),
     ("deadlock", (256,), "end", "deadlock"),
     ("divergent_collective", (256,), "end", "divergent simdgroup collective"),
     ("threadgroup_memory_overflow", (256,), "end", "threadgroup memory exceeds 32768 bytes"),
     ("misaligned_load", (256, 1024), "end", "misaligned typed access")])
def test_runtime_check_fires(checks_runner, kernel, slots, guard, expected):
    rc, _, err = raw(checks_runner, kernel, 1, 64, *slots, guard=guard)
    assert rc != 0 and expected in err, err
    if "buffer" in expected:
        assert "checks.metal:" in err  # the faulting source line


def test_too_many_threads(checks_runner):
    rc, _, err = raw(checks_runner, "reverse_ok", 1, 2048, 256)
    assert rc != 0 and "Metal allows 1 to 1024" in err, err


def test_max_total_threads_per_threadgroup_is_enforced(checks_runner):
    rc, v, err = raw(checks_runner, "capped_at_32", 1, 32, 256)
    assert rc == 0 and np.array_equal(v[:32], np.arange(32)), err
    rc, _, err = raw(checks_runner, "capped_at_32", 1, 64, 256)
    assert rc != 0 and "max_total_threads_per_threadgroup(32)" in err, err


# ---------------------------------------------------------------------------------------------
# Compile-time checks.

KERNEL_TEMPLATE = """#include <metal_stdlib>
using namespace metal;
[[kernel]] void probe(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {{
{body}
}}
"""


def compile_probe(tmp_path, name, body, flags=()):
    require_toolchain()
    src = tmp_path / f"{name}.metal"
    src.write_text(KERNEL_TEMPLATE.format(body=body))
    return simbuild.build_raw(f"probe_{name}", src, extra_flags=flags)


PROBES = {
    # MSL vectors have 2 to 4 lanes.
    "float8": ("  vec<float, 8> v = 1.0f;\n  out[i] = v[0];", (), "at most 4 lanes"),
    # M5: 16-bit vectors wider than 16 lanes crash the Metal backend.
    "half32": ("  vec<half, 32> v = half(1);\n  v = v * v;\n  out[i] = float(v[0]);",
               ("-DMETAL_SIM_MAX_VECTOR_LANES=64",), "M5 check"),
    "threadgroup_40k": ("  threadgroup float big[10240];\n  big[i] = 1.0f;\n  out[i] = big[0];",
                        (), "exceeds the 32 KiB threadgroup memory"),
    "vector_cast": ("  float4 v = (float4)out[i];\n  out[i] = v.x;", (), "C-style cast"),
}


@pytest.mark.parametrize("name", sorted(PROBES))
def test_compile_time_check_fires(tmp_path, name):
    body, flags, expected = PROBES[name]
    runner, err = compile_probe(tmp_path, name, body, flags)
    assert runner is None and expected in err, err


def test_sixteen_half_lanes_are_allowed_when_wider_vectors_are(tmp_path):
    runner, err = compile_probe(tmp_path, "half16",
                                "  vec<half, 16> v = half(1);\n  v = v * v;\n"
                                "  out[i] = float(v[0]);",
                                ("-DMETAL_SIM_MAX_VECTOR_LANES=64",))
    assert runner is not None, err
