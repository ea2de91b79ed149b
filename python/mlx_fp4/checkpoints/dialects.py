"""The NVFP4 checkpoint dialects: ModelOpt, compressed-tensors and MLX.

``quant_info`` reads a checkpoint's quantization metadata, ``classify`` names the dialect of
every quantized layer from its tensor names, and one converter per dialect turns a layer's
tensors into mlx_fp4's layout (``weight`` uint32, ``scales`` uint8, ``global_scale`` fp32 [1]
in MLX's convention, the amax). See ``mlx_fp4.checkpoints`` for the table.
"""

from __future__ import annotations

import fnmatch
import math
import re
from typing import Dict, Iterable, Optional, Tuple

import mlx.core as mx
import numpy as np

from ..formats import (
    GLOBAL_SCALE_SHAPE,
    GROUP_SIZE,
    describe,
    global_scale_from_divisor,
    global_scale_from_multiplier,
    multiplier,
)


def load_error(msg):
    return ValueError(f"[load_nvfp4] {msg}")


_CT_FORMAT = "nvfp4-pack-quantized"
_MODELOPT_ALGOS = ("NVFP4", "W4A16_NVFP4", "MIXED_PRECISION")


def _patterns(q: dict, field: str) -> list:
    """A pattern list of the quantization config; one string is one pattern (not its characters)."""
    v = q.get(field) or []
    if isinstance(v, str):
        return [v]
    if not isinstance(v, (list, tuple)) or not all(isinstance(p, str) for p in v):
        raise load_error(f"quantization config field {field!r} expected a list of patterns but got {v!r}.")
    return list(v)


def _object(v, where: str, default=None) -> dict:
    """A config field that must be a JSON object (absent: ``default``, else {})."""
    if v is None:
        return {} if default is None else default
    if not isinstance(v, dict):
        raise load_error(f"{where} expected an object but got {type(v).__name__} {v!r:.80}.")
    return v


def _compressed_tensors_info(qc: dict, info: dict) -> None:
    info["ignore"] = _patterns(qc, "ignore")
    fmt = qc.get("format")
    groups = _object(qc.get("config_groups"), "config.json field 'quantization_config.config_groups'")
    fmts = [fmt]
    for name, g in groups.items():
        g = _object(g, f"config.json field 'quantization_config.config_groups.{name}'")
        fmts.append(g.get("format"))
        wq = _object(g.get("weights"), f"config.json field 'quantization_config.config_groups.{name}.weights'")
        gs = wq.get("group_size")
        if wq.get("type") == "float" and wq.get("num_bits") == 4 and gs not in (None, GROUP_SIZE):
            raise load_error(f"config_groups.{name}.weights.group_size expected 16 but got {gs!r}.")
    info["format"] = fmt
    if _CT_FORMAT not in fmts:
        raise load_error(f"compressed-tensors format expected {_CT_FORMAT!r} but got {fmt!r} (not an NVFP4 checkpoint).")


def _modelopt_info(q: dict, info: dict, fields) -> None:
    info["algo"] = q.get("quant_algo")
    info["ignore"] = [p for f in fields for p in _patterns(q, f)]
    info["group_size"] = q.get("group_size", GROUP_SIZE)


