"""mx_fp4.quantize: byte equality with the reference quantizer (mx.quantize's GPU arithmetic in
numpy fp32, reference.quantize), ties, odd K, padding, and comparison with mx.quantize(mode="nvfp4").
Against MLX's Metal kernel itself: tests/metal_sim/test_mlx_quantize.py.

Where mx.quantize (MLX 0.32.4, CPU stream) differs from us, measured by
test_matches_mlx_quantize_except_documented_cases and test_mlx_quantize_tie_cases:
  * scale bytes: identical on fp32 inputs (both round amax/6 to E4M3 nearest-even, saturating);
  * values that round to zero from below: RNE (we, MLX's GPUs, ModelOpt) keep the sign, code 0x8
    (-0); MLX's CPU argmin over its LUT returns +0, code 0x0. This is the only difference on random
    fp32 data (about 1 nibble in 12);
  * exact ties |w / s| in {0.75, 1.75, 3.5}: RNE rounds up to the even mantissa (1.0, 2.0, 4.0),
    MLX's CPU rounds down (0.5, 1.5, 3.0). Ties at 0.25, 1.25, 2.5 and 5 round down in both;
  * where 1 / s is inexact, our (and MLX's GPU) product w * (1 / s) can put a tie an ulp to either
    side, which MLX's CPU quotient w / s does not.
Only the ties change a dequantized value (one E2M1 step).
"""

import mlx.core as mx
import numpy as np
import pytest

import mlx_fp4 as mx_fp4
import reference as ref
from common import dname, rand_float_weights, rng

K_CASES = [1, 2, 7, 15, 16, 17, 31, 33, 48, 100, 256]


def np_of(a):
    return ref.to_numpy(a)


def quantize_np(w, **kw):
    out = mx_fp4.quantize(mx.array(w), **kw)
    mx.eval(out)
    return tuple(np.array(a) for a in out)


def assert_bytes_equal(got, expected, what):
    got = np.asarray(got)
    assert got.dtype == np.uint8, f"{what} dtype {got.dtype}"
    assert got.shape == expected.shape, f"{what} shape {got.shape} != {expected.shape}"
    bad = np.argwhere(got != expected)
    assert bad.size == 0, (
        f"{what}: {len(bad)} bytes differ, first at {bad[0].tolist()}: "
        f"got {got[tuple(bad[0])]:#04x} expected {expected[tuple(bad[0])]:#04x}"
    )


@pytest.mark.parametrize("n", [1, 3, 8])
@pytest.mark.parametrize("k", K_CASES)
def test_random_fp32_byte_equal_to_reference(device, n, k):
    w = rand_float_weights(n, k, rng("q", n, k))
    packed, scales = quantize_np(w)
    exp_packed, exp_scales = ref.quantize(w)
    assert_bytes_equal(scales, exp_scales, "scales")
    assert_bytes_equal(packed, exp_packed, "packed")


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16], ids=lambda d: f"dtype={dname(d)}")
def test_half_inputs_byte_equal_to_reference(device, dtype):
    """bf16/fp16 inputs quantize like their exact fp32 values."""
    w = mx.array(rand_float_weights(6, 80, rng("half", dname(dtype)))).astype(dtype)
    packed, scales = quantize_np(w)
    exp_packed, exp_scales = ref.quantize(ref.to_numpy(w))
    assert_bytes_equal(scales, exp_scales, "scales")
    assert_bytes_equal(packed, exp_packed, "packed")


