"""mlx_fp4.checkpoints: load ModelOpt / compressed-tensors / MLX NVFP4 checkpoints, save in MLX
layout, round trip.

Fixtures are synthetic checkpoints written to tmp_path with the `safetensors` package (numpy +
ml_dtypes, so scales really are F8_E4M3 on disk), independent of the code under test."""

import json
import math

import ml_dtypes
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from safetensors.numpy import save_file

import common
import reference as ref
from mlx_fp4 import nn as fnn
from mlx_fp4.checkpoints import NVFP4Weights, load_nvfp4, save_nvfp4

# prefix -> (N, K, bias)
LAYERS = {
    "model.layers.0.self_attn.q_proj": (32, 64, True),
    "model.layers.0.mlp.down_proj": (64, 96, False),
}
FLOATS = {  # unquantized tensors: (shape, dtype)
    "model.embed_tokens.weight": ((40, 64), ml_dtypes.bfloat16),
    "model.layers.0.mlp.gate.weight": ((4, 64), ml_dtypes.bfloat16),  # router, excluded
    "model.norm.weight": ((64,), np.float32),
    "lm_head.weight": ((40, 64), ml_dtypes.bfloat16),  # excluded
}
EXCLUDE = ["lm_head", "model.layers.*.mlp.gate"]
CT_IGNORE = ["lm_head", r"re:.*mlp\.gate$"]
MODEL_CONFIG = {"model_type": "llama", "hidden_size": 64, "vocab_size": 40}


def _layer_data(p, n, k, bias):
    g = common.rng("ckpt", p)
    _, scales, packed = common.rand_weights(n, k, g)
    alpha = np.float32(np.exp2(g.uniform(-16, -4)))
    b = g.standard_normal(n).astype(ml_dtypes.bfloat16) if bias else None
    return {"packed": packed, "scales": np.array(scales), "alpha": alpha, "bias": b}


@pytest.fixture(scope="module")
def data():
    d = {p: _layer_data(p, *spec) for p, spec in LAYERS.items()}
    g = common.rng("floats")
    floats = {
        k: g.standard_normal(shape).astype(np.float32).astype(dt) for k, (shape, dt) in FLOATS.items()
    }
    return d, floats


def _floats(floats):
    return {k: np.ascontiguousarray(v) for k, v in floats.items()}


def _write_shards(folder, tensors, nshards=2):
    folder.mkdir(parents=True, exist_ok=True)
    keys = sorted(tensors)
    weight_map = {}
    for i in range(nshards):
        part = {k: tensors[k] for k in keys[i::nshards]}
        name = f"model-{i + 1:05d}-of-{nshards:05d}.safetensors"
        save_file(part, str(folder / name))
        weight_map.update({k: name for k in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def write_modelopt(folder, data, *, config_style="hf_quant_config", exclude=EXCLUDE, mutate=None,
                   algo="NVFP4"):
    layers, floats = data
    t = _floats(floats)
    for p, d in layers.items():
        t[f"{p}.weight"] = d["packed"]
        t[f"{p}.weight_scale"] = d["scales"].view(ml_dtypes.float8_e4m3fn)
        t[f"{p}.weight_scale_2"] = np.array(d["alpha"], dtype=np.float32)  # shape ()
        t[f"{p}.input_scale"] = np.array(1.0, dtype=np.float32)
        if d["bias"] is not None:
            t[f"{p}.bias"] = d["bias"]
    t["model.layers.0.self_attn.k_proj.k_scale"] = np.array(1.0, dtype=np.float32)
    if mutate:
        mutate(t)
    _write_shards(folder, t)
    quant = {"quant_algo": algo, "kv_cache_quant_algo": "FP8", "group_size": 16,
             "exclude_modules": exclude}
    cfg = dict(MODEL_CONFIG)
    if config_style == "hf_quant_config":
        (folder / "hf_quant_config.json").write_text(json.dumps(
            {"producer": {"name": "modelopt", "version": "0.29.0"}, "quantization": quant}))
    else:
        cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": algo,
                                      "group_size": 16, "ignore": exclude}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def write_ct(folder, data, *, fmt="nvfp4-pack-quantized", ignore=CT_IGNORE, mutate=None):
    layers, floats = data
    t = _floats(floats)
    for p, d in layers.items():
        t[f"{p}.weight_packed"] = d["packed"]
        t[f"{p}.weight_scale"] = d["scales"].view(ml_dtypes.float8_e4m3fn)
        t[f"{p}.weight_global_scale"] = np.array([1.0 / d["alpha"]], dtype=np.float32)  # divisor
        if d["bias"] is not None:
            t[f"{p}.bias"] = d["bias"]
    if mutate:
        mutate(t)
    _write_shards(folder, t, nshards=1)
    cfg = dict(MODEL_CONFIG)
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
        "ignore": ignore,
        "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                      "weights": {"num_bits": 4, "type": "float", "symmetric": True,
                                                  "group_size": 16, "strategy": "tensor_group",
                                                  "dynamic": False}}},
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def write_mlx(folder, data, *, mutate=None):
    layers, floats = data
    t = _floats(floats)
    for p, d in layers.items():
        t[f"{p}.weight"] = ref.bytes_to_uint32(d["packed"])
        t[f"{p}.scales"] = d["scales"]
        t[f"{p}.global_scale"] = np.array(np.float64(d["alpha"]) * 2688, dtype=np.float32)
        if d["bias"] is not None:
            t[f"{p}.bias"] = d["bias"]
    if mutate:
        mutate(t)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(t, str(folder / "model.safetensors"), metadata={"format": "mlx"})
    cfg = dict(MODEL_CONFIG, quantization={"group_size": 16, "bits": 4, "mode": "nvfp4"})
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _expected_global_scale(dialect, d):
    """MLX's convention (the amax): ModelOpt's multiplier * 2688, 2688 / compressed-tensors'
    divisor (one fp32 operation each), MLX's own value as stored."""
    a = d["alpha"]
    if dialect == "modelopt":
        return np.float32(a * np.float32(2688))
    if dialect == "compressed-tensors":
        return np.float32(np.float32(2688) / np.float32(1.0 / a))
    return np.float32(np.float64(a) * 2688)


