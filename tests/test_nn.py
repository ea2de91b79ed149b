"""mlx_fp4.nn: FP4Linear as a drop-in nn.QuantizedLinear(mode="nvfp4"), model conversion,
global scales kept out of parameters(), fused SwiGLU, LoRA on top.

Outputs are checked against the float64 reference (tests/reference.py) within the one
tolerance table (tests/common.py)."""

import math
import warnings

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

import common
import reference as ref
from mlx_fp4 import nn as fnn
from mlx_fp4.nn import FP4Linear


def _linear(k, n, bias=True, seed=0, scale=1.0):
    g = common.rng("linear", k, n, bias, seed)
    lin = nn.Linear(k, n, bias=bias)
    w = common.rand_float_weights(n, k, g, scale=scale / math.sqrt(k))
    lin.weight = mx.array(w)
    if bias:
        lin.bias = mx.array(g.standard_normal(n).astype(np.float32))
    return lin


def _check_layer(layer, x):
    """layer(x) against the float64 reference of its own bytes (+ bias, * global scale)."""
    out = layer(x)
    epi = [("add", layer.bias)] if "bias" in layer else None
    out_dtype = out.dtype
    common.check_matmul(
        out,
        x,
        layer.weight,
        layer.scales,
        global_scale=layer.global_scale,
        epilogue=epi,
        out_dtype=out_dtype,
    )
    return out


# ----------------------------------------------------------------------------------------------
# the drop-in contract


@pytest.mark.parametrize("bias", [True, False])
def test_from_linear_matches_quantized_linear_layout(bias):
    lin = _linear(64, 48, bias=bias)
    q = FP4Linear.from_linear(lin)
    ref_q = nn.QuantizedLinear.from_linear(lin, mode="nvfp4")
    assert isinstance(q, nn.QuantizedLinear)
    assert (q.group_size, q.bits, q.mode) == (16, 4, "nvfp4")
    p, rp = dict(tree_flatten(q.parameters())), dict(tree_flatten(ref_q.parameters()))
    assert p.keys() == rp.keys()
    for k in p:
        assert p[k].dtype == rp[k].dtype and p[k].shape == rp[k].shape, k
    assert q.weight.dtype == mx.uint32 and q.weight.shape == (48, 8)
    assert q.scales.dtype == mx.uint8 and q.scales.shape == (48, 4)
    assert q.get("biases") is None and q.biases is None
    assert tree_flatten(q.trainable_parameters()) == []  # frozen like QuantizedLinear
    assert "input_dims=64, output_dims=48" in repr(q)
    assert (q.input_dims, q.output_dims) == (64, 48)
    # mlx-lm derives K from weight.shape[1] * 32 // bits
    assert q.weight.shape[1] * 32 // q.bits == 64


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16, mx.float32])
@pytest.mark.parametrize("global_scale", [False, True])
def test_forward_against_reference(dtype, global_scale, device):
    lin = _linear(96, 40, seed=1)
    lin.bias = lin.bias.astype(dtype)
    q = FP4Linear.from_linear(lin, global_scale=global_scale)
    if global_scale:  # MLX's convention: the tensor amax
        amax = np.float32(np.abs(np.array(lin.weight)).max())
        assert q.global_scale.dtype == mx.float32 and q.global_scale.shape == (1,)
        assert q.global_scale.item() == amax
    else:
        assert q.global_scale is None
    x = common.rand_x((3, 5, 96), dtype, common.rng("x", dtype))
    out = _check_layer(q, x)
    assert out.dtype == dtype and out.shape == (3, 5, 40)


def test_output_dtype_promotes_like_quantized_linear():
    lin = _linear(32, 16)  # fp32 bias
    q = FP4Linear.from_linear(lin)
    x = mx.ones((2, 32), dtype=mx.bfloat16)
    assert q(x).dtype == nn.QuantizedLinear.from_linear(lin, mode="nvfp4")(x).dtype


def test_from_quantized_shares_arrays_and_matches_mlx():
    lin = _linear(64, 32, seed=2)
    mq = nn.QuantizedLinear.from_linear(lin, mode="nvfp4")
    q = FP4Linear.from_quantized(mq)
    assert q.weight is mq.weight and q.scales is mq.scales and q.bias is mq.bias
    x = common.rand_x((4, 64), mx.float32, common.rng("fq"))
    _check_layer(q, x)
    # MLX's own nvfp4 layer decodes the same bytes (fp32 x, so ~fp32 agreement)
    np.testing.assert_allclose(np.array(q(x)), np.array(mq(x)), rtol=1e-5, atol=1e-5)


