"""MXFP4 models end to end on a tiny random gpt-oss (mlx-lm's gpt_oss architecture, no downloads):
the Hugging Face MXFP4 layout (``quant_method: mxfp4``, experts as ``*_blocks`` / ``*_scales``,
read by mlx-lm's own sanitize), an mlx-community-style mxfp4 folder (MLX's nn.quantize +
mlx_lm.utils.save_model) and mx_fp4.nn.quantize(mode="mxfp4"): FP4 layers over the same bytes,
greedy tokens equal to the same model holding the dequantized weights, logits next to MLX's own
mxfp4 kernels. Also FP4Linear / FP4SwitchLinear as drop-ins for MLX's mxfp4 layers."""

import copy
import json

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from lm_fixtures import greedy, same_greedy
from mlx_fp4 import nn as fnn

lm_utils = pytest.importorskip("mlx_lm.utils")
from mlx_lm.models import gpt_oss  # noqa: E402
from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear  # noqa: E402

ARGS = dict(model_type="gpt_oss", num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2,
            vocab_size=256, hidden_size=64, intermediate_size=64, head_dim=16, num_attention_heads=4,
            num_key_value_heads=2, sliding_window=8, rope_theta=150000,
            layer_types=["sliding_attention", "full_attention"])
MXFP4 = {"group_size": 32, "bits": 4, "mode": "mxfp4"}
# MLX's kernels round their dequantized weights and accumulate in the model's dtype (fp32 here):
# next to ours within this, not bit for bit.
MLX_LOGIT_ATOL = 1e-3


def build(seed=0):
    mx.random.seed(seed)
    model = gpt_oss.Model(gpt_oss.ModelArgs.from_dict(ARGS))
    mx.eval(model.parameters())
    return model


def dequantized_twin(model):
    twin = copy.deepcopy(model)
    fnn.dequantize(twin, dtype=mx.float32)
    assert not any(isinstance(m, (fnn.FP4Linear, fnn.FP4SwitchLinear)) for _, m in twin.named_modules())
    return twin


def interleave(a, b):
    """Rows of a and b alternating along axis 1 (gpt-oss's fused gate_up_proj: gate rows even)."""
    return mx.stack([a, b], axis=2).reshape(a.shape[0], 2 * a.shape[1], *a.shape[2:])


