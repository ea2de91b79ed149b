"""MXFP4 (mode="mxfp4", gpt-oss): E2M1 values with one E8M0 scale per 32 weights, no global scale.

Format ops byte for byte against the float64 reference of mx.quantize's Metal arithmetic
(reference.quantize_mxfp4; ml_dtypes float8_e8m0fnu decode), against mx.dequantize(mode="mxfp4"), and
MLX's CPU quantize pinned by its own reference (reference.quantize_mxfp4_mlx_cpu); w4a16_matmul and
gather_w4a16_matmul against the float64 reference and against mx.quantized_matmul / mx.gather_qmm
(mode="mxfp4") on the same bytes; every CPU hot-loop build; argument checks and transforms.
"""

import json
import os
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest

import gather_reference as gref
import mlx_fp4 as mx_fp4
import reference as ref
from common import (
    MLX_GATHER_QMM_TOL,
    TOLERANCES,
    assert_close,
    check_matmul,
    error_bound,
    package_pythonpath,
    param,
    rand_weights,
    rand_x,
    rng,
)

MODE = "mxfp4"
DTYPE_NAME = {mx.float32: "float32", mx.bfloat16: "bfloat16", mx.float16: "float16"}


def mlx_routed(gather, k, m=1):
    """Metal calls our Metal kernels do not cover yet run MLX's own mxfp4 kernel (the gathered op;
    w4a16_matmul past the GEMV's 16 rows, or from 9 rows on M5) when K fits its layout; it rounds
    to x's dtype, so those are held to MLX_GATHER_QMM_TOL. CUDA (SIMT, dequantize + cuBLASLt, the
    gathered GEMV), the Metal GEMV and the CPU keep the fp32 table."""
    on_metal = mx.default_device() == mx.gpu and mx.metal.is_available()
    return on_metal and k % 32 == 0 and (gather or m >= 9)


def check_mx_matmul(out, x, w, s, **kw):
    if not mlx_routed(False, x.shape[-1], x.size // x.shape[-1]):
        return check_matmul(out, x, w, s, mode=MODE, **kw)
    _, acc, mag = ref.w4a16_matmul_with_magnitude(x, w, s, mode=MODE)
    expected = ref.apply_epilogue(acc, kw.get("epilogue"))
    assert_close(out, expected, MLX_GATHER_QMM_TOL * (mag + 1.0), what="mxfp4 (MLX route)")


def mx_bytes(a):
    """MLX's uint32 packed weights as their uint8 bytes (numpy)."""
    return ref.packed_bytes(np.array(a)) if a.ndim == 2 else np.array(a).view(np.uint8)


def float_weights(shape, g, dtype):
    """Random weights with block magnitudes over 2^-20 .. 2^10, exact in dtype, and special rows:
    an all-zero block, exact E2M1 ties (0.25, 0.75, ... at scale 1), tiny negatives (-> +0)."""
    blocks = -(-shape[-1] // 32)
    mags = np.exp2(g.uniform(-20, 10, size=shape[:-1] + (blocks,))).repeat(32, axis=-1)[..., : shape[-1]]
    w = g.standard_normal(shape) * mags
    flat = w.reshape(-1, shape[-1])
    if flat.shape[0] >= 3 and shape[-1] >= 32:
        flat[0, :32] = 0.0
        ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
        flat[1, :32] = np.concatenate([ties, -ties, ties * 0.5, -ties * 0.5])
        flat[2, :32] = np.concatenate([[6.0], -g.uniform(0, 0.2, 31)])
    return mx.array(w.astype(np.float32)).astype(dtype)


# ---------------------------------------------------------------------------------------------
# Format


def test_e8m0_every_code_decodes_as_ml_dtypes():
    """All 256 scale bytes through dequantize vs float8_e8m0fnu (0xFF NaN); vs mx.dequantize for
    0..254 (MLX decodes 0xFF as +Inf)."""
    scales = mx.array(np.arange(256, dtype=np.uint8).reshape(256, 1))
    packed = mx.array(np.full((256, 16), 0x91, np.uint8))  # +-0.5: finite in fp32 for every scale
    ours = np.array(mx_fp4.dequantize(packed, scales, mode=MODE, dtype=mx.float32, stream=mx.cpu))
    expected = ref.decode_weights(np.array(packed), np.array(scales), 32, mode=MODE)
    assert_close(ours, expected, 0.0, what="e8m0 decode")
    theirs = np.array(mx.dequantize(packed.view(mx.uint32), scales, mode=MODE, dtype=mx.float32, stream=mx.cpu))
    np.testing.assert_array_equal(ours[:255], theirs[:255])


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16, mx.float16])
@pytest.mark.parametrize("shape", [(1, 32), (7, 64), (64, 256), (3, 4096), (4, 8, 96)])
def test_quantize_is_byte_equal_to_reference(dtype, shape):
    """Ours: the reference of mx.quantize's Metal arithmetic (against MLX's Metal kernel itself:
    tests/metal_sim/test_mlx_quantize.py). MLX's CPU fallback, pinned by its own reference, differs
    only in rounding: ties low, +0, the quotient in w's dtype, exponent 0 for an all-zero block."""
    g = rng("mxq", shape, DTYPE_NAME[dtype])
    w = float_weights(shape, g, dtype)
    packed, scales = mx_fp4.quantize(w, mode=MODE, group_size=32, bits=4, stream=mx.cpu)
    flat_w = np.array(w.astype(mx.float32)).reshape(-1, shape[-1])
    ref_p, ref_s = ref.quantize_mxfp4(flat_w)
    np.testing.assert_array_equal(np.array(packed).reshape(ref_p.shape), ref_p)
    np.testing.assert_array_equal(np.array(scales).reshape(ref_s.shape), ref_s)
    theirs_w, theirs_s = mx.quantize(w, mode=MODE, stream=mx.cpu)
    cpu_p, cpu_s = ref.quantize_mxfp4_mlx_cpu(flat_w, DTYPE_NAME[dtype])
    np.testing.assert_array_equal(np.array(theirs_s).reshape(cpu_s.shape), cpu_s)
    np.testing.assert_array_equal(mx_bytes(theirs_w).reshape(cpu_p.shape), cpu_p)


