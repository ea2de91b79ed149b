"""mx_fp4.gather_w4a16_matmul against the float64 reference (gather_reference.py) and against
mx.gather_qmm(mode="nvfp4") on the same bytes: mlx-lm's call patterns (top-k decode, sorted
prefill), lhs + rhs indices, batch dims, repeats, both layouts, global scales, the chain."""

import os

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
    error_bound,
    param,
    rand_weights,
    rand_x,
    rng,
)


def experts(e, n, k, g, layout="uint8"):
    """Stacked random experts: (w [E, N, bytes], scales [E, N, blocks]) as mx arrays."""
    parts = [rand_weights(n, k, g, layout=layout) for _ in range(e)]
    return mx.stack([p[0] for p in parts]), mx.stack([p[1] for p in parts])


def check_gather(out, x, w, scales, lhs=None, rhs=None, global_scale=None, epilogue=None, out_dtype=None):
    out_dtype = out_dtype or x.dtype
    assert out.dtype == out_dtype
    acc, mag = gref.gather_matmul_with_magnitude(x, w, scales, lhs, rhs, global_scale)
    k = x.shape[-1]
    y, bound = error_bound(acc, mag, k, TOLERANCES[(x.dtype, out_dtype)], epilogue, global_scale)
    assert_close(out, y, bound, what=f"gather_w4a16_matmul x={x.dtype} out={out_dtype}")


def topk_indices(g, tokens, top_k, e, sort=False):
    """Distinct experts per token (as a router gives), or the flat sorted list of mlx-lm's prefill."""
    idx = np.stack([g.choice(e, size=top_k, replace=False) for _ in range(tokens)]).astype(np.int32)
    return np.sort(idx.reshape(-1)) if sort else idx


@pytest.mark.parametrize(
    "dtype,layout,tokens,top_k,e,n,k",
    [
        param(dt, lay, t, tk, e, n, k, dtype=dt, layout=lay, T=t, top=tk, E=e, N=n, K=k)
        for dt, lay in [(mx.bfloat16, "uint32"), (mx.float32, "uint8"), (mx.float16, "uint8")]
        for (t, tk, e, n, k) in [(1, 2, 4, 40, 64), (5, 3, 6, 33, 17), (16, 4, 8, 64, 96), (3, 2, 3, 7, 1)]
    ],
)
def test_decode_topk(device, dtype, layout, tokens, top_k, e, n, k):
    """SwitchGLU at decode: x [T, 1, 1, K], rhs [T, top_k] unsorted, lhs the default."""
    g = rng("decode", tokens, top_k, e, n, k, layout)
    w, s = experts(e, n, k, g, layout)
    x = rand_x((tokens, 1, 1, k), dtype, g)
    idx = mx.array(topk_indices(g, tokens, top_k, e))
    out = mx_fp4.gather_w4a16_matmul(x, w, s, rhs_indices=idx)
    assert out.shape == (tokens, top_k, 1, n)
    check_gather(out, x, w, s, rhs=idx)


@pytest.mark.parametrize("m", [1, 3])
def test_sorted_prefill_large_groups(device, m):
    """mlx-lm's sorted path: x [P, M, K], rhs sorted [P]; groups past the GEMV crossover."""
    g = rng("prefill", m)
    e, n, k, pairs = 3, 48, 80, 70
    w, s = experts(e, n, k, g)
    x = rand_x((pairs, m, k), mx.bfloat16, g)
    rhs = mx.array(np.sort(g.integers(0, e, size=pairs)).astype(np.uint32))
    out = mx_fp4.gather_w4a16_matmul(x, w, s, rhs_indices=rhs, sorted_indices=True)
    assert out.shape == (pairs, m, n)
    check_gather(out, x, w, s, rhs=rhs)


def test_lhs_and_rhs_with_batch_dims_and_repeats(device):
    """Both index arrays, broadcast against each other, into 2-D batch dims of x and w."""
    g = rng("lhs-rhs")
    k, n, m = 40, 24, 2
    w, s = experts(6, n, k, g)
    w, s = w.reshape(2, 3, *w.shape[1:]), s.reshape(2, 3, *s.shape[1:])
    x = rand_x((2, 2, m, k), mx.float32, g)
    lhs = mx.array(g.integers(0, 4, size=(4, 1)).astype(np.int64))
    rhs = mx.array(np.array([[5, 5, 0, 2, 5]], np.uint8))
    out = mx_fp4.gather_w4a16_matmul(x, w, s, lhs_indices=lhs, rhs_indices=rhs)
    assert out.shape == (4, 5, m, n)
    check_gather(out, x, w, s, lhs=lhs, rhs=rhs)


