"""Checkpoint holes found by the adversarial pass (issue 38): bad per-tensor scales, index files
naming paths outside the folder, malformed config fields. Each raises a clear ValueError naming
the tensor, file or field; none loads silently wrong."""

import json
import os
import struct

import mlx.core as mx
import numpy as np
import pytest

from mlx_fp4.checkpoints import load_nvfp4

from test_checkpoints import LAYERS, Q, _drop, _set, data, write_ct, write_mlx, write_modelopt  # noqa: F401


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


# ---------------------------------------------------------------------------------------------
# Found by the loader fuzz (test_loader_fuzz.py); each was a raw exception or a silent load.


def _edit_header(path, edit):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    edit(header)
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    path.write_bytes(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])


def _set_entry(name, **fields):
    def edit(header):
        header[name].update(fields)
    return edit


def _zero_bytes(name, shape):
    """A tensor of `shape` declared in 0 bytes: mx.load checks the byte count in size_t, which wraps."""
    def edit(header):
        b = header[name]["data_offsets"][0]
        header[name].update(dtype="U8", shape=shape, data_offsets=[b, b])
    return edit


NORM = "model.norm.weight"  # F32 [64]: 256 bytes


@pytest.mark.parametrize(
    "edit, match",
    [
        (_zero_bytes(NORM, [65536] * 4), r"for 18446744073709551616 bytes of U8"),  # 2^64 -> 0: loaded
        (_zero_bytes(NORM, [2**32, 2**32]), r"ints in \[0, 2\^31\)"),  # int32 dims 0: loaded as (0, 0)
        (_set_entry(NORM, shape=[-8, -8]), r"ints in \[0, 2\^31\)"),  # (-8)(-8)*4 = 256: negative dims
        (_set_entry(NORM, shape=[4294967296, 64]), r"ints in \[0, 2\^31\)"),  # loaded as [0, 64]
        (_set_entry(NORM, data_offsets=[0.0, 256]), r"expected \[begin, end\] ints"),  # MLX took floats
        (_set_entry(NORM, dtype="F64"), "not one of"),
    ],
    ids=["size-wraps", "int32-wraps", "negative", "dim-2^32", "float-offsets", "dtype"],
)
def test_safetensors_header_overflow_raises(tmp_path, data, edit, match):  # noqa: F811
    folder = write_mlx(tmp_path / "m", data)
    _edit_header(folder / "model.safetensors", edit)
    with pytest.raises(ValueError, match=r"\[load_nvfp4\] .*model\.safetensors is not a valid safetensors file: "
                       r".*" + match):
        load_nvfp4(folder)


@pytest.mark.parametrize(
    "config, match",
    [
        ({"quantization": "nvfp4"}, "field 'quantization' expected an object"),
        ({"quantization": 40}, "field 'quantization' expected an object"),
        ({"text_config": "x"}, "field 'text_config' expected an object"),
        ({"quantization_config": {"quant_method": "mlx"}}, "'mlx' is not a format"),
        ({"quantization_config": {"quant_method": ["modelopt"]}}, "quant_method' expected a string"),
        ({"quantization_config": {"quant_method": "compressed-tensors", "config_groups": "affine"}},
         "config_groups' expected an object"),
        ({"quantization_config": {"quant_method": "compressed-tensors", "format": ["x"],
                                  "config_groups": {"g": {"weights": "w"}}}}, r"config_groups\.g\.weights"),
        ({"quantization_config": {"quant_method": "modelopt", "quantization": [1]}},
         "quantization_config.quantization' expected an object"),
    ],
    ids=["quantization-str", "quantization-int", "text-config", "method-mlx", "method-list", "groups-str",
         "weights-str", "modelopt-quantization-list"],
)
def test_config_field_types_raise(tmp_path, data, config, match):  # noqa: F811
    """Were AttributeError / KeyError / TypeError from inside the loader."""
    folder = write_mlx(tmp_path / "m", data)
    (folder / "config.json").write_text(json.dumps(dict(config, model_type="llama")))
    with pytest.raises(ValueError, match=r"^\[load_nvfp4\] config\.json field .*" if "field" in match else
                       r"^\[load_nvfp4\] "):
        load_nvfp4(folder)
    with pytest.raises(ValueError, match=match):
        load_nvfp4(folder)


@pytest.mark.parametrize(
    "dialect, key, value",
    [
        ("compressed-tensors", "weight_global_scale", 1e-38),  # 2688 / 1e-38 = inf
        ("modelopt", "weight_scale_2", 1e36),  # 1e36 * 2688 = inf
        ("mlx", "global_scale", 1e-45),  # finite and > 0, but / 2688 = 0: a zero layer
    ],
)
def test_global_scale_out_of_fp32_range_raises(tmp_path, data, dialect, key, value):  # noqa: F811
    write = {"compressed-tensors": write_ct, "modelopt": write_modelopt, "mlx": write_mlx}[dialect]
    shape = (1,) if dialect == "compressed-tensors" else ()
    folder = write(tmp_path / "m", data, mutate=_set(f"{Q}.{key}", np.full(shape, value, np.float32)))
    with pytest.raises(ValueError, match=rf"{Q}\.{key} = .* outside fp32's usable range"):
        load_nvfp4(folder)


