"""Every user error: ValueError raised when the op is called (not at eval), with a message in
MLX's format "[op] <argument> ... but got <actual>." that names the argument."""

import re

import mlx.core as mx
import pytest

import mlx_fp4 as mx_fp4
from common import rand_weights, rng

N, K = 8, 40  # w uint8 [8, 20], uint32 [8, 5], scales [8, 3]


@pytest.fixture(scope="module")
def good():
    g = rng("errors")
    x = mx.zeros((3, K), dtype=mx.bfloat16)
    w8, scales, _ = rand_weights(N, K, g)
    w32, _, _ = rand_weights(N, K, g, layout="uint32")
    return dict(x=x, w=w8, w32=w32, scales=scales)


def call(fn, good, **over):
    args = dict(x=good["x"], w=good["w"], scales=good["scales"])
    kw = {k: over.pop(k) for k in list(over) if k in ("global_scale", "epilogue", "out_dtype")}
    args.update(over)
    return fn(args["x"], args["w"], args["scales"], **kw)


MATMUL_FNS = [
    pytest.param(mx_fp4.w4a16_matmul, id="w4a16_matmul"),
    pytest.param(mx_fp4.w4a16_matmul_reference_ops, id="reference_ops"),
]

# (id, overrides of the good call, regex the message must match after "[w4a16_matmul] ")
MATMUL_ERRORS = [
    ("x-scalar", dict(x=mx.array(1.0)), r"x must have at least 1 dimension .* but got a scalar"),
    (
        "x-int-dtype",
        dict(x=mx.zeros((3, K), dtype=mx.int32)),
        r"x must be float16, bfloat16 or float32 but got int32",
    ),
    ("x-bool-dtype", dict(x=mx.zeros((3, K), dtype=mx.bool_)), r"x must be .* but got bool"),
    ("x-k-zero", dict(x=mx.zeros((3, 0))), r"x must have K >= 1 .* but got shape \(3, 0\)"),
    (
        "w-1d",
        dict(w=mx.zeros((N * 20,), dtype=mx.uint8)),
        r"w must be 2-D .* but got shape \(160,\)",
    ),
    (
        "w-3d",
        dict(w=mx.zeros((1, N, 20), dtype=mx.uint8)),
        r"w must be 2-D .* but got shape \(1, 8, 20\)",
    ),
    (
        "w-float-dtype",
        dict(w=mx.zeros((N, 20), dtype=mx.float32)),
        r"w must be uint8 .* or uint32 .* but got dtype float32",
    ),
    (
        "w-int8-dtype",
        dict(w=mx.zeros((N, 20), dtype=mx.int8)),
        r"w must be uint8 .* but got dtype int8",
    ),
    (
        "w-uint8-k-mismatch",
        dict(w=mx.zeros((N, 16), dtype=mx.uint8)),
        r"w \(uint8\) must have shape \(N, ceil\(K/2\)\) = \(8, 20\) for K = 40 \(from x\) but got \(8, 16\)",
    ),
    (
        "w-uint32-k-mismatch",
        dict(w=mx.zeros((N, 4), dtype=mx.uint32)),
        r"w \(uint32\) must have shape \(N, ceil\(K/8\)\) = \(8, 5\) for K = 40 \(from x\) but got \(8, 4\)",
    ),
    (
        "scales-dtype",
        dict(scales=mx.zeros((N, 3), dtype=mx.float32)),
        r"scales must be uint8 \(E4M3 bits\) but got dtype float32",
    ),
    (
        "scales-n-mismatch",
        dict(scales=mx.zeros((N + 1, 3), dtype=mx.uint8)),
        r"scales must have shape \(N, ceil\(K/16\)\) = \(8, 3\) but got \(9, 3\)",
    ),
    (
        "scales-k-mismatch",
        dict(scales=mx.zeros((N, 2), dtype=mx.uint8)),
        r"scales must have shape .* = \(8, 3\) but got \(8, 2\)",
    ),
    (
        "scales-1d",
        dict(scales=mx.zeros((N * 3,), dtype=mx.uint8)),
        r"scales must have shape .* but got \(24,\)",
    ),
    (
        "out-dtype-int",
        dict(out_dtype=mx.int32),
        r"out_dtype must be float16, bfloat16 or float32 but got int32",
    ),
    ("out-dtype-f64", dict(out_dtype=mx.float64), r"out_dtype must be .* but got float64"),
    (
        "global-scale-shape",
        dict(global_scale=mx.array([1.0, 2.0])),
        r"global_scale must be a scalar .* but got shape \(2,\)",
    ),
    (
        "global-scale-dtype",
        dict(global_scale=mx.array(2, dtype=mx.int32)),
        r"global_scale must be a Python float or a float32 array but got dtype int32",
    ),
    (
        "operand-too-many-dims",
        dict(epilogue=[("add", mx.zeros((2, 3, N)))]),
        r"epilogue\[0\] operand must broadcast to the output shape \(3, 8\) but got shape \(2, 3, 8\)",
    ),
    (
        "operand-wrong-n",
        dict(epilogue=["relu", ("add", mx.zeros((N + 1,)))]),
        r"epilogue\[1\] operand must broadcast to the output shape \(3, 8\) but got shape \(9,\)",
    ),
    (
        "operand-wrong-rows",
        dict(epilogue=[("mul", mx.zeros((2, 1)))]),
        r"epilogue\[0\] operand must broadcast .* but got shape \(2, 1\)",
    ),
    (
        "epilogue-too-many-ops",
        dict(epilogue=["relu"] * 9),
        r"epilogue must have at most 8 ops but got 9",
    ),
    (
        "epilogue-too-many-operands",
        dict(epilogue=[("add", mx.zeros((N,)))] * 5),
        r"epilogue must have at most 4 tensor operands but got 5",
    ),
    (
        "epilogue-unknown-op",
        dict(epilogue=["relu", "swish"]),
        r"epilogue\[1\] has unknown op 'swish'; expected one of add, mul, scale, relu, silu, gelu, gelu_approx, sigmoid, tanh, clamp",
    ),
    (
        "epilogue-unknown-op-tuple",
        dict(epilogue=[("bias", mx.zeros((N,)))]),
        r"epilogue\[0\] has unknown op 'bias'",
    ),
    (
        "epilogue-add-no-operand",
        dict(epilogue=[("add",)]),
        r"epilogue\[0\] \('add'\) expected 1 argument\(s\) but got 0",
    ),
    (
        "epilogue-add-bare-name",
        dict(epilogue=["add"]),
        r"epilogue\[0\] \('add'\) expected 1 argument\(s\) but got 0",
    ),
    (
        "epilogue-relu-with-operand",
        dict(epilogue=[("relu", mx.zeros((N,)))]),
        r"epilogue\[0\] \('relu'\) expected 0 argument\(s\) but got 1",
    ),
    (
        "epilogue-clamp-one-arg",
        dict(epilogue=[("clamp", 1.0)]),
        r"epilogue\[0\] \('clamp'\) expected 2 argument\(s\) but got 1",
    ),
    (
        "epilogue-scale-two-args",
        dict(epilogue=[("scale", 1.0, 2.0)]),
        r"epilogue\[0\] \('scale'\) expected 1 argument\(s\) but got 2",
    ),
    (
        "epilogue-scale-array",
        dict(epilogue=[("scale", mx.array(2.0))]),
        r"epilogue\[0\] constant must be a Python float but got",
    ),
    (
        "epilogue-clamp-array",
        dict(epilogue=[("clamp", mx.array(0.0), 1.0)]),
        r"epilogue\[0\] lo must be a Python float but got",
    ),
    (
        "epilogue-clamp-hi-str",
        dict(epilogue=[("clamp", 0.0, "1")]),
        r"epilogue\[0\] hi must be a Python float but got",
    ),
    (
        "epilogue-clamp-lo-gt-hi",
        dict(epilogue=[("clamp", 2.0, 1.0)]),
        r"epilogue\[0\] clamp expects lo <= hi but got lo = 2, hi = 1",
    ),
    (
        "epilogue-add-str-operand",
        dict(epilogue=[("add", "bias")]),
        r"epilogue\[0\] operand must be .*Python float but got",
    ),
    (
        "epilogue-item-int",
        dict(epilogue=[3]),
        r"epilogue\[0\] must be a name or a \(name, operand...\) tuple but got",
    ),
    (
        "epilogue-item-empty-tuple",
        dict(epilogue=[()]),
        r"epilogue\[0\] must be a name or a \(name, operand...\) tuple but got \(\)",
    ),
    (
        "epilogue-item-tuple-no-name",
        dict(epilogue=[(mx.zeros((N,)), "add")]),
        r"epilogue\[0\] must be a name or a \(name, operand...\) tuple but got",
    ),
    (
        "epilogue-not-a-list",
        dict(epilogue="silu"),
        r"epilogue must be a list of ops, .* but got 'silu'",
    ),
    (
        "epilogue-dict",
        dict(epilogue={"add": 1.0}),
        r"epilogue must be a list of ops, .* but got \{",
    ),
]


