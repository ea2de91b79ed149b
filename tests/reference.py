"""Independent float64 NumPy reference for the NVFP4 format and W4A16 matmul.

Written from docs (FORMAT / nvfp4-format.md), never from our C++: every FP4 and FP8 value comes
from ml_dtypes (float4_e2m1fn for nibbles, float8_e4m3fn for scale bytes, where 0x7F/0xFF are
NaN). Nothing here imports mlx_fp4.

Layout: packed weights are uint8 [N, >= ceil(K/2)] with the low nibble holding the even k, or
MLX's uint32 [N, ceil(K/8)] (little-endian, so its bytes are the same uint8 layout). Scales are
uint8 [N, ceil(K/16)] holding E4M3 bits, one per 16 consecutive k.
"""

import math

import ml_dtypes
import numpy as np

BLOCK = 16
MX_BLOCK = 32  # MXFP4 (OCP MX, gpt-oss): one E8M0 scale per 32 weights, no global scale
E2M1_MAX = 6.0
E4M3_MAX = 448.0
GLOBAL_SCALE_DENOMINATOR = E2M1_MAX * E4M3_MAX  # 2688

_F4 = ml_dtypes.float4_e2m1fn
_F8 = ml_dtypes.float8_e4m3fn
_E8M0 = ml_dtypes.float8_e8m0fnu


# ----------------------------------------------------------------------------------------------
# Conversions from MLX (kept here so the reference can take mx.arrays without mlx_fp4).


def to_numpy(a, dtype=None):
    """An mx.array / numpy array / python number as numpy; floats become exact float64.

    bfloat16 has no NumPy dtype, so MLX floats go through float32 (exact for bf16/fp16/fp32).
    """
    if isinstance(a, (int, float, np.generic)):
        a = np.asarray(a)
    if not isinstance(a, np.ndarray):
        import mlx.core as mx  # only for the conversion

        if mx.issubdtype(a.dtype, mx.floating):
            a = np.array(a.astype(mx.float32))
        else:
            a = np.array(a)
    if dtype is not None:
        return a.astype(dtype)
    if a.dtype.kind == "f" or a.dtype in (ml_dtypes.bfloat16,):
        return a.astype(np.float64)
    return a


def packed_bytes(packed):
    """Packed weights as uint8 [N, bytes]: uint32 words are viewed as their little-endian bytes."""
    p = np.ascontiguousarray(to_numpy(packed))
    if p.dtype == np.uint32:
        return p.astype("<u4").view(np.uint8).reshape(p.shape[0], p.shape[1] * 4)
    if p.dtype != np.uint8:
        raise TypeError(f"packed must be uint8 or uint32, got {p.dtype}")
    return p


# ----------------------------------------------------------------------------------------------
# Decoding


def unpack_nibbles(packed):
    """uint8/uint32 packed [N, B] -> uint8 codes [N, 2 * bytes]; low nibble first (even k)."""
    b = packed_bytes(packed)
    lo = b & 0x0F
    hi = b >> 4
    return np.stack([lo, hi], axis=-1).reshape(b.shape[0], -1)


def pack_nibbles(codes):
    """uint8 codes [N, K] (values 0..15) -> uint8 [N, ceil(K/2)], padding nibble 0."""
    codes = np.asarray(codes, dtype=np.uint8)
    n, k = codes.shape
    if k % 2:
        codes = np.concatenate([codes, np.zeros((n, 1), np.uint8)], axis=1)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)


def bytes_to_uint32(packed_u8):
    """uint8 [N, 4 * W] -> uint32 [N, W] with the same bytes (MLX layout)."""
    b = np.ascontiguousarray(packed_u8, dtype=np.uint8)
    assert b.shape[1] % 4 == 0, b.shape
    return b.view("<u4").astype(np.uint32)


def decode_e2m1(codes):
    """E2M1 codes (low 4 bits) -> float64 through ml_dtypes.float4_e2m1fn."""
    c = (np.asarray(codes).astype(np.uint8) & 0x0F).astype(np.uint8)
    return c.view(_F4).astype(np.float64)


def decode_e4m3(codes):
    """E4M3FN bytes -> float64 through ml_dtypes.float8_e4m3fn (0x7F and 0xFF are NaN)."""
    c = np.asarray(codes).astype(np.uint8)
    return c.view(_F8).astype(np.float64)