def test_no_indices_broadcasts_batch_dims(device):
    g = rng("no-idx")
    w, s = experts(3, 16, 32, g)
    x = rand_x((2, 1, 4, 32), mx.float32, g)
    out = mx_fp4.gather_w4a16_matmul(x, w, s)
    assert out.shape == (2, 3, 4, 16)
    check_gather(out, x, w, s)


@pytest.mark.parametrize("per_expert", [False, True])
def test_global_scale_and_chain(device, per_expert):
    """MLX's global scale convention (amax; multiplier gs / 2688), then a chain with a per-pair
    operand (the expert bias of QuantizedSwitchLinear), an activation and a full gate."""
    g = rng("gs-chain", per_expert)
    e, n, k, t, top = 5, 32, 48, 4, 2
    w, s = experts(e, n, k, g)
    x = rand_x((t, 1, 1, k), mx.bfloat16, g)
    idx = mx.array(topk_indices(g, t, top, e))
    gs = mx.array(g.uniform(1, 600, size=e if per_expert else ()).astype(np.float32))
    bias = rand_x((e, n), mx.float32, g)[idx][..., None, :]
    gate = rand_x((t, top, 1, n), mx.float16, g)
    chain = [("add", bias), "silu", ("mul", gate), ("clamp", -3.0, 3.0)]
    out = mx_fp4.gather_w4a16_matmul(x, w, s, rhs_indices=idx, global_scale=gs, epilogue=chain,
                                     out_dtype=mx.float32)
    check_gather(out, x, w, s, rhs=idx, global_scale=gs, epilogue=chain, out_dtype=mx.float32)
    if not per_expert:
        out_f = mx_fp4.gather_w4a16_matmul(x, w, s, rhs_indices=idx, global_scale=float(gs.item()))
        check_gather(out_f, x, w, s, rhs=idx, global_scale=gs)


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
@pytest.mark.parametrize("k,m", [(256, 1), (384, 1), (512, 2)])
def test_decode_dense_kernel_shapes(device, dtype, k, m):
    """Decode shapes the CUDA backend runs as a batch of dense tensor-core products (K a multiple
    of the 128-wide step; 256-wide stages and single steps), with per-expert global scales, a
    per-row bias and a full gate: every pointer the batch moves is checked."""
    g = rng("decode-dense", k, m, str(dtype))
    e, n, t, top = 6, 48, 3, 4
    w, s = experts(e, n, k, g)
    x = rand_x((t, 1, m, k), dtype, g)
    idx = mx.array(topk_indices(g, t, top, e))
    gs = mx.array(g.uniform(1, 600, size=e).astype(np.float32))
    bias = rand_x((e, n), mx.float32, g)[idx][..., None, :]
    gate = rand_x((t, top, m, n), dtype, g)
    chain = [("add", bias), "silu", ("mul", gate)]
    out = mx_fp4.gather_w4a16_matmul(x, w, s, rhs_indices=idx, global_scale=gs, epilogue=chain)
    assert out.shape == (t, top, m, n)
    check_gather(out, x, w, s, rhs=idx, global_scale=gs, epilogue=chain)


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
@pytest.mark.parametrize("k,lhs_form", [(256, "none"), (384, "order")])
def test_decode_runs_of_one_expert(device, dtype, k, lhs_form):
    """mlx-lm's sorted decode (64 pairs and more): consecutive pairs of one expert, which the CUDA
    backend runs as one product per run of up to 8 rows. Runs longer than 8 and crossing the
    8-aligned windows, a run of one, x rows in the pairs' order or through lhs, per-expert global
    scales and a chain with per-row operands (every row the runs move is checked)."""
    g = rng("decode-runs", k, lhs_form, str(dtype))
    e, n, tokens = 4, 40, 9
    w, s = experts(e, n, k, g)
    rhs_np = np.sort(np.concatenate([np.full(19, 1), np.full(3, 2), [0], g.integers(0, e, size=41)]))
    pairs = rhs_np.size
    rhs = mx.array(rhs_np.astype(np.uint32))
    if lhs_form == "none":
        x = rand_x((pairs, 1, k), dtype, g)
        lhs = None
    else:
        x = rand_x((tokens, 1, k), dtype, g)
        lhs = mx.array(g.integers(0, tokens, size=pairs).astype(np.uint32))
    gs = mx.array(g.uniform(1, 600, size=e).astype(np.float32))
    bias = rand_x((e, n), mx.float32, g)[rhs][:, None, :]
    gate = rand_x((pairs, 1, n), dtype, g)
    chain = [("add", bias), "silu", ("mul", gate)]
    out = mx_fp4.gather_w4a16_matmul(x, w, s, lhs_indices=lhs, rhs_indices=rhs, global_scale=gs, epilogue=chain,
                                     sorted_indices=True)
    assert out.shape == (pairs, 1, n)
    check_gather(out, x, w, s, lhs=lhs, rhs=rhs, global_scale=gs, epilogue=chain)


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
@pytest.mark.parametrize("k,n", [(2048, 37), (2080, 16), (4096, 5)])
def test_decode_gemv_shapes(device, dtype, k, n):
    """Decode shapes of the CUDA backend's decode GEMV (one row of x per pair, K >= 2048,
    K % 32 == 0; it runs 2080 by default, 2048 and 4096 where the batched tensor-core kernel is
    turned off, MLX_FP4_CUDA_GATHER_PAIRS=decode): rows past N in the last warp, a last group of
    chunks that only some lanes reach (2080 = 65 chunks), per-expert global scales, a per-row bias
    and a full gate; on CUDA also a lazy out-of-range expert (a NaN row, nothing read)."""
    g = rng("decode-gemv", k, n, str(dtype))
    e, t, top = 5, 2, 3
    w, s = experts(e, n, k, g)
    x = rand_x((t, 1, 1, k), dtype, g)
    idx_np = topk_indices(g, t, top, e)
    idx = mx.array(idx_np)
    gs = mx.array(g.uniform(1, 600, size=e).astype(np.float32))
    bias = rand_x((e, n), mx.float32, g)[idx][..., None, :]
    gate = rand_x((t, top, 1, n), dtype, g)
    chain = [("add", bias), "silu", ("mul", gate)]
    out = mx_fp4.gather_w4a16_matmul(x, w, s, rhs_indices=idx, global_scale=gs, epilogue=chain)
    assert out.shape == (t, top, 1, n)
    check_gather(out, x, w, s, rhs=idx, global_scale=gs, epilogue=chain)
    if device == "gpu" and mx.cuda.is_available():  # the CUDA kernels' contract for lazy bad indices
        bad = idx_np.copy()
        bad[1, 2] = e  # out of range: its row is NaN, the others are unchanged
        lazy_bad = mx.array(bad) + 0  # lazy: the host check cannot read it, the kernel must not read past E
        out_bad = mx_fp4.gather_w4a16_matmul(x, w, s, rhs_indices=lazy_bad)
        assert np.isnan(np.array(out_bad[1, 2].astype(mx.float32))).all()
        check_gather(out_bad[:1], x[:1], w, s, rhs=idx[:1])