@pytest.mark.parametrize("fn", MATMUL_FNS)
@pytest.mark.parametrize("over,pattern", [pytest.param(o, p, id=i) for i, o, p in MATMUL_ERRORS])
def test_w4a16_matmul_errors(good, fn, over, pattern):
    # Raised by the call itself (nothing is evaluated here).
    with pytest.raises(ValueError) as info:
        call(fn, good, **dict(over))
    msg = str(info.value)
    assert msg.startswith("[w4a16_matmul] "), msg
    assert re.search(pattern, msg), f"message {msg!r} does not match {pattern!r}"


def test_uint8_view_of_uint32_words_is_accepted(good):
    """Not an error: uint8 with 4 * ceil(K/8) bytes per row (MLX words viewed as bytes); for
    K = 33 that is 20 bytes, not ceil(K/2) = 17. Any other width is an error."""
    x = mx.zeros((2, 33))
    w33, s33, _ = rand_weights(N, 33, rng("w33"), layout="uint32")
    out = mx_fp4.w4a16_matmul(x, mx.view(w33, mx.uint8), s33)
    assert mx.view(w33, mx.uint8).shape == (N, 20) and out.shape == (2, N)
    with pytest.raises(ValueError, match=r"w \(uint8\) must have shape"):
        mx_fp4.w4a16_matmul(x, mx.zeros((N, 19), dtype=mx.uint8), s33)


