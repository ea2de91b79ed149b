"""Adversarial inputs for w4a16_matmul, against the float64 reference (tests/reference.py):

  * all 256 E4M3 scale codes; 0x7F / 0xFF (NaN) give NaN exactly in the outputs that use them;
    subnormal scales; negative zero (scale 0x80, E2M1 code 8, x = -0, global scale -0,
    epilogue constants -0 kept apart under mx.compile);
  * Inf / NaN activations, operands and global scales (IEEE propagation as in float64);
  * overflow: an fp16 output beyond 65504 becomes +-inf exactly as a cast of the fp32 result
    would (RNE: 65519.99 -> 65504, 65520 -> inf); the fp32 accumulator itself overflows to inf;
  * non-contiguous / transposed / broadcast x, w, scales, global scale and epilogue operands;
  * index arithmetic past 2^31 elements: the int64 helpers of csrc/shared/w4a16_problem.h through
    tests/cpp/test_index_helpers.cpp (compiled here when a C++ compiler is found), and real runs
    with > 2^31-element outputs / activations when MLX_FP4_LARGE_TESTS=1 (~16 GiB RAM, ~8 min on
    2 CPU cores).
"""

import os
import shutil
import subprocess
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import mlx_fp4 as mx_fp4
import reference as ref
from common import (
    DEFAULT_SCALE_CODES,
    DTYPES,
    TOLERANCES,
    assert_close,
    check_matmul,
    dname,
    error_bound,
    param,
    rand_weights,
    rand_x,
    rng,
)

ROOT = Path(__file__).resolve().parents[1]
NAN_CODES = (0x7F, 0xFF)
SUBNORMAL_CODES = [c | s for s in (0, 0x80) for c in range(1, 8)]
LARGE = os.environ.get("MLX_FP4_LARGE_TESTS") == "1"


def np_out(a):
    return ref.to_numpy(a)


# ----------------------------------------------------------------------------------------------
# Scale codes


@pytest.mark.parametrize("m", [3, 20], ids=lambda m: f"M={m}")
def test_all_256_scale_codes(device, m):
    """Row n of w uses scale code n in its middle block: NaN exactly in columns 0x7F and 0xFF."""
    g = rng("all-scales", m)
    n, k = 256, 40  # blocks: k 0-15, 16-31, 32-39 (a partial block)
    x = rand_x((m, k), mx.float32, g)
    w, scales, packed = rand_weights(n, k, g)
    s = np.array(scales)
    s[:, 1] = np.arange(256, dtype=np.uint8)
    out = mx_fp4.w4a16_matmul(x, w, mx.array(s))
    o = np_out(out)
    nan_cols = np.isnan(o).any(axis=0)
    assert np.flatnonzero(nan_cols).tolist() == list(NAN_CODES)
    assert np.isnan(o[:, list(NAN_CODES)]).all()
    check_matmul(out, x, packed, s)


@pytest.mark.parametrize("block", [0, 2], ids=["first-block", "partial-last-block"])
@pytest.mark.parametrize("code", NAN_CODES, ids=lambda c: f"code={c:#x}")
def test_nan_scale_poisons_even_zero_weights_and_zero_x(device, code, block):
    """0 * NaN = NaN: a NaN block scale poisons its row even when the block's nibbles and x are 0."""
    g = rng("nan-zero", code, block)
    m, n, k = 10, 5, 40
    x = np.array(rand_x((m, k), mx.float32, g))
    lo, hi = 16 * block, min(16 * block + 16, k)
    x[:, lo:hi] = 0.0
    codes = g.integers(0, 16, size=(n, k), dtype=np.uint8)
    codes[3, lo:hi] = 0
    packed = ref.pack_nibbles(codes)
    s = np.full((n, 3), 0x38, np.uint8)
    s[3, block] = code
    out = mx_fp4.w4a16_matmul(mx.array(x), mx.array(packed), mx.array(s))
    o = np_out(out)
    assert np.isnan(o[:, 3]).all() and np.isfinite(np.delete(o, 3, axis=1)).all()
    check_matmul(out, mx.array(x), packed, s)


