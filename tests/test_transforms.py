"""MLX transforms of w4a16_matmul: grad / value_and_grad (x and epilogue operands) against
float64 central differences of the reference and against mx.grad of reference_ops; jvp;
mx.compile (plain, shapeless, distinct epilogues not merged); vmap; nn.Module."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlx_fp4 as mx_fp4
import reference as ref
from common import check_matmul, dname, rand_weights, rand_x, rng

M, N, K = 3, 5, 33
# fp32 forward + fp32 backward vs float64 central differences on small, well-scaled problems.
GRAD_RTOL = 2e-4


def problem(key, m=M, n=N, k=K, batch=()):
    g = rng("tf", key)
    x = rand_x((*batch, m, k), mx.float32, g, scale=0.3)
    w, scales, packed = rand_weights(n, k, g, scale_codes=np.array([0x28, 0x30, 0x38], np.uint8))
    return g, x, w, scales, packed


def central_diff(f, a, h=1e-6):
    """d f(a) / d a for scalar f of a float64 array, by central differences."""
    a = np.array(a, dtype=np.float64)
    grad = np.zeros_like(a)
    flat = a.reshape(-1)
    gflat = grad.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + h
        fp = f(a)
        flat[i] = old - h
        fm = f(a)
        flat[i] = old
        gflat[i] = (fp - fm) / (2 * h)
    return grad


def assert_grad_close(got, expected, what):
    got = ref.to_numpy(got)
    expected = np.asarray(expected)
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    scale = np.max(np.abs(expected)) + 1e-12
    np.testing.assert_allclose(got, expected, rtol=GRAD_RTOL, atol=GRAD_RTOL * scale, err_msg=what)


# Epilogues: (name, builder(g, out_shape) -> list with operand arrays, operand indices to check)
EPILOGUES = {
    "none": lambda g, s: [],
    "bias_silu_gate": lambda g, s: [
        ("add", rand_x((s[-1],), mx.float32, g)),
        "silu",
        ("mul", rand_x(s, mx.float32, g)),
    ],
    "gelu": lambda g, s: ["gelu"],
    "gelu_approx_scale": lambda g, s: [("scale", 0.5), "gelu_approx"],
    "row_sigmoid": lambda g, s: [("mul", rand_x((*s[:-1], 1), mx.float32, g)), "sigmoid"],
    "tanh_scalar": lambda g, s: [("add", mx.array(0.25)), "tanh", ("add", 1.5)],
    "relu_clamp": lambda g, s: [
        ("add", rand_x((s[-1],), mx.float32, g)),
        "relu",
        ("clamp", -1.0, 0.75),
    ],
}


def with_operands(epi, ops):
    """Replace the array operands of epi, in order, by ops."""
    out, i = [], 0
    for op in epi:
        if isinstance(op, tuple) and op[0] in ("add", "mul") and isinstance(op[1], mx.array):
            out.append((op[0], ops[i]))
            i += 1
        else:
            out.append(op)
    return out


def as_list(grads):
    """mx.grad with argnums=[i] returns a bare array; with more, a tuple."""
    return list(grads) if isinstance(grads, (list, tuple)) else [grads]


def array_operands(epi):
    return [op[1] for op in epi if isinstance(op, tuple) and isinstance(op[1], mx.array)]


@pytest.mark.parametrize("epi_name", list(EPILOGUES))
def test_grad_vs_finite_differences(device, epi_name):
    g, x, w, scales, packed = problem(epi_name)
    epi = EPILOGUES[epi_name](g, (M, N))
    cot = rand_x((M, N), mx.float32, g)
    opnds = array_operands(epi)

    def loss(x_, *ops_):
        y = mx_fp4.w4a16_matmul(
            x_, w, scales, epilogue=with_operands(epi, ops_), out_dtype=mx.float32
        )
        return mx.sum(y * cot)

    argnums = list(range(1 + len(opnds)))
    value, grads = mx.value_and_grad(loss, argnums=argnums)(x, *opnds)
    grads = as_list(grads)
    cot64 = ref.to_numpy(cot)

    def ref_loss(x64, ops64):
        epi64 = with_operands_np(epi, ops64)
        return float(np.sum(ref.w4a16_matmul(x64, packed, scales, K, None, epi64) * cot64))

    x64 = ref.to_numpy(x)
    ops64 = [ref.to_numpy(o) for o in opnds]
    np.testing.assert_allclose(float(value), ref_loss(x64, ops64), rtol=1e-5)
    assert_grad_close(grads[0], central_diff(lambda a: ref_loss(a, ops64), x64), "d/dx")
    for i, o in enumerate(ops64):

        def f(a, i=i):
            ops = list(ops64)
            ops[i] = a
            return ref_loss(x64, ops)

        assert_grad_close(grads[1 + i], central_diff(f, o), f"d/d operand {i}")


def with_operands_np(epi, ops64):
    out, i = [], 0
    for op in epi:
        if isinstance(op, tuple) and op[0] in ("add", "mul") and isinstance(op[1], mx.array):
            out.append((op[0], ops64[i]))
            i += 1
        else:
            out.append(op)
    return out


@pytest.mark.parametrize("epi_name", ["none", "bias_silu_gate", "row_sigmoid", "tanh_scalar"])
@pytest.mark.parametrize("x_dtype", [mx.float32, mx.bfloat16], ids=lambda d: f"x={dname(d)}")
def test_grad_vs_reference_ops(device, epi_name, x_dtype):
    """Gradients equal mx.grad of the plain-MLX-ops version (same math), with batch dims."""
    g, x, w, scales, packed = problem(("refops", epi_name), batch=(2,))
    x = x.astype(x_dtype)
    epi = EPILOGUES[epi_name](g, (2, M, N))
    opnds = array_operands(epi)

    def make(fn):
        def loss(x_, *ops_):
            y = fn(x_, w, scales, global_scale=0.75, epilogue=with_operands(epi, ops_))
            return mx.sum(y.astype(mx.float32) ** 2)

        return mx.grad(loss, argnums=list(range(1 + len(opnds))))

    ours = as_list(make(mx_fp4.w4a16_matmul)(x, *opnds))
    theirs = as_list(make(mx_fp4.w4a16_matmul_reference_ops)(x, *opnds))
    assert len(ours) == len(theirs) == 1 + len(opnds)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a.dtype == b.dtype and a.shape == b.shape
        tol = 2e-2 if x_dtype == mx.bfloat16 else 1e-4
        bn = ref.to_numpy(b)
        np.testing.assert_allclose(
            ref.to_numpy(a), bn, rtol=tol, atol=tol * np.max(np.abs(bn)), err_msg=f"grad {i}"
        )
    assert ours[0].dtype == x_dtype  # gradient in the dtype of x


def test_grad_of_operands_broadcast_over_batch(device):
    """Operand gradients are summed over the dims they were broadcast along."""
    g, x, w, scales, packed = problem("bcast-grad", batch=(2,))
    ops = [
        rand_x((M, 1), mx.float32, g),
        rand_x((M, N), mx.float32, g),
        rand_x((1, 1, N), mx.float32, g),
    ]

    def epi_of(o):
        return [("mul", o[0]), "tanh", ("add", o[1]), ("mul", o[2])]

    def make(fn):
        def loss(x_, *o):
            return mx.sum(fn(x_, w, scales, epilogue=epi_of(o)) ** 2)

        return mx.grad(loss, argnums=[0, 1, 2, 3])

    ours = make(mx_fp4.w4a16_matmul)(x, *ops)
    theirs = make(mx_fp4.w4a16_matmul_reference_ops)(x, *ops)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a.shape == b.shape
        np.testing.assert_allclose(
            np.array(a), np.array(b), rtol=1e-4, atol=1e-4 * np.abs(np.array(b)).max()
        )
    x64, ops64 = ref.to_numpy(x), [ref.to_numpy(o) for o in ops]

    def ref_loss(o1):
        y = ref.w4a16_matmul(x64, packed, scales, K, None, epi_of([ops64[0], o1, ops64[2]]))
        return float(np.sum(y**2))

    assert_grad_close(ours[2], central_diff(ref_loss, ops64[1]), "d/d [M, N] operand")


def test_grad_dtype_of_operands(device):
    """Gradients w.r.t. bf16 / fp16 operands come back in their dtype and shape."""
    g, x, w, scales, packed = problem("opdtype")
    b = rand_x((N,), mx.bfloat16, g)
    r = rand_x((M, 1), mx.float16, g)

    def loss(b_, r_):
        y = mx_fp4.w4a16_matmul(x, w, scales, epilogue=[("add", b_), ("mul", r_)])
        return mx.sum(y)

    gb, gr = mx.grad(loss, argnums=[0, 1])(b, r)
    assert gb.dtype == mx.bfloat16 and gb.shape == (N,)
    assert gr.dtype == mx.float16 and gr.shape == (M, 1)
    # d/db sum((acc + b) * r) = sum_m r_m ; d/dr_m = sum_n (acc + b)
    acc = ref.w4a16_matmul(x, packed, scales)
    np.testing.assert_allclose(ref.to_numpy(gb), np.full(N, ref.to_numpy(r).sum()), rtol=1e-2)
    np.testing.assert_allclose(
        ref.to_numpy(gr), (acc + ref.to_numpy(b)).sum(-1, keepdims=True), rtol=2e-2, atol=1e-2
    )


def test_grad_wrt_w_raises(device):
    g, x, w, scales, _ = problem("gradw")
    with pytest.raises((ValueError, RuntimeError), match="w4a16_matmul|integer|grad"):
        mx.grad(lambda w_: mx.sum(mx_fp4.w4a16_matmul(x, w_, scales)))(w)


def test_grad_wrt_global_scale_raises(device):
    g, x, w, scales, _ = problem("gradgs")
    with pytest.raises(ValueError, match=r"\[w4a16_matmul\].*global_scale"):
        mx.grad(lambda s: mx.sum(mx_fp4.w4a16_matmul(x, w, scales, global_scale=s)))(mx.array(0.5))


@pytest.mark.parametrize("epi_name", ["none", "bias_silu_gate", "gelu"])
def test_jvp_vs_finite_differences(device, epi_name):
    g, x, w, scales, packed = problem(("jvp", epi_name))
    epi = EPILOGUES[epi_name](g, (M, N))
    opnds = array_operands(epi)
    tx = rand_x((M, K), mx.float32, g)
    tops = [rand_x(o.shape, mx.float32, g) for o in opnds]

    def f(x_, *ops_):
        return mx_fp4.w4a16_matmul(x_, w, scales, epilogue=with_operands(epi, ops_))

    (out,), (tan,) = mx.jvp(f, [x, *opnds], [tx, *tops])
    check_matmul(out, x, packed, scales, epilogue=epi)
    x64, tx64 = ref.to_numpy(x), ref.to_numpy(tx)
    ops64 = [ref.to_numpy(o) for o in opnds]
    tops64 = [ref.to_numpy(t) for t in tops]
    h = 1e-6

    def at(s):
        e = with_operands_np(epi, [o + s * t for o, t in zip(ops64, tops64)])
        return ref.w4a16_matmul(x64 + s * tx64, packed, scales, K, None, e)

    expected = (at(h) - at(-h)) / (2 * h)
    assert_grad_close(tan, expected, "jvp")


# ----------------------------------------------------------------------------------------------
# compile


def test_compile(device):
    g, x, w, scales, packed = problem("compile")
    b = rand_x((N,), mx.float32, g)
    epi = [("add", b), "silu"]
    f = mx.compile(
        lambda x_, b_: mx_fp4.w4a16_matmul(x_, w, scales, epilogue=[("add", b_), "silu"])
    )
    out = f(x, b)
    check_matmul(out, x, packed, scales, epilogue=epi)
    np.testing.assert_array_equal(
        np.array(out), np.array(mx_fp4.w4a16_matmul(x, w, scales, epilogue=epi))
    )


def test_compile_shapeless_different_m(device):
    g, x, w, scales, packed = problem("shapeless")
    f = mx.compile(
        lambda x_, b_: mx_fp4.w4a16_matmul(x_, w, scales, epilogue=[("add", b_), "gelu"]),
        shapeless=True,
    )
    b = rand_x((N,), mx.float32, g)
    for m in [1, 3, 17, 64]:
        xm = rand_x((m, K), mx.float32, g, scale=0.3)
        out = f(xm, b)
        assert out.shape == (m, N)
        check_matmul(out, xm, packed, scales, epilogue=[("add", b), "gelu"])
    xb = rand_x((2, 4, K), mx.float32, g, scale=0.3)  # rank change too
    out = f(xb, b)
    assert out.shape == (2, 4, N)
    check_matmul(out, xb, packed, scales, epilogue=[("add", b), "gelu"])


@pytest.mark.parametrize("kind", ["row", "full", "col", "scalar"])
def test_compile_shapeless_operand_broadcast_over_batch(device, kind):
    """Operands that broadcast over leading batch dims ([M, 1], [M, N] with x [B, M, K]).

    col and scalar operands stay right for any B. row/full ones are expanded to the traced B
    when the graph is built, so calling the shapeless function with another B must raise a
    clear ValueError (never read past the operand), and the traced B itself stays right."""
    g, _, w, scales, packed = problem(("shapeless-bcast", kind))
    shape = {"row": (M, 1), "full": (M, N), "col": (N,), "scalar": ()}[kind]
    t = rand_x(shape, mx.float32, g)
    f = mx.compile(
        lambda x_, t_: mx_fp4.w4a16_matmul(x_, w, scales, epilogue=[("add", t_)]), shapeless=True
    )
    for b in [1, 2, 4, 3]:
        xb = rand_x((b, M, K), mx.float32, g)
        if kind in ("row", "full") and b != 1:
            with pytest.raises(ValueError, match=r"\[w4a16_matmul\] epilogue\[0\] operand .*shapeless"):
                mx.eval(f(xb, t))
            continue
        out = f(xb, t)
        assert out.shape == (b, M, N)
        check_matmul(out, xb, packed, scales, epilogue=[("add", t)])


@pytest.mark.parametrize(
    "pair",
    [
        (["silu"], ["gelu"]),
        ([("scale", 2.0)], [("scale", 3.0)]),
        ([("clamp", -1.0, 1.0)], [("clamp", -1.0, 2.0)]),
        ([("add", 1.0)], [("mul", 1.0)]),
        ([("scale", 0.0)], [("scale", -0.0)]),
        (["sigmoid", "relu"], ["relu", "sigmoid"]),
    ],
    ids=lambda p: f"{p[0]}-vs-{p[1]}".replace(" ", "").replace("'", ""),
)
def test_compile_does_not_merge_different_epilogues(device, pair):
    """Two calls on the same inputs with different epilogues stay two different nodes."""
    g, x, w, scales, packed = problem("merge")
    e1, e2 = pair
    x = x * 4  # make ranges where the ops differ

    def fn(x_):
        a = mx_fp4.w4a16_matmul(x_, w, scales, epilogue=e1, out_dtype=mx.float32)
        b = mx_fp4.w4a16_matmul(x_, w, scales, epilogue=e2, out_dtype=mx.float32)
        return a, b

    for f in [mx.compile(fn), mx.compile(fn, shapeless=True)]:
        a, b = f(x)
        check_matmul(a, x, packed, scales, epilogue=e1, out_dtype=mx.float32)
        check_matmul(b, x, packed, scales, epilogue=e2, out_dtype=mx.float32)
    if pair[0] == [("scale", 0.0)]:
        # -0.0 vs +0.0 scale: results differ in the sign of zero.
        assert np.any(np.signbit(np.array(a)) != np.signbit(np.array(b)))
    else:
        assert not np.array_equal(np.array(a), np.array(b))


def test_compile_same_epilogue_different_out_dtype_or_gs(device):
    g, x, w, scales, packed = problem("merge2")

    def fn(x_):
        return (
            mx_fp4.w4a16_matmul(x_, w, scales, out_dtype=mx.float32),
            mx_fp4.w4a16_matmul(x_, w, scales, out_dtype=mx.bfloat16),
            mx_fp4.w4a16_matmul(x_, w, scales, global_scale=0.5, out_dtype=mx.float32),
        )

    a, b, c = mx.compile(fn)(x)
    assert a.dtype == mx.float32 and b.dtype == mx.bfloat16
    check_matmul(a, x, packed, scales, out_dtype=mx.float32)
    check_matmul(b, x, packed, scales, out_dtype=mx.bfloat16)
    check_matmul(c, x, packed, scales, global_scale=0.5, out_dtype=mx.float32)


def test_compile_grad(device):
    g, x, w, scales, packed = problem("cgrad")
    b = rand_x((N,), mx.float32, g)

    def loss(x_, b_):
        return mx.sum(mx_fp4.w4a16_matmul(x_, w, scales, epilogue=[("add", b_), "silu"]) ** 2)

    gx, gb = mx.compile(mx.grad(loss, argnums=[0, 1]))(x, b)
    ex, eb = mx.grad(loss, argnums=[0, 1])(x, b)
    np.testing.assert_allclose(np.array(gx), np.array(ex), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(gb), np.array(eb), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------------------
# vmap


@pytest.mark.parametrize("in_axis", [0, 1, 2])
def test_vmap_over_x(device, in_axis):
    g, _, w, scales, packed = problem(("vmap", in_axis))
    V = 4
    xs = rand_x((V, M, K), mx.float32, g)
    xin = mx.moveaxis(xs, 0, in_axis)  # axis 2: [M, K, V], the mapped axis after K
    b = rand_x((N,), mx.float32, g)
    epi = [("add", b), "gelu"]
    out = mx.vmap(lambda a: mx_fp4.w4a16_matmul(a, w, scales, epilogue=epi), in_axes=in_axis)(xin)
    assert out.shape == (V, M, N)
    for v in range(V):
        check_matmul(out[v], xs[v], packed, scales, epilogue=epi)


def test_vmap_over_x_out_axis(device):
    g, _, w, scales, packed = problem("vmap-out")
    xs = rand_x((4, M, K), mx.float32, g)
    out = mx.vmap(lambda a: mx_fp4.w4a16_matmul(a, w, scales), in_axes=0, out_axes=1)(xs)
    assert out.shape == (M, 4, N)
    for v in range(4):
        check_matmul(out[:, v], xs[v], packed, scales)


@pytest.mark.parametrize("kind", ["col", "row", "full", "scalar"])
def test_vmap_over_operand(device, kind):
    """vmap over an epilogue operand only: x and w are shared."""
    g, x, w, scales, packed = problem(("vmap-op", kind))
    V = 3
    shape = {"col": (N,), "row": (M, 1), "full": (M, N), "scalar": ()}[kind]
    ts = rand_x((V, *shape), mx.float32, g)
    out = mx.vmap(
        lambda t: mx_fp4.w4a16_matmul(x, w, scales, epilogue=[("add", t), "silu", ("mul", t)])
    )(ts)
    assert out.shape == (V, M, N)
    for v in range(V):
        epi = [("add", ts[v]), "silu", ("mul", ts[v])]
        check_matmul(out[v], x, packed, scales, epilogue=epi)


def test_vmap_over_x_and_operand(device):
    g, _, w, scales, packed = problem("vmap-both")
    V = 3
    xs = rand_x((M, V, K), mx.float32, g)  # mapped on axis 1
    bs = rand_x((N, V), mx.float32, g)  # mapped on axis 1
    out = mx.vmap(
        lambda a, b: mx_fp4.w4a16_matmul(a, w, scales, epilogue=[("add", b)]), in_axes=(1, 1)
    )(xs, bs)
    assert out.shape == (V, M, N)
    for v in range(V):
        check_matmul(out[v], xs[:, v], packed, scales, epilogue=[("add", bs[:, v])])


def test_vmap_grad(device):
    """Per-example gradients: vmap(grad(f)) equals the loop of grads."""
    g, _, w, scales, packed = problem("vmap-grad")
    xs = rand_x((4, M, K), mx.float32, g)

    def loss(a):
        return mx.sum(mx_fp4.w4a16_matmul(a, w, scales, epilogue=["tanh"]))

    got = mx.vmap(mx.grad(loss))(xs)
    for v in range(4):
        np.testing.assert_allclose(
            np.array(got[v]), np.array(mx.grad(loss)(xs[v])), rtol=1e-5, atol=1e-6
        )


# ----------------------------------------------------------------------------------------------
# nn.Module


class FP4Dense(nn.Module):
    """A minimal layer: frozen packed weights, trainable bias used in the fused epilogue."""

    def __init__(self, w, scales, n):
        super().__init__()
        self.w = w
        self.scales = scales
        self.bias = mx.zeros((n,))
        self.freeze(keys=["w", "scales"])

    def __call__(self, x):
        return mx_fp4.w4a16_matmul(x, self.w, self.scales, epilogue=[("add", self.bias), "gelu"])


def test_inside_nn_module(device):
    g, x, w, scales, packed = problem("module")
    layer = FP4Dense(w, scales, N)
    layer.bias = rand_x((N,), mx.float32, g)
    assert set(dict(nn.utils.tree_flatten(layer.trainable_parameters()))) == {"bias"}
    target = rand_x((M, N), mx.float32, g)

    def loss_fn(model, a):
        return mx.mean((model(a) - target) ** 2)

    loss, grads = nn.value_and_grad(layer, loss_fn)(layer, x)
    b64 = ref.to_numpy(layer.bias)
    t64 = ref.to_numpy(target)

    def ref_loss(bb):
        y = ref.w4a16_matmul(x, packed, scales, K, None, [("add", bb), "gelu"])
        return float(np.mean((y - t64) ** 2))

    np.testing.assert_allclose(float(loss), ref_loss(b64), rtol=1e-5)
    assert_grad_close(grads["bias"], central_diff(ref_loss, b64), "d loss / d bias")
    # One SGD step through the optimizer machinery lowers the loss.
    import mlx.optimizers as optim

    opt = optim.SGD(learning_rate=0.1)
    opt.update(layer, grads)
    mx.eval(layer.parameters())
    assert float(loss_fn(layer, x)) < float(loss)
    # Compiled module call agrees.
    out = mx.compile(layer)(x)
    check_matmul(out, x, packed, scales, epilogue=[("add", layer.bias), "gelu"])


def test_vmap_over_x_with_unmapped_row_and_full_operands(device):
    g, _, w, scales, packed = problem("vmap-unmapped")
    xs = rand_x((4, M, K), mx.float32, g)
    epi = [("mul", rand_x((M, 1), mx.float32, g)), "silu", ("add", rand_x((M, N), mx.bfloat16, g))]
    out = mx.vmap(lambda a: mx_fp4.w4a16_matmul(a, w, scales, epilogue=epi))(xs)
    assert out.shape == (4, M, N)
    for v in range(4):
        check_matmul(out[v], xs[v], packed, scales, epilogue=epi)


def test_vmap_nested(device):
    g, _, w, scales, packed = problem("vmap-nested")
    xs = rand_x((2, 3, M, K), mx.float32, g)
    out = mx.vmap(mx.vmap(lambda a: mx_fp4.w4a16_matmul(a, w, scales, epilogue=["gelu"])))(xs)
    assert out.shape == (2, 3, M, N)
    check_matmul(out, xs, packed, scales, epilogue=["gelu"])


# K not a multiple of 16 exercises the column gathers of decode (no Pad/Slice nodes).
K_SHAPELESS = [32, 33, 40]


@pytest.mark.parametrize("k", K_SHAPELESS, ids=lambda k: f"K={k}")
def test_compile_shapeless_grad(device, k):
    g, _, w, scales, packed = problem(("shapeless-grad", k), k=k)
    b = rand_x((N,), mx.float32, g)

    def loss(fn):
        return lambda x_, b_: mx.sum(fn(x_, w, scales, epilogue=[("add", b_), "silu"]) ** 2)

    f = mx.compile(mx.grad(loss(mx_fp4.w4a16_matmul), argnums=[0, 1]), shapeless=True)
    for m in [2, 6, 11]:
        x = rand_x((m, k), mx.float32, g, scale=0.3)
        gx, gb = f(x, b)
        ex, eb = mx.grad(loss(mx_fp4.w4a16_matmul_reference_ops), argnums=[0, 1])(x, b)
        assert gx.shape == (m, k)
        np.testing.assert_allclose(np.array(gx), np.array(ex), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(np.array(gb), np.array(eb), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("k", K_SHAPELESS, ids=lambda k: f"K={k}")
def test_compile_shapeless_reference_ops_and_dequantize(device, k):
    g, _, w, scales, packed = problem(("shapeless-refops", k), k=k)
    f = mx.compile(lambda x_: mx_fp4.w4a16_matmul_reference_ops(x_, w, scales), shapeless=True)
    for m in [1, 5]:
        x = rand_x((m, k), mx.float32, g)
        check_matmul(f(x), x, packed, scales)
    d = mx.compile(lambda a, s: mx_fp4.dequantize(a, s, k=k, dtype=mx.float32), shapeless=True)(
        w, scales
    )
    np.testing.assert_array_equal(np.array(d), ref.decode_weights(packed, scales, k))