# The first read of an output whose lazy index is out of range, before any other read of it.
FIRST_READS = {
    "eval-view": lambda out: mx.eval(out[1, 2]),
    "numpy-view": lambda out: np.array(out[1, 2]),  # NumPy drops the buffer error and reads again
    "eval-whole": lambda out: mx.eval(out),
}


@pytest.mark.parametrize("first_read", sorted(FIRST_READS))
@pytest.mark.parametrize("m,bad_arg", [(1, "rhs"), (1, "lhs"), (16, "rhs")])
def test_lazy_bad_index_every_read_is_defined(device, first_read, m, bad_arg):
    """A lazy out-of-range index (rhs: an expert; lhs: a matrix of x) is seen only by the kernel,
    after MLX has marked the output and all its views evaluated; an error raised there would
    reach the caller at most once, maybe at another call, and leave the buffer unwritten. So on
    every backend every read of every view sees the same defined values: a NaN row for the bad
    pair, the product elsewhere (m = 1: the GEMV groups, m = 16: the GEMM groups)."""
    g = rng("lazy-bad", m, bad_arg)
    e, n, k, t, top = 5, 37, 2048, 2, 3
    w, s = experts(e, n, k, g)
    x = rand_x((t, 1, m, k), mx.bfloat16, g)
    rhs = topk_indices(g, t, top, e)
    lhs = np.repeat(np.arange(t, dtype=np.int32)[:, None], top, axis=1)
    bad, limit = (rhs, e) if bad_arg == "rhs" else (lhs, t)
    bad[1, 2] = limit  # out of range; "+ 0" below keeps it lazy, so the call cannot check it
    out = mx_fp4.gather_w4a16_matmul(x, w, s, lhs_indices=mx.array(lhs) + 0, rhs_indices=mx.array(rhs) + 0,
                                     out_dtype=mx.float32)
    FIRST_READS[first_read](out)  # no backend raises (nor later, on an unrelated call)
    for _ in range(2):  # any view, any number of times: the same values
        assert np.isnan(np.array(out[1, 2])).all()
        check_gather(out[:1], x, w, s, lhs=mx.array(lhs[:1]), rhs=mx.array(rhs[:1]), out_dtype=mx.float32)
        check_gather(out[1:, :2], x, w, s, lhs=mx.array(lhs[1:, :2]), rhs=mx.array(rhs[1:, :2]), out_dtype=mx.float32)
    good = mx_fp4.gather_w4a16_matmul(x, w, s, rhs_indices=mx.array(rhs[:1]) + 0)  # the stream still works
    check_gather(good, x, w, s, rhs=mx.array(rhs[:1]))


