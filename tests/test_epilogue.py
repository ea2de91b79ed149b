"""The fused epilogue: every op alone and in chains, every operand shape, against the float64
reference and against the same chain composed from MLX ops in fp32; NaN/Inf propagation."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlx_fp4 as mx_fp4
import reference as ref
from common import (
    SAFETY,
    TOLERANCES,
    assert_close,
    check_matmul,
    dname,
    error_bound,
    rand_weights,
    rand_x,
    rng,
)

ACTIVATIONS = ["relu", "silu", "gelu", "gelu_approx", "sigmoid", "tanh"]

# The same ops composed from MLX (fp32), as the contract defines the semantics.
MLX_ACTIVATION = {
    "relu": lambda v: mx.maximum(v, 0.0),
    "silu": nn.silu,
    "gelu": nn.gelu,
    "gelu_approx": nn.gelu_approx,
    "sigmoid": mx.sigmoid,
    "tanh": mx.tanh,
}


def mlx_chain(acc, epilogue):
    """Apply an epilogue with MLX ops to an fp32 accumulator."""
    v = acc
    for op in epilogue:
        name, args = (op, ()) if isinstance(op, str) else (op[0], op[1:])
        if name == "add":
            v = v + (args[0].astype(mx.float32) if isinstance(args[0], mx.array) else args[0])
        elif name == "mul":
            v = v * (args[0].astype(mx.float32) if isinstance(args[0], mx.array) else args[0])
        elif name == "scale":
            v = v * args[0]
        elif name == "clamp":
            v = mx.clip(v, args[0], args[1])
        else:
            v = MLX_ACTIVATION[name](v)
    return v


def setup(key, m=6, n=40, k=48, batch=(), x_dtype=mx.float32):
    g = rng("epi", key)
    x = rand_x((*batch, m, k), x_dtype, g)
    w, scales, packed = rand_weights(n, k, g, layout="uint32")
    return g, x, w, scales, packed


def mlx_acc(x, w32, scales):
    """fp32 accumulator from MLX's own dequantize (independent of mx_fp4)."""
    wf = mx.dequantize(w32, scales, mode="nvfp4", dtype=mx.float32)
    return x.astype(mx.float32) @ wf.T


def check_both(out, x, w, scales, packed, epilogue, out_dtype=None, what=""):
    """Against the float64 reference (table tolerance) and the MLX-composed chain (2x of it)."""
    check_matmul(out, x, packed, scales, epilogue=epilogue, out_dtype=out_dtype)
    composed = mlx_chain(mlx_acc(x, w, scales), epilogue).astype(out.dtype)
    _, acc, mag = ref.w4a16_matmul_with_magnitude(x, packed, scales)
    _, bound = error_bound(acc, mag, x.shape[-1], TOLERANCES[(x.dtype, out.dtype)], epilogue)
    assert_close(out, ref.to_numpy(composed), 2 * bound, f"vs MLX-composed chain {what}")


def operands(g, shape_out, kind):
    """An operand of the given broadcast kind for an output of shape_out [..., M, N]."""
    n = shape_out[-1]
    if kind == "col":  # [N], e.g. a bias
        return rand_x((n,), mx.float32, g)
    if kind == "row":  # [..., M, 1]
        return rand_x((*shape_out[:-1], 1), mx.float32, g)
    if kind == "full":  # [..., M, N]
        return rand_x(shape_out, mx.float32, g)
    if kind == "scalar":  # shape ()
        return mx.array(0.7109375)
    if kind == "float":
        return -0.3125
    if kind == "bf16_full":
        return rand_x(shape_out, mx.bfloat16, g)
    if kind == "fp16_col":
        return rand_x((n,), mx.float16, g)
    if kind == "one_n":  # [1, N]
        return rand_x((1, n), mx.float32, g)
    raise ValueError(kind)


