"""Shared test helpers: the one tolerance table, assert_close, random data, shape lists, ids.

Error model of W4A16 (x @ W.T with fp32 accumulation, then fp32 epilogue, then one cast):
  * every decoded weight e2m1 * e4m3 is exact (<= 6 significant bits), so the only errors are
    the fp32 products x_k * w_k (exact unless x is fp32), the fp32 sums, the global-scale
    multiply, the epilogue ops and the final rounding to the output dtype;
  * summation error is bounded by ~K * u32 * sum_k |x_k w_k| (any order), so the absolute
    tolerance scales with mag = |gs| * sum_k |x_k w_k| and with K, which keeps large K fair;
  * the output cast adds <= u_out * |y| (round to nearest).
"""

import dataclasses
import zlib

import mlx.core as mx
import numpy as np

import reference as ref

U32 = 2.0**-24  # fp32 unit roundoff
U16 = 2.0**-11  # fp16 unit roundoff
UBF16 = 2.0**-8  # bf16 unit roundoff (8 significant bits)

DTYPES = [mx.bfloat16, mx.float16, mx.float32]
DTYPE_NAMES = {mx.bfloat16: "bf16", mx.float16: "fp16", mx.float32: "fp32"}
UNIT = {mx.bfloat16: UBF16, mx.float16: U16, mx.float32: U32}
# A cast that lands below the smallest normal has an absolute error of up to half the subnormal
# spacing (the relative unit misses it; e.g. an fp16 output near 2.7e-5).
SUBNORMAL_HALF_SPACING = {mx.float16: 2.0**-25, mx.bfloat16: 2.0**-134, mx.float32: 2.0**-150}


@dataclasses.dataclass(frozen=True)
class Tol:
    product_u: float  # rounding of one product x_k * w_k in fp32
    acc_u: float  # per-addition rounding of the fp32 accumulator (times K)
    out_u: float  # rounding of the final cast, relative to |y|
    out_abs: float  # ... and its absolute floor: half the subnormal spacing of the out dtype
    reason: str


def _tol(x_dtype, out_dtype):
    exact = x_dtype != mx.float32
    prod = 0.0 if exact else U32
    why_prod = "x*w exact in fp32 (<= 8+6 or 11+6 bits)" if exact else "fp32 x*w rounds once (u32)"
    why_out = {
        mx.bfloat16: "bf16 output rounding 2^-8 relative",
        mx.float16: "fp16 output rounding 2^-11 relative",
        mx.float32: "fp32 output: only accumulation order, ~K*u32*sum|x||w|",
    }[out_dtype]
    return Tol(
        prod, U32, UNIT[out_dtype], SUBNORMAL_HALF_SPACING[out_dtype], f"{why_prod}; {why_out}"
    )


# THE tolerance table: (x dtype, out dtype) -> Tol. One line of reason per entry.
TOLERANCES = {(xd, od): _tol(xd, od) for xd in DTYPES for od in DTYPES}

# mx.gather_qmm / mx.quantized_matmul (nvfp4) on the CPU are held to this relative bound of
# mag = sum |x w| (+1 absolute): MLX accumulates in the activation dtype and rounds its dequantized
# weights to it, so it is not an accuracy oracle (docs: ~0.14 at |y| ~ 18); the bound catches
# wrong experts, rows or scales, which are off by O(mag).
MLX_GATHER_QMM_TOL = 2.0**-6

# Safety factor on every derived bound (bounds are first-order; keep a margin of 2).
SAFETY = 2.0


def error_bound(acc, mag, k, tol, epilogue=None, global_scale=None):
    """Per-element absolute error bound of the core's output against the float64 reference.

    acc: float64 accumulator (after global scale) from the reference; mag: |gs| sum|x w|.
    Returns (expected float64 output, bound).
    """
    acc_err = (k * tol.acc_u + tol.product_u + (U32 if global_scale is not None else 0)) * mag
    y, e = ref.apply_epilogue(acc, epilogue, err=acc_err, unit=U32)
    bound = SAFETY * (e + tol.out_u * np.abs(y) + tol.out_abs)
    return y, bound


def to_f64(a):
    return ref.to_numpy(a)


def assert_close(actual, expected, bound, what=""):
    """|actual - expected| <= bound elementwise; NaN must match NaN, +-Inf must match exactly."""
    a = to_f64(actual)
    e = np.asarray(expected, dtype=np.float64)
    assert a.shape == e.shape, f"{what} shape {a.shape} != expected {e.shape}"
    nan_a, nan_e = np.isnan(a), np.isnan(e)
    if not np.array_equal(nan_a, nan_e):
        idx = np.argwhere(nan_a != nan_e)[:5]
        raise AssertionError(
            f"{what} NaN mismatch at {idx.tolist()}: actual {a[tuple(idx.T)]} "
            f"expected {e[tuple(idx.T)]}"
        )
    inf_e = np.isinf(e)
    if not np.array_equal(a[inf_e], e[inf_e]) or np.isinf(a[~inf_e & ~nan_e]).any():
        raise AssertionError(f"{what} Inf mismatch")
    fin = ~nan_e & ~inf_e
    with np.errstate(invalid="ignore"):
        diff = np.abs(a - e)
    b = np.broadcast_to(np.asarray(bound, dtype=np.float64), e.shape)
    bad = fin & ~(diff <= b)
    if bad.any():
        idx = np.argwhere(bad)
        i = tuple(idx[0])
        raise AssertionError(
            f"{what} {bad.sum()} of {fin.sum()} elements out of tolerance; first at {i}: "
            f"actual {a[i]!r} expected {e[i]!r} |diff| {diff[i]:.3g} > bound {b[i]:.3g}; "
            f"max diff/bound {np.max(diff[fin] / b[fin]):.3g}"
        )