def grouped_case(g, e, n, k, m, pairs, dtype, sort):
    """A prefill-sized gathered product: experts, 4 x matrices of m rows, lhs into them, experts
    per pair (numpy, sorted when `sort`), per-expert global scale, a bias per pair and a full gate."""
    w, s = experts(e, n, k, g)
    x = rand_x((4, m, k), dtype, g)
    lhs = mx.array(g.integers(0, 4, size=pairs).astype(np.uint32))
    r = g.integers(0, e, size=pairs)
    gs = mx.array(g.uniform(1, 600, size=e).astype(np.float32))
    bias = rand_x((pairs, 1, n), mx.float32, g)
    gate = rand_x((pairs, m, n), dtype, g)
    return w, s, x, lhs, np.sort(r) if sort else r, gs, bias, gate


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
@pytest.mark.parametrize("m,sort,k", [(1, True, 256), (2, False, 768), (1, False, 512)])
def test_grouped_prefill_wgmma_tiles(device, dtype, m, sort, k):
    """At least 32 rows per expert on average and K % 256 == 0 (prefill): on an H200 the plan's
    tiles of 64 rows run on the wgmma kernel over x gathered into the sorted order. N = 200: the
    second weight tile's copies run into the next expert's rows (computed, never stored); groups
    end inside tiles; per-expert global scale, a per-pair bias and a full gate in the chain; lhs
    into several x matrices; a lazy out-of-range expert gives a NaN row and no read."""
    e, n, pairs = 3, 200, 240
    w, s, x, lhs, r, gs, bias, gate = grouped_case(rng("grouped-wgmma", m, sort, k, dtype), e, n, k, m, pairs, dtype,
                                                   sort)
    chain = [("add", bias), "silu", ("mul", gate)]
    bad = r.copy()
    bad[-1] = e  # lazy ("+ 0"): only the kernels see it
    out = mx_fp4.gather_w4a16_matmul(x, w, s, lhs_indices=lhs, rhs_indices=mx.array(bad.astype(np.uint32)) + 0,
                                     global_scale=gs, epilogue=chain, sorted_indices=sort)
    assert out.shape == (pairs, m, n)
    assert np.isnan(np.array(out[-1].astype(mx.float32))).all()
    check_gather(out[:-1], x, w, s, lhs=lhs[:-1], rhs=mx.array(r[:-1].astype(np.uint32)), global_scale=gs,
                 epilogue=[("add", bias[:-1]), "silu", ("mul", gate[:-1])])