@pytest.mark.parametrize("k", [1, 3, 15, 17, 33])
def test_padding_nibble_is_zero(device, k):
    w = rand_float_weights(4, k, rng("pad", k), scale=100.0)
    w[w == 0] = 1.0
    packed, scales = quantize_np(w)
    assert packed.shape == (4, -(-k // 2)) and scales.shape == (4, -(-k // 16))
    if k % 2:
        assert (packed[:, -1] >> 4 == 0).all(), "padding nibble past K must be 0"


# Exact ties of E2M1 (|w / s| at a midpoint) with s = 1 (block amax 6 -> scale byte 0x38).
# RNE: 0.25->0, 0.75->1.0, 1.25->1.0, 1.75->2.0, 2.5->2.0, 3.5->4.0, 5->4.0.
TIES = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
TIE_RNE_CODES = [0, 2, 2, 4, 4, 6, 6]


@pytest.mark.parametrize("block_scale", [1.0, 0.5, 1.125, 2.0**-7, 20.0])
def test_e2m1_ties_round_to_nearest_even(device, block_scale):
    vals = np.array(TIES + [-t for t in TIES], np.float64) * block_scale
    row = np.zeros(16, np.float64)
    row[: len(vals)] = vals
    row[15] = 6.0 * block_scale  # amax: the scale is exactly block_scale
    w = row[None, :].astype(np.float32)
    assert np.all(w.astype(np.float64) == row), "test values must be exact in fp32"
    packed, scales = quantize_np(w)
    assert ref.decode_e4m3(scales)[0, 0] == block_scale
    codes = ref.unpack_nibbles(packed)[0, : len(vals)]
    expected = TIE_RNE_CODES + [c | 8 for c in TIE_RNE_CODES]
    np.testing.assert_array_equal(codes, expected)
    assert_bytes_equal(packed, ref.quantize(w)[0], "packed")


# Ties of the E4M3 scale: amax / 6 exactly halfway between two E4M3 values.
def _scale_tie_cases():
    cases = []
    for i in range(0x7D):
        lo, hi = ref.decode_e4m3(np.array([i, i + 1]))
        cases.append(((lo + hi) / 2, i if i % 2 == 0 else i + 1))
    return cases


def test_e4m3_scale_ties_round_to_nearest_even(device):
    """amax/6 at every midpoint between adjacent finite E4M3 values goes to the even code."""
    cases = _scale_tie_cases()
    amax = np.array([6.0 * mid for mid, _ in cases])
    w = np.zeros((len(cases), 16), np.float64)
    w[:, 3] = -amax
    w32 = w.astype(np.float32)
    assert np.all(w32.astype(np.float64) == w)
    _, scales = quantize_np(w32)
    np.testing.assert_array_equal(scales[:, 0], [code for _, code in cases])
    np.testing.assert_array_equal(scales, ref.quantize(w32)[1])


def test_e4m3_scale_saturates_at_448(device):
    """amax/6 >= 448 -> 0x7E (448), never NaN; values beyond 6 * 448 saturate to code 7."""
    w = np.zeros((3, 16), np.float32)
    w[0, 0] = 6 * 448.0
    w[1, 0] = 6 * 470.0  # ml_dtypes alone would give NaN (>= 464)
    w[2, :] = 1e30
    w[2, 1] = -1e30
    packed, scales = quantize_np(w)
    np.testing.assert_array_equal(scales[:, 0], [0x7E, 0x7E, 0x7E])
    codes = ref.unpack_nibbles(packed)
    assert codes[1, 0] == 7 and codes[2, 0] == 7 and codes[2, 1] == 15
    assert_bytes_equal(packed, ref.quantize(w)[0], "packed")


def test_small_and_zero_blocks(device):
    """Subnormal scales, scales that round to 0 (all codes 0), all-zero blocks (scale 0)."""
    w = np.zeros((4, 16), np.float32)
    w[0, :] = np.linspace(-1, 1, 16) * 6 * 2.0**-8  # subnormal scale 2^-8
    w[1, :] = np.linspace(-1, 1, 16) * 6 * 2.0**-11  # amax/6 < 2^-10: scale byte 0
    w[1, 5] = -6 * 2.0**-11
    # w[2] all zero; w[3] a single tiny value.
    w[3, 7] = 1e-20
    packed, scales = quantize_np(w)
    exp_packed, exp_scales = ref.quantize(w)
    np.testing.assert_array_equal(scales[:, 0], [0x02, 0x00, 0x00, 0x00])
    assert_bytes_equal(scales, exp_scales, "scales")
    assert_bytes_equal(packed, exp_packed, "packed")
    # Zero-scale blocks: w * 0, so +0 or -0 by the sign of w (MLX's Metal fp_quantize keeps it).
    codes = ref.unpack_nibbles(packed)[1:]
    assert ((codes == 0) | (codes == 8)).all(), "zero-scale blocks must have +-0 codes"
    np.testing.assert_array_equal(codes == 8, np.signbit(w[1:]))


def test_round_trip_error_bound(device):
    """dequantize(quantize(w)) is within half an E2M1 step (times the scale) of w, plus the
    saturation excess where scale rounding pushed |w| / s past 6."""
    w = rand_float_weights(16, 96, rng("rt"))
    packed, scales = quantize_np(w)
    d = np_of(mx_fp4.dequantize(mx.array(packed), mx.array(scales), k=96, dtype=mx.float32))
    s = np.repeat(ref.decode_e4m3(scales), 16, axis=1)
    q = np.abs(w) / s
    gaps = np.diff(ref.E2M1_GRID)  # .5 .5 .5 .5 1 1 2
    step = gaps[np.clip(np.searchsorted(ref.E2M1_GRID, q) - 1, 0, len(gaps) - 1)]
    bound = (0.5 * step + np.maximum(q - 6.0, 0.0)) * s * (1 + 1e-6)
    err = np.abs(d - w)
    assert np.all(err <= bound), np.max(err / bound)


def test_quantize_is_lazy_graph_op(device):
    w = mx.array(rand_float_weights(4, 32, rng("lazy")))
    out = mx_fp4.quantize(w)
    assert len(out) == 2 and all(isinstance(a, mx.array) for a in out)
    f = mx.compile(lambda a: mx_fp4.quantize(a))
    for a, b in zip(f(w), out):
        np.testing.assert_array_equal(np.array(a), np.array(b))


# ----------------------------------------------------------------------------------------------
# Against mx.quantize(mode="nvfp4")


def nibble_diff(ours_packed, mlx_w32):
    a = ref.unpack_nibbles(ours_packed)
    b = ref.unpack_nibbles(mlx_w32)
    return a, b, a != b


@pytest.mark.parametrize("n,k", [(8, 64), (32, 256), (3, 32 * 3)])
def test_matches_mlx_quantize_except_documented_cases(n, k):
    """Scales byte-equal; nibbles equal except -0 (ours 0x8) vs +0 (MLX 0x0). MLX on the CPU."""
    w = rand_float_weights(n, k, rng("mlx", n, k))
    with mx.stream(mx.cpu):
        mw, ms = mx.quantize(mx.array(w), mode="nvfp4")
        packed, scales = quantize_np(w)
    assert_bytes_equal(scales, np.array(ms), "scales vs mx.quantize")
    a, b, diff = nibble_diff(packed, mw)
    assert set(zip(a[diff].tolist(), b[diff].tolist())) <= {(8, 0)}
    # Every difference is a negative value that rounds to zero.
    s_full = np.repeat(ref.decode_e4m3(scales), 16, axis=1)[:, :k]
    assert np.all(w[diff] < 0) and np.all(np.abs(w[diff]) <= 0.25 * s_full[diff])
    # After dequantization they are equal.
    np.testing.assert_array_equal(
        ref.decode_weights(packed, scales, k), ref.decode_weights(mw, ms, k)
    )


def test_mlx_quantize_tie_cases():
    """Measures (and pins) where MLX's CPU quantize rounds ties differently (see module doc)."""
    vals = np.array(TIES + [-t for t in TIES], np.float32)
    row = np.zeros(32, np.float32)
    row[: len(vals)] = vals
    row[15] = 6.0
    w = np.stack([row, row])  # N*K % 32 == 0 for MLX's CPU path
    with mx.stream(mx.cpu):
        mw, ms = mx.quantize(mx.array(w), mode="nvfp4")
        packed, scales = quantize_np(w)
    assert_bytes_equal(scales, np.array(ms), "scales vs mx.quantize")
    a, b, diff = nibble_diff(packed, mw)
    differing = sorted(set(np.abs(w[diff]).tolist()))
    assert differing == [0.25, 0.75, 1.75, 3.5], differing
    # 0.25 differs only by the sign of zero (-0.25 -> RNE -0, MLX +0).
    quarter = diff & (np.abs(w) == 0.25)
    assert set(zip(a[quarter].tolist(), b[quarter].tolist())) == {(8, 0)}


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16], ids=dname)
def test_matches_mlx_gpu_quantize_bytes(device, dtype):
    """On the GPU, mx.quantize(mode="nvfp4") rounds to nearest even and keeps -0 (CUDA's
    cvt.rn.satfinite.e2m1x2, Metal's fp4_e2m1), as we do: the bytes are equal, ties included.
    (Its CPU path differs at ties and zeros: test_mlx_quantize_tie_cases.)"""
    if device != mx.gpu:
        pytest.skip("MLX's GPU quantize kernel")
    g = rng("gpu_quantize", dname(dtype))
    w = rand_float_weights(64, 256, g)
    row = np.zeros(256, np.float32)
    row[: 2 * len(TIES)] = TIES + [-t for t in TIES]
    row[15] = 6.0
    w[0] = row  # exact ties at block scale 1
    wx = mx.array(w).astype(dtype)
    mw, ms = mx.quantize(wx, mode="nvfp4")[:2]
    packed, scales = quantize_np(wx)
    assert_bytes_equal(scales, np.array(ms), "scales vs mx.quantize (GPU)")
    a, b, diff = nibble_diff(packed, mw)
    assert not diff.any(), f"{int(diff.sum())} codes differ from mx.quantize on the GPU"