def write_hf_checkpoint(folder, model):
    """The layout of openai/gpt-oss-*: experts as MXFP4 blocks [E, N, K/32, 16] and E8M0 scales,
    gate and up fused row-interleaved; everything else float under mlx-lm's names."""
    weights = {k: v for k, v in tree_flatten(model.parameters()) if ".mlp.experts." not in k}
    for i, layer in enumerate(model.model.layers):
        ex, p = layer.mlp.experts, f"model.layers.{i}.mlp.experts"
        parts = {}
        for name in ("gate_proj", "up_proj", "down_proj"):
            q, s = mx.quantize(getattr(ex, name).weight, mode="mxfp4")
            e, n, words = q.shape
            parts[name] = (q.view(mx.uint8).reshape(e, n, words * 4 // 16, 16), s, getattr(ex, name).bias)
        (gq, gs, gb), (uq, us, ub), (dq, ds, db) = parts["gate_proj"], parts["up_proj"], parts["down_proj"]
        weights.update({
            f"{p}.gate_up_proj_blocks": interleave(gq, uq), f"{p}.gate_up_proj_scales": interleave(gs, us),
            f"{p}.gate_up_proj_bias": interleave(gb[..., None], ub[..., None]).squeeze(-1),
            f"{p}.down_proj_blocks": dq, f"{p}.down_proj_scales": ds, f"{p}.down_proj_bias": db,
        })
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    (folder / "config.json").write_text(json.dumps(dict(ARGS, quantization_config={"quant_method": "mxfp4"})))
    return folder


def experts_of(model):
    return [m for _, m in model.named_modules() if isinstance(m, fnn.FP4SwitchLinear)]


def test_hugging_face_gpt_oss_checkpoint(tmp_path):
    folder = write_hf_checkpoint(tmp_path / "hf", build())
    ours, _ = fnn.load_model(folder)
    experts = experts_of(ours)
    assert len(experts) == 3 * ARGS["num_hidden_layers"]
    assert all(m.mode == "mxfp4" and m.scales.shape[-1] == m.input_dims // 32 for m in experts)
    assert not any(isinstance(m, (QuantizedSwitchLinear, SwitchLinear)) for _, m in ours.named_modules())
    theirs, _ = lm_utils.load_model(folder)  # mlx-lm's own load: MLX's mxfp4 QuantizedSwitchLinear
    for (path, a), (_, b) in zip(tree_flatten(ours.parameters()), tree_flatten(theirs.parameters())):
        assert a.dtype == b.dtype and mx.array_equal(a, b).item(), path  # the same bytes
    got = greedy(ours)
    same_greedy(got, greedy(dequantized_twin(ours)))
    same_greedy(got, greedy(theirs), atol=MLX_LOGIT_ATOL)


def test_mlx_community_mxfp4_folder(tmp_path):
    """What mlx_lm.convert -q --q-mode mxfp4 writes: every linear and expert in MLX's mxfp4
    layers, the embedding too (left to MLX)."""
    model = build(1)
    nn.quantize(model, group_size=32, bits=4, mode="mxfp4", class_predicate=lambda p, m: hasattr(m, "to_quantized"))
    folder = tmp_path / "mlx"
    lm_utils.save_model(folder, model)
    lm_utils.save_config(dict(ARGS, quantization=MXFP4), folder / "config.json")
    ours, _ = fnn.load_model(folder)
    kinds = {type(m).__name__ for _, m in ours.named_modules() if hasattr(m, "scales")}
    assert kinds == {"FP4Linear", "FP4SwitchLinear", "QuantizedEmbedding"}, kinds
    assert all(m.mode == "mxfp4" for _, m in ours.named_modules() if isinstance(m, fnn.FP4Linear))
    got = greedy(ours)
    same_greedy(got, greedy(dequantized_twin(ours)))
    same_greedy(got, greedy(model), atol=MLX_LOGIT_ATOL)


def test_nn_quantize_mode_mxfp4():
    model = build(2)
    summary = fnn.quantize(model, mode="mxfp4", progress=False)
    assert "MXFP4" in str(summary) and not summary.underflow
    assert len(experts_of(model)) == 3 * ARGS["num_hidden_layers"]
    linears = [m for _, m in model.named_modules() if isinstance(m, fnn.FP4Linear)]
    assert linears and all(m.mode == "mxfp4" and "global_scale" not in m for m in linears)
    same_greedy(greedy(model), greedy(dequantized_twin(model)))
    with pytest.raises(ValueError, match="global_scale is only supported for mode 'nvfp4'"):
        fnn.quantize(build(), mode="mxfp4", global_scale=True, progress=False)
    with pytest.raises(ValueError, match="group_size expected 32"):
        fnn.quantize(build(), 16, 4, mode="mxfp4", progress=False)


@pytest.mark.parametrize("bias", [False, True])
def test_layers_are_drop_ins_for_mlx_mxfp4_layers(bias):
    mx.random.seed(3)
    q = nn.QuantizedLinear(96, 40, bias=bias, mode="mxfp4")
    ours = fnn.FP4Linear.from_quantized(q)
    assert ours["weight"] is q["weight"] or mx.array_equal(ours["weight"], q["weight"]).item()
    assert (ours.group_size, ours.bits, ours.mode) == (32, 4, "mxfp4")
    x = mx.random.normal((3, 96))
    np.testing.assert_allclose(np.array(ours(x)), np.array(q(x)), atol=1e-4)
    qs = QuantizedSwitchLinear(64, 24, 5, bias=bias, group_size=32, bits=4, mode="mxfp4")
    ours_s = fnn.FP4SwitchLinear.from_quantized(qs)
    idx = mx.array([[0, 3], [4, 1]])
    xs = mx.random.normal((2, 1, 1, 64))
    np.testing.assert_allclose(np.array(ours_s(xs, idx)), np.array(qs(xs, idx)), atol=1e-4)
    fresh = fnn.FP4Linear(64, 8, mode="mxfp4")
    assert fresh.scales.shape == (8, 2)
    with pytest.raises(ValueError, match="global_scale is only supported"):
        fnn.FP4Linear(64, 8, mode="mxfp4", global_scale=1.0)
    with pytest.raises(ValueError, match="multiple of 32"):
        fnn.FP4Linear(48, 8, mode="mxfp4")