def test_quantize_differs_from_mlx_cpu_only_at_ties_and_zeros():
    """Where MLX's CPU fallback writes other bytes than ours (= its Metal kernel's): the all-zero
    block's scale (byte 127 against 0), values that round to zero (+0 against -0) and exact ties
    (low against even). Nothing else, and no decoded value differs except at the ties."""
    w = float_weights((8, 64), rng("mx-cpu-diff"), mx.float32)
    packed, scales = mx_fp4.quantize(w, mode=MODE)
    theirs_w, theirs_s = mx.quantize(w, mode=MODE, stream=mx.cpu)
    diff_s = np.array(scales) != np.array(theirs_s)
    assert [list(i) for i in diff_s.nonzero()] == [[0], [0]]  # float_weights' all-zero block
    a = ref.unpack_nibbles(np.array(packed))
    b = ref.unpack_nibbles(mx_bytes(theirs_w).reshape(np.array(packed).shape))
    v = np.abs(np.array(w)) / np.repeat(ref.decode_e8m0(np.array(scales)), 32, axis=1)
    tie = np.isin(v, [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    minus_zero = (a == 8) & (b == 0)
    assert ((a == b) | minus_zero | tie).all()
    assert minus_zero.any() and (tie & (a != b)).any()  # the data holds both kinds


@pytest.mark.parametrize("k", [1, 17, 31, 33, 100])
def test_quantize_any_k_pads_with_zeros(k):
    """K that mx.quantize rejects: the bytes of the zero-padded matrix, cut to K."""
    g = rng("mx-anyk", k)
    w = g.standard_normal((5, k)).astype(np.float32)
    packed, scales = mx_fp4.quantize(mx.array(w), mode=MODE)
    kp = -(-k // 32) * 32
    ref_p, ref_s = ref.quantize_mxfp4(np.pad(w, [(0, 0), (0, kp - k)]))
    assert packed.shape == (5, (k + 1) // 2) and scales.shape == (5, kp // 32)
    np.testing.assert_array_equal(np.array(scales), ref_s)
    np.testing.assert_array_equal(np.array(packed), ref_p[:, : (k + 1) // 2])
    back = mx_fp4.dequantize(packed, scales, k=k, mode=MODE, dtype=mx.float32)
    np.testing.assert_array_equal(np.array(back), ref.decode_weights(np.array(packed), np.array(scales), k, mode=MODE))


def test_quantize_out_of_range_blocks():
    """Where mx.quantize has no defined answer we follow OCP MX: a non-finite block gets the NaN
    scale 0xFF; a block with amax / 6 below 2^-127 clamps to byte 0 (mx.quantize wraps around)."""
    w = np.ones((3, 32), np.float32)
    w[0, 3] = np.nan
    w[1, 0] = np.inf
    w[2] = 1e-40
    _, scales = mx_fp4.quantize(mx.array(w), mode=MODE)
    assert np.array(scales).ravel().tolist() == [0xFF, 0xFF, 0]


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16, mx.float16])
def test_dequantize_matches_mx_dequantize(dtype):
    g = rng("mx-deq", DTYPE_NAME[dtype])
    w = float_weights((16, 128), g, mx.float32)
    q, s = mx.quantize(w, mode=MODE, stream=mx.cpu)
    for packed in (q, q.view(mx.uint8)):
        ours = mx_fp4.dequantize(packed, s, mode=MODE, dtype=dtype)
        assert ours.dtype == dtype
        np.testing.assert_array_equal(np.array(ours.astype(mx.float32)),
                                      np.array(mx.dequantize(q, s, mode=MODE, dtype=dtype).astype(mx.float32)))


def test_stacked_quantize_and_dequantize():
    g = rng("mx-stack")
    w = float_weights((3, 2, 8, 64), g, mx.bfloat16)
    packed, scales = mx_fp4.quantize(w, mode=MODE)
    assert packed.shape == (3, 2, 8, 32) and scales.shape == (3, 2, 8, 2)
    back = mx_fp4.dequantize(packed, scales, mode=MODE, dtype=mx.float32)
    flat = np.array(w.astype(mx.float32)).reshape(-1, 64)
    ref_p, ref_s = ref.quantize_mxfp4(flat)
    np.testing.assert_array_equal(np.array(packed).reshape(ref_p.shape), ref_p)
    np.testing.assert_array_equal(np.array(back).reshape(flat.shape), ref.decode_weights(ref_p, ref_s, 64, mode=MODE))


# ---------------------------------------------------------------------------------------------
# w4a16_matmul


def mx_weights(n, k, g, layout="uint8"):
    return rand_weights(n, k, g, layout=layout, mode=MODE)[:2]


@pytest.mark.parametrize(
    "dtype,m,n,k",
    [
        param(dt, m, n, k, dtype=dt, M=m, N=n, K=k)
        for dt in (mx.bfloat16, mx.float32)
        for m in (1, 4, 9, 64)
        for n in (1, 37)
        for k in (1, 31, 33, 64, 300)
    ]
    + [param(mx.float16, m, 96, 4096, dtype=mx.float16, M=m, N=96, K=4096) for m in (1, 7)]
    + [param(mx.bfloat16, 300, 200, 100, dtype=mx.bfloat16, M=300, N=200, K=100)],
)
def test_matmul_vs_reference(device, dtype, m, n, k):
    g = rng("mx-mm", m, n, k, DTYPE_NAME[dtype])
    w, s = mx_weights(n, k, g, layout="uint32" if k % 2 else "uint8")
    x = rand_x((m, k), dtype, g)
    check_mx_matmul(mx_fp4.w4a16_matmul(x, w, s, mode=MODE), x, w, s)


@pytest.mark.parametrize("m", [1, 5, 40])
def test_matmul_epilogue_and_out_dtype(device, m):
    g = rng("mx-epi", m)
    n, k = 45, 96
    w, s = mx_weights(n, k, g)
    x = rand_x((2, m, k), mx.bfloat16, g)
    bias = mx.array(g.standard_normal((n,)).astype(np.float32))
    epi = [("add", bias), "silu", ("scale", 0.5)]
    y = mx_fp4.w4a16_matmul(x, w, s, mode=MODE, epilogue=epi, out_dtype=mx.float32)
    check_mx_matmul(y, x, w, s, epilogue=epi, out_dtype=mx.float32)


@pytest.mark.parametrize("m", [1, 3, 16, 100])
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float32])
def test_matmul_vs_mx_quantized_matmul(device, m, dtype):
    """mx.quantize's own bytes; MLX's kernel rounds in the activation dtype (MLX_GATHER_QMM_TOL)."""
    g = rng("mx-qmm", m, DTYPE_NAME[dtype])
    n, k = 64, 256
    q, s = mx.quantize(float_weights((n, k), g, mx.float32), mode=MODE)
    x = rand_x((m, k), dtype, g)
    ours = mx_fp4.w4a16_matmul(x, q, s, mode=MODE)
    check_mx_matmul(ours, x, q, s)
    theirs = mx.quantized_matmul(x, q, s, mode=MODE, transpose=True)
    _, _, mag = ref.w4a16_matmul_with_magnitude(x, q, s, mode=MODE)
    assert_close(ours, ref.to_numpy(theirs), MLX_GATHER_QMM_TOL * (mag + 1.0), what="vs mx.quantized_matmul")


def test_nan_scale_poisons_only_its_rows(device):
    g = rng("mx-nan")
    w, s = mx_weights(20, 96, g)
    s_np = np.array(s)
    s_np[3, 2] = 0xFF
    for m in (2, 20):
        y = np.array(mx_fp4.w4a16_matmul(rand_x((m, 96), mx.float32, g), w, mx.array(s_np), mode=MODE))
        assert np.isnan(y[:, 3]).all() and not np.isnan(np.delete(y, 3, axis=1)).any()


@pytest.mark.parametrize("m,k", [(1, 256), (8, 2880), (40, 512)])
def test_matmul_every_e8m0_exponent(device, m, k):
    """Scale bytes 0 .. 252 (2^-127 .. 2^125) across rows, the blocks of a row within 8 codes of the
    row's own, x small so that 6 * 2^125 * x stays finite; a NaN scale (0xFF) poisons its row. On CUDA
    the tensor-core kernels (staged K = 256, 512; register-prefetch K = 2880) apply E8M0 to fp32 block
    products, SIMT and the CPU decode in fp32."""
    g = rng("mx-e8m0", m, k)
    n, blocks, top = 96, -(-k // 32), 252
    w, _ = mx_weights(n, k, g)
    centers = np.linspace(0, top, n).round().astype(int)[:, None]
    s_np = np.clip(centers + g.integers(-8, 9, size=(n, blocks)), 0, top).astype(np.uint8)
    s_np[0, 0], s_np[-1, -1], s_np[3, 1] = 0, top, 0xFF
    x = rand_x((m, k), mx.bfloat16, g, scale=2.0**-10)
    check_mx_matmul(mx_fp4.w4a16_matmul(x, w, mx.array(s_np), mode=MODE), x, w, mx.array(s_np))


_CHILD = r"""
import json, sys
import mlx.core as mx, numpy as np
import mlx_fp4 as F
from mlx_fp4 import _ext
out = {"hot_loops": _ext.cpu_info()["hot_loops"]}
for (m, n, k) in json.loads(sys.argv[1]):
    rng = np.random.default_rng(m * 7919 + k)
    w = mx.array(rng.integers(0, 256, size=(n, (k + 1) // 2), dtype=np.uint8))
    s = mx.array(rng.integers(120, 134, size=(n, (k + 31) // 32), dtype=np.uint8))
    x = mx.array(rng.standard_normal((m, k)).astype(np.float32))
    out[f"{m}x{n}x{k}"] = np.array(F.w4a16_matmul(x, w, s, mode="mxfp4", stream=mx.cpu)).tolist()
print(json.dumps(out))
"""
ISA_SHAPES = [(1, 67, 1000), (5, 29, 333), (40, 61, 700), (17, 30, 47)]


@pytest.mark.parametrize("isa", ["default", "avx2", "generic"])
def test_every_hot_loop_build(isa):
    """GEMV and GEMM of each CPU build (the AVX-512 chunk holds one MXFP4 block, AVX2 half of one,
    generic a quarter) against the float64 reference, K tails included."""
    env = dict(os.environ, PYTHONPATH=package_pythonpath())
    if isa != "default":
        env["MLX_FP4_CPU_ISA"] = isa
    res = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(ISA_SHAPES)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    if isa == "avx2" and out["hot_loops"] != "avx2-fma" or isa == "generic" and out["hot_loops"] != "generic-128":
        pytest.skip(f"this CPU / build cannot run the {isa} hot loops")
    for m, n, k in ISA_SHAPES:
        r = np.random.default_rng(m * 7919 + k)
        w = r.integers(0, 256, size=(n, (k + 1) // 2), dtype=np.uint8)
        s = r.integers(120, 134, size=(n, (k + 31) // 32), dtype=np.uint8)
        x = r.standard_normal((m, k)).astype(np.float32)
        _, acc, mag = ref.w4a16_matmul_with_magnitude(x, w, s, k, mode=MODE)
        y, bound = error_bound(acc, mag, k, TOLERANCES[(mx.float32, mx.float32)])
        assert_close(np.array(out[f"{m}x{n}x{k}"]), y, bound, what=f"{out['hot_loops']} {m}x{n}x{k}")


# ---------------------------------------------------------------------------------------------
# gather_w4a16_matmul


def mx_experts(e, n, k, g):
    parts = [mx_weights(n, k, g) for _ in range(e)]
    return mx.stack([p[0] for p in parts]), mx.stack([p[1] for p in parts])


def check_gather(out, x, w, s, rhs):
    acc, mag = gref.gather_matmul_with_magnitude(x, w, s, rhs=rhs, mode=MODE)
    y, bound = error_bound(acc, mag, x.shape[-1], TOLERANCES[(x.dtype, out.dtype)])
    if mlx_routed(True, x.shape[-1]):
        bound = MLX_GATHER_QMM_TOL * (mag + 1.0)
    assert_close(out, y, bound, what="gather mxfp4")
    return mag


# 2080 x 19: the CUDA decode GEMV (K >= 2048, K % 32 == 0), a partial last group of chunks and rows
# past N in the last warp.
@pytest.mark.parametrize("tokens,top_k,e,n,k", [(1, 4, 8, 40, 64), (5, 2, 6, 33, 45), (3, 2, 3, 7, 1),
                                               (2, 3, 4, 19, 2080)])
def test_gather_decode_topk(device, tokens, top_k, e, n, k):
    g = rng("mx-gather", tokens, top_k, e, n, k)
    w, s = mx_experts(e, n, k, g)
    x = rand_x((tokens, 1, 1, k), mx.bfloat16, g)
    idx = mx.array(np.stack([g.choice(e, size=top_k, replace=False) for _ in range(tokens)]).astype(np.int32))
    out = mx_fp4.gather_w4a16_matmul(x, w, s, rhs_indices=idx, mode=MODE)
    assert out.shape == (tokens, top_k, 1, n)
    check_gather(out, x, w, s, idx)


def test_gather_sorted_prefill_uses_the_gemm(device):
    g = rng("mx-prefill")
    e, n, k, pairs = 3, 48, 96, 60
    w, s = mx_experts(e, n, k, g)
    x = rand_x((pairs, 1, k), mx.float32, g)
    rhs = mx.array(np.sort(g.integers(0, e, size=pairs)).astype(np.uint32))
    check_gather(mx_fp4.gather_w4a16_matmul(x, w, s, rhs_indices=rhs, sorted_indices=True, mode=MODE), x, w, s, rhs)


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
@pytest.mark.parametrize("pairs,m,k", [(80, 1, 100), (40, 3, 288), (6, 1, 256), (100, 1, 256), (30, 3, 384)])
def test_gather_half_x_tensor_core_shapes(device, dtype, pairs, m, k):
    """Shapes the CUDA backend runs on tensor cores in MXFP4: more than 64 rows (the grouped
    kernel, K % 32 != 0 tails too; K % 128 == 0: the grouped staged kernel's shape, which takes
    MXFP4 on CUDA since these passed on an H200) and a few pairs with K % 128 == 0 (the batched
    dense kernel)."""
    g = rng("mx-gather-tc", pairs, m, k, str(dtype))
    e, n = 5, 40
    w, s = mx_experts(e, n, k, g)
    x = rand_x((pairs, m, k), dtype, g)
    rhs = mx.array(np.sort(g.integers(0, e, size=pairs)).astype(np.uint32))
    out = mx_fp4.gather_w4a16_matmul(x, w, s, rhs_indices=rhs, sorted_indices=True, mode=MODE)
    assert out.shape == (pairs, m, n)
    check_gather(out, x, w, s, rhs)


@pytest.mark.parametrize("sort", [False, True])
def test_gather_vs_mx_gather_qmm(device, sort):
    g = rng("mx-gqmm", sort)
    e, n, k, t, top = 8, 64, 128, 6, 3
    wq, sq = mx.quantize(float_weights((e, n, k), g, mx.float32), mode=MODE)
    x = rand_x((t, 1, 1, k), mx.float32, g)
    idx = np.stack([g.choice(e, size=top, replace=False) for _ in range(t)]).astype(np.uint32)
    if sort:
        x, idx = rand_x((t * top, 1, k), mx.float32, g), np.sort(idx.reshape(-1))  # mlx-lm's sorted rows
    idx = mx.array(idx)
    ours = mx_fp4.gather_w4a16_matmul(x, wq, sq, rhs_indices=idx, sorted_indices=sort, mode=MODE)
    theirs = mx.gather_qmm(x, wq, sq, rhs_indices=idx, transpose=True, mode=MODE, sorted_indices=sort)
    assert ours.shape == theirs.shape
    mag = check_gather(ours, x, wq, sq, idx)
    assert_close(ours, ref.to_numpy(theirs), MLX_GATHER_QMM_TOL * (mag + 1.0), what="vs mx.gather_qmm")


# ---------------------------------------------------------------------------------------------
# Arguments and transforms


def test_arguments_are_checked():
    g = rng("mx-args")
    w, s = mx_weights(8, 64, g)
    x = rand_x((2, 64), mx.float32, g)
    cases = [
        (lambda: mx_fp4.w4a16_matmul(x, w, s, mode=MODE, global_scale=1.0), "global_scale is only supported"),
        (lambda: mx_fp4.w4a16_matmul(x, w, s, mode=MODE, group_size=16), "group_size must be 32"),
        (lambda: mx_fp4.w4a16_matmul(x, w, s, mode=MODE, bits=8), "bits must be 4"),
        (lambda: mx_fp4.w4a16_matmul(x, w, s, mode="affine"), "mode must be 'nvfp4' or 'mxfp4'"),
        (lambda: mx_fp4.w4a16_matmul(x, w, s), r"ceil\(K/16\)\) = \(8, 4\) but got \(8, 2\) \(mode 'nvfp4'\)"),
        (lambda: mx_fp4.w4a16_matmul(x, w, mx.zeros((8, 4), mx.uint8), mode=MODE), r"ceil\(K/32\)"),
        (lambda: mx_fp4.quantize(x, mode=MODE, global_scale=True), "global_scale is only supported"),
        (lambda: mx_fp4.quantize(x, mode=MODE, group_size=16), "group_size must be 32"),
        (lambda: mx_fp4.quantize(x, group_size=32), "group_size must be 16 for mode 'nvfp4'"),
        (lambda: mx_fp4.dequantize(w, s, mode=MODE, global_scale=1.0), "global_scale is only supported"),
        (lambda: mx_fp4.gather_w4a16_matmul(x, w[None], s[None], mode=MODE, global_scale=1.0), "global_scale"),
        (lambda: mx_fp4.gather_w4a16_matmul(x, w[None], s[None]), r"ceil\(K/16\)"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    mx.eval(mx_fp4.w4a16_matmul(x, w, s, mode=MODE, group_size=32, bits=4))  # matching values are fine


def test_grad_vmap_and_compile():
    g = rng("mx-transforms")
    w, s = mx_weights(24, 80, g)
    x = rand_x((3, 80), mx.float32, g)
    ct = mx.array(g.standard_normal((3, 24)).astype(np.float32))
    ours = mx.grad(lambda x: (mx_fp4.w4a16_matmul(x, w, s, mode=MODE) * ct).sum())(x)
    wf = mx.array(ref.decode_weights(np.array(w), np.array(s), 80, mode=MODE).astype(np.float32))
    np.testing.assert_allclose(np.array(ours), np.array(ct @ wf), rtol=1e-5, atol=1e-5)
    xs = rand_x((4, 3, 80), mx.float32, g)
    mapped = mx.vmap(lambda x: mx_fp4.w4a16_matmul(x, w, s, mode=MODE))(xs)
    check_matmul(mapped, xs, w, s, mode=MODE)
    compiled = mx.compile(lambda x: mx_fp4.w4a16_matmul(x, w, s, mode=MODE))
    np.testing.assert_array_equal(np.array(compiled(x)), np.array(mx_fp4.w4a16_matmul(x, w, s, mode=MODE)))


def test_modes_are_distinct_graph_nodes():
    """K <= 16 gives both modes the same input shapes: compile must not merge the two nodes."""
    g = rng("mx-equiv")
    w, s = rand_weights(8, 16, g, scale_codes=np.arange(0x30, 0x38, dtype=np.uint8))[:2]
    x = rand_x((2, 16), mx.float32, g)
    both = mx.compile(lambda x: mx.stack([mx_fp4.w4a16_matmul(x, w, s), mx_fp4.w4a16_matmul(x, w, s, mode=MODE)]))(x)
    check_matmul(both[0], x, w, s)
    check_matmul(both[1], x, w, s, mode=MODE)