@pytest.mark.parametrize(
    "write, extra, match",
    [
        (write_modelopt, "scales", r"a 'scales' tensor in the modelopt layer"),
        (write_modelopt, "global_scale", r"a 'global_scale' tensor in the modelopt layer"),
        (write_ct, "weight", r"q_proj\.weight is a tensor of the checkpoint and also what its layer converts to"),
    ],
    ids=["modelopt+scales", "modelopt+global_scale", "ct+weight"],
)
def test_two_dialects_in_a_layer_raise(tmp_path, data, write, extra, match):  # noqa: F811
    """Which of the two tensors loaded was the order of the keys: now an error."""
    folder = write(tmp_path / "m", data, mutate=_set(f"{Q}.{extra}", np.ones((32, 4), np.uint8)))
    with pytest.raises(ValueError, match=match):
        load_nvfp4(folder)


def test_compressed_tensors_layer_without_packed_weight_raises(tmp_path, data):  # noqa: F811
    """Its weight_scale and weight_global_scale passed through as plain tensors."""
    folder = write_ct(tmp_path / "m", data, mutate=_drop(f"{Q}.weight_packed"))
    with pytest.raises(ValueError, match=rf"{Q}\.weight_packed is missing"):
        load_nvfp4(folder)


def test_hugging_face_cache_symlinks_load(tmp_path, data):  # noqa: F811
    """The Hugging Face cache links each file of a snapshot to a blob outside the snapshot folder;
    the index check refused those (it resolved links). Names are checked, links followed."""
    src = write_modelopt(tmp_path / "src", data)
    blobs, snap = tmp_path / "hub" / "blobs", tmp_path / "hub" / "snapshots" / "abc"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for i, f in enumerate(sorted(src.iterdir())):
        blob = blobs / f"blob{i}"
        f.rename(blob)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    w = load_nvfp4(snap)
    assert sorted(w.quantized) == sorted(LAYERS)


@pytest.mark.parametrize("name, match", [("config.json", "not a .safetensors file"),
                                         ("a\x00b.safetensors", "outside the checkpoint folder")])
def test_index_names_other_files_raise(tmp_path, data, name, match):  # noqa: F811
    folder = write_modelopt(tmp_path / "m", data)
    index = folder / "model.safetensors.index.json"
    wm = json.loads(index.read_text())["weight_map"]
    index.write_text(json.dumps({"weight_map": {k: name for k in wm}}))
    with pytest.raises(ValueError, match=match):
        load_nvfp4(folder)


@pytest.mark.parametrize("value", [np.array([32.5, 64], np.float32), np.array([np.nan, 64], np.float32),
                                   np.array([32, 64], np.complex64)], ids=["fraction", "nan", "complex"])
def test_compressed_tensors_weight_shape_must_be_integers(tmp_path, data, value):  # noqa: F811
    """int() truncated 32.5 to 32 and dropped an imaginary part (both loaded), and raised a bare
    ValueError on NaN."""
    folder = write_ct(tmp_path / "m", data, mutate=_set(f"{Q}.weight_shape", value))
    with pytest.raises(ValueError, match=rf"^\[load_nvfp4\] {Q}\.weight_shape expected integers \[32, 64\]"):
        load_nvfp4(folder)


def test_load_model_checks_headers_before_mlx_lm(tmp_path):
    """mlx_fp4.load / load_model hand the folder to mlx-lm, which mx.loads every model*.safetensors
    itself: the headers are checked before it does."""
    pytest.importorskip("mlx_lm")
    import mlx_fp4 as mx_fp4
    from mlx_fp4 import nn as fnn

    from lm_fixtures import CONFIG, tiny_llama

    model = tiny_llama(seed=1)
    fnn.quantize(model, global_scale=False, progress=False)
    out = tmp_path / "out"
    mx_fp4.save_nvfp4(out, model, config=CONFIG)
    _edit_header(out / "model.safetensors", _zero_bytes(NORM, [65536] * 4))
    with pytest.raises(ValueError, match=r"^\[load_nvfp4\] .*model\.safetensors is not a valid safetensors file"):
        mx_fp4.load_model(out)


def test_null_safetensors_metadata_loads(tmp_path, data):  # noqa: F811
    """"__metadata__": null is no metadata (MLX reads it so, and the gpt-oss fixture's writer puts it)."""
    folder = write_mlx(tmp_path / "m", data)
    _edit_header(folder / "model.safetensors", lambda h: h.__setitem__("__metadata__", None))
    assert sorted(load_nvfp4(folder).quantized) == sorted(LAYERS)
