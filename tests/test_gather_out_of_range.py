"""Lazy out-of-range indices of gather_w4a16_matmul beyond the forward (issue 38): gradients, vmap,
and reads of a slice of the output.

The forward gives NaN rows for a pair whose lhs or rhs index is out of range (>= the matrices of x
or the experts, negative, >= 2^32 for 64-bit dtypes). The vjp ran through mx.gather_mm, which read
such an index modulo the batch (a finite gradient from another expert) and, for a bad lhs,
scattered past x's gradient (a SIGSEGV). The rule now: NaN flows back from those rows. A bad rhs
makes NaN the rows of x's gradient that the pair reads (and the epilogue operands' gradients at its
rows); a bad lhs names no row of x, so all of x's gradient is NaN. Everything else is unchanged.
"""

import gc
import sys

import mlx.core as mx
import numpy as np
import pytest

import mlx_fp4 as mx_fp4

import reference as ref
from common import TOLERANCES, assert_close, error_bound, rand_weights, rand_x, rng

E, N, K, M = 3, 40, 32, 2
PAIRS = 3  # pair 2 gets the bad index; x has PAIRS matrices, so lhs and rhs share the bound E
BAD_PAIR = 2
INT_DTYPES = [mx.int8, mx.int16, mx.int32, mx.int64, mx.uint8, mx.uint16, mx.uint32, mx.uint64]
NP_OF = {mx.int8: np.int8, mx.int16: np.int16, mx.int32: np.int32, mx.int64: np.int64, mx.uint8: np.uint8,
         mx.uint16: np.uint16, mx.uint32: np.uint32, mx.uint64: np.uint64}


def bad_values(dtype):
    """Out-of-range values of an index dtype: the bound, the dtype's extremes, 2^32 + 1 if 64-bit."""
    info = np.iinfo(NP_OF[dtype])
    values = {E, int(info.max)}
    if info.min < 0:
        values |= {-1, int(info.min)}
    if info.bits == 64:
        values.add((1 << 32) + 1)
    return sorted(values)


BAD_CASES = [(d, v) for d in INT_DTYPES for v in bad_values(d)]
BAD_IDS = [f"{NP_OF[d].__name__}={v}" for d, v in BAD_CASES]
# Under mx.compile: one case per kind of bad value (the cast that wrapped, negative, past E).
COMPILED_CASES = [(mx.int64, (1 << 32) + 1), (mx.int32, -1), (mx.uint32, E)]
GRAD_CASES = [(d, v, False) for d, v in BAD_CASES] + [(d, v, True) for d, v in COMPILED_CASES]
GRAD_IDS = BAD_IDS + [f"compiled-{NP_OF[d].__name__}={v}" for d, v in COMPILED_CASES]


@pytest.fixture
def moe():
    g = rng("out-of-range-grad")
    parts = [rand_weights(N, K, g) for _ in range(E)]
    w, s = mx.stack([p[0] for p in parts]), mx.stack([p[1] for p in parts])
    x = rand_x((PAIRS, M, K), mx.float32, g)
    cot = rand_x((PAIRS, M, N), mx.float32, g)
    return dict(w=w, s=s, x=x, cot=cot, decoded=[ref.decode_weights(p[2], p[1], K) for p in parts])


def lazy_index(good, dtype, bad):
    """`good` with pair BAD_PAIR set to `bad`, as a lazy array of `dtype` (the op cannot read it)."""
    base = np.array(good, NP_OF[dtype])
    base[BAD_PAIR] = 0
    shift = np.zeros(PAIRS, NP_OF[dtype])
    shift[BAD_PAIR] = bad
    return mx.array(base) + mx.array(shift)


def indices(side, dtype, bad):
    good = np.arange(PAIRS)
    lazy = lazy_index(good, dtype, bad)
    other = mx.array(good.astype(np.uint32))
    return (lazy, other) if side == "lhs" else (other, lazy)


def reference_grad_x(moe, lhs, rhs, skip):
    """float64 d(sum(out * cot))/dx over the pairs not in `skip`, with its error bound."""
    acc = np.zeros((PAIRS, M, K))
    mag = np.zeros_like(acc)
    cot = np.array(moe["cot"], np.float64)
    for b in range(PAIRS):
        if b in skip:
            continue
        acc[lhs[b]] += cot[b] @ moe["decoded"][rhs[b]]
        mag[lhs[b]] += np.abs(cot[b]) @ np.abs(moe["decoded"][rhs[b]])
    # fp32 sums over N products per pair and over the pairs that share a row.
    return error_bound(acc, mag, N * PAIRS, TOLERANCES[(mx.float32, mx.float32)])


