"""Mixture-of-experts end to end on mlx-lm architectures (Qwen3-MoE, Mixtral, Qwen2-MoE with a
shared expert; tiny configs, random weights, no downloads): mx_fp4.nn.quantize converts every SwitchLinear to FP4SwitchLinear (and the
attention to FP4Linear); greedy tokens equal the same model holding the dequantized weights.
Also: FP4SwitchLinear is a drop-in for mlx-lm's nvfp4 QuantizedSwitchLinear (same bytes, same
output as mx.gather_qmm)."""

import copy

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from common import assert_close
from lm_fixtures import greedy, same_greedy
from mlx_fp4 import nn as fnn

switch_layers = pytest.importorskip("mlx_lm.models.switch_layers")

COMMON = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              rms_norm_eps=1e-5, vocab_size=256, max_position_embeddings=128, tie_word_embeddings=False)
MODELS = {
    "qwen3_moe": dict(COMMON, model_type="qwen3_moe", intermediate_size=128, moe_intermediate_size=32,
                      num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[],
                      norm_topk_prob=True, head_dim=16, rope_theta=10000.0),
    "mixtral": dict(COMMON, model_type="mixtral", intermediate_size=48, num_local_experts=4,
                    num_experts_per_tok=2, rope_theta=10000.0),
    # with a shared expert (dense MLP) and its gate next to the routed experts
    "qwen2_moe": dict(COMMON, model_type="qwen2_moe", intermediate_size=128, moe_intermediate_size=32,
                      num_experts=6, num_experts_per_tok=2, shared_expert_intermediate_size=48,
                      rope_theta=10000.0),
}


def build(name, seed=0):
    import importlib

    mod = importlib.import_module(f"mlx_lm.models.{name}")
    mx.random.seed(seed)
    model = mod.Model(mod.ModelArgs.from_dict(MODELS[name]))
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("global_scale", [False, True])
def test_quantize_converts_experts_and_decodes_as_dequantized(device, name, global_scale):
    model = build(name)
    n_switch = sum(isinstance(m, switch_layers.SwitchLinear) for _, m in model.named_modules())
    assert n_switch == 3 * MODELS[name]["num_hidden_layers"]
    fnn.quantize(model, global_scale=global_scale, progress=False)
    experts = [m for _, m in model.named_modules() if isinstance(m, fnn.FP4SwitchLinear)]
    assert len(experts) == n_switch
    assert not any(isinstance(m, switch_layers.SwitchLinear) for _, m in model.named_modules())
    assert all((m.get("global_scale") is not None) == global_scale for m in experts)
    twin = copy.deepcopy(model)
    fnn.dequantize(twin, dtype=mx.float32)
    assert not any(isinstance(m, fnn.FP4SwitchLinear) for _, m in twin.named_modules())
    ours = greedy(model)
    same_greedy(ours, greedy(twin))
    assert len(set(ours[0])) > 1
    # A prompt of 40 tokens x top-2 = 80 >= 64 pairs takes mlx-lm's sorted path (sorted_indices).
    long_prompt = [int(t) for t in np.random.default_rng(0).integers(0, 256, size=40)]
    same_greedy(greedy(model, long_prompt, 2), greedy(twin, long_prompt, 2))


def test_wraps_mlx_nvfp4_quantized_switch_linear_without_copying(device):
    sl = switch_layers.SwitchLinear(64, 48, 6, bias=True)
    sl.bias = mx.random.normal((6, 48))
    qsl = sl.to_quantized(group_size=16, bits=4, mode="nvfp4")
    fp4 = fnn.FP4SwitchLinear.from_quantized(qsl)
    assert fp4["weight"] is qsl["weight"] and fp4["scales"] is qsl["scales"]
    assert {k: v.shape for k, v in tree_flatten(fp4.parameters())} == {
        k: v.shape for k, v in tree_flatten(qsl.parameters())
    }
    x = mx.random.normal((3, 1, 1, 64))
    idx = mx.array([[0, 5], [2, 2], [4, 1]])
    ours, theirs = fp4(x, idx), qsl(x, idx)
    assert ours.shape == theirs.shape
    t = np.array(theirs)
    assert_close(ours, t, 2.0**-6 * (np.abs(t) + 1.0), what="FP4SwitchLinear vs QuantizedSwitchLinear")
    # nn.quantize wraps it in place inside a SwitchGLU.
    glu = switch_layers.SwitchGLU(64, 32, 4)
    nn.quantize(glu, group_size=16, bits=4, mode="nvfp4")
    fnn.quantize(glu, progress=False)
    assert isinstance(glu.gate_proj, fnn.FP4SwitchLinear)
    mx.eval(glu(mx.random.normal((2, 5, 64)), mx.array(np.tile([[0, 3]], (2, 5, 1)))))


def test_global_scale_layer_runs_on_cpu_where_mlx_cannot(device):
    """mlx-lm's nvfp4 experts with per-expert global scales: mx.gather_qmm refuses the global
    scale on the CPU; the FP4 layer computes it (checked against its dequantized weights)."""
    sl = switch_layers.SwitchLinear(32, 16, 4, bias=False)
    qsl = sl.to_quantized(group_size=16, bits=4, mode="nvfp4", global_scale=True)
    fp4 = fnn.FP4SwitchLinear.from_quantized(qsl)
    assert fp4.global_scale.shape == (4,)
    x = mx.random.normal((2, 1, 1, 32))
    idx = mx.array([[1, 3], [0, 1]])
    want = mx.gather_mm(x, fp4.dequantized_weight().swapaxes(-1, -2), rhs_indices=idx)
    w = np.array(want)
    assert_close(fp4(x, idx), w, 1e-5 * (np.abs(w) + 1.0), what="global-scale experts")


def test_fused_switch_glu_matches_and_decodes_the_same(device):
    """fuse_switch_glu: silu in the gate's epilogue, the product in the up projection's; the layer
    matches the unfused SwitchGLU on its decode and sorted paths, and greedy tokens agree."""
    model = build("qwen3_moe", seed=7)
    fnn.quantize(model, progress=False)
    glu = model.model.layers[0].mlp.switch_mlp
    fused = fnn.FP4SwitchGLU(glu)
    assert fused.gate_proj is glu.gate_proj  # the experts are shared, not copied
    for tokens in (3, 40):  # 40 x top-2 >= 64 pairs: the sorted path
        x = mx.random.normal((1, tokens, 64))
        idx = mx.array(np.stack([np.random.default_rng(tokens + i).choice(8, 2, replace=False)
                                 for i in range(tokens)])[None].astype(np.uint32))
        want = np.array(glu(x, idx))
        assert_close(fused(x, idx), want, 1e-5 * (np.abs(want) + 1.0), what=f"fused SwitchGLU T={tokens}")
    twin = copy.deepcopy(model)
    fnn.fuse_switch_glu(model)
    assert isinstance(model.model.layers[1].mlp.switch_mlp, fnn.FP4SwitchGLU)
    same_greedy(greedy(model), greedy(twin), atol=1e-4)


def test_quantize_summary_names_the_expert_layers():
    model = build("mixtral", seed=8)
    summary = fnn.quantize(model, class_predicate=lambda p, m: "layers.1" not in p, progress=False)
    switch = "model.layers.{}.block_sparse_moe.switch_mlp.{}"
    for proj in ("gate_proj", "up_proj", "down_proj"):
        assert summary.converted[switch.format(0, proj)].startswith("quantized")
        assert switch.format(0, proj) in summary.errors
        assert summary.skipped[switch.format(1, proj)] == "class_predicate returned False"
