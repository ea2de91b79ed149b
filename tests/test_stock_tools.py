"""The global scale through stock MLX / mlx-lm tools: each one either carries it exactly or
raises a clear error; none silently computes without it (issue: after quantize with global
scales, save_model + load gave max |logit| 66,048 instead of 2.05, dequantize_model likewise,
model.shard changed logits by 2.9).

A tiny mlx-lm Llama with random weights, quantized with global scales; small-magnitude weights
so that the global scale matters (without it the block scales underflow)."""

import json

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

import reference as ref
from mlx_fp4 import distributed as D
from mlx_fp4 import nn as fnn

llama = pytest.importorskip("mlx_lm.models.llama")

CONFIG = dict(
    model_type="llama", hidden_size=64, num_hidden_layers=1, intermediate_size=128,
    num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=128,
    tie_word_embeddings=False,
)
TOKENS = mx.array([[1, 7, 42, 99, 5]])
WEIGHT_SIGMA = 2e-4  # E4M3 block scales alone underflow here (issue: relative error 1.0)


def _model(global_scale=True):
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs(**CONFIG))
    model.update(
        {"lm_head": {"weight": mx.random.normal(model.lm_head.weight.shape) * WEIGHT_SIGMA}}
    )
    fnn.quantize(model, global_scale=global_scale, progress=False)
    mx.eval(model.parameters())
    return model


def _logits(model):
    return np.array(model(TOKENS).astype(mx.float32))


def _save(tmp_path, model):
    from mlx_lm.utils import save_model

    save_model(tmp_path, model)
    cfg = dict(CONFIG, quantization={"group_size": 16, "bits": 4, "mode": "nvfp4"})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_parameters_carry_the_global_scale():
    model = _model()
    params = dict(tree_flatten(model.parameters()))
    assert params["lm_head.global_scale"].shape == (1,)
    n_fp4 = sum(isinstance(m, fnn.FP4Linear) for _, m in model.named_modules())
    assert sum(k.endswith(".global_scale") for k in params) == n_fp4 == 7 + 1


def test_global_scale_matches_mx_dequantize():
    """MLX's convention: mx.dequantize takes the layer's global_scale as it is."""
    layer = _model().lm_head
    mine = layer.dequantized_weight(mx.float32)
    theirs = mx.dequantize(layer.weight, layer.scales, mode="nvfp4", global_scale=layer.global_scale,
                           dtype=mx.float32)
    np.testing.assert_allclose(np.array(mine), np.array(theirs), rtol=2**-22, atol=0)
    want = ref.decode_weights(layer.weight, layer.scales, 64, ref.multiplier(layer.global_scale))
    np.testing.assert_allclose(np.array(mine), want, rtol=2**-23, atol=0)


def test_save_model_then_mlx_lm_load_raises_and_ours_is_exact(tmp_path):
    from mlx_lm.utils import load_model

    model = _model()
    folder = _save(tmp_path, model)
    with pytest.raises(ValueError, match="global_scale"):
        load_model(folder)  # MLX's QuantizedLinear has no global scale: refused, not dropped
    fresh = llama.Model(llama.ModelArgs(**CONFIG))
    fnn.load_weights(fresh, folder)
    np.testing.assert_array_equal(_logits(fresh), _logits(model))


def test_save_model_without_global_scale_opens_in_mlx_lm(tmp_path):
    from mlx_lm.utils import load_model

    model = _model(global_scale=False)
    loaded, _ = load_model(_save(tmp_path, model))
    assert type(loaded.lm_head) is nn.QuantizedLinear  # MLX's own kernel, same bytes
    np.testing.assert_allclose(_logits(loaded), _logits(model), rtol=1e-4, atol=1e-5)


def test_dequantize_model_raises_and_ours_is_exact():
    from mlx_lm.utils import dequantize_model

    model = _model()
    want = _logits(model)
    with pytest.raises(ValueError, match="global_scale.*mlx_fp4.nn.dequantize"):
        dequantize_model(model)
    fnn.dequantize(model, dtype=mx.float32)
    assert type(model.lm_head) is nn.Linear
    np.testing.assert_allclose(_logits(model), want, rtol=1e-4, atol=1e-6)


def test_model_shard_raises_and_shard_model_is_exact():
    group = mx.distributed.init()  # one rank here; tests/test_distributed.py runs two
    model = _model()
    want = _logits(model)
    with pytest.raises(ValueError, match="global_scale"):
        model.shard(group)
    model = _model()
    D.shard_model(model, group)
    assert isinstance(model.model.layers[0].self_attn.o_proj, D.FP4ShardedToAllLinear)
    np.testing.assert_array_equal(_logits(model), want)


def test_mlx_shard_linear_raises_and_ours_carries_it():
    from mlx.nn.layers.distributed import shard_linear

    group = mx.distributed.init()
    layer = _model().lm_head
    x = mx.random.normal((2, 64))
    for sharding in ("all-to-sharded", "sharded-to-all"):
        with pytest.raises(ValueError, match="global_scale"):
            shard_linear(layer, sharding, group=group)
        ours = D.shard_linear(layer, sharding, group=group)
        assert ours.global_scale.item() == layer.global_scale.item()
        np.testing.assert_array_equal(np.array(ours(x)), np.array(layer(x)))


def test_distributed_quantize_refuses_auto():
    """Shard-first conversion has no whole tensor to measure 'auto' on: a clear error."""
    with pytest.raises(ValueError, match="global_scale expected True or False"):
        D.quantize(_model(global_scale=False), global_scale="auto", progress=False)


@pytest.mark.parametrize("global_scale", [False, True])
def test_moe_dequantize_model_is_exact_or_raises(global_scale):
    """mlx-lm's dequantize_model on an FP4 MoE model (tiny Qwen3-MoE): with global scales it raises
    (the FP4Linear layers refuse to lose them); without, it dequantizes the linears and leaves the
    FP4SwitchLinear experts, which it does not know, as they are: the logits do not change. Ours
    turns both into float layers, exactly."""
    from mlx_lm.models.switch_layers import SwitchLinear
    from mlx_lm.utils import dequantize_model

    from test_moe_e2e import build

    model = build("qwen3_moe")
    fnn.quantize(model, global_scale=global_scale, progress=False)
    tokens = mx.array([[1, 7, 42, 99]])
    want = np.array(model(tokens).astype(mx.float32))
    if global_scale:
        with pytest.raises(ValueError, match="global_scale.*mlx_fp4.nn.dequantize"):
            dequantize_model(model)
    else:
        dequantize_model(model)
        assert not any(isinstance(m, fnn.FP4Linear) for _, m in model.named_modules())
        assert sum(isinstance(m, fnn.FP4SwitchLinear) for _, m in model.named_modules()) == 3 * 2
        np.testing.assert_allclose(np.array(model(tokens).astype(mx.float32)), want, rtol=1e-4, atol=1e-5)
    fnn.dequantize(model, dtype=mx.float32)
    assert not any(isinstance(m, (fnn.FP4Linear, fnn.FP4SwitchLinear)) for _, m in model.named_modules())
    assert sum(type(m) is SwitchLinear for _, m in model.named_modules()) == 3 * 2
    np.testing.assert_allclose(np.array(model(tokens).astype(mx.float32)), want, rtol=1e-4, atol=1e-5)