def check_matmul(out, x, w, scales, *, k=None, global_scale=None, epilogue=None, out_dtype=None, mode="nvfp4"):
    """Compare one w4a16_matmul output with the float64 reference within the table.
    ``global_scale`` as the op takes it (MLX's convention, the amax)."""
    x_dtype = x.dtype
    global_scale = None if global_scale is None else ref.multiplier(global_scale)
    out_dtype = out_dtype or x_dtype
    assert out.dtype == out_dtype, f"out dtype {out.dtype} != {out_dtype}"
    k = x.shape[-1] if k is None else k
    _, acc, mag = ref.w4a16_matmul_with_magnitude(x, w, scales, k, global_scale, mode=mode)
    y, bound = error_bound(acc, mag, k, TOLERANCES[(x_dtype, out_dtype)], epilogue, global_scale)
    assert_close(out, y, bound, what=f"w4a16_matmul x={x_dtype} out={out_dtype}")


# ----------------------------------------------------------------------------------------------
# Random data: random floats (not small integers, which make fp32 sums exact).


def rng(*key):
    """A NumPy Generator seeded from any hashable key (stable across runs)."""
    seed = zlib.crc32(repr(key).encode())  # hash() of str is salted per process
    return np.random.default_rng(seed)


def rand_x(shape, dtype, gen, scale=1.0):
    """Random normal activations, exactly representable in dtype (rounded through MLX)."""
    a = gen.standard_normal(shape).astype(np.float32) * np.float32(scale)
    return mx.array(a).astype(dtype)


# Scale bytes used by default: E4M3 normals from 2^-4 to 2^2 (all 8 mantissas), so that outputs
# have moderate magnitudes. Format tests cover all 256 codes separately.
DEFAULT_SCALE_CODES = np.arange(0x18, 0x48, dtype=np.uint8)
# MXFP4 (E8M0) scale bytes used by default: 2^-4 .. 2^3.
DEFAULT_E8M0_CODES = np.arange(123, 131, dtype=np.uint8)


def rand_weights(n, k, gen, layout="uint8", garbage_padding=False, scale_codes=None, mode="nvfp4"):
    """Random packed weights over all 16 E2M1 codes and random finite scale bytes.

    Returns (w as mx uint8 [N, ceil(K/2)] or uint32 [N, ceil(K/8)], scales mx uint8 [N, ceil(K/16)]
    (mode="mxfp4": E8M0 [N, ceil(K/32)]), packed uint8 numpy [N, ...] as passed). Padding nibbles
    beyond K are 0 unless garbage_padding.
    """
    codes = gen.integers(0, 16, size=(n, k), dtype=np.uint8)
    if layout == "uint32":
        row_bytes = 4 * (-(-k // 8))
    else:
        row_bytes = -(-k // 2)
    full = np.zeros((n, 2 * row_bytes), np.uint8)
    if garbage_padding:
        full[:] = gen.integers(1, 16, size=full.shape, dtype=np.uint8)
    full[:, :k] = codes
    packed = ref.pack_nibbles(full)
    block, default_codes = (ref.MX_BLOCK, DEFAULT_E8M0_CODES) if mode == "mxfp4" else (ref.BLOCK, DEFAULT_SCALE_CODES)
    sc = default_codes if scale_codes is None else scale_codes
    scales = gen.choice(sc, size=(n, -(-k // block))).astype(np.uint8)
    if layout == "uint32":
        w = mx.array(ref.bytes_to_uint32(packed))
    else:
        w = mx.array(packed)
    return w, mx.array(scales), packed


def rand_float_weights(n, k, gen, scale=1.0):
    """Random fp32 weights with varied block magnitudes (for quantize tests)."""
    blocks = -(-k // ref.BLOCK)
    mags = np.exp2(gen.uniform(-6, 4, size=(n, blocks)))
    mags = np.repeat(mags, ref.BLOCK, axis=1)[:, :k]
    return (gen.standard_normal((n, k)) * mags * scale).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# Shapes and ids

M_VALUES = [0, 1, 7, 64, 300]
K_VALUES = [1, 15, 17, 31, 33, 4096]
N_VALUES = [1, 96, 200]
K_LARGE = 4096


def mnk_cases():
    """(M, N, K) grid; K = 4096 only with small M and N to keep CI time low."""
    cases = []
    for m in M_VALUES:
        for n in N_VALUES:
            for k in K_VALUES:
                if k == K_LARGE and (m > 7 or n > 96):
                    continue
                cases.append((m, n, k))
    return cases


def dname(dtype):
    return DTYPE_NAMES.get(dtype, str(dtype))


def case_id(**kw):
    """Readable id: case_id(dtype=mx.bfloat16, M=1, N=96) -> 'dtype=bf16-M=1-N=96'."""
    parts = []
    for key, v in kw.items():
        if isinstance(v, mx.Dtype):
            v = dname(v)
        elif isinstance(v, (list, tuple)):
            v = "x".join(str(i) for i in v)
        parts.append(f"{key}={v}")
    return "-".join(parts)


def param(*values, **kw):
    """pytest.param with a readable id built from keyword names."""
    import pytest

    return pytest.param(*values, id=case_id(**kw))


def package_pythonpath(*extra):
    """PYTHONPATH for a child process that must import the same mlx_fp4 as this one (the installed
    package in CI, python/ in a development tree), plus `extra` folders."""
    import os

    import mlx_fp4

    parent = os.path.dirname(os.path.dirname(os.path.abspath(mlx_fp4.__file__)))
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join([parent, *map(str, extra), *rest])
