"""gather_w4a16_matmul under MLX transforms: vjp (x and epilogue operands) against the MLX-ops
reference, vmap against a loop of calls, compile (plain and shapeless) against eager."""

import mlx.core as mx
import numpy as np
import pytest

import mlx_fp4 as mx_fp4
from common import assert_close, rand_weights, rand_x, rng

TOP_K = 2


@pytest.fixture
def moe():
    g = rng("gather-transforms")
    e, n, k, t = 4, 24, 40, 3
    parts = [rand_weights(n, k, g) for _ in range(e)]
    w, s = mx.stack([p[0] for p in parts]), mx.stack([p[1] for p in parts])
    x = rand_x((t, 1, 1, k), mx.float32, g)
    idx = mx.array(np.stack([g.choice(e, TOP_K, replace=False) for _ in range(t)]).astype(np.uint32))
    gs = mx.array(g.uniform(100, 300, size=e).astype(np.float32))
    return dict(x=x, w=w, s=s, idx=idx, gs=gs, g=g, n=n)


def close(a, b, what, rel=1e-5):
    b = np.array(b.astype(mx.float32))
    assert_close(a, b, rel * (np.abs(b) + 1.0), what=what)


def test_vjp_x_and_operands(device, moe):
    x, w, s, idx, gs = moe["x"], moe["w"], moe["s"], moe["idx"], moe["gs"]
    bias = rand_x((x.shape[0], TOP_K, 1, moe["n"]), mx.float32, moe["g"])

    def loss(op):
        def f(x, bias):
            y = op(x, w, s, rhs_indices=idx, global_scale=gs, epilogue=[("add", bias), "silu"])
            return (y * y).sum()

        return mx.grad(f, argnums=(0, 1))

    gx, gb = loss(mx_fp4.gather_w4a16_matmul)(x, bias)
    rx, rb = loss(mx_fp4.gather_w4a16_matmul_reference_ops)(x, bias)
    assert gx.shape == x.shape and gb.shape == bias.shape
    close(gx, rx, "grad x")
    close(gb, rb, "grad bias")


def test_vjp_matches_mx_gather_qmm(device, moe):
    x, w, s, idx = moe["x"], moe["w"], moe["s"], moe["idx"]
    # MLX's quantizer output: the bytes mx.gather_qmm reads.
    wq, sq = mx.quantize(mx.array(moe["g"].standard_normal((4, 24, 64)).astype(np.float32)), mode="nvfp4")[:2]
    xx = rand_x((3, 1, 1, 64), mx.float32, moe["g"])
    ours = mx.grad(lambda v: mx_fp4.gather_w4a16_matmul(v, wq, sq, rhs_indices=idx).sum())(xx)
    theirs = mx.grad(lambda v: mx.gather_qmm(v, wq, sq, rhs_indices=idx, transpose=True, mode="nvfp4").sum())(xx)
    close(ours, theirs, "grad vs gather_qmm", rel=2.0**-6)


def test_grad_wrt_weights_raises(device, moe):
    x, w, s, idx, gs = moe["x"], moe["w"], moe["s"], moe["idx"], moe["gs"]
    f = lambda g: mx_fp4.gather_w4a16_matmul(x, w, s, rhs_indices=idx, global_scale=g).sum()  # noqa: E731
    with pytest.raises(ValueError, match="global_scale are not supported"):
        mx.grad(f)(gs)


def test_vmap_over_x_and_indices(device, moe):
    x, w, s, idx = moe["x"], moe["w"], moe["s"], moe["idx"]
    xs = mx.stack([x, 2 * x, -x])  # [3, T, 1, 1, K]
    fn = lambda v: mx_fp4.gather_w4a16_matmul(v, w, s, rhs_indices=idx)  # noqa: E731
    out = mx.vmap(fn)(xs)
    loop = mx.stack([fn(xs[i]) for i in range(3)])
    close(out, loop, "vmap x")

    idxs = mx.stack([idx, (idx + 1) % 4])
    fi = lambda i: mx_fp4.gather_w4a16_matmul(x, w, s, rhs_indices=i, epilogue=["relu"])  # noqa: E731
    close(mx.vmap(fi)(idxs), mx.stack([fi(idxs[0]), fi(idxs[1])]), "vmap indices")

    both = lambda v, i: mx_fp4.gather_w4a16_matmul(v, w, s, rhs_indices=i)  # noqa: E731
    out = mx.vmap(both, in_axes=(1, 0))(mx.stack([x, -x], axis=1), idxs)
    close(out, mx.stack([both(x, idxs[0]), both(-x, idxs[1])]), "vmap x and indices")


def test_compile_and_shapeless(device, moe):
    """Plain compile with mlx-lm's decode call; shapeless compile with both index arrays given in
    the full shape (a default index is an arange of the traced size, pinned as in mx.gather_qmm)."""
    w, s, gs = moe["w"], moe["s"], moe["gs"]

    def decode(x, idx):
        return mx_fp4.gather_w4a16_matmul(x, w, s, rhs_indices=idx, global_scale=gs, epilogue=["gelu"])

    def pairs(x, lhs, rhs):
        return mx_fp4.gather_w4a16_matmul(x, w, s, lhs_indices=lhs, rhs_indices=rhs, epilogue=["silu"])

    cd, cp = mx.compile(decode), mx.compile(pairs, shapeless=True)
    for t in (3, 5):
        g = rng("compile", t)
        x = rand_x((t, 1, 1, 40), mx.float32, g)
        idx = mx.array(np.stack([g.choice(4, TOP_K, replace=False) for _ in range(t)]).astype(np.uint32))
        out = cd(x, idx)
        assert out.shape == (t, TOP_K, 1, moe["n"])
        close(out, decode(x, idx), f"compile T={t}", rel=0.0)
        flat = idx.reshape(-1)
        lhs = mx.array(np.arange(t * TOP_K, dtype=np.uint32) // TOP_K)
        xt = x.reshape(t, 1, 40)
        out = cp(xt, lhs, flat)
        assert out.shape == (t * TOP_K, 1, moe["n"])
        close(out, pairs(xt, lhs, flat), f"shapeless T={t}", rel=0.0)


def test_bad_lazy_index_gives_nan_rows_and_the_stream_recovers(device, moe):
    x, w, s, idx = moe["x"], moe["w"], moe["s"], moe["idx"]
    lazy = idx + 4  # every expert out of [0, 4), known only when the op runs: NaN rows, no read
    out = mx_fp4.gather_w4a16_matmul(x, w, s, rhs_indices=lazy)
    assert np.isnan(np.array(out.astype(mx.float32))).all()
    good = mx_fp4.gather_w4a16_matmul(x, w, s, rhs_indices=idx)
    assert not np.isnan(np.array(good.astype(mx.float32))).any()