def test_constructor_and_errors():
    q = FP4Linear(32, 8, bias=False)
    assert q.weight.shape == (8, 4) and q.scales.shape == (8, 2) and "bias" not in q
    q = FP4Linear(32, 8, group_size=16, bits=4, mode="nvfp4", global_scale=0.5)
    assert float(q.global_scale) == 0.5 and "bias" in q
    with pytest.raises(ValueError, match="multiple of 16"):
        FP4Linear(24, 8)
    with pytest.raises(ValueError, match="mode"):
        FP4Linear(32, 8, mode="affine")
    with pytest.raises(ValueError, match="group_size"):
        FP4Linear(32, 8, group_size=32)
    with pytest.raises(ValueError, match="nvfp4"):
        FP4Linear.from_quantized(nn.QuantizedLinear(64, 8, mode="affine"))
    with pytest.raises(ValueError, match="nvfp4"):
        FP4Linear.from_quantized(nn.Linear(64, 8))
    with pytest.raises(ValueError, match="scalar"):
        q.global_scale = mx.ones((2,))


def test_global_scale_is_a_frozen_parameter():
    q = FP4Linear.from_linear(_linear(64, 32), global_scale=True)
    keys = {k for k, _ in tree_flatten(q.parameters())}
    assert keys == {"weight", "scales", "bias", "global_scale"}
    assert tree_flatten(q.trainable_parameters()) == []
    q.global_scale = 2.0  # python float accepted, stored fp32 [1]
    assert q["global_scale"].dtype == mx.float32 and q["global_scale"].shape == (1,)
    assert q.global_scale.item() == 2.0 and tree_flatten(q.trainable_parameters()) == []
    q.load_weights(list(tree_flatten(q.parameters())))  # strict round trip
    q.global_scale = None
    assert q.global_scale is None and "global_scale" not in q
    assert {k for k, _ in tree_flatten(q.parameters())} == {"weight", "scales", "bias"}
    for bad, match in [(True, "bool"), (mx.ones((2,)), "one element"), (mx.array(1, mx.int32), "floating"),
                       ("1.0", "str")]:
        with pytest.raises(ValueError, match=match):
            q.global_scale = bad


def test_biases_read_refuses_to_drop_the_global_scale():
    q = FP4Linear.from_linear(_linear(64, 32))
    assert q.biases is None and q.get("biases") is None
    q.global_scale = 1.0
    with pytest.raises(ValueError, match="global_scale.*mlx_fp4.nn.dequantize"):
        q.biases


# ----------------------------------------------------------------------------------------------
# model conversion


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 32)
        self.a = _linear(32, 64, seed=3)
        self.b = nn.QuantizedLinear.from_linear(_linear(64, 32, bias=False, seed=4), mode="nvfp4")
        self.c = nn.QuantizedLinear.from_linear(_linear(64, 32, seed=5), mode="affine")
        self.odd = nn.Linear(24, 32)  # K % 16 != 0
        self.blocks = [nn.Sequential(_linear(32, 32, seed=6), nn.ReLU()) for _ in range(2)]
        self.norm = nn.RMSNorm(32)


def test_quantize_model_default():
    net = _Net()
    b_weight = net.b.weight
    summary = fnn.quantize(net, progress=False)
    assert summary.model is net
    assert isinstance(net.a, FP4Linear)
    assert isinstance(net.b, FP4Linear) and net.b.weight is b_weight  # no byte copy
    assert type(net.c) is nn.QuantizedLinear  # affine left alone
    assert type(net.odd) is nn.Linear
    assert isinstance(net.embed, nn.Embedding) and isinstance(net.norm, nn.RMSNorm)
    assert all(isinstance(b.layers[0], FP4Linear) for b in net.blocks)
    x = common.rand_x((2, 32), mx.bfloat16, common.rng("qm"))
    _check_layer(net.a, x)
    # the summary says what happened and why
    assert set(summary.converted) == {"a", "b", "blocks.0.layers.0", "blocks.1.layers.0"}
    assert summary.converted["b"].startswith("wrapped")
    assert "K=24" in summary.skipped["odd"] and "affine" in summary.skipped["c"]
    assert "Embedding" in summary.skipped["embed"]
    assert set(summary.errors) == {"a", "blocks.0.layers.0", "blocks.1.layers.0"}
    assert all(0 < e < 0.2 for e in summary.errors.values())
    assert "bits per weight" in str(summary) and 4.5 < summary.bits_per_weight < 32