def test_errors_do_not_depend_on_layout_uint32(good):
    with pytest.raises(ValueError, match=r"\[w4a16_matmul\] scales must have shape"):
        mx_fp4.w4a16_matmul(good["x"], good["w32"], mx.zeros((N, 2), dtype=mx.uint8))


@pytest.mark.parametrize(
    "transform,pattern",
    [
        ("grad_w", r"gradients with respect to w, scales and global_scale are not supported"),
        ("grad_scales", r"gradients with respect to w, scales and global_scale are not supported"),
        (
            "grad_global_scale",
            r"gradients with respect to w, scales and global_scale are not supported",
        ),
        ("vmap_w", r"vmap over w or scales is not supported"),
        ("vmap_scales", r"vmap over w or scales is not supported"),
        ("vmap_global_scale", r"vmap over global_scale is not supported"),
    ],
)
def test_transform_errors(good, transform, pattern):
    x = good["x"].astype(mx.float32)
    w, s = good["w"], good["scales"]
    f = mx_fp4.w4a16_matmul
    with pytest.raises(ValueError) as info:
        if transform == "grad_w":
            mx.grad(lambda w_: mx.sum(f(x, w_, s)))(w)
        elif transform == "grad_scales":
            mx.grad(lambda s_: mx.sum(f(x, w, s_)))(s)
        elif transform == "grad_global_scale":
            mx.grad(lambda g_: mx.sum(f(x, w, s, global_scale=g_)))(mx.array(0.5))
        elif transform == "vmap_w":
            mx.vmap(lambda w_: f(x, w_, s))(mx.stack([w, w]))
        elif transform == "vmap_scales":
            mx.vmap(lambda s_: f(x, w, s_))(mx.stack([s, s]))
        else:
            mx.vmap(lambda g_: f(x, w, s, global_scale=g_))(mx.array([1.0, 2.0]))
    msg = str(info.value)
    assert msg.startswith("[w4a16_matmul] ") and re.search(pattern, msg), msg


# ----------------------------------------------------------------------------------------------
# quantize / dequantize

QUANTIZE_ERRORS = [
    ("w-1d", mx.zeros((16,)), r"w must be 2-D \[N, K\] or stacked \[..., N, K\] but got shape \(16,\)"),
    ("w-int", mx.zeros((2, 16), dtype=mx.int32), r"w must be a floating dtype .* but got int32"),
    ("w-uint8", mx.zeros((2, 16), dtype=mx.uint8), r"w must be a floating dtype .* but got uint8"),
    ("w-k-zero", mx.zeros((2, 0)), r"w must have K >= 1 columns but got shape \(2, 0\)"),
]