def grad_x(moe, lhs, rhs, compiled=False):
    def f(x):
        return mx_fp4.gather_w4a16_matmul(x, moe["w"], moe["s"], lhs_indices=lhs, rhs_indices=rhs)

    def vjp(x):
        out, (gx,) = mx.vjp(lambda v: [f(v)], [x], [moe["cot"]])
        return out[0], gx

    out, gx = (mx.compile(vjp) if compiled else vjp)(moe["x"])
    return np.array(out), np.array(gx)


@pytest.mark.parametrize("dtype,bad,compiled", GRAD_CASES, ids=GRAD_IDS)
def test_grad_bad_rhs_is_nan_in_the_row_it_reads(device, moe, dtype, bad, compiled):
    """Was finite (expert bad mod E's weights); now NaN in x row lhs[BAD_PAIR], the others exact."""
    lhs, rhs = indices("rhs", dtype, bad)
    out, gx = grad_x(moe, lhs, rhs, compiled)
    assert np.isnan(out[BAD_PAIR]).all() and np.isfinite(np.delete(out, BAD_PAIR, 0)).all()
    assert np.isnan(gx[BAD_PAIR]).all(), "the row of x the bad pair reads"
    want, bound = reference_grad_x(moe, np.arange(PAIRS), np.arange(PAIRS), skip={BAD_PAIR})
    keep = [b for b in range(PAIRS) if b != BAD_PAIR]
    assert_close(gx[keep], want[keep], bound[keep], what=f"grad x rows {keep} (rhs {bad})")


@pytest.mark.parametrize("dtype,bad,compiled", GRAD_CASES, ids=GRAD_IDS)
def test_grad_bad_lhs_is_nan_everywhere(device, moe, dtype, bad, compiled):
    """A bad lhs (-1 as int32) made mx.gather_mm's vjp scatter past x's gradient: a SIGSEGV on CPU.
    It reads no row of x, so all of x's gradient is NaN; the forward's other rows are unchanged."""
    lhs, rhs = indices("lhs", dtype, bad)
    out, gx = grad_x(moe, lhs, rhs, compiled)
    assert np.isnan(out[BAD_PAIR]).all() and np.isfinite(np.delete(out, BAD_PAIR, 0)).all()
    assert np.isnan(gx).all()


@pytest.mark.parametrize("side", ["lhs", "rhs"])
def test_grad_epilogue_operands_nan_at_bad_rows(device, moe, side):
    """An operand's gradient at the bad pair's rows is NaN (for "add" it was the finite cotangent),
    elsewhere exactly what it is without the bad pair; a [N] operand sums over every row: NaN."""
    lhs, rhs = indices(side, mx.int32, -1)
    g = rng("out-of-range-operands", side)
    bias = rand_x((PAIRS, M, N), mx.float32, g)
    col = rand_x((N,), mx.float32, g)

    def f(bias, col):
        return mx_fp4.gather_w4a16_matmul(moe["x"], moe["w"], moe["s"], lhs_indices=lhs, rhs_indices=rhs,
                                          epilogue=[("add", bias), ("mul", col)])

    _, (gb, gc_) = mx.vjp(lambda b, c: [f(b, c)], [bias, col], [moe["cot"]])
    gb, gc_ = np.array(gb), np.array(gc_)
    assert np.isnan(gb[BAD_PAIR]).all() and np.isnan(gc_).all()
    # d(sum(((y + bias) * col) * cot)) / d bias = cot * col, exact in fp32.
    want = np.array(moe["cot"]) * np.array(col)
    keep = [b for b in range(PAIRS) if b != BAD_PAIR]
    np.testing.assert_array_equal(gb[keep], want[keep])


def test_vmap_keeps_a_bad_lhs_out_of_range(device, moe):
    """vmap over x folded the map into lhs (lhs + v * matrices per map): a lazy lhs = 3 with 3
    matrices per map named map v + 1's matrix 0, a finite row of the wrong input. Now NaN, as the
    call per map gives."""
    lhs, rhs = indices("lhs", mx.uint32, PAIRS)
    xs = mx.stack([moe["x"], moe["x"] * 2])

    def f(x):  # lhs + 0: lazy at every call
        return mx_fp4.gather_w4a16_matmul(x, moe["w"], moe["s"], lhs_indices=lhs + 0, rhs_indices=rhs)

    mapped = np.array(mx.vmap(f)(xs))
    for v in range(xs.shape[0]):
        np.testing.assert_array_equal(mapped[v], np.array(f(xs[v])), err_msg=f"map {v}")
        assert np.isnan(mapped[v, BAD_PAIR]).all()


def test_reference_ops_lazy_bad_index_is_nan(device, moe):
    """The MLX-ops form (the oracle, the vjp's graph) gives the kernels' NaN rows, not index mod E."""
    for side in ("lhs", "rhs"):
        lhs, rhs = indices(side, mx.int64, (1 << 32) + 1)
        out = np.array(mx_fp4.gather_w4a16_matmul_reference_ops(moe["x"], moe["w"], moe["s"], lhs_indices=lhs,
                                                                rhs_indices=rhs))
        assert np.isnan(out[BAD_PAIR]).all() and np.isfinite(np.delete(out, BAD_PAIR, 0)).all(), side


