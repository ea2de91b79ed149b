"""Checkpoint holes found by the adversarial pass (issue 38): bad per-tensor scales, index files
naming paths outside the folder, malformed config fields. Each raises a clear ValueError naming
the tensor, file or field; none loads silently wrong."""

import json

import mlx.core as mx
import numpy as np
import pytest

from mlx_fp4.checkpoints import load_nvfp4

from test_checkpoints import LAYERS, Q, _drop, _set, data, write_ct, write_modelopt  # noqa: F401


@pytest.mark.parametrize("value", [np.nan, np.inf, 0.0, -0.01], ids=["nan", "inf", "zero", "negative"])
@pytest.mark.parametrize("dialect", ["modelopt", "compressed-tensors"])
def test_bad_global_scale_raises(tmp_path, data, dialect, value):  # noqa: F811
    if dialect == "modelopt":
        key, write = f"{Q}.weight_scale_2", write_modelopt
    else:
        key, write = f"{Q}.weight_global_scale", write_ct
    folder = write(tmp_path / "bad", data, mutate=_set(key, np.array(value, np.float32)))
    with pytest.raises(ValueError, match=rf"{key} expected a finite value > 0"):
        load_nvfp4(folder)


def test_modelopt_missing_weight_scale_2_raises(tmp_path, data):  # noqa: F811
    with pytest.raises(ValueError, match=rf"{Q}\.weight_scale_2 is missing"):
        load_nvfp4(write_modelopt(tmp_path / "m", data, mutate=_drop(f"{Q}.weight_scale_2")))


@pytest.mark.parametrize("where", ["absolute", "parent"])
def test_index_outside_folder_raises(tmp_path, data, where):  # noqa: F811
    folder = write_modelopt(tmp_path / "m", data)
    index = folder / "model.safetensors.index.json"
    wm = json.loads(index.read_text())["weight_map"]
    first = sorted(set(wm.values()))[0]
    outside = tmp_path / "elsewhere.safetensors"
    (folder / first).rename(outside)
    name = str(outside) if where == "absolute" else "../elsewhere.safetensors"
    index.write_text(json.dumps({"weight_map": {k: (name if v == first else v) for k, v in wm.items()}}))
    with pytest.raises(ValueError, match="outside the checkpoint folder"):
        load_nvfp4(folder)


@pytest.mark.parametrize(
    "file, text, match",
    [
        ("hf_quant_config.json", '"NVFP4"', "expected a JSON object"),
        ("hf_quant_config.json", '{"quantization": "NVFP4"}', "field 'quantization' expected an object"),
        ("hf_quant_config.json", "{not json", "not valid JSON"),
        ("model.safetensors.index.json", '{"weight_map": ["a.safetensors"]}', "field 'weight_map'"),
        ("config.json", '{"model_type": "llama", "quantization_config": "nvfp4"}',
         "field 'quantization_config' expected an object"),
    ],
    ids=["hf-string", "quantization-string", "bad-json", "weight-map-list", "quant-config-string"],
)
def test_malformed_json_fields_raise(tmp_path, data, file, text, match):  # noqa: F811
    folder = write_modelopt(tmp_path / "m", data)
    (folder / file).write_text(text)
    with pytest.raises(ValueError, match=match):
        load_nvfp4(folder)


def test_bad_regex_pattern_raises(tmp_path, data):  # noqa: F811
    with pytest.raises(ValueError, match="not a valid regular expression"):
        load_nvfp4(write_ct(tmp_path / "ct", data, ignore=["re:(unclosed"]))


def test_exclude_modules_string_is_one_pattern(tmp_path, data):  # noqa: F811
    """exclude_modules: "lm_head" once became the patterns 'l', 'm', '_', ...; now one pattern,
    so the q_proj (no match) loads quantized and lm_head stays float."""
    folder = write_modelopt(tmp_path / "m", data, exclude="lm_head")
    w = load_nvfp4(folder)
    assert Q in w.quantized
    assert w["lm_head.weight"].dtype == mx.bfloat16
    folder = write_modelopt(tmp_path / "m2", data, exclude="model.layers.*.self_attn*")
    with pytest.raises(ValueError, match="matches"):
        load_nvfp4(folder)
