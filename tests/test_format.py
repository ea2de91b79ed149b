"""The NVFP4 format through mx_fp4.dequantize: every E2M1 code, every E4M3 scale byte, nibble
order, MLX's uint32 layout, exactness per dtype, global scale in fp32."""

import ml_dtypes
import mlx.core as mx
import numpy as np
import pytest

import mlx_fp4 as mx_fp4
import reference as ref
from common import DTYPES, dname, rand_weights, rng

ALL_E2M1 = np.arange(16, dtype=np.uint8)
ALL_E4M3 = np.arange(256, dtype=np.uint8)
NAN_SCALE_CODES = (0x7F, 0xFF)
SCALE_ONE = 0x38  # E4M3 1.0


def np_of(a):
    return ref.to_numpy(a)


def all_pairs():
    """Row r uses scale byte r (all 256) and holds the 16 E2M1 codes in order -> [256, 16]."""
    packed = np.tile(ref.pack_nibbles(ALL_E2M1[None, :]), (256, 1))
    scales = ALL_E4M3[:, None].copy()
    return packed, scales


def test_e2m1_table_matches_ml_dtypes():
    """The reference itself: 16 codes -> 0, .5, 1, 1.5, 2, 3, 4, 6 and their negatives."""
    expected = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]
    np.testing.assert_array_equal(ref.decode_e2m1(ALL_E2M1), expected)
    assert np.isnan(ref.decode_e4m3(np.array([0x7F, 0xFF]))).all()
    assert ref.decode_e4m3(np.array([0x7E]))[0] == 448.0
    assert ref.decode_e4m3(np.array([0x01]))[0] == 2.0**-9


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: f"dtype={dname(d)}")
def test_all_e2m1_codes(device, dtype):
    packed = ref.pack_nibbles(ALL_E2M1[None, :])
    scales = np.array([[SCALE_ONE]], np.uint8)
    out = mx_fp4.dequantize(mx.array(packed), mx.array(scales), k=16, dtype=dtype)
    assert out.dtype == dtype and out.shape == (1, 16)
    np.testing.assert_array_equal(np_of(out)[0], ref.decode_e2m1(ALL_E2M1))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: f"dtype={dname(d)}")
def test_all_e4m3_codes_times_all_e2m1_codes(device, dtype):
    """All 256 x 16 products are exact in bf16/fp16/fp32; scale bytes 0x7F/0xFF give NaN."""
    packed, scales = all_pairs()
    out = mx_fp4.dequantize(mx.array(packed), mx.array(scales), k=16, dtype=dtype)
    assert out.shape == (256, 16)
    expected = ref.decode_weights(packed, scales, 16)
    got = np_of(out)
    np.testing.assert_array_equal(got, expected)  # NaN == NaN here
    for code in NAN_SCALE_CODES:
        assert np.isnan(got[code]).all(), f"scale byte {code:#x} must decode to NaN"
    finite = np.ones(256, bool)
    finite[list(NAN_SCALE_CODES)] = False
    assert np.isfinite(got[finite]).all()


def test_scale_decode_matches_mlx(device):
    """Cross-check with mx.dequantize(mode="nvfp4") on all 256 x 16 pairs. MLX 0.32.4's CPU
    dequantize also gives NaN for 0x7F/0xFF (measured; the Metal decode is documented as +-480,
    so the NaN codes are only compared on the CPU)."""
    packed, scales = all_pairs()
    w32 = mx.array(ref.bytes_to_uint32(packed))
    ours = np_of(mx_fp4.dequantize(w32, mx.array(scales), k=16, dtype=mx.float32))
    theirs = np_of(mx.dequantize(w32, mx.array(scales), mode="nvfp4", dtype=mx.float32))
    finite = np.ones(256, bool)
    finite[list(NAN_SCALE_CODES)] = False
    np.testing.assert_array_equal(ours[finite], theirs[finite])
    assert np.isnan(ours[~finite]).all()
    if device == mx.cpu:
        assert np.isnan(theirs[~finite]).all()


def test_nibble_order_low_nibble_is_even_k(device):
    # byte 0x71: low nibble 1 (0.5) is k=0, high nibble 7 (6.0) is k=1.
    packed = np.zeros((1, 8), np.uint8)
    packed[0, 0] = 0x71
    packed[0, 3] = 0xA4  # k=6 -> code 4 (2.0), k=7 -> code 0xA (-1.0)
    out = mx_fp4.dequantize(
        mx.array(packed), mx.array(np.array([[SCALE_ONE]], np.uint8)), dtype=mx.float32
    )
    expected = np.zeros(16)
    expected[[0, 1, 6, 7]] = [0.5, 6.0, 2.0, -1.0]
    np.testing.assert_array_equal(np_of(out)[0], expected)


def test_scale_block_is_16_consecutive_k(device):
    """k in [16j, 16j + 16) uses scale byte j."""
    n, k = 2, 48
    codes = np.full((n, k), 2, np.uint8)  # all 1.0
    scales = np.array([[0x38, 0x40, 0x30], [0x48, 0x28, 0x00]], np.uint8)  # 1,2,.5 / 4,.25,0
    out = np_of(
        mx_fp4.dequantize(mx.array(ref.pack_nibbles(codes)), mx.array(scales), dtype=mx.float32)
    )
    np.testing.assert_array_equal(out, np.repeat(ref.decode_e4m3(scales), 16, axis=1))


