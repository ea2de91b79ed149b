"""Folders through mlx-lm's own loaders and savers: mx_fp4.save_nvfp4 writes what mlx_lm.load
and mlx_lm.generate open (no global scales), mx_fp4.load / load_model read every folder with
FP4 layers (global scales, what mlx_lm.convert -q --q-mode nvfp4 writes: quantized embeddings,
per-layer affine recipes)."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlx_fp4 as mx_fp4
from mlx_fp4 import nn as fnn

pytest.importorskip("mlx_lm")
from lm_fixtures import CONFIG, PROMPT, read_json, tiny_llama, write_tokenizer  # noqa: E402

TOKENS = mx.array([[1, 17, 42, 99, 5]])


def _logits(model):
    return np.array(model(TOKENS).astype(mx.float32))


def _saved(tmp_path, global_scale):
    src = write_tokenizer(tmp_path / "src")
    model = tiny_llama(seed=1)
    fnn.quantize(model, global_scale=global_scale, progress=False)
    files = mx_fp4.save_nvfp4(tmp_path / "out", model, config=CONFIG, tokenizer=src)
    return model, files, tmp_path / "out"


def test_save_writes_an_mlx_lm_folder(tmp_path):
    import mlx_lm

    model, files, out = _saved(tmp_path, global_scale=False)
    names = [f.name for f in files]
    assert names[:3] == ["model.safetensors", "model.safetensors.index.json", "config.json"]
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(names)
    cfg = read_json(out / "config.json")
    assert cfg["quantization"] == cfg["quantization_config"] == {"group_size": 16, "bits": 4, "mode": "nvfp4"}
    stock, tokenizer = mlx_lm.load(str(out))
    assert type(stock.model.layers[0].mlp.up_proj) is nn.QuantizedLinear  # MLX's kernel
    np.testing.assert_allclose(_logits(stock), _logits(model), rtol=1e-4, atol=1e-5)
    text = mlx_lm.generate(stock, tokenizer, prompt=PROMPT, max_tokens=3)
    assert isinstance(text, str)
    ours, tok = mx_fp4.load(str(out))
    assert isinstance(ours.model.layers[0].mlp.up_proj, fnn.FP4Linear)
    assert tok.encode(PROMPT) == tokenizer.encode(PROMPT)
    np.testing.assert_array_equal(_logits(ours), _logits(model))


def test_global_scales_round_trip_and_stock_mlx_lm_refuses(tmp_path):
    import mlx_lm

    model, _, out = _saved(tmp_path, global_scale=True)
    with pytest.raises(ValueError, match="global_scale"):
        mlx_lm.load(str(out))
    ours, _, cfg = mx_fp4.load(str(out), return_config=True)
    lm_head = ours.lm_head
    assert isinstance(lm_head, fnn.FP4Linear) and lm_head.global_scale.item() == model.lm_head.global_scale.item()
    assert cfg["quantization"]["mode"] == "nvfp4"
    np.testing.assert_array_equal(_logits(ours), _logits(model))


def test_reads_what_mlx_lm_convert_writes(tmp_path):
    """mlx_lm.utils.quantize_model(mode="nvfp4") quantizes the embedding too (QuantizedEmbedding)
    and follows per-layer recipes (here an 8-bit affine layer, as routers are kept)."""
    from mlx_lm.utils import quantize_model, save_config, save_model

    model = tiny_llama(seed=2)
    recipe = {"group_size": 64, "bits": 8, "mode": "affine"}
    model, config = quantize_model(
        model, dict(CONFIG), None, None, mode="nvfp4",
        quant_predicate=lambda p, m: recipe if p == "model.layers.0.mlp.gate_proj" else True,
    )
    out = tmp_path / "lm"
    save_model(out, model)
    save_config(config, out / "config.json")
    write_tokenizer(out)
    assert "model.embed_tokens.scales" in read_json(out / "model.safetensors.index.json")["weight_map"]
    ours, _ = mx_fp4.load(str(out))
    assert type(ours.model.embed_tokens) is nn.QuantizedEmbedding  # left to MLX
    gate = ours.model.layers[0].mlp.gate_proj
    assert type(gate) is nn.QuantizedLinear and (gate.mode, gate.bits) == ("affine", 8)  # left to MLX
    assert isinstance(ours.model.layers[0].mlp.up_proj, fnn.FP4Linear)
    assert isinstance(ours.model.layers[1].mlp.gate_proj, fnn.FP4Linear)
    np.testing.assert_allclose(_logits(ours), _logits(model), rtol=1e-4, atol=1e-5)