# ---------------------------------------------------------------------------------------------
# Item 8: only a slice of an output with a lazy bad index evaluated. The output's buffer is made to
# be one that held a sentinel value (freed just before), so an unwritten element would show it.

SENTINEL = 12345.0
REUSE_TRIES = 8
SENTINEL_BUFFERS = 32


def _address(a):
    return np.asarray(memoryview(a)).ctypes.data


def _on_sentinel_buffer(make):
    """Fill SENTINEL_BUFFERS buffers of make()'s output size with sentinels and free them, then
    evaluate a slice of make()'s output. Returns (output, slice, whether the output took one of
    them). So many that every free block of the size is one of them (glibc keeps 7 per size in its
    thread cache, filled by earlier tests)."""
    sent = [mx.full((PAIRS, M, N), SENTINEL, mx.float32) for _ in range(SENTINEL_BUFFERS)]
    mx.eval(sent)
    addrs = {_address(a) for a in sent}
    del sent
    gc.collect()
    out = make()
    view = out[1:3]
    mx.eval(view)
    return out, view, _address(view) - M * N * 4 in addrs  # the view starts at row 1 of [PAIRS, M, N]


@pytest.mark.parametrize("target", ["gathered", "dense after"])
@pytest.mark.parametrize("side", ["lhs", "rhs"])
def test_slice_of_lazy_bad_index_output_is_written(moe, side, target):
    with mx.stream(mx.cpu):
        lhs, rhs = indices(side, mx.int32, E)
        w2, s2, _ = rand_weights(N, N, rng("slice-dense"))
        mx.eval(lhs, rhs, moe["x"], moe["w"], moe["s"], w2, s2)

        def make():
            y = mx_fp4.gather_w4a16_matmul(moe["x"], moe["w"], moe["s"], lhs_indices=lhs + 0, rhs_indices=rhs + 0)
            return y if target == "gathered" else mx_fp4.w4a16_matmul(y, w2, s2)

        reused = 0
        for _ in range(REUSE_TRIES):
            out, view, hit = _on_sentinel_buffer(make)
            reused += hit
            for what, a in (("slice", np.array(view)), ("whole", np.array(out))):
                assert not (a == SENTINEL).any(), f"{what}: an unwritten element (sentinel) in the output"
            assert np.isnan(np.array(out[BAD_PAIR])).all()
            assert np.isfinite(np.array(out[:BAD_PAIR])).all()
    cuda = getattr(mx, "cuda", None)
    if sys.platform.startswith("linux") and not (mx.metal.is_available() or (cuda and cuda.is_available())):
        # glibc reuses a freed block of the same size: the check above ran on the sentinel buffer.
        assert reused > 0, "no output took the sentinel buffer: the test checked nothing"


def test_dense_vjp_jvp_nan_scale_has_no_hole(device):
    """The dense op's analogue of a bad index, a NaN scale code (E4M3 0x7F): output column n is NaN,
    so is x's gradient over that block's columns (every row, through cot[:, n]) and the jvp's
    column n; its other columns match the float64 reference."""
    g = rng("dense-nan-scale")
    w, s, packed = rand_weights(N, K, g)
    codes = np.array(s)
    row, block = 3, 1
    codes[row, block] = 0x7F
    x = rand_x((M, K), mx.float32, g)
    cot = mx.ones((M, N))
    out, (gx,) = mx.vjp(lambda v: [mx_fp4.w4a16_matmul(v, w, mx.array(codes))], [x], [cot])
    _, (jv,) = mx.jvp(lambda v: mx_fp4.w4a16_matmul(v, w, mx.array(codes)), [x], [mx.ones_like(x)])
    nan_cols = np.zeros(K, bool)
    nan_cols[block * ref.BLOCK:(block + 1) * ref.BLOCK] = True
    np.testing.assert_array_equal(np.isnan(np.array(out[0])).any(0), np.arange(N) == row)
    np.testing.assert_array_equal(np.isnan(np.array(jv)).all(0), np.arange(N) == row)
    gx = np.array(gx)
    assert np.isnan(gx[:, nan_cols]).all() and np.isfinite(gx[:, ~nan_cols]).all()
    wd = ref.decode_weights(packed, np.array(s), K)
    want = np.ones((M, N)) @ wd
    mag = np.ones((M, N)) @ np.abs(wd)
    y, bound = error_bound(want, mag, N, TOLERANCES[(mx.float32, mx.float32)])
    assert_close(gx[:, ~nan_cols], y[:, ~nan_cols], bound[:, ~nan_cols], what="dense grad x")
