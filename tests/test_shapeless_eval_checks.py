"""Shapes re-checked when the graph runs (issue 38): mx.compile(shapeless=True) hands the node
inputs of other shapes than the op validated. A larger K once gave garbage (two calls differed) and
K = 2^24 a SIGSEGV; now the call raises a clear ValueError before any kernel reads."""

import mlx.core as mx
import numpy as np
import pytest

import mlx_fp4 as mx_fp4

import common

K, N, E = 64, 32, 3


def _weights(k=K):
    w, s, _ = common.rand_weights(N, k, common.rng("shapeless", k))
    return w, s


@pytest.mark.parametrize("layout", ["uint8", "uint32"])
@pytest.mark.parametrize("new_k", [1024, 1 << 24])
def test_dense_shapeless_larger_k_raises(layout, new_k):
    w, s, _ = common.rand_weights(N, K, common.rng("shapeless", layout), layout=layout)
    f = mx.compile(lambda x: mx_fp4.w4a16_matmul(x, w, s), shapeless=True)
    mx.eval(f(mx.ones((1, K))))
    with pytest.raises(ValueError, match=r"\[w4a16_matmul\].*K = %d" % new_k):
        mx.eval(f(mx.ones((1, new_k))))


def test_dense_shapeless_weights_as_inputs_other_n_raises():
    w, s = _weights()
    f = mx.compile(lambda x, w, s: mx_fp4.w4a16_matmul(x, w, s), shapeless=True)
    mx.eval(f(mx.ones((1, K)), w, s))
    w2, s2, _ = common.rand_weights(2 * N, K, common.rng("shapeless_n"))
    with pytest.raises(ValueError, match=r"\[w4a16_matmul\] scales"):
        mx.eval(f(mx.ones((1, K)), w2, s))  # scales of N rows for a 2N-row weight
    # Consistent new shapes (other M, other N with its own scales) still run, correctly.
    x = mx.ones((3, K))
    common.check_matmul(f(x, w2, s2), x, w2, s2)


@pytest.mark.parametrize("new_k", [1024, 1 << 24])
def test_gather_shapeless_larger_k_raises(new_k):
    g = common.rng("shapeless_gather")
    w = mx.array(g.integers(0, 256, (E, N, K // 2), dtype=np.uint8))
    s = mx.array(g.integers(0x30, 0x40, (E, N, K // 16), dtype=np.uint8))
    idx = mx.array(np.array([[0, 2]], np.uint32))
    f = mx.compile(lambda x: mx_fp4.gather_w4a16_matmul(x, w, s, rhs_indices=idx), shapeless=True)
    mx.eval(f(mx.ones((1, 1, K))))
    with pytest.raises(ValueError, match=r"\[gather_w4a16_matmul\].*K = %d" % new_k):
        mx.eval(f(mx.ones((1, 1, new_k))))


@pytest.mark.parametrize("short_k", [57, 63])
def test_layers_refuse_short_x(short_k):
    """A K = 64 weight fills the same uint32 words for K = 57..63: the op cannot tell, the layer can
    (stock nn.QuantizedLinear raises there too)."""
    import mlx.nn as nn
    from mlx_lm.models.switch_layers import SwitchLinear

    from mlx_fp4.nn import FP4Linear, FP4SwitchLinear

    lin = FP4Linear(K, N)
    with pytest.raises(ValueError, match=r"\[FP4Linear\].*input_dims = 64"):
        lin(mx.ones((1, short_k)))
    stock = nn.QuantizedLinear(K, N, mode="nvfp4")
    with pytest.raises(ValueError):
        mx.eval(stock(mx.ones((1, short_k))))
    sw = FP4SwitchLinear.from_switch_linear(SwitchLinear(K, N, E, bias=False))
    with pytest.raises(ValueError, match=r"\[FP4SwitchLinear\].*input_dims = 64"):
        sw(mx.ones((1, 1, 1, short_k)), mx.array([[0]], mx.uint32))
    assert lin(mx.ones((1, K))).shape == (1, N)


@pytest.mark.parametrize("side", ["lhs", "rhs"])
@pytest.mark.parametrize("bad", [(1 << 32) + 1, (1 << 40), -1])
def test_gather_lazy_int64_out_of_range_is_nan(side, bad):
    """A lazy int64 index of 2^32 + 1 wrapped to 1 in the uint32 cast and silently used expert
    (or x matrix) 1; docs promise NaN rows for lazy bad indices. Under compile too."""
    g = common.rng("int64_idx", side)
    w = mx.array(g.integers(0, 256, (E, N, K // 2), dtype=np.uint8))
    s = mx.array(g.integers(0x30, 0x40, (E, N, K // 16), dtype=np.uint8))
    x = mx.array(g.standard_normal((2, 1, K)).astype(np.float32))

    def f(i):
        idx = mx.array(np.array([0, 1], np.int64)) + i  # lazy: the op cannot read the values
        kw = {"lhs_indices": idx, "rhs_indices": mx.array(np.array([0, 1], np.uint32))} if side == "lhs" else \
            {"lhs_indices": mx.array(np.array([0, 1], np.uint32)), "rhs_indices": idx}
        return mx_fp4.gather_w4a16_matmul(x, w, s, **kw)

    shift = mx.array(np.array([0, bad - 1], np.int64))
    for fn in (f, mx.compile(f)):
        out = np.array(fn(shift))
        assert np.isfinite(out[0]).all() and np.isnan(out[1]).all()


def test_epilogue_checks_name_the_op():
    """Length before parsing (a 3e7-op list took 17 s and 1.5 GB), complex operands refused (the
    imaginary part was dropped), and the gathered op's errors say gather_w4a16_matmul."""
    w, s = _weights()
    x = mx.ones((1, K))
    huge = ["relu"] * 10_000_000
    with pytest.raises(ValueError, match=r"\[w4a16_matmul\] epilogue must have at most 8 ops but got 10000000"):
        mx_fp4.w4a16_matmul(x, w, s, epilogue=huge)
    with pytest.raises(ValueError, match=r"\[w4a16_matmul\] epilogue\[0\] operand must be a real array"):
        mx_fp4.w4a16_matmul(x, w, s, epilogue=[("add", mx.zeros((N,), mx.complex64))])
    gw = mx.expand_dims(w, 0)
    gsc = mx.expand_dims(s, 0)
    with pytest.raises(ValueError, match=r"\[gather_w4a16_matmul\] epilogue\[0\] has unknown op"):
        mx_fp4.gather_w4a16_matmul(x, gw, gsc, epilogue=["nope"])
