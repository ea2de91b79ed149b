"""mx_fp4.w4a16_matmul against the float64 reference: shapes (ragged M, N, K), batch dims,
every x dtype x out dtype pair, global scale, both weight layouts, strided x."""

import mlx.core as mx
import numpy as np
import pytest

import mlx_fp4 as mx_fp4
import reference as ref
from common import (
    DTYPES,
    TOLERANCES,
    U32,
    assert_close,
    case_id,
    check_matmul,
    error_bound,
    mnk_cases,
    param,
    rand_weights,
    rand_x,
    rng,
)

SHAPE_DTYPES = [mx.bfloat16, mx.float32]


def shape_params():
    return [
        param(dt, m, n, k, dtype=dt, M=m, N=n, K=k)
        for dt in SHAPE_DTYPES
        for (m, n, k) in mnk_cases()
    ]


@pytest.mark.parametrize("dtype,m,n,k", shape_params())
def test_shapes(device, dtype, m, n, k):
    g = rng("shapes", m, n, k)
    x = rand_x((m, k), dtype, g)
    w, scales, packed = rand_weights(n, k, g)
    out = mx_fp4.w4a16_matmul(x, w, scales)
    assert out.shape == (m, n) and out.dtype == dtype
    check_matmul(out, x, packed, scales)


@pytest.mark.parametrize(
    "x_dtype,out_dtype,m,n,k",
    [
        param(xd, od, m, n, k, x=xd, out=od, M=m, N=n, K=k)
        for xd in DTYPES
        for od in DTYPES
        for (m, n, k) in [(7, 96, 33), (64, 200, 128)]
    ],
)
def test_dtype_pairs(device, x_dtype, out_dtype, m, n, k):
    g = rng("dtypes", m, n, k)
    x = rand_x((m, k), x_dtype, g)
    w, scales, packed = rand_weights(n, k, g)
    out = mx_fp4.w4a16_matmul(x, w, scales, out_dtype=out_dtype)
    assert out.dtype == out_dtype
    check_matmul(out, x, packed, scales, out_dtype=out_dtype)


@pytest.mark.parametrize(
    "batch,k",
    [param(b, k, batch=b, K=k) for b in [(2, 3), (1, 5), (2, 1, 4), (2, 0)] for k in [17, 64]],
)
def test_batch_dims(device, batch, k):
    n = 40
    g = rng("batch", batch, k)
    x = rand_x((*batch, k), mx.float32, g)
    w, scales, packed = rand_weights(n, k, g)
    out = mx_fp4.w4a16_matmul(x, w, scales)
    assert out.shape == (*batch, n)
    check_matmul(out, x, packed, scales)


def test_vector_x(device):
    """x of rank 1 [K] gives [N]."""
    g = rng("vec")
    x = rand_x((33,), mx.float32, g)
    w, scales, packed = rand_weights(9, 33, g)
    out = mx_fp4.w4a16_matmul(x, w, scales)
    assert out.shape == (9,)
    check_matmul(out, x, packed, scales)


@pytest.mark.parametrize("kind", ["float", "array", "array1"])
@pytest.mark.parametrize(
    "dtype", [mx.bfloat16, mx.float16, mx.float32], ids=lambda d: case_id(dtype=d)
)
def test_global_scale(device, kind, dtype):
    g = rng("gs", kind)
    m, n, k = 7, 96, 48
    x = rand_x((m, k), dtype, g)
    w, scales, packed = rand_weights(n, k, g)
    gs_value = 0.0173  # not a power of two
    gs = {
        "float": gs_value,
        "array": mx.array(gs_value, dtype=mx.float32),
        "array1": mx.array([gs_value], dtype=mx.float32),
    }[kind]
    out = mx_fp4.w4a16_matmul(x, w, scales, global_scale=gs)
    check_matmul(out, x, packed, scales, global_scale=np.float32(gs_value))