# ----------------------------------------------------------------------------------------------
# global_scale=True


def nearest_ok(value, decoded, grid, rel=1e-6):
    """decoded (>= 0) is a nearest point of grid to value (>= 0), up to a relative slack."""
    idx = np.searchsorted(grid, value)
    lo = grid[np.clip(idx - 1, 0, len(grid) - 1)]
    hi = grid[np.clip(idx, 0, len(grid) - 1)]
    best = np.minimum(np.abs(value - lo), np.abs(hi - value))
    return np.abs(decoded - value) <= best * (1 + rel) + rel * value + 1e-300


@pytest.mark.parametrize("n,k", [(4, 64), (7, 33)])
def test_global_scale(device, n, k):
    w = rand_float_weights(n, k, rng("gs", n, k), scale=1e4)
    packed, scales, gs = quantize_np(w, global_scale=True)
    amax = np.max(np.abs(w)).astype(np.float32)
    assert gs.shape in ((), (1,)) and gs.dtype == np.float32
    assert float(gs) == float(amax), (float(gs), float(amax))  # MLX's convention: the amax
    m = ref.multiplier(gs)  # the decode multiplier, amax / 2688 in fp32
    # The block holding amax gets the largest scale byte; no scale byte is NaN.
    assert scales.max() == 0x7E and not np.isin(scales, [0x7F, 0xFF]).any()
    # Scales: a nearest E4M3 value of amax_block / 6 / gs.
    blocks = -(-k // 16)
    wp = np.zeros((n, blocks * 16))
    wp[:, :k] = w
    amax_b = np.abs(wp.reshape(n, blocks, 16)).max(-1)
    target = amax_b / 6 / m
    assert np.all(nearest_ok(np.minimum(target, 448), ref.decode_e4m3(scales), ref.E4M3_GRID))
    # Values: a nearest E2M1 value of w / (s * gs).
    s_eff = np.repeat(ref.decode_e4m3(scales), 16, axis=1)[:, :k] * m
    codes = ref.unpack_nibbles(packed)[:, :k]
    q = np.abs(w) / s_eff
    assert np.all(nearest_ok(np.minimum(q, 6), np.abs(ref.decode_e2m1(codes)), ref.E2M1_GRID))
    nonzero = (codes & 7) != 0
    np.testing.assert_array_equal((codes >= 8)[nonzero], (w < 0)[nonzero])
    # Round trip with the global scale as returned.
    d = np_of(
        mx_fp4.dequantize(
            mx.array(packed), mx.array(scales), k=k, global_scale=mx.array(gs), dtype=mx.float32
        )
    )
    assert np.all(np.abs(d - w) <= s_eff * (1.0 + 6 * 2.0**-4) + 1e-6 * np.abs(w))
    rel = np.linalg.norm(d - w) / np.linalg.norm(w)
    assert rel < 0.15, rel


def test_global_scale_all_zero(device):
    packed, scales, gs = quantize_np(np.zeros((2, 32), np.float32), global_scale=True)
    assert float(gs) == 0.0
    assert (packed == 0).all() and (scales == 0).all()