def test_quantize_has_mlx_nn_quantize_signature():
    for args, kw in [((16, 4), {}), ((), dict(group_size=16, bits=4, mode="nvfp4")), ((None, None), {})]:
        net = _Net()
        fnn.quantize(net, *args, progress=False, **kw)
        assert isinstance(net.a, FP4Linear)
    for args, kw, match in [
        ((32,), {}, "group_size expected 16"),
        ((16, 8), {}, "bits expected 4"),
        ((16,), dict(mode="mxfp4"), "group_size expected 32"),
        ((), dict(mode="affine"), "mode expected 'nvfp4'"),
        ((), dict(quantize_input=True), "weight-only"),
        ((), dict(global_scale="yes"), "global_scale expected True, False or 'auto'"),
    ]:
        with pytest.raises(ValueError, match=match):
            fnn.quantize(_Net(), *args, progress=False, **kw)


def _small_net(sigma, outlier=None):
    net = nn.Sequential(nn.Linear(64, 48, bias=False))
    w = common.rng("small", sigma).standard_normal((48, 64)).astype(np.float32) * sigma
    if outlier is not None:
        w[0, 0] = outlier
    net.layers[0].weight = mx.array(w)
    return net


def test_underflow_warns_and_auto_picks_the_lower_error():
    with pytest.warns(UserWarning, match="zero E4M3 block scales"):
        plain = fnn.quantize(_small_net(2e-4), global_scale=False, progress=False)
    assert plain.underflow["layers.0"] > 0.9 and plain.errors["layers.0"] > 0.9  # all zeros
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        auto = fnn.quantize(_small_net(2e-4), progress=False)  # default "auto"
    assert auto.converted["layers.0"] == "quantized + global scale"
    assert auto.errors["layers.0"] < 0.15 and not auto.underflow
    # weights of magnitude ~0.2: both errors agree within 1%, so no global scale is kept
    # (the layer stays loadable by stock mlx-lm)
    with_gs = fnn.quantize(_small_net(0.2), global_scale=True, progress=False)
    auto = fnn.quantize(_small_net(0.2), progress=False)
    assert auto.converted["layers.0"] == "quantized"
    assert auto.errors["layers.0"] < with_gs.errors["layers.0"] * 1.01


def test_dequantize_model_applies_global_scale():
    net = _Net()
    fnn.quantize(net, global_scale=True, progress=False)
    q = net.a
    fnn.dequantize(net, dtype=mx.float32)
    assert type(net.a) is nn.Linear
    want = ref.decode_weights(q.weight, q.scales, 32, ref.multiplier(q.global_scale))
    np.testing.assert_allclose(np.array(net.a.weight), want, rtol=2**-23, atol=0)
    assert net.a.bias is q.bias


def test_load_weights_attaches_global_scales_and_swaps_layers():
    src = _Net()
    fnn.quantize(src, global_scale=True, progress=False)
    dst = _Net()
    weights = dict(tree_flatten(src.parameters()))
    weights.update(fnn.global_scales(src))
    from mlx_fp4.checkpoints import NVFP4Weights

    fnn.load_weights(dst, NVFP4Weights(weights))
    assert isinstance(dst.a, FP4Linear) and dst.a.global_scale.item() == src.a.global_scale.item()
    assert dst.a.weight is src.a.weight
    x = common.rand_x((2, 32), mx.float32, common.rng("lw"))
    np.testing.assert_array_equal(np.array(dst.a(x)), np.array(src.a(x)))
    bad = NVFP4Weights(weights)
    bad["norm.global_scale"] = mx.array(1.0)
    with pytest.raises(ValueError, match="norm.global_scale"):
        fnn.load_weights(_Net(), bad)