def quant_info(cfgs: dict) -> dict:
    """Normalise the quantization metadata: method and ignore patterns. A field of the wrong JSON
    type is a clear error naming it (a string ``quantization`` was an AttributeError)."""
    info = {"method": None, "ignore": []}
    config = cfgs.get("config") or {}
    hf = cfgs.get("hf_quant_config")
    qc = config.get("quantization_config")
    if qc is None:
        text = _object(config.get("text_config"), "config.json field 'text_config'")
        qc = text.get("quantization_config")
    if qc is not None and not isinstance(qc, dict):
        raise load_error(f"config.json field 'quantization_config' expected an object but got {type(qc).__name__}.")
    if hf is not None:
        q = hf.get("quantization", hf)
        if not isinstance(q, dict):
            raise load_error(f"hf_quant_config.json field 'quantization' expected an object but got {type(q).__name__}.")
        info["method"] = "modelopt"
        _modelopt_info(q, info, ("exclude_modules", "ignore"))
    elif isinstance(qc, dict) and qc.get("quant_method") is not None:
        method = qc["quant_method"]
        if not isinstance(method, str):
            raise load_error(f"config.json field 'quantization_config.quant_method' expected a string but got {method!r}.")
        info["method"] = method
        if method == "mxfp4":  # gpt-oss on Hugging Face: *_blocks / *_scales experts
            info["mode"] = "mxfp4"
        if method == "modelopt":
            q = _object(qc.get("quantization"), "config.json field 'quantization_config.quantization'", qc)
            _modelopt_info(q, info, ("ignore", "exclude_modules"))
        elif method == "compressed-tensors":
            _compressed_tensors_info(qc, info)
        elif method == "mlx":  # mlx-lm writes "quantization", not a quant_method
            raise load_error("config.json field 'quantization_config.quant_method' 'mlx' is not a format "
                             "(MLX checkpoints say 'quantization': {...}).")
    elif "quantization" in config:
        q = _object(config["quantization"], "config.json field 'quantization'")
        info["method"] = "mlx"
        info["mode"] = q.get("mode", "affine")
    if info["method"] == "modelopt":
        algo = info.get("algo")
        if not isinstance(algo, str) or algo not in _MODELOPT_ALGOS:
            raise load_error(f"ModelOpt quant_algo expected one of {_MODELOPT_ALGOS} but got {algo!r}.")
        if info.get("group_size", GROUP_SIZE) != GROUP_SIZE:
            raise load_error(f"ModelOpt group_size expected 16 but got {info['group_size']!r}.")
    elif info["method"] == "mlx":
        if not isinstance(info["mode"], str) or info["mode"] not in ("nvfp4", "mxfp4"):
            raise load_error(f"MLX quantization mode expected 'nvfp4' or 'mxfp4' but got {info['mode']!r}.")
    elif info["method"] not in (None, "compressed-tensors", "mxfp4"):
        raise load_error(f"quant_method {info['method']!r} is not an NVFP4 format.")
    return info


def match_pattern(name: str, patterns: Iterable[str]) -> Optional[str]:
    """The first ModelOpt (fnmatch) / compressed-tensors ("re:" regex) pattern
    matching the module ``name``, else None."""
    for pat in patterns:
        if not isinstance(pat, str):
            continue
        if pat.startswith("re:"):
            try:
                hit = re.match(pat[3:], name)
            except re.error as e:
                raise load_error(f"quantization config pattern {pat!r} is not a valid regular expression: {e}.") from None
            if hit:
                return pat
        elif fnmatch.fnmatchcase(name, pat):
            return pat
    return None


def _packed_dims(p: str, name: str, w: mx.array) -> Tuple[int, int]:
    if w.dtype != mx.uint8 or w.ndim != 2 or w.shape[1] % 8 != 0:
        raise load_error(
            f"{p}.{name} expected uint8 [N, K/2] with K a multiple of 16 but got {describe(w)}."
        )
    return w.shape[0], w.shape[1] * 2