@pytest.mark.parametrize("sort", [False, True])
def test_same_bytes_as_mx_gather_qmm(device, sort):
    """MLX's own quantizer output, on MLX's call patterns; MLX's kernels round differently (see
    MLX_GATHER_QMM_TOL), so both are also held to the float64 reference."""
    g = rng("mlx", sort)
    e, n, k, t, top = 8, 64, 128, 6, 3
    wf = mx.array(g.standard_normal((e, n, k)).astype(np.float32))
    wq, sq = mx.quantize(wf, mode="nvfp4")[:2]
    x = rand_x((t, 1, 1, k), mx.float32, g)
    idx = topk_indices(g, t, top, e)
    if sort:  # as mlx-lm's _gather_sort: one row per (token, expert), ordered by expert
        order = np.argsort(idx.reshape(-1), kind="stable")
        x = x.reshape(t, 1, k)[mx.array(order // top)]
        idx = idx.reshape(-1)[order]
    idx = mx.array(idx)
    ours = mx_fp4.gather_w4a16_matmul(x, wq, sq, rhs_indices=idx, sorted_indices=sort)
    theirs = mx.gather_qmm(x, wq, sq, rhs_indices=idx, transpose=True, mode="nvfp4", sorted_indices=sort)
    assert ours.shape == theirs.shape
    acc, mag = gref.gather_matmul_with_magnitude(x, wq, sq, rhs=idx)
    check_gather(ours, x, wq, sq, rhs=idx)
    assert_close(ours, ref.to_numpy(theirs), MLX_GATHER_QMM_TOL * (mag + 1.0), what="vs mx.gather_qmm")


@pytest.mark.parametrize("case", ["lhs+rhs", "batch-dims", "no-indices"])
def test_index_forms_same_as_mx_gather_qmm(device, case):
    """lhs and rhs indices together (repeats included), 2-D batch dims of x and w, and no indices,
    on MLX's own bytes: the same output shape as mx.gather_qmm and values within MLX's accuracy."""
    g = rng("mlx-forms", case)
    wf = mx.array(g.standard_normal((6, 32, 64)).astype(np.float32))
    wq, sq = mx.quantize(wf, mode="nvfp4")[:2]
    kw = {}
    if case == "lhs+rhs":
        x = rand_x((4, 2, 64), mx.float32, g)
        kw = dict(lhs_indices=mx.array([[0], [3], [3]]), rhs_indices=mx.array([[5, 0, 5, 2]]))
    elif case == "batch-dims":
        wq, sq = wq.reshape(2, 3, 32, -1), sq.reshape(2, 3, 32, -1)
        x = rand_x((2, 3, 1, 64), mx.float32, g)
        kw = dict(rhs_indices=mx.array([[4, 1, 1], [0, 5, 2]]))
    else:
        x = rand_x((6, 3, 64), mx.float32, g)
    ours = mx_fp4.gather_w4a16_matmul(x, wq, sq, **kw)
    theirs = mx.gather_qmm(x, wq, sq, transpose=True, mode="nvfp4", **kw)
    assert ours.shape == theirs.shape
    check_gather(ours, x, wq, sq, lhs=kw.get("lhs_indices"), rhs=kw.get("rhs_indices"))
    _, mag = gref.gather_matmul_with_magnitude(x, wq, sq, kw.get("lhs_indices"), kw.get("rhs_indices"))
    assert_close(ours, ref.to_numpy(theirs), MLX_GATHER_QMM_TOL * (mag + 1.0), what=f"{case} vs mx.gather_qmm")


def test_reference_ops_match(device):
    g = rng("refops")
    w, s = experts(4, 24, 40, g)
    x = rand_x((3, 1, 1, 40), mx.float32, g)
    idx = mx.array(topk_indices(g, 3, 2, 4))
    gs = mx.array([10.0, 20.0, 30.0, 40.0])
    a = mx_fp4.gather_w4a16_matmul(x, w, s, rhs_indices=idx, global_scale=gs, epilogue=["gelu"])
    b = mx_fp4.gather_w4a16_matmul_reference_ops(x, w, s, rhs_indices=idx, global_scale=gs, epilogue=["gelu"])
    check_gather(a, x, w, s, rhs=idx, global_scale=gs, epilogue=["gelu"])
    check_gather(b, x, w, s, rhs=idx, global_scale=gs, epilogue=["gelu"])


def test_one_dimensional_x_without_indices(device):
    g = rng("1d")
    w, s, packed = rand_weights(12, 33, g)
    x = rand_x((33,), mx.float32, g)
    out = mx_fp4.gather_w4a16_matmul(x, w, s, epilogue=[("add", mx.ones((12,)))])
    assert out.shape == (12,)
    check_gather(out[None], x[None], w, s, epilogue=[("add", np.ones(12))])


def test_empty_shapes(device):
    g = rng("empty")
    w, s = experts(2, 8, 16, g)
    x = rand_x((3, 0, 16), mx.float32, g)
    assert mx_fp4.gather_w4a16_matmul(x, w, s, rhs_indices=mx.array([1, 0, 1])).shape == (3, 0, 8)
    x = rand_x((1, 1, 16), mx.float32, g)
    out = mx_fp4.gather_w4a16_matmul(x, w, s, rhs_indices=mx.zeros((0,), mx.int32))
    assert out.shape == (0, 1, 8)
    mx.eval(out)


def test_quantize_stacked_equals_per_expert(device):
    g = rng("stacked-q")
    wf = mx.array(g.standard_normal((3, 2, 16, 40)).astype(np.float32))
    packed, scales, gs = mx_fp4.quantize(wf, global_scale=True)
    assert packed.shape == (3, 2, 16, 20) and scales.shape == (3, 2, 16, 3) and gs.shape == (3, 2)
    for i, j in [(0, 0), (2, 1)]:
        p1, s1, g1 = mx_fp4.quantize(wf[i, j], global_scale=True)
        assert mx.array_equal(p1, packed[i, j]) and mx.array_equal(s1, scales[i, j])
        assert gs[i, j].item() == g1.item()
        d = mx_fp4.dequantize(packed, scales, k=40, global_scale=gs, dtype=mx.float32)[i, j]
        assert mx.array_equal(d, mx_fp4.dequantize(p1, s1, k=40, global_scale=g1, dtype=mx.float32))
    p0, s0 = mx_fp4.quantize(wf)
    p1, s1 = mx_fp4.quantize(wf[1, 0])
    assert mx.array_equal(p0[1, 0], p1) and mx.array_equal(s0[1, 0], s1)


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
@pytest.mark.parametrize("m,sort,k", [(1, True, 256), (3, False, 384), (1, False, 512)])
def test_grouped_prefill_tiles(device, dtype, m, sort, k):
    """Past the pair GEMV's rows (prefill), K % 128 == 0: on CUDA the plan's tiles run on the
    dense staged kernel through row maps (tiles of 32 rows, partial last tiles, two weight-row
    tiles over N = 72); per-expert global scale, a per-pair bias and a full gate in the chain
    (operands indexed by the mapped output row), lhs indices into several x matrices."""
    e, n, pairs = 5, 72, 90
    w, s, x, lhs, r, gs, bias, gate = grouped_case(rng("grouped-prefill", m, sort, k, dtype), e, n, k, m, pairs,
                                                   dtype, sort)
    rhs = mx.array(r.astype(np.uint32))
    chain = [("add", bias), "silu", ("mul", gate)]
    out = mx_fp4.gather_w4a16_matmul(x, w, s, lhs_indices=lhs, rhs_indices=rhs, global_scale=gs, epilogue=chain,
                                     sorted_indices=sort)
    assert out.shape == (pairs, m, n)
    check_gather(out, x, w, s, lhs=lhs, rhs=rhs, global_scale=gs, epilogue=chain)


@pytest.mark.skipif(os.environ.get("MLX_FP4_GATHER_DEFAULT_INDICES") == "nodes",
                    reason="MLX_FP4_GATHER_DEFAULT_INDICES=nodes asks for the nodes (an A/B switch)")
def test_default_indices_add_no_nodes(device):
    """An absent lhs_indices (mlx-lm's SwitchGLU) or absent indices are constants, not Arange /
    Reshape / Broadcast nodes (each node costs host time at every decode step); the products read
    the same matrices as the explicit indices, and repeated calls reuse the cached constant."""
    from mlx_fp4.bench.decode_host import graph_nodes

    g = rng("default-indices")
    e, n, k, tokens, top_k = 4, 24, 64, 3, 2
    w, s = experts(e, n, k, g)
    x = rand_x((tokens, 1, 1, k), mx.bfloat16, g)  # SwitchGLU's expanded x at decode
    idx = mx.array(topk_indices(g, tokens, top_k, e).astype(np.uint32))
    mx.eval(x, w, s, idx)
    out = mx_fp4.gather_w4a16_matmul(x, w, s, rhs_indices=idx)
    assert graph_nodes(out)["by_primitive"] == {"GatherW4A16Matmul": 1}
    lhs = mx.broadcast_to(mx.arange(tokens, dtype=mx.uint32).reshape(tokens, 1), (tokens, top_k))
    explicit = mx_fp4.gather_w4a16_matmul(x, w, s, lhs_indices=lhs, rhs_indices=idx)
    assert mx.array_equal(out, explicit).item()
    check_gather(out, x, w, s, rhs=np.array(idx))
    again = mx_fp4.gather_w4a16_matmul(x * 2, w, s, rhs_indices=idx)  # a cached constant: still right
    check_gather(again, x * 2, w, s, rhs=np.array(idx))
    xb = rand_x((2, 1, 5, k), mx.bfloat16, g)  # no indices: x's and w's batch dims broadcast
    plain = mx_fp4.gather_w4a16_matmul(xb, w.reshape(2, 2, n, -1), s.reshape(2, 2, n, -1))
    assert plain.shape == (2, 2, 5, n)
    assert "Arange" not in graph_nodes(plain)["by_primitive"]
