"""A folder's quantization metadata must match its tensors (mlx-lm infers each layer's recipe from the
shapes, so a wrong block used to be ignored), and save_nvfp4 writes the block the layers have:
mxfp4, per-layer entries for other recipes, none for a float model."""

import json
import shutil

import mlx.core as mx
import mlx.nn as nn
import pytest

import mlx_fp4 as mx_fp4
from mlx_fp4 import nn as fnn

pytest.importorskip("mlx_lm")
from lm_fixtures import CONFIG, read_json, tiny_llama, write_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def nvfp4_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nvfp4")
    model = tiny_llama(seed=2)
    fnn.quantize(model, global_scale=False, progress=False)
    mx_fp4.save_nvfp4(folder, model, config=dict(CONFIG), tokenizer=write_tokenizer(tmp_path_factory.mktemp("tok")))
    return folder


def _patched(src, dst, **fields):
    shutil.copytree(src, dst)
    cfg = read_json(dst / "config.json")
    cfg.update(fields)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


NVFP4 = {"group_size": 16, "bits": 4, "mode": "nvfp4"}


@pytest.mark.parametrize("field", ["quantization", "quantization_config"])
@pytest.mark.parametrize("wrong", [{"group_size": 32}, {"mode": "mxfp4", "group_size": 32}, {"bits": 8}])
def test_wrong_mlx_block_is_an_error(nvfp4_folder, tmp_path, field, wrong):
    folder = _patched(nvfp4_folder, tmp_path / "m", **{field: {**NVFP4, **wrong}})
    says = {**NVFP4, **wrong}
    with pytest.raises(ValueError, match=(
            rf"config\.json field '{field}' says mode '{says['mode']}', group_size {says['group_size']}, "
            rf"bits {says['bits']}, but the tensors of .* are mode 'nvfp4', group_size 16, bits 4")):
        mx_fp4.load(str(folder))


def test_right_block_loads(nvfp4_folder):
    model, _ = mx_fp4.load(str(nvfp4_folder))
    assert isinstance(model.model.layers[0].mlp.up_proj, fnn.FP4Linear)


def test_float_folder_claiming_modelopt_is_an_error(tmp_path):
    folder = tmp_path / "float"
    folder.mkdir()
    from mlx_lm.utils import save_model

    save_model(folder, tiny_llama(seed=1))
    cfg = {**CONFIG, "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"quantization_config' says the checkpoint is quantized \(modelopt\), "
                                         "but no tensor is"):
        mx_fp4.nn.load_model(folder)


def test_save_writes_the_layers_recipe(tmp_path):
    """mxfp4 layers -> an mxfp4 block; an 8-bit affine layer -> its own entry; float -> no block."""
    model = tiny_llama(seed=4)
    fnn.quantize(model, mode="mxfp4", progress=False)
    dense = nn.Linear(CONFIG["hidden_size"], CONFIG["intermediate_size"], bias=False)
    model.model.layers[0].mlp.gate_proj = dense.to_quantized(group_size=64, bits=8)
    mx.eval(model.parameters())
    mx_fp4.save_nvfp4(tmp_path / "mx", model, config=dict(CONFIG))
    q = read_json(tmp_path / "mx" / "config.json")["quantization"]
    assert {k: q[k] for k in ("group_size", "bits", "mode")} == {"group_size": 32, "bits": 4, "mode": "mxfp4"}
    assert q["model.layers.0.mlp.gate_proj"] == {"group_size": 64, "bits": 8, "mode": "affine"}
    back, _ = mx_fp4.nn.load_model(tmp_path / "mx")
    assert back.model.layers[0].mlp.gate_proj.bits == 8 and back.model.layers[1].mlp.up_proj.mode == "mxfp4"

    mx_fp4.save_nvfp4(tmp_path / "float", tiny_llama(seed=4), config=dict(CONFIG))
    cfg = read_json(tmp_path / "float" / "config.json")
    assert "quantization" not in cfg and "quantization_config" not in cfg
