"""LoRA on FP4 experts (mlx-lm's tuner): FP4SwitchLinear.to_lora gives mlx-lm's LoRASwitchLinear
over the FP4 experts, so linear_to_lora_layers adapts an FP4 MoE model's experts where it adapts
its own nvfp4 QuantizedSwitchLinear; forward and gradients match the float64 reference and a
float twin, and fuse() keeps the per-expert global scale (mlx-lm's own fuse drops it)."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

import common
import reference as ref
from mlx_fp4 import nn as fnn

lora_mod = pytest.importorskip("mlx_lm.tuner.lora")
from mlx_lm.models.switch_layers import SwitchLinear  # noqa: E402
from mlx_lm.tuner.utils import linear_to_lora_layers  # noqa: E402

E, N, K, R, SCALE = 4, 24, 64, 4, 2.0
TOKENS, TOP_K = 5, 2


def _lora(global_scale):
    mx.random.seed(3)
    sl = SwitchLinear(K, N, E, bias=True)
    sl.bias = mx.array(common.rng("lora-bias").standard_normal((E, N)).astype(np.float32))
    base = fnn.FP4SwitchLinear.from_switch_linear(sl, global_scale=global_scale)
    lora = base.to_lora(r=R, scale=SCALE)
    g = common.rng("lora-b", global_scale)
    lora.lora_b = mx.array(0.1 * g.standard_normal(lora.lora_b.shape).astype(np.float32))
    return lora


def _inputs():
    g = common.rng("lora-inputs")
    x = mx.array(g.standard_normal((TOKENS, 1, 1, K)).astype(np.float32))
    idx = mx.array(np.stack([g.choice(E, TOP_K, replace=False) for _ in range(TOKENS)]).astype(np.uint32))
    return x, idx


def _decoded(base):
    """[E, N, K] float64 through ml_dtypes (reference.decode_weights), per-expert multiplier."""
    gs = base.get("global_scale")
    return np.stack([ref.decode_weights(base.weight[e], base.scales[e], K,
                                        None if gs is None else ref.multiplier(gs[e])) for e in range(E)])


@pytest.mark.parametrize("global_scale", [False, True])
def test_forward_matches_float64_reference(device, global_scale):
    lora = _lora(global_scale)
    assert type(lora).__name__ == "FP4LoRASwitchLinear" and isinstance(lora, lora_mod.LoRASwitchLinear)
    assert isinstance(lora.linear, fnn.FP4SwitchLinear)
    x, idx = _inputs()
    y = lora(x, idx)
    assert y.shape == (TOKENS, TOP_K, 1, N)
    w, b = _decoded(lora.linear), np.array(lora.linear.bias, dtype=np.float64)
    a, bb = np.array(lora.lora_a, dtype=np.float64), np.array(lora.lora_b, dtype=np.float64)
    xs, ids = np.array(x, dtype=np.float64)[:, 0, 0], np.array(idx)
    want = np.empty((TOKENS, TOP_K, 1, N))
    mag = np.empty_like(want)
    for t in range(TOKENS):
        for j, e in enumerate(ids[t]):
            z = a[e] @ xs[t]
            want[t, j, 0] = w[e] @ xs[t] + b[e] + SCALE * (bb[e] @ z)
            ax = np.abs(xs[t])
            mag[t, j, 0] = np.abs(w[e]) @ ax + np.abs(b[e]) + SCALE * (np.abs(bb[e]) @ (np.abs(a[e]) @ ax))
    # fp32 everywhere: the table's (fp32, fp32) accumulation term over K (and R) additions.
    tol = common.TOLERANCES[(mx.float32, mx.float32)]
    bound = common.SAFETY * ((K + R) * tol.acc_u + tol.product_u + tol.out_u) * mag
    common.assert_close(y, want, bound, "LoRA over FP4 experts")


def test_gradients_match_the_float_twin():
    """Only lora_a / lora_b train; their gradients equal those of mlx-lm's LoRASwitchLinear over a
    float SwitchLinear holding the decoded weights (same float32 math but the expert matmul)."""
    lora = _lora(True)
    twin = lora_mod.LoRASwitchLinear.from_base(lora.linear.to_switch_linear(mx.float32), r=R, scale=SCALE)
    twin.lora_a, twin.lora_b = lora.lora_a, lora.lora_b
    twin.linear.freeze()
    assert {k for k, _ in tree_flatten(lora.trainable_parameters())} == {"lora_a", "lora_b"}
    x, idx = _inputs()
    target = mx.array(common.rng("lora-target").standard_normal((TOKENS, TOP_K, 1, N)).astype(np.float32))

    def loss(m):
        return mx.mean((m(x, idx) - target) ** 2)

    lv, grads = nn.value_and_grad(lora, loss)(lora)
    tv, tgrads = nn.value_and_grad(twin, loss)(twin)
    np.testing.assert_allclose(float(lv), float(tv), rtol=1e-4)
    g, tg = dict(tree_flatten(grads)), dict(tree_flatten(tgrads))
    assert g.keys() == tg.keys() == {"lora_a", "lora_b"}
    for k in g:
        assert float(mx.abs(g[k]).max()) > 0, k
        np.testing.assert_allclose(np.array(g[k]), np.array(tg[k]), rtol=1e-3, atol=1e-5, err_msg=k)


@pytest.mark.parametrize("global_scale", [False, True])
def test_fuse_keeps_the_global_scale(global_scale):
    lora = _lora(global_scale)
    dense = lora.fuse(dequantize=True)
    assert type(dense) is SwitchLinear
    want = _decoded(lora.linear) + SCALE * (np.array(lora.lora_b, np.float64) @ np.array(lora.lora_a, np.float64))
    np.testing.assert_allclose(np.array(dense.weight), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.array(dense.bias), np.array(lora.linear.bias))
    fused = lora.fuse()
    assert isinstance(fused, fnn.FP4SwitchLinear) and fused.mode == lora.linear.mode
    assert (fused.get("global_scale") is not None) == global_scale
    # the fused experts are the nvfp4 quantization of the fused float weights, byte for byte
    requant = fnn.FP4SwitchLinear.from_switch_linear(dense, global_scale=global_scale)
    for name in ("weight", "scales", "bias") + (("global_scale",) if global_scale else ()):
        assert mx.array_equal(fused[name], requant[name]).item(), name


def test_linear_to_lora_layers_adapts_fp4_experts():
    """Default keys: the FP4 model gets LoRA on the same modules as mlx-lm's own nvfp4 model."""
    import copy

    from test_moe_e2e import MODELS, build

    model = build("qwen3_moe")
    theirs = copy.deepcopy(model)
    nn.quantize(theirs, group_size=16, bits=4, mode="nvfp4")
    fnn.quantize(model, progress=False)
    config = {"rank": R, "scale": SCALE, "dropout": 0.0}
    for m in (model, theirs):
        m.freeze()
        linear_to_lora_layers(m, 2, config)
    ours = {k: type(m).__name__ for k, m in model.named_modules() if isinstance(m, lora_mod.LoRASwitchLinear)}
    want = {k: type(m).__name__ for k, m in theirs.named_modules() if isinstance(m, lora_mod.LoRASwitchLinear)}
    assert ours.keys() == want.keys() and len(ours) == 3 * 2
    assert set(ours.values()) == {"FP4LoRASwitchLinear"}
    trainable = {k for k, _ in tree_flatten(model.trainable_parameters())}
    assert trainable == {k for k, _ in tree_flatten(theirs.trainable_parameters())}
    y = model(mx.array([[1, 2, 3]]))  # the adapted model runs
    assert y.shape == (1, 3, MODELS["qwen3_moe"]["vocab_size"])