@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("out_dtype", [mx.float32, mx.bfloat16], ids=lambda d: f"out={dname(d)}")
def test_activation_alone(device, name, out_dtype):
    # Scale x so the accumulator spans the interesting range of every activation (|v| ~ 0..10).
    g, x, w, scales, packed = setup(name)
    x = x * 0.2
    out = mx_fp4.w4a16_matmul(x, w, scales, epilogue=[name], out_dtype=out_dtype)
    check_both(out, x, w, scales, packed, [name], out_dtype)


@pytest.mark.parametrize("op", ["add", "mul"])
@pytest.mark.parametrize(
    "kind", ["col", "row", "full", "scalar", "float", "bf16_full", "fp16_col", "one_n"]
)
def test_operand_kinds(device, op, kind):
    g, x, w, scales, packed = setup((op, kind))
    t = operands(g, (6, 40), kind)
    epi = [(op, t)]
    out = mx_fp4.w4a16_matmul(x, w, scales, epilogue=epi)
    check_both(out, x, w, scales, packed, epi)


@pytest.mark.parametrize("kind", ["col", "row", "full", "scalar", "float"])
def test_operand_kinds_with_batch_dims(device, kind):
    g, x, w, scales, packed = setup(("batch", kind), batch=(2, 3))
    t = operands(g, (2, 3, 6, 40), kind)
    epi = [("add", t), "silu", ("mul", operands(g, (2, 3, 6, 40), "full"))]
    out = mx_fp4.w4a16_matmul(x, w, scales, epilogue=epi)
    assert out.shape == (2, 3, 6, 40)
    check_both(out, x, w, scales, packed, epi)


@pytest.mark.parametrize(
    "shape",
    [
        (1, 1, 1, 40),
        (2, 1, 1, 40),
        (2, 3, 1, 1),
        (1, 3, 6, 1),
        (2, 1, 6, 40),
        (3, 6, 40),
        (6, 1),
        (1,),
    ],
)
def test_partial_broadcast_operand(device, shape):
    """Operands that broadcast over some leading dims only (e.g. per-batch bias [B, 1, 1, N])."""
    g, x, w, scales, packed = setup(("partial", shape), batch=(2, 3))
    t = rand_x(shape, mx.float32, g)
    epi = [("add", t), ("mul", t)]
    out = mx_fp4.w4a16_matmul(x, w, scales, epilogue=epi)
    assert out.shape == (2, 3, 6, 40)
    check_both(out, x, w, scales, packed, epi)


@pytest.mark.parametrize("c", [2.5, -0.0078125, 0.0])
def test_scale(device, c):
    g, x, w, scales, packed = setup(("scale", c))
    epi = [("scale", c)]
    out = mx_fp4.w4a16_matmul(x, w, scales, epilogue=epi)
    check_both(out, x, w, scales, packed, epi)


@pytest.mark.parametrize("lo,hi", [(-1.0, 1.0), (0.0, 0.0), (-1e30, 2.5), (-3.0, 1e30)])
def test_clamp(device, lo, hi):
    g, x, w, scales, packed = setup(("clamp", lo, hi))
    epi = [("clamp", lo, hi)]
    out = mx_fp4.w4a16_matmul(x, w, scales, epilogue=epi)
    check_both(out, x, w, scales, packed, epi)


CHAINS = {
    "swiglu_like": lambda g, s: [
        ("add", operands(g, s, "col")),
        "silu",
        ("mul", operands(g, s, "full")),
    ],
    "residual": lambda g, s: [
        ("add", operands(g, s, "col")),
        "gelu",
        ("add", operands(g, s, "full")),
    ],
    "scaled_tanh": lambda g, s: [("scale", 0.125), "tanh", ("scale", 4.0), ("clamp", -3.0, 3.0)],
    "row_gate": lambda g, s: [("mul", operands(g, s, "row")), "sigmoid", ("add", 1.0)],
    "long": lambda g, s: [  # the limits: 8 ops, 4 tensor operands
        ("add", operands(g, s, "col")),
        "gelu_approx",
        ("mul", operands(g, s, "scalar")),
        "relu",
        ("add", 0.25),
        ("clamp", -0.5, 4.0),
        ("mul", operands(g, s, "full")),
        ("add", operands(g, s, "bf16_full")),
    ],
    "same_operand_twice": None,  # built in the test
}