def _check_loaded(w, data, dialect):
    layers, floats = data
    assert isinstance(w, NVFP4Weights) and w.dialects == {dialect}
    assert sorted(w.quantized) == sorted(LAYERS)
    want = set(floats)
    for p, d in layers.items():
        n, k, bias = LAYERS[p]
        want |= {f"{p}.weight", f"{p}.scales", f"{p}.global_scale"} | ({f"{p}.bias"} if bias else set())
        assert w[f"{p}.weight"].dtype == mx.uint32 and w[f"{p}.weight"].shape == (n, k // 8)
        assert w[f"{p}.scales"].dtype == mx.uint8 and w[f"{p}.scales"].shape == (n, k // 16)
        np.testing.assert_array_equal(ref.packed_bytes(w[f"{p}.weight"]), d["packed"])
        np.testing.assert_array_equal(np.array(w[f"{p}.scales"]), d["scales"])
        gs = w[f"{p}.global_scale"]
        assert gs.dtype == mx.float32 and gs.shape == (1,)
        assert np.float32(gs.item()) == _expected_global_scale(dialect, d), p
        # the decode multiplier is the source's own within one fp32 ulp
        np.testing.assert_allclose(ref.multiplier(gs), d["alpha"], rtol=2**-23)
        if bias:
            np.testing.assert_array_equal(np.array(w[f"{p}.bias"].astype(mx.float32)),
                                          d["bias"].astype(np.float32))
    assert set(w) == want  # input_scale / k_scale dropped, nothing else
    for k, v in floats.items():  # pass-through unchanged
        assert w[k].shape == v.shape
        np.testing.assert_array_equal(np.array(w[k].astype(mx.float32)), v.astype(np.float32))


# ----------------------------------------------------------------------------------------------
# the three dialects


@pytest.mark.parametrize("style", ["hf_quant_config", "config"])
def test_load_modelopt(tmp_path, data, style):
    w = load_nvfp4(write_modelopt(tmp_path / "mo", data, config_style=style))
    _check_loaded(w, data, "modelopt")


def test_load_compressed_tensors(tmp_path, data):
    w = load_nvfp4(write_ct(tmp_path / "ct", data))
    _check_loaded(w, data, "compressed-tensors")


def test_load_mlx(tmp_path, data):
    folder = write_mlx(tmp_path / "mlx", data)
    w = load_nvfp4(folder / "model.safetensors")  # a single file: configs read next to it
    _check_loaded(w, data, "mlx")
    # MLX convention: dequantize(..., global_scale=gs) == e2m1 * e4m3 * gs / 2688
    p = "model.layers.0.mlp.down_proj"
    raw = mx.load(str(folder / "model.safetensors"))
    mlx_w = mx.dequantize(raw[f"{p}.weight"], raw[f"{p}.scales"], mode="nvfp4",
                          global_scale=raw[f"{p}.global_scale"], dtype=mx.float32)
    m = ref.multiplier(w[f"{p}.global_scale"])
    ours = ref.decode_weights(w[f"{p}.weight"], w[f"{p}.scales"], 96, m)
    np.testing.assert_allclose(np.array(mlx_w), ours, rtol=1e-6)


def test_load_dict_source_with_config(tmp_path, data):
    folder = write_ct(tmp_path / "ct", data)
    arrays = mx.load(str(folder / "model-00001-of-00001.safetensors"))
    cfg = json.loads((folder / "config.json").read_text())
    _check_loaded(load_nvfp4(arrays, config=cfg), data, "compressed-tensors")
    # without a config, names alone identify the dialect
    _check_loaded(load_nvfp4(arrays), data, "compressed-tensors")
    w = load_nvfp4(arrays)
    assert load_nvfp4(w) is w


@pytest.mark.parametrize("dialect", ["modelopt", "compressed-tensors", "mlx"])
def test_loaded_model_matches_reference(tmp_path, data, dialect, device):
    """Checkpoint -> FP4Linear layers (mx_fp4.nn.load_weights) -> outputs vs float64 reference
    of the checkpoint's own bytes and global scale convention."""
    writer = {"modelopt": write_modelopt, "compressed-tensors": write_ct, "mlx": write_mlx}[dialect]
    folder = writer(tmp_path / dialect, data)
    model = _TinyModel()
    fnn.load_weights(model, folder)
    layers, _ = data
    x = common.rand_x((3, 64), mx.bfloat16, common.rng("ckpt-x"))
    q = model.model.layers[0].self_attn.q_proj
    assert isinstance(q, fnn.FP4Linear) and type(model.lm_head) is nn.Linear
    d = layers["model.layers.0.self_attn.q_proj"]
    gs = _expected_global_scale(dialect, d)
    bias = mx.array(d["bias"].astype(np.float32)).astype(mx.bfloat16)
    common.check_matmul(q(x), x, mx.array(d["packed"]), mx.array(d["scales"]),
                        global_scale=mx.array(gs), epilogue=[("add", bias)])


class _Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(64, 32, bias=True)


class _MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(64, 4, bias=False)
        self.down_proj = nn.Linear(96, 64, bias=False)


class _Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = _Attn()
        self.mlp = _MLP()


class _Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(40, 64)
        self.layers = [_Layer()]
        self.norm = nn.RMSNorm(64)


class _TinyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = _Inner()
        self.lm_head = nn.Linear(64, 40, bias=False)


# ----------------------------------------------------------------------------------------------
# validation: errors name the tensor

Q = "model.layers.0.self_attn.q_proj"


def _set(key, value):
    def mutate(t):
        t[key] = value
    return mutate


def _drop(key):
    def mutate(t):
        del t[key]
    return mutate


@pytest.mark.parametrize(
    "mutate, match",
    [
        # ModelOpt PR #2038-style half-size block scales
        (_set(f"{Q}.weight_scale", np.zeros((32, 2), ml_dtypes.float8_e4m3fn)),
         rf"{Q}\.weight_scale expected .*\[32, 4\].* but got uint8 \[32, 2\]"),
        (_set(f"{Q}.weight_scale", np.ones((32, 4), np.float32)), rf"{Q}\.weight_scale .*float32"),
        (_set(f"{Q}.weight_scale_2", np.ones((2,), np.float32)), rf"{Q}\.weight_scale_2 expected a float32 scalar"),
        (_set(f"{Q}.weight", np.zeros((32, 36), np.uint8)), rf"{Q}\.weight expected uint8 \[N, K/2\]"),
        # Model-Optimizer #868-style: FP8 weights where packed FP4 was expected
        (_set(f"{Q}.weight", np.zeros((32, 64), ml_dtypes.float8_e4m3fn)), rf"{Q}\.weight_scale expected"),
        (_drop(f"{Q}.weight_scale"), rf"{Q}\.weight_scale is missing"),
    ],
    ids=["half-size-scales", "fp32-scales", "vector-weight_scale_2", "k-not-16", "fp8-weight",
         "missing-scale"],
)
def test_modelopt_validation_errors(tmp_path, data, mutate, match):
    folder = write_modelopt(tmp_path / "bad", data, mutate=mutate)
    with pytest.raises(ValueError, match=match):
        load_nvfp4(folder)


def test_exclude_and_ignore_wildcards(tmp_path, data):
    # excluded modules' float tensors pass through (checked in _check_loaded); a quantized
    # tensor inside an excluded module is an inconsistent checkpoint
    folder = write_modelopt(tmp_path / "mo", data, exclude=["lm_head", "model.layers.*.self_attn*"])
    with pytest.raises(ValueError, match=rf"{Q}.* matches .*'model\.layers\.\*\.self_attn\*'"):
        load_nvfp4(folder)
    folder = write_ct(tmp_path / "ct", data, ignore=["lm_head", r"re:.*\.down_proj$"])
    with pytest.raises(ValueError, match=r"down_proj.* matches .*re:"):
        load_nvfp4(folder)
    # "re:" patterns are regexes, not globs: this one matches nothing quantized
    _check_loaded(load_nvfp4(write_ct(tmp_path / "ct2", data, ignore=["re:lm_head$", "re:.*gate$"])),
                  data, "compressed-tensors")


def test_config_errors(tmp_path, data):
    with pytest.raises(ValueError, match="format expected 'nvfp4-pack-quantized' but got 'pack-quantized'"):
        load_nvfp4(write_ct(tmp_path / "ct", data, fmt="pack-quantized"))
    with pytest.raises(ValueError, match="quant_algo .* got 'FP8'"):
        load_nvfp4(write_modelopt(tmp_path / "mo", data, algo="FP8"))
    cp = lambda key, v: _set(key, v)
    with pytest.raises(ValueError, match=rf"{Q}\.scales .*group size 32"):
        load_nvfp4(write_mlx(tmp_path / "mx1", data, mutate=cp(f"{Q}.scales", np.zeros((32, 2), np.uint8))))
    # an affine layer (zero points) is MLX's own: passed through untouched, not NVFP4
    affine = load_nvfp4(write_mlx(tmp_path / "mx2", data, mutate=cp(f"{Q}.biases", np.zeros((32, 4), np.float16))))
    assert Q not in affine.quantized and affine[f"{Q}.biases"].shape == (32, 4)
    with pytest.raises(ValueError, match="neither"):
        load_nvfp4(tmp_path / "does-not-exist")


def test_compressed_tensors_without_global_scale(tmp_path, data):
    """nvfp4-pack-quantized always carries weight_global_scale: a layer without it would decode
    2688 / global_scale times too large, so it is an error, not "no global scale"."""
    def mutate(t):
        for p in LAYERS:
            del t[f"{p}.weight_global_scale"]

    with pytest.raises(ValueError, match=r"weight_global_scale is missing"):
        load_nvfp4(write_ct(tmp_path / "ct", data, mutate=mutate))


# ----------------------------------------------------------------------------------------------
# saving


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        if mx.issubdtype(a[k].dtype, mx.floating):
            np.testing.assert_array_equal(np.array(a[k].astype(mx.float32)),
                                          np.array(b[k].astype(mx.float32)), err_msg=k)
        else:
            np.testing.assert_array_equal(np.array(a[k]), np.array(b[k]), err_msg=k)


@pytest.mark.parametrize("dialect", ["modelopt", "compressed-tensors"])
def test_save_round_trip(tmp_path, data, dialect):
    writer = write_modelopt if dialect == "modelopt" else write_ct
    w = load_nvfp4(writer(tmp_path / "in", data))
    files = save_nvfp4(tmp_path / "out", w, config=dict(MODEL_CONFIG))
    assert [f.name for f in files] == ["model.safetensors", "model.safetensors.index.json", "config.json"]
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["quantization"] == {"group_size": 16, "bits": 4, "mode": "nvfp4"}
    back = load_nvfp4(tmp_path / "out")
    assert back.dialects == {"mlx"}
    _assert_same(back, w)  # bit for bit, global scales included
    # on disk: MLX layout, global_scale in MLX's convention (the amax), as in memory
    raw = mx.load(str(tmp_path / "out" / "model.safetensors"))
    assert raw[f"{Q}.weight"].dtype == mx.uint32 and raw[f"{Q}.scales"].dtype == mx.uint8
    assert raw[f"{Q}.global_scale"].item() == w[f"{Q}.global_scale"].item()
    # the index names every tensor (mlx-lm's save_model wrote it)
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(w)


def test_save_model_and_reload(tmp_path):
    model = _TinyModel()
    fnn.quantize(model, global_scale=True, class_predicate=lambda p, m: p != "lm_head", progress=False)
    files = save_nvfp4(tmp_path / "m.safetensors", model)
    assert files == [tmp_path / "m.safetensors"]
    fresh = _TinyModel()
    fnn.load_weights(fresh, tmp_path / "m.safetensors")
    x = mx.array([[1, 2, 3]])
    h = fresh.model.embed_tokens(x)
    for a, b in [(fresh.model.layers[0].self_attn.q_proj, model.model.layers[0].self_attn.q_proj),
                 (fresh.model.layers[0].mlp.gate, model.model.layers[0].mlp.gate)]:
        assert a.global_scale.item() == b.global_scale.item()
        np.testing.assert_array_equal(np.array(a(h)), np.array(b(h)))
    # K = 32: [4, 2] (nvfp4) and [4, 1] (mxfp4) are layouts; [4, 3] is neither.
    with pytest.raises(ValueError, match=r"save_nvfp4.*scales expected uint8 \[4, 2\] \(nvfp4\) or \[4, 1\] \(mxfp4\)"):
        bad = NVFP4Weights({"a.weight": mx.zeros((4, 4), mx.uint32), "a.scales": mx.zeros((4, 3), mx.uint8)})
        save_nvfp4(tmp_path / "bad.safetensors", bad)