@pytest.mark.parametrize("w,pattern", [pytest.param(w, p, id=i) for i, w, p in QUANTIZE_ERRORS])
@pytest.mark.parametrize("gs", [False, True], ids=["plain", "global_scale"])
def test_quantize_errors(w, pattern, gs):
    with pytest.raises(ValueError) as info:
        mx_fp4.quantize(w, global_scale=gs)
    msg = str(info.value)
    assert msg.startswith("[quantize] ") and re.search(pattern, msg), msg


P8 = mx.zeros((N, 20), dtype=mx.uint8)  # K up to 40
S3 = mx.zeros((N, 3), dtype=mx.uint8)

DEQUANTIZE_ERRORS = [
    (
        "packed-1d",
        dict(packed=mx.zeros((20,), dtype=mx.uint8)),
        r"packed must be 2-D \[N, packed\] but got shape \(20,\)",
    ),
    (
        "packed-float",
        dict(packed=mx.zeros((N, 20))),
        r"packed must be uint8 \[N, ceil\(K/2\)\] or uint32 \[N, ceil\(K/8\)\] but got dtype float32",
    ),
    (
        "packed-int32",
        dict(packed=mx.zeros((N, 5), dtype=mx.int32)),
        r"packed must be uint8 .* but got dtype int32",
    ),
    ("k-too-large", dict(k=41), r"k must be in \[1, 40\] for packed of shape \(8, 20\) but got 41"),
    ("k-zero", dict(k=0), r"k must be in \[1, 40\] .* but got 0"),
    ("k-negative", dict(k=-16), r"k must be in \[1, 40\] .* but got -16"),
    (
        "dtype-int",
        dict(dtype=mx.int32),
        r"dtype must be float16, bfloat16 or float32 but got int32",
    ),
    (
        "scales-dtype",
        dict(scales=mx.zeros((N, 3))),
        r"scales must be uint8 of shape \(N, ceil\(k/16\)\) = \(8, 3\) but got float32 \(8, 3\)",
    ),
    (
        "scales-shape",
        dict(scales=mx.zeros((N, 2), dtype=mx.uint8)),
        r"scales must be uint8 of shape .* = \(8, 3\) but got uint8 \(8, 2\)",
    ),
    (
        "scales-k-mismatch",
        dict(k=16),
        r"scales must be uint8 of shape .* = \(8, 1\) but got uint8 \(8, 3\)",
    ),
    (
        "scales-n",
        dict(scales=mx.zeros((N - 1, 3), dtype=mx.uint8)),
        r"scales must be uint8 of shape .* = \(8, 3\) but got uint8 \(7, 3\)",
    ),
    (
        "global-scale-shape",
        dict(global_scale=mx.zeros((2, 2))),
        r"global_scale must be a scalar .* but got shape \(2, 2\)",
    ),
    (
        "global-scale-dtype",
        dict(global_scale=mx.array(1, dtype=mx.uint8)),
        r"global_scale must be a Python float or a float32 array but got dtype uint8",
    ),
]


@pytest.mark.parametrize(
    "over,pattern", [pytest.param(o, p, id=i) for i, o, p in DEQUANTIZE_ERRORS]
)
def test_dequantize_errors(over, pattern):
    args = dict(packed=P8, scales=S3)
    args.update(over)
    packed, scales = args.pop("packed"), args.pop("scales")
    with pytest.raises(ValueError) as info:
        mx_fp4.dequantize(packed, scales, **args)
    msg = str(info.value)
    assert msg.startswith("[dequantize] ") and re.search(pattern, msg), msg


def test_good_calls_do_not_raise(good):
    """The fixtures above are valid except for the one broken argument."""
    for fn in (mx_fp4.w4a16_matmul, mx_fp4.w4a16_matmul_reference_ops):
        out = call(
            fn, good, global_scale=0.5, epilogue=[("add", mx.zeros((N,))), ("clamp", 0.0, 1.0)]
        )
        mx.eval(out)
        assert out.shape == (3, N)
    mx.eval(mx_fp4.dequantize(P8, S3, k=40, global_scale=mx.array(1.0)))
    mx.eval(mx_fp4.quantize(mx.zeros((2, 16)), global_scale=True))
    assert mx_fp4.dequantize(P8, S3, k=33, dtype=mx.float32).shape == (N, 33)