# ----------------------------------------------------------------------------------------------
# SwiGLU


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("global_scale", [False, True])
def test_fused_swiglu_against_reference(bias, global_scale, device):
    gate = FP4Linear.from_linear(_linear(64, 96, bias=bias, seed=7), global_scale=global_scale)
    up = FP4Linear.from_linear(_linear(64, 96, bias=bias, seed=8), global_scale=global_scale)
    x = common.rand_x((2, 3, 64), mx.bfloat16, common.rng("swiglu"))
    u = _check_layer(up, x)
    out = fnn.swiglu(x, gate, up)
    epi = ([("add", gate.bias)] if bias else []) + ["silu", ("mul", u)]
    common.check_matmul(
        out, x, gate.weight, gate.scales, global_scale=gate.global_scale, epilogue=epi,
        out_dtype=out.dtype,
    )
    # the unfused form agrees to bf16 rounding of the intermediates
    unfused = nn.silu(gate(x)) * up(x)
    np.testing.assert_allclose(
        np.array(out.astype(mx.float32)), np.array(unfused.astype(mx.float32)),
        rtol=3 * 2**-8, atol=3 * 2**-8 * float(mx.abs(unfused).max()),
    )


def test_fuse_swiglu_on_mlx_lm_llama(device):
    from mlx_lm.models import llama

    args = llama.ModelArgs(
        model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=96,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=64,
        tie_word_embeddings=True,
    )
    mx.random.seed(0)
    model = llama.Model(args)
    fnn.quantize(model, progress=False)
    tokens = mx.array([[1, 5, 9, 3]])
    before = model(tokens)
    fnn.fuse_swiglu(model)
    assert all(isinstance(l.mlp, fnn.FP4SwiGLU) for l in model.model.layers)
    assert isinstance(model.model.layers[0].self_attn.q_proj, FP4Linear)  # untouched
    after = model(tokens)
    np.testing.assert_allclose(np.array(after), np.array(before), rtol=1e-4, atol=1e-4)
    # parameter names unchanged: the same weights load strictly
    model.load_weights(list(tree_flatten(model.parameters())))


def test_fuse_swiglu_skips_gelu_gated_mlp():
    class GeluMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = FP4Linear(32, 32)
            self.up_proj = FP4Linear(32, 32)
            self.down_proj = FP4Linear(32, 32)

        def __call__(self, x):
            return self.down_proj(nn.gelu_approx(self.gate_proj(x)) * self.up_proj(x))

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = GeluMLP()

    m = fnn.fuse_swiglu(M())
    assert isinstance(m.mlp, GeluMLP)


# ----------------------------------------------------------------------------------------------
# LoRA on top (mlx-lm)


def _lora_stack(from_base):
    mx.random.seed(1)
    base1 = FP4Linear.from_linear(_linear(64, 64, seed=9), global_scale=True)
    base2 = FP4Linear.from_linear(_linear(64, 32, seed=10))
    l1, l2 = from_base(base1), from_base(base2)
    for l in (l1, l2):  # non-zero B so that grad wrt A is non-zero too
        l.lora_b = mx.array(common.rng("b", l.lora_b.shape).standard_normal(l.lora_b.shape)
                            .astype(np.float32) * 0.1)
    return l1, l2


def _dense_twin(lora):
    """The same LoRA layer over an fp32 nn.Linear with the dequantized weight."""
    from mlx_lm.tuner.lora import LoRALinear

    base = lora.linear.to_linear(mx.float32)
    twin = LoRALinear.from_base(base, r=lora.lora_a.shape[1], scale=lora.scale)
    twin.lora_a, twin.lora_b = lora.lora_a, lora.lora_b
    return twin


@pytest.mark.parametrize("how", ["from_base", "to_lora"])
def test_lora_forward_backward(how, device):
    from mlx_lm.tuner.lora import LoRALinear

    if how == "from_base":
        from_base = lambda b: LoRALinear.from_base(b, r=4, scale=2.0)
    else:
        from_base = lambda b: b.to_lora(r=4, scale=2.0)
    l1, l2 = _lora_stack(from_base)
    assert isinstance(l1, LoRALinear) and isinstance(l1.linear, FP4Linear)
    model = nn.Sequential(l1, nn.ReLU(), l2)
    twin = nn.Sequential(_dense_twin(l1), nn.ReLU(), _dense_twin(l2))
    # only the LoRA matrices are trainable
    trainable = {k for k, _ in tree_flatten(model.trainable_parameters())}
    assert trainable == {f"layers.{i}.{n}" for i in (0, 2) for n in ("lora_a", "lora_b")}

    x = common.rand_x((5, 64), mx.float32, common.rng("lora-x"))
    y = common.rand_x((5, 32), mx.float32, common.rng("lora-y"))

    def loss(m):
        return mx.mean((m(x) - y) ** 2)

    lv, grads = nn.value_and_grad(model, loss)(model)
    tv, tgrads = nn.value_and_grad(twin, loss)(twin)
    np.testing.assert_allclose(float(lv), float(tv), rtol=1e-4)
    g, tg = dict(tree_flatten(grads)), dict(tree_flatten(tgrads))
    assert g.keys() == trainable
    for k in g:
        assert float(mx.abs(g[k]).max()) > 0, k
        np.testing.assert_allclose(np.array(g[k]), np.array(tg[k]), rtol=1e-3, atol=1e-5, err_msg=k)