def multiplier(global_scale):
    """MLX's global_scale (the tensor amax) -> the decode multiplier the kernels apply:
    fp32(amax) / fp32(2688) rounded once to fp32, as mx.dequantize(..., mode="nvfp4") computes
    it. The functions below take the multiplier (kernel-level math); tests of the public ops
    convert with this (common.check_matmul does)."""
    g = np.asarray(to_numpy(global_scale), dtype=np.float32).reshape(())  # () or (1,)
    return np.float32(g / np.float32(E2M1_MAX * E4M3_MAX))


def decode_e8m0(codes):
    """E8M0 bytes -> float64 through ml_dtypes.float8_e8m0fnu (2^(code - 127); 0xFF is NaN)."""
    c = np.asarray(codes).astype(np.uint8)
    return c.view(_E8M0).astype(np.float64)


# mode -> (block size, scale decode), as mx.quantize's modes.
MODES = {"nvfp4": (BLOCK, decode_e4m3), "mxfp4": (MX_BLOCK, decode_e8m0)}


def decode_weights(packed, scales, k, global_scale=None, mode="nvfp4"):
    """Dequantized weights [N, k] in float64: e2m1 * scale (* global_scale, a multiplier)."""
    block, decode_scale = MODES[mode]
    codes = unpack_nibbles(packed)[:, :k]
    s = to_numpy(scales).astype(np.uint8)
    blocks = -(-k // block)
    assert s.shape[1] >= blocks, (s.shape, k)
    s_full = np.repeat(decode_scale(s[:, :blocks]), block, axis=1)[:, :k]
    with np.errstate(invalid="ignore"):
        w = decode_e2m1(codes) * s_full
        if global_scale is not None:
            w = w * float(to_numpy(global_scale))
    return w


# ----------------------------------------------------------------------------------------------
# Epilogue (float64, the literal formulas of the contract evaluated in IEEE arithmetic)

_erf = np.frompyfunc(math.erf, 1, 1)


def erf(v):
    return _erf(np.asarray(v, dtype=np.float64)).astype(np.float64)


def sigmoid(v):
    with np.errstate(over="ignore", invalid="ignore"):
        return 1.0 / (1.0 + np.exp(-v))


def activation(name, v):
    """The activation `name` applied to float64 v, written as the contract defines it."""
    v = np.asarray(v, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        if name == "relu":
            # max(v, 0) keeping NaN (as mx.maximum and the contract do).
            return np.where(np.isnan(v), v, np.where(v < 0, 0.0, v))
        if name == "silu":
            return v * sigmoid(v)
        if name == "gelu":
            return 0.5 * v * (1.0 + erf(v / math.sqrt(2.0)))
        if name == "gelu_approx":
            c = math.sqrt(2.0 / math.pi)
            return 0.5 * v * (1.0 + np.tanh(c * (v + 0.044715 * v**3)))
        if name == "sigmoid":
            return sigmoid(v)
        if name == "tanh":
            return np.tanh(v)
    raise ValueError(f"unknown activation {name!r}")


# Lipschitz constants (max |f'|) of the activations, used to propagate error bounds.
ACTIVATION_LIPSCHITZ = {
    "relu": 1.0,
    "silu": 1.1,
    "gelu": 1.13,
    "gelu_approx": 1.13,
    "sigmoid": 0.25,
    "tanh": 1.0,
}


def f32(c):
    """A Python constant as the core sees it: rounded to float32 (constants are fp32)."""
    return float(np.float32(c))


def _op_parts(op):
    if isinstance(op, str):
        return op, ()
    return op[0], tuple(op[1:])


def apply_epilogue(acc, epilogue, err=None, unit=2.0**-24):
    """Apply an epilogue chain to float64 `acc` [..., N].

    If `err` (an absolute error bound of acc, same shape) is given, also return an error bound of
    the result for an implementation that runs the chain in fp32 (unit roundoff `unit`): each
    op scales the incoming error by its Lipschitz constant and adds a few ulps of its own.
    """
    v = np.asarray(acc, dtype=np.float64)
    e = None if err is None else np.broadcast_to(np.asarray(err, dtype=np.float64), v.shape)
    for op in epilogue or []:
        name, args = _op_parts(op)
        with np.errstate(over="ignore", invalid="ignore"):
            if name in ("add", "mul"):
                t = f32(args[0]) if isinstance(args[0], (int, float)) else to_numpy(args[0])
                out = v + t if name == "add" else v * t
                if e is not None:
                    e = (e if name == "add" else e * np.abs(t)) + 2 * unit * np.abs(out)
            elif name == "scale":
                c = f32(args[0])
                out = v * c
                if e is not None:
                    e = e * abs(c) + 2 * unit * np.abs(out)
            elif name == "clamp":
                lo, hi = f32(args[0]), f32(args[1])
                out = np.where(np.isnan(v), v, np.where(v < lo, lo, np.where(v > hi, hi, v)))
                # e unchanged: clamp is 1-Lipschitz and exact.
            else:
                out = activation(name, v)
                if e is not None:
                    e = ACTIVATION_LIPSCHITZ[name] * e + 16 * unit * (np.abs(v) + np.abs(out))
        v = np.asarray(out, dtype=np.float64)
        if e is not None:
            e = np.broadcast_to(e, v.shape)
    return v if err is None else (v, e)


# ----------------------------------------------------------------------------------------------
# W4A16 matmul


def w4a16_matmul(x, packed, scales, k=None, global_scale=None, epilogue=None, mode="nvfp4"):
    """float64 epilogue(global_scale * (x @ W.T)); x [..., K]; returns [..., N]."""
    return w4a16_matmul_with_magnitude(x, packed, scales, k, global_scale, epilogue, mode)[0]


def w4a16_matmul_with_magnitude(x, packed, scales, k=None, global_scale=None, epilogue=None, mode="nvfp4"):
    """Like w4a16_matmul, and also mag = |gs| * sum_k |x_k w_k| (the scale of rounding errors)."""
    xf = to_numpy(x)
    k = xf.shape[-1] if k is None else k
    w = decode_weights(packed, scales, k, mode=mode)
    with np.errstate(invalid="ignore", over="ignore"):
        acc = xf @ w.T
        mag = np.abs(xf) @ np.abs(w).T
        if global_scale is not None:
            g = float(to_numpy(global_scale).astype(np.float32))  # the core takes gs in fp32
            acc = acc * g
            mag = mag * abs(g)
    return apply_epilogue(acc, epilogue), acc, mag


# ----------------------------------------------------------------------------------------------
# Quantization (round-to-nearest-even, E4M3 saturating at 448)


def e4m3_round(v):
    """float -> E4M3 bytes, RNE, saturating at 448 (ml_dtypes itself turns >= 464 into NaN)."""
    v = np.asarray(v, dtype=np.float64)
    v = np.clip(v, -E4M3_MAX, E4M3_MAX)
    return v.astype(_F8).view(np.uint8)


def e2m1_round(v):
    """float -> E2M1 codes, RNE, saturating at 6 (ml_dtypes casts are RNE and saturate)."""
    v = np.asarray(v, dtype=np.float64)
    return v.astype(_F4).view(np.uint8) & 0x0F


def _blocks(w, block):
    """w [N, K] zero-padded to whole blocks, as [N, blocks, block]."""
    n, k = w.shape
    blocks = -(-k // block)
    pad = blocks * block - k
    wp = np.concatenate([w, np.zeros((n, pad))], axis=1) if pad else w
    return wp.reshape(n, blocks, block)


def quantize(w, global_scale=None):
    """Reference NVFP4 quantizer of w [N, K] (values given exactly, e.g. fp32): mx.quantize's
    arithmetic on MLX's GPUs (the fp_quantize kernels of Metal and CUDA, MLX 0.32.4), in numpy fp32.

    enc = fp32(2688 / global_scale) (1 without; global_scale is the tensor amax, MLX's
    convention); scale = e4m3(fp32(amax_16 / 6) * enc), RNE, saturating at 448; values
    e2m1(fp32(w) * fp32(enc / scale)), RNE with the sign kept (-0), and w * 0 where the scale
    decodes to 0. The fp32 product, not the exact quotient, decides ties: w / scale at an E2M1
    midpoint can land an ulp either side. Returns (packed uint8 [N, ceil(K/2)], scales uint8
    [N, ceil(K/16)]).
    """
    w = to_numpy(w).astype(np.float32)
    n, k = w.shape
    wb = _blocks(w, BLOCK).astype(np.float32)
    blocks = wb.shape[1]
    enc = np.float32(1.0)
    if global_scale is not None:
        enc = np.float32(GLOBAL_SCALE_DENOMINATOR) / np.float32(global_scale)
    amax = np.max(np.abs(wb), axis=-1)
    s_bytes = e4m3_round((amax / np.float32(E2M1_MAX)).astype(np.float32) * enc)
    s = decode_e4m3(s_bytes).astype(np.float32)[..., None]
    block_enc = np.where(s > 0, enc / np.where(s > 0, s, np.float32(1.0)), np.float32(0.0)).astype(np.float32)
    q = (wb * block_enc).astype(np.float32)
    codes = e2m1_round(q).reshape(n, blocks * BLOCK)[:, :k]
    return pack_nibbles(codes), s_bytes.astype(np.uint8)


def _e8m0_ceil_exponent(q, zero_block):
    """The smallest e with 2^e >= q, clamped at -127; `zero_block` where q == 0."""
    mant, ex = np.frexp(q)  # q = mant * 2^ex, mant in [0.5, 1)
    e = np.where(mant == 0.5, ex - 1, ex)
    return np.where(q == 0, zero_block, np.maximum(e, -127))


def quantize_mxfp4(w):
    """Reference of mx.quantize(w, mode="mxfp4") on MLX's Metal GPUs (MLX 0.32.4 fp_quantize with
    mx_scale_round_up) for w [N, K] given exactly.

    Per block of 32: q = fp32(amax) / 6 in fp32; scale 2^e with e the smallest integer such that
    2^e >= q, clamped at -127 (also for q == 0); values w / 2^e rounded to nearest even E2M1 with the
    sign kept (-0). Returns (packed uint8 [N, ceil(K/2)], scales uint8 [N, ceil(K/32)]).
    """
    w = to_numpy(w)
    n, k = w.shape
    wb = _blocks(w, MX_BLOCK)
    q = (np.max(np.abs(wb), axis=-1).astype(np.float32) / np.float32(E2M1_MAX)).astype(np.float64)
    e = _e8m0_ceil_exponent(q, zero_block=-127)
    v = wb / np.exp2(e)[..., None]
    codes = e2m1_round(v).reshape(n, -1)[:, :k]
    return pack_nibbles(codes), (e + 127).astype(np.uint8)


def quantize_mxfp4_mlx_cpu(w, dtype):
    """mx.quantize(w, mode="mxfp4") on MLX 0.32.4's CPU: as quantize_mxfp4 but the quotient
    amax / 6 rounded to the weights' dtype (`dtype`: "float32", "float16" or "bfloat16"), e = 0 for
    an all-zero block, and values to the nearest E2M1 magnitude with ties to the smaller one (the
    first minimum of |v - table|), +0 for values that round to 0."""
    w = to_numpy(w)
    n, k = w.shape
    wb = _blocks(w, MX_BLOCK)
    amax = np.max(np.abs(wb), axis=-1)
    if dtype == "float16":
        q = (amax.astype(np.float16) / np.float16(E2M1_MAX)).astype(np.float64)
    else:
        q32 = amax.astype(np.float32) / np.float32(E2M1_MAX)
        q = (q32.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else q32).astype(np.float64)
    e = _e8m0_ceil_exponent(q, zero_block=0)
    v = wb / np.exp2(e)[..., None]
    idx = np.argmin(np.abs(np.abs(v)[..., None] - E2M1_GRID), axis=-1)  # first minimum on ties
    codes = np.where((v < 0) & (idx > 0), idx | 0x8, idx).astype(np.uint8).reshape(n, -1)[:, :k]
    return pack_nibbles(codes), (e + 127).astype(np.uint8)


E2M1_GRID = decode_e2m1(np.arange(8))  # 0, .5, 1, 1.5, 2, 3, 4, 6
E4M3_GRID = decode_e4m3(np.arange(0x7F))  # 0 .. 448, the finite non-negative values