@pytest.mark.parametrize("chain", list(CHAINS))
@pytest.mark.parametrize("x_dtype", [mx.bfloat16, mx.float32], ids=lambda d: f"x={dname(d)}")
def test_chains(device, chain, x_dtype):
    g, x, w, scales, packed = setup(("chain", chain), x_dtype=x_dtype)
    if chain == "same_operand_twice":
        t = operands(g, (6, 40), "col")
        epi = [("add", t), "silu", ("mul", t)]
    else:
        epi = CHAINS[chain](g, (6, 40))
    out = mx_fp4.w4a16_matmul(x, w, scales, epilogue=epi)
    check_both(out, x, w, scales, packed, epi)


def test_chain_order_matters(device):
    """[add, relu] != [relu, add]: ops apply in list order."""
    g, x, w, scales, packed = setup("order")
    b = mx.full((40,), -1.0)
    a = mx_fp4.w4a16_matmul(x, w, scales, epilogue=[("add", b), "relu"], out_dtype=mx.float32)
    c = mx_fp4.w4a16_matmul(x, w, scales, epilogue=["relu", ("add", b)], out_dtype=mx.float32)
    check_both(a, x, w, scales, packed, [("add", b), "relu"])
    check_both(c, x, w, scales, packed, ["relu", ("add", b)])
    assert (np.array(a) >= 0).all() and (np.array(c) < 0).any()


def test_epilogue_with_global_scale(device):
    """The global scale is applied before the chain."""
    g, x, w, scales, packed = setup("gs")
    epi = [("add", operands(g, (6, 40), "col")), "relu"]
    out = mx_fp4.w4a16_matmul(x, w, scales, global_scale=0.03, epilogue=epi)
    check_matmul(out, x, packed, scales, global_scale=np.float32(0.03), epilogue=epi)


def test_empty_epilogue_equals_none(device):
    g, x, w, scales, packed = setup("empty")
    a = mx_fp4.w4a16_matmul(x, w, scales, epilogue=[])
    b = mx_fp4.w4a16_matmul(x, w, scales)
    np.testing.assert_array_equal(np.array(a), np.array(b))


def test_epilogue_as_tuple(device):
    g, x, w, scales, packed = setup("tuple")
    epi = (("scale", 2.0), "relu")
    out = mx_fp4.w4a16_matmul(x, w, scales, epilogue=epi)
    check_both(out, x, w, scales, packed, list(epi))


# ----------------------------------------------------------------------------------------------
# NaN / Inf through the activations: inject specials into the accumulator with ("add", t).

SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, 88.0, -88.0, -104.0])

# What IEEE arithmetic gives for the literal formulas (and MLX's composed ops), e.g.
# silu(-inf) = -inf * sigmoid(-inf) = -inf * 0 = NaN.
EXPECTED_SPECIAL = {
    "relu": [np.nan, np.inf, 0.0],
    "silu": [np.nan, np.inf, np.nan],
    "gelu": [np.nan, np.inf, np.nan],
    "gelu_approx": [np.nan, np.inf, np.nan],
    "sigmoid": [np.nan, 1.0, 0.0],
    "tanh": [np.nan, 1.0, -1.0],
}


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_nan_inf_through_activation(device, name):
    k, n = 16, len(SPECIALS)
    x = mx.zeros((2, k), dtype=mx.float32)
    w, scales, packed = rand_weights(n, k, rng("special"))
    t = mx.array(np.stack([SPECIALS, -SPECIALS]).astype(np.float32))
    epi = [("add", t), name]
    out = ref.to_numpy(mx_fp4.w4a16_matmul(x, w, scales, epilogue=epi))
    np.testing.assert_array_equal(out[0, :3], EXPECTED_SPECIAL[name])
    expected = ref.activation(name, np.stack([SPECIALS, -SPECIALS]).astype(np.float32))
    # Finite inputs: within fp32 rounding of the float64 value.
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-30, equal_nan=True)
    # And exactly the specials MLX's composed ops give.
    composed = ref.to_numpy(mlx_chain(mx.zeros((2, n)), epi))
    np.testing.assert_array_equal(np.isnan(out), np.isnan(composed))
    np.testing.assert_array_equal(out[np.isinf(composed)], composed[np.isinf(composed)])