def test_lora_fuse_keeps_global_scale():
    l1, _ = _lora_stack(lambda b: b.to_lora(r=4, scale=2.0))
    dense = l1.fuse(dequantize=True)
    assert type(dense) is nn.Linear
    want = ref.decode_weights(l1.linear.weight, l1.linear.scales, 64, ref.multiplier(l1.linear.global_scale))
    want = want + 2.0 * (np.array(l1.lora_b).T @ np.array(l1.lora_a).T)
    np.testing.assert_allclose(np.array(dense.weight), want, rtol=1e-5, atol=1e-6)
    fused = l1.fuse()
    assert isinstance(fused, FP4Linear) and fused.global_scale is not None
    x = common.rand_x((3, 64), mx.float32, common.rng("fuse"))
    err = np.abs(np.array(fused(x)) - np.array(l1(x))).max()
    assert err < 0.15 * np.abs(np.array(l1(x))).max()  # re-quantization error only


def test_linear_to_lora_layers_uses_fp4_lora():
    from mlx_lm.tuner.utils import linear_to_lora_layers

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = FP4Linear(32, 32)

        def __call__(self, x):
            return self.q_proj(x)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = [Block(), Block()]

    m = M()
    linear_to_lora_layers(m, 2, {"rank": 4, "scale": 10.0, "dropout": 0.0, "keys": ["q_proj"]})
    assert type(m.layers[1].q_proj).__name__ == "FP4LoRALinear"
    assert isinstance(m.layers[1].q_proj.linear, FP4Linear)


def test_fuse_swiglu_is_opt_in_by_type():
    class PreNormMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = FP4Linear(32, 32)
            self.up_proj = FP4Linear(32, 32)
            self.down_proj = FP4Linear(32, 32)

        def __call__(self, x):
            x = 2 * x
            return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))

    class SiluMLP(PreNormMLP):
        def __call__(self, x):
            return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = PreNormMLP()
            self.b = SiluMLP()

    m = M()
    x = mx.ones((1, 32))
    before = m.b(x)
    fnn.fuse_swiglu(m)  # neither class is a known mlx-lm MLP: nothing is guessed
    assert type(m.a) is PreNormMLP and type(m.b) is SiluMLP
    fnn.fuse_swiglu(m, [SiluMLP])
    assert type(m.a) is PreNormMLP and isinstance(m.b, fnn.FP4SwiGLU)
    np.testing.assert_allclose(np.array(m.b(x)), np.array(before), rtol=1e-5, atol=1e-5)
    m = M()
    fnn.fuse_swiglu(m, class_predicate=lambda path, mod: path == "a")
    assert isinstance(m.a, fnn.FP4SwiGLU) and type(m.b) is SiluMLP


def test_swiglu_mlp_list_matches_installed_mlx_lm():
    """Every class named in SWIGLU_MLPS has the single-statement SwiGLU forward."""
    import ast
    import importlib
    import inspect
    import textwrap

    from mlx_fp4.layers.swiglu import SWIGLU_MLPS

    want = "self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))"
    for name in sorted(SWIGLU_MLPS):
        module, _, cls = name.rpartition(".")
        call = getattr(importlib.import_module(module), cls).__call__
        fn = ast.parse(textwrap.dedent(inspect.getsource(call))).body[0]
        body = [st for st in fn.body if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant))]
        assert [a.arg for a in fn.args.args] == ["self", "x"], name
        assert len(body) == 1 and isinstance(body[0], ast.Return), name
        assert ast.unparse(body[0].value) == want, name


def test_quantize_rejects_activation_quantization():
    with pytest.raises(ValueError, match="weight-only"):
        fnn.quantize(_Net(), class_predicate=lambda p, m: {"quantize_input": True}, progress=False)
