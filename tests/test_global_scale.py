"""global_scale in the ops means what it means in MLX: the fp32 tensor amax, decoded with the
multiplier amax / 2688 (one fp32 division). Checked against mx.quantize / mx.dequantize on the
same arrays and against the float64 reference; a bool, another dtype or shape is a ValueError."""

import mlx.core as mx
import numpy as np
import pytest

import common
import reference as ref
import mlx_fp4 as mx_fp4


def _weights(n=24, k=64, sigma=1e-3):
    g = common.rng("gs-conv", n, k)
    return mx.array(g.standard_normal((n, k)).astype(np.float32) * sigma)


def test_quantize_returns_mlx_global_scale():
    w = _weights()
    packed, scales, gs = mx_fp4.quantize(w, global_scale=True)
    amax = np.float32(np.abs(np.array(w)).max())
    assert gs.dtype == mx.float32 and gs.item() == amax
    # MLX decodes our bytes with our global_scale, no conversion
    mlx_w = mx.dequantize(packed.view(mx.uint32), scales, mode="nvfp4", global_scale=gs, dtype=mx.float32)
    ours = mx_fp4.dequantize(packed, scales, global_scale=gs, dtype=mx.float32)
    want = ref.decode_weights(packed, scales, 64, ref.multiplier(gs))
    np.testing.assert_allclose(np.array(ours), want, rtol=2**-23, atol=0)  # one fp32 rounding
    np.testing.assert_allclose(np.array(mlx_w), want, rtol=2**-22, atol=0)  # MLX rounds twice
    # the global scale keeps these small weights out of E4M3 underflow
    rel = np.linalg.norm(want - np.array(w)) / np.linalg.norm(np.array(w))
    assert rel < 0.15, rel


def test_mlx_quantized_bytes_with_mlx_global_scale():
    """Bytes from mx.quantize(..., global_scale=amax) run in w4a16_matmul with that same amax."""
    w = _weights(40, 96)
    amax = mx.max(mx.abs(w))
    qw, qs = mx.quantize(w, mode="nvfp4", global_scale=amax)
    x = common.rand_x((3, 96), mx.float32, common.rng("gs-x"))
    out = mx_fp4.w4a16_matmul(x, qw, qs, global_scale=amax)
    common.check_matmul(out, x, ref.packed_bytes(qw), qs, global_scale=amax)
    mlx_y = x @ mx.dequantize(qw, qs, mode="nvfp4", global_scale=amax, dtype=mx.float32).T
    np.testing.assert_allclose(np.array(out), np.array(mlx_y), rtol=1e-5, atol=1e-7)


def test_quantize_with_a_given_global_scale():
    w = _weights()
    _, _, gs = mx_fp4.quantize(w, global_scale=True)
    half = w[:12]
    p_given, s_given = mx_fp4.quantize(half, global_scale=gs)  # e.g. a shard of a bigger tensor
    p_all, s_all, _ = mx_fp4.quantize(w, global_scale=True)
    np.testing.assert_array_equal(np.array(p_given), np.array(p_all[:12]))
    np.testing.assert_array_equal(np.array(s_given), np.array(s_all[:12]))


@pytest.mark.parametrize("op", ["w4a16_matmul", "dequantize", "reference_ops", "quantize"])
@pytest.mark.parametrize(
    "bad, match",
    [
        (True, "got a bool"),
        (mx.ones((2,)), r"scalar .* but got shape \(2,\)"),
        (mx.array(1.0, mx.float16), "float32 array but got dtype float16"),
        ("1.0", "but got <class 'str'>"),
    ],
    ids=["bool", "shape", "dtype", "str"],
)
def test_bad_global_scale_is_a_value_error(op, bad, match):
    w = _weights(8, 32)
    packed, scales = mx_fp4.quantize(w)
    x = mx.ones((1, 32))
    if op == "quantize" and bad is True:
        pytest.skip("quantize(global_scale=True) computes the amax")
    calls = {
        "w4a16_matmul": lambda: mx_fp4.w4a16_matmul(x, packed, scales, global_scale=bad),
        "reference_ops": lambda: mx_fp4.w4a16_matmul_reference_ops(x, packed, scales, global_scale=bad),
        "dequantize": lambda: mx_fp4.dequantize(packed, scales, global_scale=bad),
        "quantize": lambda: mx_fp4.quantize(w, global_scale=bad),
    }
    with pytest.raises(ValueError, match=r"global_scale.*" + match):
        mx.eval(calls[op]())