def _check_block_scales(p: str, name: str, s: mx.array, n: int, k: int, wname: str):
    want = [n, k // GROUP_SIZE]
    if s.dtype != mx.uint8 or list(s.shape) != want:
        raise load_error(
            f"{p}.{name} expected float8_e4m3fn (read as uint8) {want} for {p}.{wname} "
            f"(K={k}) but got {describe(s)}."
        )


def _scalar(p: str, name: str, t: mx.array) -> mx.array:
    """A per-tensor scale: one float, finite and > 0 (NaN/inf gave NaN logits, 0 a zero layer and a
    negative one a sign-flipped layer, all silently)."""
    if t.size != 1 or t.ndim > 1 or not mx.issubdtype(t.dtype, mx.floating):
        raise load_error(f"{p}.{name} expected a float32 scalar ([] or [1]) but got {describe(t)}.")
    t = t.reshape(()).astype(mx.float32)
    v = t.item()
    if not (math.isfinite(v) and v > 0):
        raise load_error(f"{p}.{name} expected a finite value > 0 but got {v}.")
    return t


def _usable(p: str, name: str, source: mx.array, gs: mx.array) -> mx.array:
    """MLX's global scale converted from the file's ``source``: finite, with a decode multiplier
    (/ 2688) > 0 in fp32 (a compressed-tensors divisor of 1e-38 gave inf, an MLX scale of 1e-45 a
    multiplier of 0: NaN logits or a zero layer)."""
    v, m = gs.item(), multiplier(gs).item()
    if not (math.isfinite(v) and math.isfinite(m) and m > 0):
        raise load_error(f"{p}.{name} = {source.item()!r} gives the global scale {v!r} (MLX's convention, "
                         f"the amax; its multiplier / 2688 = {m!r}): outside fp32's usable range.")
    return gs


def from_modelopt(p, w, get):
    n, k = _packed_dims(p, "weight", w)
    s = get("weight_scale")
    _check_block_scales(p, "weight_scale", s, n, k, "weight")
    out = {f"{p}.weight": w.view(mx.uint32), f"{p}.scales": s}
    # ModelOpt's NVFP4 always writes the per-tensor scale: without it the layer would decode wrong.
    m = _scalar(p, "weight_scale_2", get("weight_scale_2"))
    out[f"{p}.global_scale"] = _usable(p, "weight_scale_2", m, global_scale_from_multiplier(m))
    return out


def from_compressed_tensors(p, w, get):
    n, k = _packed_dims(p, "weight_packed", w)
    s = get("weight_scale")
    _check_block_scales(p, "weight_scale", s, n, k, "weight_packed")
    shape = get("weight_shape", None)
    if shape is not None:
        # Integers only: int() of a float or complex entry truncated 32.5, dropped an imaginary
        # part or raised on NaN.
        got = [int(v) for v in np.array(shape).reshape(-1)] if mx.issubdtype(shape.dtype, mx.integer) else None
        if got != [n, k]:
            values = f" = {got}" if got is not None else ""
            raise load_error(f"{p}.weight_shape expected integers [{n}, {k}] but got {describe(shape)}{values}.")
    out = {f"{p}.weight": w.view(mx.uint32), f"{p}.scales": s}
    # compressed-tensors' nvfp4 always writes the global scale: without it the layer would decode wrong.
    d = _scalar(p, "weight_global_scale", get("weight_global_scale"))
    out[f"{p}.global_scale"] = _usable(p, "weight_global_scale", d, global_scale_from_divisor(d))
    return out


def from_mlx(p, w, get):
    if w.dtype == mx.uint8:
        n, k = _packed_dims(p, "weight", w)
        w = w.view(mx.uint32)
    elif w.dtype == mx.uint32 and w.ndim == 2:
        n, k = w.shape[0], w.shape[1] * 8
    else:
        raise load_error(f"{p}.weight expected uint32 [N, K/8] but got {describe(w)}.")
    s = get("scales")
    if s.dtype == mx.uint8 and s.ndim == 2 and s.shape[0] == n and s.shape[1] * 32 == k:
        raise load_error(
            f"{p}.scales expected uint8 [{n}, {k // GROUP_SIZE}] but got {describe(s)}: "
            "group size 32 (mxfp4), not nvfp4."
        )
    _check_block_scales(p, "scales", s, n, k, "weight")
    out = {f"{p}.weight": w, f"{p}.scales": s}
    gs = get("global_scale", None)
    if gs is not None:  # already MLX's convention
        gs = _scalar(p, "global_scale", gs)
        out[f"{p}.global_scale"] = _usable(p, "global_scale", gs, gs.reshape(GLOBAL_SCALE_SHAPE))
    return out


DIALECT_KEYS = {
    "compressed-tensors": (
        "weight_packed",
        "weight_scale",
        "weight_global_scale",
        "input_global_scale",
        "weight_shape",
    ),
    "modelopt": ("weight", "weight_scale", "weight_scale_2", "input_scale"),
    "mlx": ("weight", "scales", "global_scale"),
}


# The tensor names of a quantized layer besides its weight: one of them in a layer of another
# dialect means tensors of two formats (it would pass through next to the converted ones).
QUANTIZATION_NAMES = frozenset(n for keys in DIALECT_KEYS.values() for n in keys) - {"weight", "input_scale",
                                                                                     "input_global_scale"}

ACTIVATION_SCALES = ("input_scale", "input_global_scale", "k_scale", "v_scale")


def classify(weights: dict) -> Dict[str, str]:
    """prefix -> dialect for every layer that looks NVFP4-quantized."""
    layers = {}
    for key in weights:
        p, _, name = key.rpartition(".")
        if not p or p in layers:
            continue
        # Names only one dialect writes mark the layer even without its packed weight, which
        # is then reported missing (the layer's other tensors passed through as plain ones).
        if name in ("weight_packed", "weight_global_scale", "weight_shape"):
            layers[p] = "compressed-tensors"
        elif name == "weight_scale" and f"{p}.weight_packed" in weights:
            layers[p] = "compressed-tensors"
        elif name == "weight_scale_2" or (name == "weight_scale" and f"{p}.weight" in weights):
            layers[p] = "modelopt"
        elif name == "scales" and f"{p}.weight" in weights and weights[f"{p}.weight"].ndim == 2:
            if f"{p}.biases" not in weights:  # affine (zero points): MLX's own, passed through
                layers[p] = "mlx"
    return layers