def test_global_scale_applied_in_fp32_before_cast(device):
    """A huge accumulator times a tiny gs must not overflow fp16 (apply gs before the cast)."""
    k, n = 64, 8
    x = mx.full((2, k), 100.0, dtype=mx.float16)
    codes = np.full((n, k), 7, np.uint8)  # 6.0
    packed = ref.pack_nibbles(codes)
    scales = np.full((n, k // 16), 0x7E, np.uint8)  # 448: acc = 64 * 100 * 2688 ~ 1.7e7
    out = mx_fp4.w4a16_matmul(x, mx.array(packed), mx.array(scales), global_scale=1e-4)
    assert out.dtype == mx.float16
    check_matmul(out, x, packed, mx.array(scales), global_scale=np.float32(1e-4))
    assert np.isfinite(ref.to_numpy(out)).all()


def test_global_scale_array_is_an_input_not_a_constant(device):
    """Changing the array's value (same shapes) changes the result, also under compile."""
    g = rng("gs-input")
    x = rand_x((3, 32), mx.float32, g)
    w, scales, packed = rand_weights(5, 32, g)
    f = mx.compile(lambda a, s: mx_fp4.w4a16_matmul(a, w, scales, global_scale=s))
    for v in [0.5, 3.0]:
        out = f(x, mx.array(v, dtype=mx.float32))
        check_matmul(out, x, packed, scales, global_scale=np.float32(v))


@pytest.mark.parametrize("k", [8, 16, 33, 64, 100])
def test_uint32_layout(device, k):
    """MLX uint32 [N, ceil(K/8)] weights give the same output as the uint8 view."""
    g = rng("u32", k)
    m, n = 5, 24
    x = rand_x((m, k), mx.float32, g)
    w32, scales, packed = rand_weights(n, k, g, layout="uint32")
    assert w32.dtype == mx.uint32 and w32.shape == (n, -(-k // 8))
    out32 = mx_fp4.w4a16_matmul(x, w32, scales)
    check_matmul(out32, x, packed, scales)
    # The uint8 view of the words (4 * ceil(K/8) bytes per row) is accepted too and agrees.
    w8 = mx.array(ref.packed_bytes(w32))
    out8 = mx_fp4.w4a16_matmul(x, w8, scales)
    np.testing.assert_array_equal(np.array(out32), np.array(out8))


def test_weights_from_mx_quantize(device):
    """Consumes mx.quantize(mode="nvfp4") output directly; equals x @ mx.dequantize(...).T."""
    g = rng("mxq")
    m, n, k = 9, 64, 128
    wf = mx.array(g.standard_normal((n, k)).astype(np.float32))
    w32, scales = mx.quantize(wf, mode="nvfp4")
    x = rand_x((m, k), mx.bfloat16, g)
    out = mx_fp4.w4a16_matmul(x, w32, scales, out_dtype=mx.float32)
    check_matmul(out, x, w32, scales, out_dtype=mx.float32)
    deq = mx.dequantize(w32, scales, mode="nvfp4", dtype=mx.float32)
    expected = ref.to_numpy(x) @ ref.to_numpy(deq).T
    _, _, mag = ref.w4a16_matmul_with_magnitude(x, w32, scales)
    assert_close(out, expected, 2 * k * U32 * mag, "vs mx.dequantize")


@pytest.mark.parametrize("k", [1, 15, 17, 31, 33])
@pytest.mark.parametrize("layout", ["uint8", "uint32"])
def test_padding_nibbles_are_ignored(device, k, layout):
    """Garbage in the nibbles past K (and the byte/word tail) does not change the result."""
    g = rng("garbage", k, layout)
    x = rand_x((7, k), mx.float32, g)
    w, scales, packed = rand_weights(11, k, g, layout=layout, garbage_padding=True)
    out = mx_fp4.w4a16_matmul(x, w, scales)
    check_matmul(out, x, packed, scales)


@pytest.mark.parametrize(
    "how", ["transposed", "sliced_rows", "sliced_cols", "strided", "broadcast", "batch_transposed"]
)
def test_non_contiguous_x(device, how):
    g = rng("strided", how)
    k, n = 40, 24
    w, scales, packed = rand_weights(n, k, g)
    if how == "transposed":
        x = rand_x((k, 6), mx.float32, g).T
    elif how == "sliced_rows":
        x = rand_x((20, k), mx.float32, g)[3:17:2]
    elif how == "sliced_cols":
        x = rand_x((6, k + 9), mx.float32, g)[:, 5 : 5 + k]
    elif how == "strided":
        x = rand_x((6, 2 * k), mx.bfloat16, g)[:, ::2]
    elif how == "broadcast":
        x = mx.broadcast_to(rand_x((1, k), mx.float16, g), (5, k))
    else:
        x = mx.transpose(rand_x((3, k, 4), mx.float32, g), (0, 2, 1))
    out = mx_fp4.w4a16_matmul(x, w, scales)
    check_matmul(out, x, packed, scales)


def test_m_zero_gives_empty(device):
    g = rng("m0")
    w, scales, _ = rand_weights(16, 32, g)
    for shape in [(0, 32), (3, 0, 32)]:
        out = mx_fp4.w4a16_matmul(mx.zeros(shape, dtype=mx.bfloat16), w, scales, epilogue=["silu"])
        mx.eval(out)
        assert out.shape == shape[:-1] + (16,) and out.size == 0


def test_nan_scale_poisons_only_its_columns(device):
    """E4M3 0x7F decodes to NaN: output column n is NaN iff row n of w has a NaN scale."""
    g = rng("nanscale")
    m, n, k = 4, 6, 32
    x = rand_x((m, k), mx.float32, g)
    w, scales, packed = rand_weights(n, k, g)
    s = np.array(scales)
    s[1, 1] = 0x7F
    s[4, 0] = 0xFF
    out = ref.to_numpy(mx_fp4.w4a16_matmul(x, w, mx.array(s)))
    assert np.isnan(out[:, [1, 4]]).all()
    assert np.isfinite(out[:, [0, 2, 3, 5]]).all()
    check_matmul(mx.array(out), x, packed, s)


def test_nan_and_inf_in_x_propagate(device):
    g = rng("naninf")
    m, n, k = 3, 8, 32
    x = np.array(rand_x((m, k), mx.float32, g))
    x[0, 5] = np.nan
    x[1, 7] = np.inf
    codes = g.integers(1, 8, size=(n, k), dtype=np.uint8)  # no zero weights: inf*w is +-inf
    codes[::2, 7] |= 8  # some negative
    packed = ref.pack_nibbles(codes)
    scales = np.full((n, 2), 0x38, np.uint8)
    out = mx_fp4.w4a16_matmul(mx.array(x), mx.array(packed), mx.array(scales))
    o = ref.to_numpy(out)
    assert np.isnan(o[0]).all()
    np.testing.assert_array_equal(o[1], np.where(codes[:, 7] >= 8, -np.inf, np.inf))
    assert np.isfinite(o[2]).all()
    check_matmul(out, mx.array(x), packed, scales)


def test_exact_sums_are_exact(device):
    """Dyadic data whose sums are exact in fp32: the output must match to the last bit."""
    g = rng("exact")
    m, n, k = 7, 33, 80
    x = mx.array(g.integers(-8, 9, size=(m, k)).astype(np.float32) / 4)
    w, scales, packed = rand_weights(n, k, g, scale_codes=np.array([0x30, 0x38, 0x40], np.uint8))
    out = mx_fp4.w4a16_matmul(x, w, scales)
    np.testing.assert_array_equal(ref.to_numpy(out), ref.w4a16_matmul(x, packed, scales))


@pytest.mark.parametrize(
    "x_dtype,out_dtype,m,k",
    [
        param(xd, od, m, k, x=xd, out=od, M=m, K=k)
        for (xd, od) in [
            (mx.bfloat16, mx.bfloat16),
            (mx.float32, mx.float32),
            (mx.float16, mx.float32),
        ]
        for m in [1, 64]
        for k in [33, 256]
    ],
)
def test_matches_reference_ops(device, x_dtype, out_dtype, m, k):
    """The kernel and mx_fp4.w4a16_matmul_reference_ops (plain MLX ops) agree within 2x the table."""
    g = rng("refops", m, k)
    n = 72
    x = rand_x((m, k), x_dtype, g)
    w, scales, packed = rand_weights(n, k, g)
    b = rand_x((n,), mx.float32, g)
    epi = [("add", b), "gelu"]
    kw = dict(global_scale=0.37, epilogue=epi, out_dtype=out_dtype)
    out = mx_fp4.w4a16_matmul(x, w, scales, **kw)
    oracle = mx_fp4.w4a16_matmul_reference_ops(x, w, scales, **kw)
    assert oracle.dtype == out.dtype and oracle.shape == out.shape
    check_matmul(
        out, x, packed, scales, global_scale=np.float32(0.37), epilogue=epi, out_dtype=out_dtype
    )
    check_matmul(
        oracle, x, packed, scales, global_scale=np.float32(0.37), epilogue=epi, out_dtype=out_dtype
    )
    # Directly against each other: both within the bound of the reference, so within 2x of it.
    _, acc, mag = ref.w4a16_matmul_with_magnitude(x, packed, scales, global_scale=np.float32(0.37))
    y, bound = error_bound(acc, mag, k, TOLERANCES[(x_dtype, out_dtype)], epi, 0.37)
    assert_close(out, ref.to_numpy(oracle), 2 * bound, "kernel vs reference_ops")


def test_result_independent_of_other_rows(device):
    """Row m of the output depends only on row m of x (no cross-row leakage in tiling)."""
    g = rng("rows")
    k, n = 48, 70
    w, scales, _ = rand_weights(n, k, g)
    x = rand_x((300, k), mx.float32, g)
    full = np.array(mx_fp4.w4a16_matmul(x, w, scales))
    for rows in [slice(0, 1), slice(5, 12), slice(250, 300)]:
        part = np.array(mx_fp4.w4a16_matmul(x[rows], w, scales))
        np.testing.assert_allclose(part, full[rows], rtol=1e-5, atol=1e-5 * np.abs(full).max())


def test_stream_argument(device):
    g = rng("stream")
    x = rand_x((3, 32), mx.float32, g)
    w, scales, packed = rand_weights(5, 32, g)
    out = mx_fp4.w4a16_matmul(x, w, scales, stream=mx.cpu)
    check_matmul(out, x, packed, scales)


# Shapes that straddle the usual blocking boundaries (powers of two and a bit) of CPU/GPU
# kernels: M across the GEMV/GEMM switch and 512-row chunks, N across 64/448/512-row panels,
# K across 256-deep panels and not a multiple of 16. Epilogue operands of every kind check the
# (row, col) bookkeeping in every path.
TILE_CASES = [
    (9, 449, 257),
    (513, 50, 300),
    (64, 897, 520),
    (8, 65, 4100),
    (520, 7, 17),
    (2 * 300, 70, 48),
]


@pytest.mark.parametrize(
    "dtype,m,n,k",
    [
        param(dt, m, n, k, dtype=dt, M=m, N=n, K=k)
        for dt in SHAPE_DTYPES
        for (m, n, k) in TILE_CASES
    ],
)
def test_tile_boundaries_with_epilogue(device, dtype, m, n, k):
    g = rng("tiles", m, n, k)
    lead = (2, m // 2) if m == 600 else (m,)
    x = rand_x((*lead, k), dtype, g)
    w, scales, packed = rand_weights(n, k, g, layout="uint32", garbage_padding=True)
    epi = [
        ("add", rand_x((n,), mx.float32, g)),
        ("mul", rand_x((*lead, 1), mx.bfloat16, g)),
        "silu",
        ("add", rand_x((*lead, n), mx.float32, g)),
    ]
    out = mx_fp4.w4a16_matmul(x, w, scales, global_scale=0.5, epilogue=epi)
    assert out.shape == (*lead, n)
    check_matmul(out, x, packed, scales, global_scale=np.float32(0.5), epilogue=epi)


def test_alternating_paths_each_correct(device):
    """Products of different kernels in turn, twice, each against the reference. On CUDA (sm_90a)
    the split-K wgmma kernel (x permutation + cluster launch) alternates with a tensor-core kernel
    behind MLX's divide for the global scale or behind the copy of a strided x: graphs of the same
    node topology, so MLX's graph cache updates one into the other (it once kept the cluster shape)."""
    g = rng("alternate")
    cases = []
    for m, n, k, gs, strided in [
        (32, 1280, 4096, None, False),  # H200: wgmma (N x K over its small-weight bound), 32-row tiles, split K over 2
        (7, 96, 48, 0.37, False),  # tensor cores after the global scale's divide
        (64, 2560, 2048, None, False),  # wgmma, another grid, split K over 2
        (5, 40, 40, None, True),  # tensor cores after the strided copy of x
    ]:
        x = rand_x((m, 2 * k if strided else k), mx.bfloat16, g)
        x = x[:, ::2] if strided else x
        w, scales, packed = rand_weights(n, k, g)
        mx.eval(x, w, scales)
        cases.append((x, w, scales, packed, gs))
    for _ in range(2):
        for x, w, scales, packed, gs in cases:
            out = mx_fp4.w4a16_matmul(x, w, scales, global_scale=gs)
            check_matmul(out, x, packed, scales, global_scale=None if gs is None else np.float32(gs))


def test_products_sharing_x_each_correct(device):
    """Products reading one x (q/k/v, gate/up), each against the reference. On CUDA (sm_90a) the
    wgmma products after the first reuse its permuted x (csrc/cuda/wgmma_x_cache.h): in one graph
    and across evaluations, through a reshaped view of the same buffer, but not for a view of those
    bytes as another dtype, another x of the same shape, or another stream."""
    g = rng("share_x")
    m, k = 64, 4096  # H200: the wgmma kernel (N x K over its small-weight bound)
    x = rand_x((m, k), mx.bfloat16, g)
    other = rand_x((m, k), mx.bfloat16, g)
    weights = [rand_weights(n, k, g) for n in (1152, 1280, 1536)]
    mx.eval(x, other, *[a for w, s, _ in weights for a in (w, s)])

    def check(xx, i, stream=None):
        w, scales, packed = weights[i]
        out = mx_fp4.w4a16_matmul(xx, w, scales, stream=stream)
        return out, xx, packed, scales

    # One graph: three products of x, then x's bytes as fp16 (a view of the same buffer).
    x16 = x.view(mx.float16)
    batch = [check(x, 0), check(x, 1), check(x.reshape(2, m // 2, k), 2), check(x16, 0)]
    mx.eval(*[b[0] for b in batch])
    # Separate evaluations: x again, another x, x again, x on another stream.
    batch += [check(x, 1), check(other, 2), check(x, 0), check(x, 2, stream=mx.new_stream(mx.default_device()))]
    for out, xx, packed, scales in batch:
        mx.eval(out)
        check_matmul(out, xx, packed, scales)


@pytest.mark.parametrize("m", [1, 300])
def test_repeat_evaluation_is_bitwise_identical(device, m):
    """Multithreaded kernels: no races, a fixed reduction order (same bits every time)."""
    g = rng("determinism", m)
    x = rand_x((m, 1000), mx.float32, g)
    w, scales, _ = rand_weights(513, 1000, g)
    first = np.array(mx_fp4.w4a16_matmul(x, w, scales))
    for _ in range(3):
        np.testing.assert_array_equal(np.array(mx_fp4.w4a16_matmul(x, w, scales)), first)


@pytest.mark.parametrize("layout", ["uint8", "uint32"])
@pytest.mark.parametrize("how", ["row_step", "col_slice", "transposed"])
def test_non_contiguous_w_and_scales(device, layout, how):
    """Strided views of w and scales read the right bytes."""
    g = rng("strided-w", layout, how)
    n, k = 12, 48
    w, scales, packed = rand_weights(2 * n, k, g, layout=layout)
    x = rand_x((5, k), mx.float32, g)
    if how == "row_step":
        wv, sv, pv = w[1::2], scales[1::2], packed[1::2]
    elif how == "col_slice":
        # Weights and scales embedded in wider buffers, then sliced back out.
        wide_w = mx.concatenate([mx.zeros_like(w[:, :1]), w, mx.zeros_like(w[:, :2])], axis=1)
        wide_s = mx.concatenate([scales, mx.full(scales[:, :1].shape, 0x7F, mx.uint8)], axis=1)
        wv, sv, pv = wide_w[:, 1 : 1 + w.shape[1]], wide_s[:, : scales.shape[1]], packed
    else:  # column-major storage: the transpose of a contiguous [bytes, N] array
        wv = mx.array(np.ascontiguousarray(np.array(w).T)).T
        sv = mx.array(np.ascontiguousarray(np.array(scales).T)).T
        pv = packed
    out = mx_fp4.w4a16_matmul(x, wv, sv)
    check_matmul(out, x, pv, sv)
