"""End to end on a real mlx-lm architecture (Llama from mlx_lm.models, tiny config, random
weights, no downloads): convert with mx_fp4.nn.quantize, greedy-decode a fixed prompt with
mlx_lm's generate_step, and compare with the same model holding the dequantized weights, with
MLX's own nvfp4 QuantizedLinear, and with the model re-loaded from saved / ModelOpt checkpoints."""

import copy
import json

import ml_dtypes
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten
from safetensors.numpy import save_file

import reference as ref
from mlx_fp4 import nn as fnn
from mlx_fp4.checkpoints import save_nvfp4

llama = pytest.importorskip("mlx_lm.models.llama")
from mlx_lm.generate import generate_step  # noqa: E402

CONFIG = dict(
    model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
    num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=256,
    tie_word_embeddings=False, max_position_embeddings=128,
)
PROMPT = [1, 17, 42, 99, 5, 200, 3, 64]
STEPS = 12


def build(dtype=mx.float32, seed=0):
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs(**CONFIG))
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


def greedy(model, steps=STEPS):
    toks, logps = [], []
    for tok, lp in generate_step(mx.array(PROMPT), model, max_tokens=steps):
        toks.append(int(tok))
        logps.append(np.array(lp.astype(mx.float32)))
    return toks, np.stack(logps)


def compare(got, want, atol):
    """Same greedy tokens. A divergence is only acceptable at a near-tie of the reference (its
    two candidates within atol), and the log-probabilities agree within atol up to there."""
    (gt, gl), (wt, wl) = got, want
    for i, (a, b) in enumerate(zip(gt, wt)):
        np.testing.assert_allclose(gl[i], wl[i], atol=atol, rtol=0, err_msg=f"step {i}")
        if a != b:
            gap = abs(wl[i][a] - wl[i][b])
            assert gap <= atol, f"step {i}: token {a} != {b} with reference gap {gap}"
            return
    assert gt == wt


def dequantized_twin(model):
    twin = copy.deepcopy(model)
    fnn.dequantize(twin, dtype=mx.float32)
    return twin


def test_fp32_decode_matches_dequantized_and_mlx_nvfp4(device):
    base = build()
    mlx_q = copy.deepcopy(base)
    nn.quantize(mlx_q, mode="nvfp4", class_predicate=lambda p, m: isinstance(m, nn.Linear))
    fp4 = copy.deepcopy(mlx_q)
    fnn.quantize(fp4, progress=False)  # converts MLX's nvfp4 layers in place, same bytes
    layers = [m for _, m in fp4.named_modules() if isinstance(m, fnn.FP4Linear)]
    assert len(layers) == 2 * 7 + 1  # q k v o gate up down per layer, plus lm_head
    ours = greedy(fp4)
    compare(ours, greedy(dequantized_twin(fp4)), atol=1e-4)
    compare(ours, greedy(mlx_q), atol=1e-4)
    assert len(set(ours[0])) > 1  # not a degenerate repeated token


@pytest.mark.parametrize("fuse", [False, True])
def test_bf16_global_scale_decode(fuse, device):
    model = build(mx.bfloat16, seed=1)
    fnn.quantize(model, global_scale=True, progress=False)
    twin = dequantized_twin(model)  # fp32 weights
    twin.set_dtype(mx.bfloat16)
    if fuse:
        fnn.fuse_swiglu(model)
        assert isinstance(model.model.layers[0].mlp, fnn.FP4SwiGLU)
    # bf16 activations round differently along the way (fp32 accumulator vs bf16 matmul out)
    compare(greedy(model), greedy(twin), atol=0.1)


def test_stock_mlx_lm_load_then_convert(tmp_path):
    """save_nvfp4 writes a folder stock mlx-lm loads (MLX QuantizedLinear, nvfp4); converting
    that model with mx_fp4.nn.quantize keeps the bytes and the tokens."""
    from mlx_lm.utils import load_model

    model = build(seed=2)
    fnn.quantize(model, global_scale=False, progress=False)  # what stock MLX layers can hold
    save_nvfp4(tmp_path / "m", model, config=CONFIG)
    loaded, cfg = load_model(tmp_path / "m")
    assert cfg["quantization"]["mode"] == "nvfp4"
    q = loaded.model.layers[0].self_attn.q_proj
    assert type(q) is nn.QuantizedLinear and q.mode == "nvfp4"
    want = greedy(model)
    compare(greedy(loaded), want, atol=1e-4)
    fnn.quantize(loaded, progress=False)
    assert loaded.model.layers[0].self_attn.q_proj.weight is q.weight
    compare(greedy(loaded), want, atol=1e-6)


def modelopt_tensors(model, params):
    """ModelOpt layout of (key, array) pairs of a quantized model: uint8 weights, F8_E4M3
    weight_scale, the FP4Linear multipliers as weight_scale_2."""
    tensors = {}
    for k, v in params:
        p, _, name = k.rpartition(".")
        if name == "global_scale":
            continue  # written below in ModelOpt's convention
        if name == "weight" and v.dtype == mx.uint32:
            tensors[k] = ref.packed_bytes(v)
        elif name == "scales":
            tensors[f"{p}.weight_scale"] = np.array(v).view(ml_dtypes.float8_e4m3fn)
        else:
            tensors[k] = np.array(v)
    for k, gs in fnn.global_scales(model).items():  # ModelOpt stores the multiplier, shape ()
        tensors[k.replace(".global_scale", ".weight_scale_2")] = np.array(ref.multiplier(gs))
    return tensors


def test_modelopt_checkpoint_into_mlx_lm_llama(tmp_path):
    """A ModelOpt-layout export of the quantized model (uint8 weight, F8_E4M3 weight_scale,
    weight_scale_2 multiplier) loads into a fresh mlx-lm Llama and decodes the same tokens."""
    model = build(seed=3)
    fnn.quantize(model, global_scale=True, progress=False)
    tensors = modelopt_tensors(model, tree_flatten(model.parameters()))
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(8, np.float32)  # sanitized
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(
        {"producer": {"name": "modelopt"},
         "quantization": {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": []}}))
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    fresh, _ = fnn.load_model(tmp_path)  # architecture from config.json via mlx-lm
    assert isinstance(fresh.lm_head, fnn.FP4Linear) and fresh.lm_head.global_scale is not None
    compare(greedy(fresh), greedy(model), atol=1e-6)
    other = build(seed=4)  # or into a model built by hand
    fnn.load_weights(other, tmp_path)
    compare(greedy(other), greedy(model), atol=1e-6)