def test_dequantize_all_256_scale_codes(device):
    """dequantize decodes every scale byte as ml_dtypes' float8_e4m3fn does (NaN for 0x7F/0xFF)."""
    k = 32
    codes = np.tile(np.arange(16, dtype=np.uint8), (256, 2))
    packed = ref.pack_nibbles(codes)
    s = np.stack([np.arange(256, dtype=np.uint8)] * 2, axis=1)
    d = np_out(mx_fp4.dequantize(mx.array(packed), mx.array(s), dtype=mx.float32))
    expected = ref.decode_weights(packed, s, k)
    np.testing.assert_array_equal(d, expected)  # NaN == NaN positions; exact values
    num = ~np.isnan(expected)  # (the sign of a NaN carries no meaning)
    np.testing.assert_array_equal(np.signbit(d[num]), np.signbit(expected[num]))  # -0 included


@pytest.mark.parametrize("x_dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("m", [2, 40], ids=lambda m: f"M={m}")
def test_subnormal_scales(device, x_dtype, m):
    """Scales 0x01-0x07 / 0x81-0x87 (m * 2^-9) decode exactly; tiny outputs match."""
    g = rng("subnormal", m, x_dtype)
    n, k = 24, 80
    x = rand_x((m, k), x_dtype, g)
    w, scales, packed = rand_weights(n, k, g, scale_codes=np.array(SUBNORMAL_CODES, np.uint8))
    for od in DTYPES:
        out = mx_fp4.w4a16_matmul(x, w, scales, out_dtype=od)
        if od == mx.float16:
            # Outputs ~1e-3: fp16 normals, so the table's relative bound applies.
            assert np.abs(np_out(out)).max() > 2.0**-14
        check_matmul(out, x, packed, scales, out_dtype=od)


# ----------------------------------------------------------------------------------------------
# Negative zero


def test_negative_zero_scale_and_nibble(device):
    """Scale 0x80 (-0) and nibble 8 (-0) contribute nothing; the result equals the reference."""
    g = rng("negzero")
    m, n, k = 6, 16, 48
    x = rand_x((m, k), mx.float32, g)
    codes = g.integers(0, 16, size=(n, k), dtype=np.uint8)
    codes[:, 16:32] = 8  # -0 nibbles in block 1
    packed = ref.pack_nibbles(codes)
    s = g.choice(DEFAULT_SCALE_CODES, size=(n, 3)).astype(np.uint8)
    s[::2, 2] = 0x80  # -0 scale for block 2 of even rows
    out = mx_fp4.w4a16_matmul(x, mx.array(packed), mx.array(s))
    assert np.isfinite(np_out(out)).all()
    check_matmul(out, x, packed, s)
    # Same result as with +0 in those places (only the signs of zero terms differ).
    codes0 = codes.copy()
    codes0[:, 16:32] = 0
    s0 = s.copy()
    s0[::2, 2] = 0
    out0 = mx_fp4.w4a16_matmul(x, mx.array(ref.pack_nibbles(codes0)), mx.array(s0))
    np.testing.assert_array_equal(np_out(out), np_out(out0))


@pytest.mark.parametrize("x_dtype", DTYPES, ids=dname)
def test_negative_zero_activations(device, x_dtype):
    g = rng("negzero-x", x_dtype)
    w, scales, packed = rand_weights(12, 33, g)
    x = mx.full((3, 33), -0.0, dtype=x_dtype)
    out = mx_fp4.w4a16_matmul(x, w, scales)
    o = np_out(out)
    assert (o == 0).all()
    check_matmul(out, x, packed, scales)


def test_negative_zero_constants_are_kept_apart(device):
    """gs = -0 makes the accumulator -0 (for positive sums); ("add", -0.0) keeps it -0 and
    ("add", 0.0) makes it +0. Under mx.compile the two chains must not be merged."""
    k, n = 32, 4
    packed = ref.pack_nibbles(np.full((n, k), 2, np.uint8))  # +1.0
    s = np.full((n, 2), 0x38, np.uint8)  # 1.0
    x = mx.ones((2, k), dtype=mx.float32)
    w, sc = mx.array(packed), mx.array(s)

    def both(a):
        neg = mx_fp4.w4a16_matmul(a, w, sc, global_scale=-0.0, epilogue=[("add", -0.0)])
        pos = mx_fp4.w4a16_matmul(a, w, sc, global_scale=-0.0, epilogue=[("add", 0.0)])
        relu = mx_fp4.w4a16_matmul(a, w, sc, global_scale=-0.0, epilogue=["relu"])
        clamp = mx_fp4.w4a16_matmul(a, w, sc, global_scale=-0.0, epilogue=[("clamp", 0.0, 1.0)])
        return neg, pos, relu, clamp

    for f in (both, mx.compile(both)):
        neg, pos, relu, clamp = (np_out(o) for o in f(x))
        assert (neg == 0).all() and np.signbit(neg).all(), "acc * -0 + -0 = -0"
        assert (pos == 0).all() and not np.signbit(pos).any(), "-0 + +0 = +0"
        assert np.signbit(relu).all(), "relu keeps -0 (v < 0 is false)"
        assert np.signbit(clamp).all(), "clamp(-0, 0, 1) keeps -0 (-0 < 0 is false)"


# ----------------------------------------------------------------------------------------------
# Inf / NaN


@pytest.mark.parametrize("x_dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("m", [4, 30], ids=lambda m: f"M={m}")
def test_inf_nan_activations(device, x_dtype, m):
    """NaN rows, +-Inf against zero / positive / negative weights (inf * 0 = NaN, inf - inf = NaN)."""
    g = rng("infnan", x_dtype, m)
    n, k = 40, 48
    x = np.array(rand_x((m, k), mx.float32, g))
    x[0, 3] = np.nan
    x[1, 17] = np.inf
    x[2, 40] = -np.inf
    x[3, 5] = np.inf
    x[3, 6] = -np.inf
    if m > 8:
        x[m - 1, :] = np.inf
    codes = g.integers(0, 16, size=(n, k), dtype=np.uint8)
    codes[0:5, 17] = 0  # inf * +0 -> NaN
    codes[5:10, 17] = 8  # inf * -0 -> NaN
    packed = ref.pack_nibbles(codes)
    scales = g.choice(DEFAULT_SCALE_CODES, size=(n, 3)).astype(np.uint8)
    xm = mx.array(x).astype(x_dtype)
    out = mx_fp4.w4a16_matmul(xm, mx.array(packed), mx.array(scales), out_dtype=mx.float32)
    o = np_out(out)
    assert np.isnan(o[0]).all()
    assert np.isnan(o[1, :10]).all() and np.isinf(o[1, 10:][codes[10:, 17] & 7 != 0]).all()
    check_matmul(out, xm, packed, scales, out_dtype=mx.float32)


def test_inf_nan_epilogue_operands_and_global_scale(device):
    g = rng("infnan-epi")
    m, n, k = 5, 24, 32
    x = rand_x((m, k), mx.float32, g)
    w, scales, packed = rand_weights(n, k, g)
    bias = np.array(rand_x((n,), mx.float32, g))
    bias[[1, 2, 3]] = [np.inf, -np.inf, np.nan]
    resid = np.array(rand_x((m, n), mx.float32, g))
    resid[2, 4] = np.nan
    epi = [("add", mx.array(bias)), "silu", ("mul", mx.array(resid)), ("clamp", -1e30, np.inf)]
    out = mx_fp4.w4a16_matmul(x, w, scales, epilogue=epi)
    check_matmul(out, x, packed, scales, epilogue=epi)
    o = np_out(out)
    assert np.isnan(o[:, 3]).all() and np.isnan(o[2, 4])
    for gs in [np.inf, -np.inf, np.nan]:
        out = mx_fp4.w4a16_matmul(x, w, scales, global_scale=float(gs))
        check_matmul(out, x, packed, scales, global_scale=np.float32(gs))


# ----------------------------------------------------------------------------------------------
# Overflow


FP16_EDGE = np.array(
    [65504.0, 65519.99609375, 65520.0, 70000.0, 1e30, -65504.0, -65520.0, -1e6, 3.0e38, 6.0e4],
    np.float32,
)


def test_fp16_output_overflow_is_a_cast(device):
    """Values beyond fp16's range become +-inf, exactly as mx.astype / numpy cast the fp32 value:
    |v| < 65520 rounds to at most 65504, |v| >= 65520 becomes inf (round to nearest even)."""
    m, k = 2, 16
    n = FP16_EDGE.size
    x = mx.zeros((m, k), dtype=mx.float16)
    w = mx.zeros((n, k // 2), dtype=mx.uint8)
    s = mx.full((n, 1), 0x38, dtype=mx.uint8)
    t = mx.array(np.tile(FP16_EDGE, (m, 1)))
    out = mx_fp4.w4a16_matmul(x, w, s, epilogue=[("add", t)])
    assert out.dtype == mx.float16
    o = np.array(out)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(o, np.tile(FP16_EDGE, (m, 1)).astype(np.float16))
    np.testing.assert_array_equal(o, np.array(t.astype(mx.float16)))
    assert o[0].tolist()[:5] == [65504.0, 65504.0, np.inf, np.inf, np.inf]


@pytest.mark.parametrize("m", [2, 20], ids=lambda m: f"M={m}")
def test_fp16_matmul_overflow(device, m):
    """x = 60000 (fp16), w = 6 * 448: the fp32 accumulator (~1.6e8 K) is finite; an fp16 output
    is +-inf (like a cast), bf16 / fp32 outputs are finite, and a small global scale applied in
    fp32 before the cast brings it back into range."""
    k, n = 32, 8
    x = mx.full((m, k), 60000.0, dtype=mx.float16)
    codes = np.full((n, k), 7, np.uint8)  # +6
    codes[1::2] = 15  # -6
    packed = ref.pack_nibbles(codes)
    s = np.full((n, 2), 0x7E, np.uint8)  # 448
    w, sc = mx.array(packed), mx.array(s)
    o16 = np_out(mx_fp4.w4a16_matmul(x, w, sc))
    assert np.array_equal(o16, np.tile(np.where(np.arange(n) % 2, -np.inf, np.inf), (m, 1)))
    for od in (mx.bfloat16, mx.float32):
        out = mx_fp4.w4a16_matmul(x, w, sc, out_dtype=od)
        assert np.isfinite(np_out(out)).all()
        check_matmul(out, x, packed, s, out_dtype=od)
    out = mx_fp4.w4a16_matmul(x, w, sc, global_scale=2.0**-20)
    assert np.isfinite(np_out(out)).all()
    check_matmul(out, x, packed, s, global_scale=np.float32(2.0**-20))


@pytest.mark.parametrize("out_dtype", DTYPES, ids=dname)
def test_fp32_accumulator_overflow(device, out_dtype):
    """Products beyond fp32's range overflow the fp32 accumulator to +-inf whatever the output
    dtype or global scale (the scale is applied after accumulation, as documented)."""
    k, n, m = 32, 4, 3
    x = mx.full((m, k), 1e36, dtype=mx.float32)
    packed = ref.pack_nibbles(np.full((n, k), 7, np.uint8))
    s = np.full((n, 2), 0x7E, np.uint8)
    out = mx_fp4.w4a16_matmul(x, mx.array(packed), mx.array(s), out_dtype=out_dtype,
                              global_scale=1e-10)
    assert np.isposinf(np_out(out)).all()


def test_bf16_output_overflow_is_a_cast(device):
    """fp32 values above bf16's largest finite (3.3895e38) round like a cast (>= 3.3962e38: inf)."""
    vals = np.array([3.3895e38, 3.39e38, 3.397e38, 3.4e38, -3.4e38], np.float32)
    n = vals.size
    out = mx_fp4.w4a16_matmul(
        mx.zeros((1, 16), mx.float32), mx.zeros((n, 8), mx.uint8), mx.full((n, 1), 0x38, mx.uint8),
        epilogue=[("add", mx.array(vals))], out_dtype=mx.bfloat16,
    )
    expected = mx.array(vals).astype(mx.bfloat16)
    np.testing.assert_array_equal(np_out(out)[0], np_out(expected))
    assert np.isinf(np_out(out)[0, 3:]).all()


# ----------------------------------------------------------------------------------------------
# Layouts: non-contiguous, transposed, broadcast


def x_variant(how, m, k, dtype, g):
    if how == "transposed":
        return rand_x((k, m), dtype, g).T
    if how == "row_stride":
        return rand_x((2 * m, k), dtype, g)[::2]
    if how == "col_slice":
        return rand_x((m, k + 7), dtype, g)[:, 3 : 3 + k]
    if how == "col_stride":
        return rand_x((m, 3 * k), dtype, g)[:, ::3]
    if how == "reversed":
        return rand_x((m, k), dtype, g)[::-1, ::-1]
    if how == "broadcast_rows":
        return mx.broadcast_to(rand_x((1, k), dtype, g), (m, k))
    if how == "broadcast_batch":
        return mx.broadcast_to(rand_x((m, k), dtype, g), (3, m, k))
    if how == "batch_transposed":
        return mx.transpose(rand_x((2, k, m), dtype, g), (0, 2, 1))
    if how == "swapped_batch":
        return mx.transpose(rand_x((m, 2, k), dtype, g), (1, 0, 2))
    raise ValueError(how)


X_LAYOUTS = ["transposed", "row_stride", "col_slice", "col_stride", "reversed", "broadcast_rows",
             "broadcast_batch", "batch_transposed", "swapped_batch"]


@pytest.mark.parametrize("x_dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("m", [5, 40], ids=lambda m: f"M={m}")
@pytest.mark.parametrize("how", X_LAYOUTS)
def test_x_layouts(device, how, m, x_dtype):
    g = rng("x-layout", how, m, x_dtype)
    k, n = 40, 24
    w, scales, packed = rand_weights(n, k, g)
    x = x_variant(how, m, k, x_dtype, g)
    out = mx_fp4.w4a16_matmul(x, w, scales)
    assert out.shape == x.shape[:-1] + (n,)
    check_matmul(out, x, packed, scales)
    # And identical bits to the contiguous copy.
    np.testing.assert_array_equal(np_out(out), np_out(mx_fp4.w4a16_matmul(mx.array(np_out(x)).astype(x_dtype), w, scales)))


W_LAYOUTS = ["row_stride", "col_slice", "transposed", "broadcast_rows", "reversed_rows"]


@pytest.mark.parametrize("target", ["w", "scales", "both"])
@pytest.mark.parametrize("how", W_LAYOUTS)
@pytest.mark.parametrize("layout", ["uint8", "uint32"])
def test_weight_and_scale_layouts(device, layout, how, target):
    g = rng("w-layout", layout, how, target)
    m, n, k = 7, 20, 48
    x = rand_x((m, k), mx.float32, g)
    w, scales, packed = rand_weights(n, k, g, layout=layout)
    w_np, s_np = np.array(w), np.array(scales)

    def variant(a):
        if how == "row_stride":
            big = np.zeros((2 * a.shape[0], a.shape[1]), a.dtype)
            big[::2] = a
            return mx.array(big)[::2], a
        if how == "col_slice":
            big = np.zeros((a.shape[0], a.shape[1] + 3), a.dtype)
            big[:, 2 : 2 + a.shape[1]] = a
            return mx.array(big)[:, 2 : 2 + a.shape[1]], a
        if how == "transposed":
            return mx.array(np.ascontiguousarray(a.T)).T, a
        if how == "broadcast_rows":
            return mx.broadcast_to(mx.array(a[:1]), a.shape), np.broadcast_to(a[:1], a.shape)
        if how == "reversed_rows":
            return mx.array(a[::-1].copy())[::-1], a
        raise ValueError(how)

    wv, w_ref = variant(w_np) if target in ("w", "both") else (w, w_np)
    sv, s_ref = variant(s_np) if target in ("scales", "both") else (scales, s_np)
    out = mx_fp4.w4a16_matmul(x, wv, sv)
    check_matmul(out, x, ref.packed_bytes(np.ascontiguousarray(w_ref)), np.ascontiguousarray(s_ref))


@pytest.mark.parametrize("how", ["broadcast", "slice", "array1"])
def test_global_scale_layouts(device, how):
    g = rng("gs-layout", how)
    x = rand_x((4, 32), mx.float32, g)
    w, scales, packed = rand_weights(6, 32, g)
    v = np.float32(0.3125)
    gs = {"broadcast": mx.broadcast_to(mx.array(float(v)), ()), "slice": mx.array([1.0, float(v), 2.0])[1],
          "array1": mx.array([float(v)])[::-1]}[how]
    out = mx_fp4.w4a16_matmul(x, w, scales, global_scale=gs)
    check_matmul(out, x, packed, scales, global_scale=v)


# Regression: a strided, reversed or broadcast [N] (col) operand was once read as if contiguous
# (csrc/ops.cpp canonical_operand reshaped it without mx::contiguous; a broadcast bias read past
# its 1-element buffer). Fixed in b95a4e0.


def operand_variant(how, kind, lead, n, g):
    """An epilogue operand of broadcast kind `kind` for an output [*lead, n], laid out `how`."""
    shape = {"scalar": (), "col": (n,), "row": (*lead, 1), "full": (*lead, n)}[kind]
    if how == "contiguous":
        return rand_x(shape, mx.float32, g)
    if how == "strided":
        if kind == "scalar":
            return rand_x((3,), mx.float32, g)[1]
        big = rand_x(shape[:-1] + (2 * shape[-1],), mx.float32, g)
        return big[..., ::2]
    if how == "transposed":
        if len(shape) < 2:
            return rand_x(shape, mx.float32, g).T
        return mx.swapaxes(rand_x(shape[:-2] + (shape[-1], shape[-2]), mx.float32, g), -1, -2)
    if how == "broadcast":
        if kind == "scalar":
            return mx.broadcast_to(rand_x((1,), mx.float32, g), (1, 1))
        one = shape[:-1] + (1,) if kind in ("col", "full") else (1,) * len(shape)
        return mx.broadcast_to(rand_x(one, mx.float32, g), shape)
    if how == "reversed":
        if kind == "scalar":
            return rand_x((), mx.float32, g)
        return rand_x(shape, mx.float32, g)[..., ::-1]
    raise ValueError(how)


def _operand_cases():
    cases = []
    for kind in ["scalar", "col", "row", "full"]:
        for how in ["contiguous", "strided", "transposed", "broadcast", "reversed"]:
            cases.append(pytest.param(kind, how, id=f"{kind}-{how}"))
    return cases


@pytest.mark.parametrize("lead", [(5,), (2, 12)], ids=["M=5", "B=2xM=12"])
@pytest.mark.parametrize("kind,how", _operand_cases())
def test_epilogue_operand_layouts(device, kind, how, lead):
    g = rng("opnd-layout", kind, how, lead)
    k, n = 40, 24
    x = rand_x((*lead, k), mx.float32, g)
    w, scales, packed = rand_weights(n, k, g)
    t = operand_variant(how, kind, lead, n, g)
    for name in ("add", "mul"):
        epi = [(name, t)]
        out = mx_fp4.w4a16_matmul(x, w, scales, epilogue=epi)
        check_matmul(out, x, packed, scales, epilogue=epi)


def test_col_operand_strided_and_broadcast_minimal(device):
    """Minimal repro of the fixed bug: bias = mx.arange(8.)[::2] (shape [4], stride 2)."""
    x = mx.zeros((1, 16), mx.float32)
    w = mx.zeros((4, 8), mx.uint8)
    s = mx.full((4, 1), 0x38, mx.uint8)
    bias = mx.arange(8, dtype=mx.float32)[::2]  # [0, 2, 4, 6]
    out = mx_fp4.w4a16_matmul(x, w, s, epilogue=[("add", bias)])
    np.testing.assert_array_equal(np.array(out), [[0.0, 2.0, 4.0, 6.0]])  # was [[0, 1, 2, 3]]
    bias = mx.broadcast_to(mx.array([5.0]), (4,))
    out = mx_fp4.w4a16_matmul(x, w, s, epilogue=[("add", bias)])
    np.testing.assert_array_equal(np.array(out), [[5.0] * 4])  # was [[5, 4.6e-41, 0, 0]]


# ----------------------------------------------------------------------------------------------
# Index arithmetic past 2^31


def _cxx():
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")


@pytest.mark.skipif(_cxx() is None, reason="no C++ compiler (g++/clang++) on PATH")
def test_index_helpers_int64(tmp_path):
    """Compiles and runs tests/cpp/test_index_helpers.cpp (header-only, about 1 s)."""
    exe = tmp_path / "test_index_helpers"
    subprocess.run(
        [_cxx(), "-std=c++17", "-O1", "-Wall", f"-I{ROOT / 'csrc'}",
         str(ROOT / "tests/cpp/test_index_helpers.cpp"), "-o", str(exe)],
        check=True, capture_output=True, text=True,
    )
    r = subprocess.run([str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 failures" in r.stdout


def _periodic_weights(period, k, g):
    codes = g.integers(0, 16, size=(period, k), dtype=np.uint8)
    packed = ref.pack_nibbles(codes)
    s = g.choice(DEFAULT_SCALE_CODES, size=(period, -(-k // 16))).astype(np.uint8)
    return packed, s


@pytest.mark.skipif(not LARGE, reason="set MLX_FP4_LARGE_TESTS=1 (needs ~16 GiB RAM, minutes on CPU)")
def test_large_output_past_2_31_elements(device):
    """Output [2, 2^30 + 8] bf16 (2^31 + 16 elements, 4 GiB): element offsets row * N + col and
    weight byte offsets n * w_row_bytes (2 GiB of weights) cross 2^31. Weights repeat with a
    prime period, so every output column is checked against a small reference."""
    g = rng("large-out")
    n, k, period = (1 << 30) + 8, 3, 251
    small_w, small_s = _periodic_weights(period, k, g)
    reps = n // period + 1
    w = mx.array(np.tile(small_w, (reps, 1))[:n])
    s = mx.array(np.tile(small_s, (reps, 1))[:n])
    x = rand_x((2, k), mx.bfloat16, g)
    out = mx_fp4.w4a16_matmul(x, w, s)
    mx.eval(out)
    del w, s
    _, acc, mag = ref.w4a16_matmul_with_magnitude(x, small_w, small_s, k)
    y, bound = error_bound(acc, mag, k, TOLERANCES[(mx.bfloat16, mx.bfloat16)])
    chunk = 1 << 26
    for c0 in range(0, n, chunk):
        c1 = min(n, c0 + chunk)
        cols = np.arange(c0, c1) % period
        assert_close(out[:, c0:c1], y[:, cols], bound[:, cols], f"columns {c0}:{c1}")


@pytest.mark.skipif(not LARGE, reason="set MLX_FP4_LARGE_TESTS=1 (needs ~16 GiB RAM, minutes on CPU)")
def test_large_activations_past_2_31_elements(device):
    """x [2^27 + 5, 17] bf16 (2^31 + 85 elements, 4 GiB): activation offsets row * K + k cross 2^31.
    Rows of x repeat with a prime period; every output row is checked."""
    g = rng("large-x")
    m, k, n, period = (1 << 27) + 5, 17, 3, 127
    small_x = np.array(rand_x((period, k), mx.float32, g))
    w, s, packed = rand_weights(n, k, g)
    xs = mx.array(small_x).astype(mx.bfloat16)
    bits16 = np.array(xs.view(mx.uint16))
    x = mx.array(np.tile(bits16, (m // period + 1, 1))[:m]).view(mx.bfloat16)
    out = mx_fp4.w4a16_matmul(x, w, s, out_dtype=mx.float32)
    mx.eval(out)
    del x
    _, acc, mag = ref.w4a16_matmul_with_magnitude(xs, packed, s, k)
    y, bound = error_bound(acc, mag, k, TOLERANCES[(mx.bfloat16, mx.float32)])
    chunk = 1 << 24
    for r0 in range(0, m, chunk):
        r1 = min(m, r0 + chunk)
        rows = np.arange(r0, r1) % period
        assert_close(out[r0:r1], y[rows], bound[rows], f"rows {r0}:{r1}")
