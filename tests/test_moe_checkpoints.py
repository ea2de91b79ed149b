"""MoE NVFP4 checkpoints: ModelOpt-style exports with per-expert tensors
(``...experts.<e>.<proj>.{weight, weight_scale, weight_scale_2}``, ``hf_quant_config.json``) and
the same in compressed-tensors' layout (``weight_packed``, ``weight_global_scale``) load with mx_fp4.nn.load_model into mlx-lm's switch_mlp layout (naming from mlx-lm's own
sanitize) and decodes the same greedy tokens as the model it was exported from."""

import json

import ml_dtypes
import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from safetensors.numpy import save_file

import reference as ref
from mlx_fp4 import nn as fnn
from test_mlx_lm_e2e import modelopt_tensors as dense_modelopt_tensors
from test_moe_e2e import MODELS, build, greedy, same_greedy

pytest.importorskip("mlx_lm.models.switch_layers")

# mlx-lm switch projection -> the per-expert name in the Hugging Face checkpoint, per model type.
HF_EXPERT_NAMES = {
    "qwen3_moe": ("mlp.switch_mlp", "mlp.experts", {"gate_proj": "gate_proj", "up_proj": "up_proj",
                                                    "down_proj": "down_proj"}),
    "qwen2_moe": ("mlp.switch_mlp", "mlp.experts", {"gate_proj": "gate_proj", "up_proj": "up_proj",
                                                    "down_proj": "down_proj"}),
    "mixtral": ("block_sparse_moe.switch_mlp", "block_sparse_moe.experts",
                {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}),
}
E2M1_E4M3_MAX = np.float32(2688.0)


def modelopt_tensors(model, name):
    """ModelOpt layout of a quantized MoE model: experts one tensor set each (uint8 weight,
    F8_E4M3 weight_scale, fp32 multiplier weight_scale_2), the rest as the dense export."""
    stacked, per_expert, projs = HF_EXPERT_NAMES[name]
    tensors, rest = {}, []
    for k, v in tree_flatten(model.parameters()):
        if f".{stacked}." not in k:
            rest.append((k, v))
            continue
        p, _, leaf = k.rpartition(".")
        base, _, proj = p.rpartition(".")
        base = base.replace(stacked, per_expert)
        for e in range(v.shape[0]):
            q = f"{base}.{e}.{projs[proj]}"
            if leaf == "weight":
                tensors[f"{q}.weight"] = ref.packed_bytes(v[e])
            elif leaf == "scales":
                tensors[f"{q}.weight_scale"] = np.array(v[e]).view(ml_dtypes.float8_e4m3fn)
            elif leaf == "global_scale":
                tensors[f"{q}.weight_scale_2"] = np.asarray(np.array(v[e]) / E2M1_E4M3_MAX, np.float32)
    return {**tensors, **dense_modelopt_tensors(model, rest)}


def as_compressed_tensors(tensors):
    """The ModelOpt tensors renamed to compressed-tensors' nvfp4-pack-quantized layout
    (weight_packed; weight_global_scale = 1 / multiplier, a divisor)."""
    out = {}
    for k, v in tensors.items():
        p, _, leaf = k.rpartition(".")
        if leaf == "weight" and f"{p}.weight_scale" in tensors:
            out[f"{p}.weight_packed"] = v
        elif leaf == "weight_scale_2":
            out[f"{p}.weight_global_scale"] = np.asarray(np.float32(1.0) / v, np.float32).reshape(1)
        else:
            out[k] = v
    return out


CT_CONFIG = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
             "quantization_status": "compressed", "ignore": [],
             "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                           "weights": {"num_bits": 4, "type": "float", "symmetric": True,
                                                       "group_size": 16, "strategy": "tensor_group"}}}}


@pytest.mark.parametrize("dialect", ["modelopt", "compressed-tensors"])
@pytest.mark.parametrize("name", list(MODELS))
def test_moe_folder_loads_and_decodes_the_same(tmp_path, name, dialect):
    model = build(name, seed=5)
    fnn.quantize(model, global_scale=True, progress=False)
    tensors = modelopt_tensors(model, name)
    assert any(".experts.1." in k and k.endswith("weight_scale_2") for k in tensors)
    config = dict(MODELS[name])
    if dialect == "modelopt":
        (tmp_path / "hf_quant_config.json").write_text(json.dumps(
            {"producer": {"name": "modelopt"},
             "quantization": {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": []}}))
    else:
        tensors = as_compressed_tensors(tensors)
        config["quantization_config"] = CT_CONFIG
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(config))
    fresh, _ = fnn.load_model(tmp_path)
    experts = [m for _, m in fresh.named_modules() if isinstance(m, fnn.FP4SwitchLinear)]
    assert len(experts) == 3 * MODELS[name]["num_hidden_layers"]
    assert all(m.global_scale is not None and m.global_scale.shape == (m.num_experts,) for m in experts)
    same_greedy(greedy(fresh), greedy(model), atol=1e-5)


def test_missing_expert_is_a_clear_error(tmp_path):
    model = build("qwen3_moe", seed=6)
    fnn.quantize(model, progress=False, global_scale=True)  # ModelOpt writes weight_scale_2 for every layer
    tensors = modelopt_tensors(model, "qwen3_moe")
    del tensors["model.layers.1.mlp.experts.3.up_proj.weight_scale"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(
        {"quantization": {"quant_algo": "NVFP4", "group_size": 16}}))
    (tmp_path / "config.json").write_text(json.dumps(MODELS["qwen3_moe"]))
    with pytest.raises(ValueError, match=r"experts\.3\.up_proj|up_proj.*expert"):
        fnn.load_model(tmp_path)


@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral"])
def test_save_nvfp4_moe_loads_in_stock_mlx_lm_and_back(tmp_path, name):
    """save_nvfp4 of a model with FP4SwitchLinear experts writes what mlx_lm.load reads (its nvfp4
    QuantizedSwitchLinear, the same tokens), and mx_fp4.nn.load_model reads it back as FP4."""
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear
    from mlx_lm.utils import load_model

    from mlx_fp4.checkpoints import save_nvfp4

    model = build(name, seed=9)
    fnn.quantize(model, global_scale=False, progress=False)  # stock mlx-lm takes no global scales
    save_nvfp4(tmp_path / "m", model, config=MODELS[name])
    stock, cfg = load_model(tmp_path / "m")
    assert cfg["quantization"]["mode"] == "nvfp4"
    experts = [m for _, m in stock.named_modules() if isinstance(m, QuantizedSwitchLinear)]
    assert len(experts) == 3 * MODELS[name]["num_hidden_layers"] and all(m.mode == "nvfp4" for m in experts)
    want = greedy(model)
    same_greedy(greedy(stock), want, atol=1e-4)  # float32 model: MLX's kernels agree closely
    back, _ = fnn.load_model(tmp_path / "m")
    assert sum(isinstance(m, fnn.FP4SwitchLinear) for _, m in back.named_modules()) == len(experts)
    same_greedy(greedy(back), want, atol=1e-6)
