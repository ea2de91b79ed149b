"""Path-specific tests of the CPU kernel (csrc/cpu): GEMV (M <= 8) and GEMM (M > 8) code paths,
chunk / scale-block / panel-depth K tails, N tails around the micro-tile heights, the 1- and
2-vector activation groups, every hot-loop build this CPU can run (MLX_FP4_CPU_ISA), and results
that are bit-identical for any thread count (MLX_FP4_NUM_THREADS).

Oracle: the float64 numpy reference (tests/reference.py) with the shared tolerance table.
"""

import json
import os
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest

import mlx_fp4 as mx_fp4

import reference as ref
from common import TOLERANCES, assert_close, error_bound, package_pythonpath

CPU = mx.cpu
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _problem(m, n, k, seed, x_dtype=mx.float32):
    rng = np.random.default_rng(seed)
    packed = rng.integers(0, 256, size=(n, (k + 1) // 2), dtype=np.uint8)
    if k % 2:
        packed[:, -1] &= 0x0F  # padding nibble 0
    scales = rng.integers(0x18, 0x40, size=(n, (k + 15) // 16), dtype=np.uint8)
    x = rng.standard_normal((m, k)).astype(np.float32)
    return mx.array(x).astype(x_dtype), mx.array(packed), mx.array(scales)


def _check(m, n, k, seed=0, x_dtype=mx.float32, out_dtype=mx.float32, epilogue=None):
    x, w, s = _problem(m, n, k, seed, x_dtype)
    y = mx_fp4.w4a16_matmul(x, w, s, out_dtype=out_dtype, epilogue=epilogue, stream=CPU)
    _, acc, mag = ref.w4a16_matmul_with_magnitude(x, w, s)
    expected, bound = error_bound(acc, mag, k, TOLERANCES[(x_dtype, out_dtype)], epilogue=epilogue)
    assert_close(y, expected, bound, f"m={m} n={n} k={k}")


# K around the chunk sizes (8/16/32 values), the scale block (16) and the GEMM panel depth (256).
K_TAILS = [1, 2, 7, 15, 16, 17, 31, 32, 33, 63, 65, 255, 256, 257, 300, 513]


@pytest.mark.parametrize("m", list(range(1, 9)))
@pytest.mark.parametrize("k", [1, 17, 33, 257])
def test_gemv_rows_and_k_tails(m, k):
    _check(m, 37, k, seed=m * 1000 + k)  # N = 37: groups of 4 / 2 weight rows plus remainders


@pytest.mark.parametrize("k", K_TAILS)
def test_gemm_k_tails(k):
    _check(20, 30, k, seed=k)


# N around the micro-tile heights (6/12 for AVX2 and generic, 14/28 for AVX-512) and the task size.
@pytest.mark.parametrize("n", [1, 5, 6, 13, 14, 15, 27, 28, 29, 211, 225, 449])
def test_gemm_n_tails(n):
    _check(40, n, 100, seed=n)


# M: 1-vector groups (<= vec rows left), 2-vector groups, and more than one 512-row pass.
@pytest.mark.parametrize("m", [9, 16, 17, 31, 32, 33, 48, 49, 65, 513])
def test_gemm_m_groups(m):
    _check(m, 29, 70, seed=m)


@pytest.mark.parametrize("x_dtype", [mx.bfloat16, mx.float16, mx.float32])
@pytest.mark.parametrize("m", [3, 40])
def test_paths_dtypes_and_epilogue(x_dtype, m):
    n = 45
    rng = np.random.default_rng(7)
    bias = mx.array(rng.standard_normal((n,)).astype(np.float32))
    _check(m, n, 96, seed=m, x_dtype=x_dtype, out_dtype=mx.bfloat16, epilogue=[("add", bias), "silu"])


def test_nan_scale_in_gemv_and_gemm():
    for m in (2, 20):
        x, w, s = _problem(m, 30, 80, seed=m)
        s_np = np.array(s)
        s_np[3, 4] = 0x7F  # row 3, last block (k 64..79)
        y = np.array(mx_fp4.w4a16_matmul(x, w, mx.array(s_np), stream=CPU))
        assert np.isnan(y[:, 3]).all()
        assert not np.isnan(np.delete(y, 3, axis=1)).any()


_CHILD = r"""
import json, sys
import mlx.core as mx, numpy as np
import mlx_fp4 as F
from mlx_fp4 import _ext
rng = np.random.default_rng(3)
out = {"hot_loops": _ext.cpu_info()["hot_loops"]}
for (m, n, k) in [(1, 67, 1000), (5, 67, 333), (40, 230, 700), (100, 61, 260)]:
    w = mx.array(rng.integers(0, 256, size=(n, (k + 1) // 2), dtype=np.uint8))
    s = mx.array(rng.integers(0x18, 0x40, size=(n, (k + 15) // 16), dtype=np.uint8))
    x = mx.array(rng.standard_normal((m, k)).astype(np.float32))
    y = F.w4a16_matmul(x, w, s, stream=mx.cpu)
    out[f"{m}x{n}x{k}"] = np.array(y).view(np.uint32).tolist()
print(json.dumps(out))
"""


def _run_child(env_extra):
    env = dict(os.environ)
    env.update(env_extra)
    env["PYTHONPATH"] = package_pythonpath()
    res = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_thread_count_does_not_change_bits():
    one = _run_child({"MLX_FP4_NUM_THREADS": "1"})
    three = _run_child({"MLX_FP4_NUM_THREADS": "3"})
    assert one == three


@pytest.mark.parametrize("isa", ["generic", "avx2"])
def test_forced_narrower_builds(isa):
    """Each hot-loop build agrees with the default one within the fp32 tolerance."""
    base = _run_child({})
    other = _run_child({"MLX_FP4_CPU_ISA": isa})
    if isa == "avx2" and other["hot_loops"] != "avx2-fma":
        pytest.skip("CPU has no AVX2+FMA (or is not x86-64)")
    if isa == "generic" and other["hot_loops"] != "generic-128":
        pytest.skip("this platform has no separate generic build")
    for key, bits in base.items():
        if key == "hot_loops":
            continue
        a = np.array(bits, dtype=np.uint32).view(np.float32)
        b = np.array(other[key], dtype=np.uint32).view(np.float32)
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5 * np.abs(a).max())


def test_arm64_picks_neon():
    """An AArch64 build runs the NEON hot loops (tools/test_arm64.sh runs this under emulation), and
    they give the portable build's bits: the same decoded values and the same FMA order per output."""
    import platform

    if platform.machine().lower() not in ("aarch64", "arm64"):
        pytest.skip("not an AArch64 machine")
    neon = _run_child({})
    assert neon["hot_loops"] == "neon"
    generic = _run_child({"MLX_FP4_CPU_ISA": "generic"})
    assert generic["hot_loops"] == "generic-128"
    for key, bits in neon.items():
        if key != "hot_loops":
            assert bits == generic[key], key