@pytest.mark.parametrize("k", [8, 16, 40, 64, 200])
def test_uint32_layout_equals_uint8_layout(device, k):
    """mx.quantize(mode="nvfp4") uint32 words hold the same bytes as our uint8 layout."""
    n = 8  # MLX's CPU quantize needs N * K % 32 == 0
    k16 = -(-k // 16) * 16
    g = rng("uint32", k)
    w = mx.array(g.standard_normal((n, k16)).astype(np.float32))
    w32, scales = mx.quantize(w, mode="nvfp4")
    assert w32.dtype == mx.uint32
    w8 = mx.array(ref.packed_bytes(w32))
    a = mx_fp4.dequantize(w32, scales, k=k16, dtype=mx.float32)
    b = mx_fp4.dequantize(w8, scales, k=k16, dtype=mx.float32)
    np.testing.assert_array_equal(np_of(a), np_of(b))
    np.testing.assert_array_equal(np_of(a), ref.decode_weights(w32, scales, k16))
    # And MLX's own decode of its own output agrees.
    np.testing.assert_array_equal(
        np_of(a), np_of(mx.dequantize(w32, scales, mode="nvfp4", dtype=mx.float32))
    )


@pytest.mark.parametrize("layout", ["uint8", "uint32"])
@pytest.mark.parametrize("k", [1, 15, 17, 33])
def test_dequantize_odd_k(device, layout, k):
    """k smaller than the packed width: [N, k]; padding nibbles (garbage here) are ignored."""
    g = rng("odd", layout, k)
    w, scales, packed = rand_weights(3, k, g, layout=layout, garbage_padding=True)
    out = mx_fp4.dequantize(w, scales, k=k, dtype=mx.float32)
    assert out.shape == (3, k)
    np.testing.assert_array_equal(np_of(out), ref.decode_weights(packed, scales, k))


@pytest.mark.parametrize("layout", ["uint8", "uint32"])
def test_dequantize_default_k(device, layout):
    g = rng("default-k", layout)
    w, scales, packed = rand_weights(4, 32, g, layout=layout)
    out = mx_fp4.dequantize(w, scales)
    assert out.shape == (4, 32)
    assert out.dtype == mx.bfloat16  # default dtype
    np.testing.assert_array_equal(np_of(out), ref.decode_weights(packed, scales, 32))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: f"dtype={dname(d)}")
@pytest.mark.parametrize("gs_kind", ["float", "array"])
def test_global_scale_applied_in_fp32(device, dtype, gs_kind):
    """out = cast(fp32(e2m1 * e4m3) * fp32(gs / 2688)): one fp32 multiply, then one cast."""
    gs = 0.0123456789  # not a power of two: products are not exact in bf16/fp16
    gs32 = np.float32(gs)
    packed, scales = all_pairs()
    keep = np.ones(256, bool)
    keep[list(NAN_SCALE_CODES)] = False
    packed, scales = packed[keep], scales[keep]
    g = mx.array(gs32) if gs_kind == "array" else gs
    out = mx_fp4.dequantize(mx.array(packed), mx.array(scales), k=16, global_scale=g, dtype=dtype)
    exact = ref.decode_weights(packed, scales, 16)  # exact, <= 6 significant bits
    m32 = np.float32(ref.multiplier(gs32))  # MLX's convention: gs is the amax
    expected32 = (exact * np.float64(m32)).astype(np.float32)  # == fp32 product, rounded once
    if dtype == mx.bfloat16:
        expected = expected32.astype(ml_dtypes.bfloat16).astype(np.float64)
    elif dtype == mx.float16:
        expected = expected32.astype(np.float16).astype(np.float64)
    else:
        expected = expected32.astype(np.float64)
    np.testing.assert_array_equal(np_of(out), expected)


def test_nan_scale_gives_nan_only_in_its_block(device):
    codes = np.full((2, 32), 2, np.uint8)
    scales = np.array([[0x38, 0x7F], [0xFF, 0x38]], np.uint8)
    out = np_of(
        mx_fp4.dequantize(mx.array(ref.pack_nibbles(codes)), mx.array(scales), dtype=mx.float32)
    )
    assert np.isnan(out[0, 16:]).all() and np.isnan(out[1, :16]).all()
    np.testing.assert_array_equal(out[0, :16], 1.0)
    np.testing.assert_array_equal(out[1, 16:], 1.0)


def test_dequantize_is_lazy(device):
    """A graph op: returns an unevaluated array (no eager NumPy work)."""
    g = rng("lazy")
    w, scales, _ = rand_weights(2, 32, g)
    out = mx_fp4.dequantize(w, scales)
    assert isinstance(out, mx.array)
    # Works inside a compiled function, which only accepts graph ops.
    f = mx.compile(lambda a, b: mx_fp4.dequantize(a, b, dtype=mx.float32))
    np.testing.assert_array_equal(np_of(f(w, scales)), np_of(out.astype(mx.float32)))