def test_nan_through_clamp_and_relu_kept(device):
    k = 16
    x = mx.zeros((1, k), dtype=mx.float32)
    w, scales, _ = rand_weights(3, k, rng("nanclamp"))
    t = mx.array(np.array([[np.nan, np.inf, -np.inf]], np.float32))
    out = ref.to_numpy(
        mx_fp4.w4a16_matmul(x, w, scales, epilogue=[("add", t), ("clamp", -2.0, 2.0)])
    )
    np.testing.assert_array_equal(out[0], [np.nan, 2.0, -2.0])
    out = ref.to_numpy(mx_fp4.w4a16_matmul(x, w, scales, epilogue=[("add", t), "relu"]))
    np.testing.assert_array_equal(out[0], [np.nan, np.inf, 0.0])


def test_overflow_in_output_cast_gives_inf(device):
    """fp32 values beyond fp16 range become +-inf at the final cast (IEEE), not NaN or max."""
    k = 16
    x = mx.zeros((1, k), dtype=mx.float16)
    w, scales, _ = rand_weights(2, k, rng("ovf"))
    out = ref.to_numpy(mx_fp4.w4a16_matmul(x, w, scales, epilogue=[("add", mx.array([1e6, -1e6]))]))
    np.testing.assert_array_equal(out[0], [np.inf, -np.inf])


@pytest.mark.parametrize("m", [1, 5])
def test_operand_from_our_matmul_adds_no_node(device, m):
    """The fused SwiGLU's pattern: the product of one of our matmuls as the full-shape operand of
    the next adds no Reshape or Contiguous node (each node costs host time per decode step), and
    the result equals the unfused one on the same bytes."""
    import io

    g, x, w, scales, _ = setup(("own-operand", m), m=m, x_dtype=mx.bfloat16)
    x = x.reshape(1, m, -1)
    w2, s2, _ = rand_weights(w.shape[0], x.shape[-1], g, layout="uint32")
    mx.eval(x, w, scales, w2, s2)  # as a model's weights and a layer's input are
    u = mx_fp4.w4a16_matmul(x, w, scales)
    y = mx_fp4.w4a16_matmul(x, w2, s2, epilogue=["silu", ("mul", u)])
    dot = io.StringIO()
    mx.export_to_dot(dot, y)
    labels = [line.split('label ="')[1].split('"')[0] for line in dot.getvalue().splitlines() if 'label ="' in line]
    assert labels.count("W4A16Matmul") == 2 and "Reshape" not in labels and "Contiguous" not in labels, labels
    acc = mx_fp4.w4a16_matmul(x, w2, s2, out_dtype=mx.float32)
    expected = (nn.silu(acc) * mx.array(u).astype(mx.float32)).astype(y.dtype)
    # Both sides round fp32 values equal up to fp32 ulps once to bf16: two output roundings.
    tol = TOLERANCES[(mx.bfloat16, mx.bfloat16)]
    np.testing.assert_allclose(
        np.array(y.astype(mx.float32)), np.array(expected.astype(mx.float32)),
        rtol=2 * tol.out_u * SAFETY, atol=2 * tol.out_abs,
    )
