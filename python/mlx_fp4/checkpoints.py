"""Read NVFP4 checkpoints as they exist in the wild; save them in MLX layout.

:func:`load_nvfp4` turns a checkpoint into the MLX nvfp4 layout consumed by
:class:`mlx_fp4.nn.FP4Linear`. For every quantized linear with prefix ``p``:

* ``p.weight``       uint32 ``[N, K/8]`` (the checkpoint's packed bytes, viewed)
* ``p.scales``       uint8  ``[N, K/16]`` (raw E4M3 bits, unchanged)
* ``p.global_scale`` float32 scalar *multiplier*: ``w = e2m1 * e4m3 * global_scale``
  (absent when the checkpoint has none)
* ``p.bias``         when present.

Every other tensor passes through unchanged. Dialects, recognised per layer by
their tensor names (and checked against the config files when present):

================== ======================= ==================== ===========================
dialect            packed weight           block scales         per-tensor scale
================== ======================= ==================== ===========================
NVIDIA ModelOpt    ``weight`` u8 [N,K/2]   ``weight_scale`` F8  ``weight_scale_2`` () multiplier
compressed-tensors ``weight_packed`` u8    ``weight_scale`` F8  ``weight_global_scale`` [1] divisor
MLX nvfp4          ``weight`` u32 [N,K/8]  ``scales`` u8        ``global_scale`` (= amax; /2688)
================== ======================= ==================== ===========================

Activation scales of W4A4 exports (``input_scale``, ``input_global_scale``) are
dropped: this is a weight-only (W4A16) path.

:func:`save_nvfp4` writes the MLX layout back to safetensors, with
``global_scale`` in MLX's own convention (``alpha * 2688``, what
``mx.dequantize(..., mode="nvfp4", global_scale=...)`` expects) plus the exact
multipliers in the file metadata, so ``load_nvfp4(save_nvfp4(w)) == w`` bit for bit.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import math
import os
import re
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Tuple, Union

import mlx.core as mx
import numpy as np

__all__ = ["load_nvfp4", "save_nvfp4", "NVFP4Weights", "E2M1_E4M3_MAX"]

E2M1_E4M3_MAX = 2688.0  # 6 * 448: MLX global_scale = alpha * 2688
GROUP_SIZE = 16
_ALPHA_META_KEY = "mlx_fp4.alpha"

Source = Union[str, os.PathLike, Mapping[str, mx.array]]


class NVFP4Weights(dict):
    """``dict[str, mx.array]`` in mlx_fp4's layout (``global_scale`` entries are
    multipliers). Returned by :func:`load_nvfp4`; passing one back to
    :func:`load_nvfp4` or :func:`mlx_fp4.nn.load_weights` uses it as is.

    ``.dialects`` names the formats that were converted, ``.quantized`` lists
    the prefixes of the quantized linears.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.dialects = set()
        self.quantized = []


def _err(msg):
    return ValueError(f"[load_nvfp4] {msg}")


def _dt(dtype) -> str:
    return str(dtype).rpartition(".")[2]


def _desc(a: mx.array) -> str:
    return f"{_dt(a.dtype)} {list(a.shape)}"


# --------------------------------------------------------------------------- #
# reading sources
# --------------------------------------------------------------------------- #
def _read_json(path: Path) -> Optional[dict]:
    if path.is_file():
        with open(path) as f:
            return json.load(f)
    return None


def _read_configs(folder: Path) -> dict:
    cfg = {}
    config = _read_json(folder / "config.json")
    if config is not None:
        cfg["config"] = config
    hf = _read_json(folder / "hf_quant_config.json")
    if hf is not None:
        cfg["hf_quant_config"] = hf
    return cfg


def _load_file(path: Path) -> Tuple[dict, dict]:
    try:
        arrays, metadata = mx.load(str(path), return_metadata=True)
    except Exception as e:  # pragma: no cover - message depends on MLX
        raise _err(f"cannot read {path}: {e}") from e
    return arrays, dict(metadata or {})


def _alpha_meta(meta: dict) -> dict:
    """The exact multipliers save_nvfp4 stored in the metadata: prefix -> fp32."""
    try:
        return {
            k: np.float32(float.fromhex(v))
            for k, v in json.loads(meta.get(_ALPHA_META_KEY, "{}")).items()
        }
    except (ValueError, TypeError, AttributeError):
        return {}


def _read_source(source) -> Tuple[dict, dict, dict]:
    """-> (weights, metadata, configs)."""
    if isinstance(source, Mapping):
        return dict(source), {}, {}
    path = Path(source)
    if path.is_file():
        if path.suffix != ".safetensors":
            raise _err(f"source expected a .safetensors file or a folder but got {path}.")
        weights, meta = _load_file(path)
        meta[_ALPHA_META_KEY] = _alpha_meta(meta)
        return weights, meta, _read_configs(path.parent)
    if path.is_dir():
        index = _read_json(path / "model.safetensors.index.json")
        if index is not None and "weight_map" in index:
            files = sorted(set(index["weight_map"].values()))
            files = [path / f for f in files]
        else:
            files = sorted(Path(p) for p in glob.glob(str(path / "*.safetensors")))
        if not files:
            raise _err(f"no .safetensors files in {path}.")
        weights, meta, alphas = {}, {}, {}
        for f in files:
            w, m = _load_file(f)
            dup = weights.keys() & w.keys()
            if dup:
                raise _err(f"tensor {sorted(dup)[0]} appears in more than one file ({f.name}).")
            weights.update(w)
            alphas.update(_alpha_meta(m))
            meta.update(m)
        meta[_ALPHA_META_KEY] = alphas
        return weights, meta, _read_configs(path)
    raise _err(f"source {str(path)!r} is neither a file, a folder nor a dict.")


# --------------------------------------------------------------------------- #
# configs
# --------------------------------------------------------------------------- #
_CT_FORMAT = "nvfp4-pack-quantized"
_MODELOPT_ALGOS = ("NVFP4", "W4A16_NVFP4", "MIXED_PRECISION")


def _quant_info(cfgs: dict) -> dict:
    """Normalise the quantization metadata: method and ignore patterns."""
    info = {"method": None, "ignore": []}
    config = cfgs.get("config") or {}
    hf = cfgs.get("hf_quant_config")
    qc = config.get("quantization_config")
    if qc is None:
        qc = (config.get("text_config") or {}).get("quantization_config")
    if hf is not None:
        q = hf.get("quantization", hf)
        info["method"] = "modelopt"
        info["algo"] = q.get("quant_algo")
        info["ignore"] = list(q.get("exclude_modules") or []) + list(q.get("ignore") or [])
        info["group_size"] = q.get("group_size", GROUP_SIZE)
    elif isinstance(qc, dict) and qc.get("quant_method") is not None:
        method = qc["quant_method"]
        info["method"] = method
        if method == "modelopt":
            q = qc.get("quantization", qc)
            info["algo"] = q.get("quant_algo")
            info["ignore"] = list(q.get("ignore") or []) + list(q.get("exclude_modules") or [])
            info["group_size"] = q.get("group_size", GROUP_SIZE)
        elif method == "compressed-tensors":
            info["ignore"] = list(qc.get("ignore") or [])
            fmt = qc.get("format")
            groups = qc.get("config_groups") or {}
            fmts = {fmt} | {g.get("format") for g in groups.values() if isinstance(g, dict)}
            info["format"] = fmt
            if _CT_FORMAT not in fmts:
                raise _err(
                    f"compressed-tensors format expected {_CT_FORMAT!r} but got {fmt!r} "
                    "(not an NVFP4 checkpoint)."
                )
            for name, g in groups.items():
                wq = (g or {}).get("weights") or {}
                gs = wq.get("group_size")
                if wq.get("type") == "float" and wq.get("num_bits") == 4 and gs not in (None, GROUP_SIZE):
                    raise _err(f"config_groups.{name}.weights.group_size expected 16 but got {gs}.")
    elif "quantization" in config:
        q = config["quantization"]
        info["method"] = "mlx"
        info["mode"] = q.get("mode", "affine")
    if info["method"] == "modelopt":
        algo = info.get("algo")
        if algo not in _MODELOPT_ALGOS:
            raise _err(f"ModelOpt quant_algo expected one of {_MODELOPT_ALGOS} but got {algo!r}.")
        if info.get("group_size", GROUP_SIZE) != GROUP_SIZE:
            raise _err(f"ModelOpt group_size expected 16 but got {info['group_size']}.")
    elif info["method"] == "mlx":
        if info["mode"] != "nvfp4":
            raise _err(f"MLX quantization mode expected 'nvfp4' but got {info['mode']!r}.")
    elif info["method"] not in (None, "compressed-tensors"):
        raise _err(f"quant_method {info['method']!r} is not an NVFP4 format.")
    return info


def _match(name: str, patterns: Iterable[str]) -> Optional[str]:
    """The first ModelOpt (fnmatch) / compressed-tensors ("re:" regex) pattern
    matching the module ``name``, else None."""
    for pat in patterns:
        if not isinstance(pat, str):
            continue
        if pat.startswith("re:"):
            if re.match(pat[3:], name):
                return pat
        elif fnmatch.fnmatchcase(name, pat):
            return pat
    return None


# --------------------------------------------------------------------------- #
# per-layer conversion
# --------------------------------------------------------------------------- #
def _packed_dims(p: str, name: str, w: mx.array) -> Tuple[int, int]:
    if w.dtype != mx.uint8 or w.ndim != 2 or w.shape[1] % 8 != 0:
        raise _err(
            f"{p}.{name} expected uint8 [N, K/2] with K a multiple of 16 but got {_desc(w)}."
        )
    return w.shape[0], w.shape[1] * 2


def _check_block_scales(p: str, name: str, s: mx.array, n: int, k: int, wname: str):
    want = [n, k // GROUP_SIZE]
    if s.dtype != mx.uint8 or list(s.shape) != want:
        raise _err(
            f"{p}.{name} expected float8_e4m3fn (read as uint8) {want} for {p}.{wname} "
            f"(K={k}) but got {_desc(s)}."
        )


def _scalar(p: str, name: str, t: mx.array) -> mx.array:
    if t.size != 1 or not mx.issubdtype(t.dtype, mx.floating):
        raise _err(f"{p}.{name} expected a float32 scalar ([] or [1]) but got {_desc(t)}.")
    return t.reshape(()).astype(mx.float32)


def _modelopt(p, w, get):
    n, k = _packed_dims(p, "weight", w)
    s = get("weight_scale")
    _check_block_scales(p, "weight_scale", s, n, k, "weight")
    out = {f"{p}.weight": w.view(mx.uint32), f"{p}.scales": s}
    ws2 = get("weight_scale_2", None)
    if ws2 is not None:
        out[f"{p}.global_scale"] = _scalar(p, "weight_scale_2", ws2)
    return out


def _compressed_tensors(p, w, get):
    n, k = _packed_dims(p, "weight_packed", w)
    s = get("weight_scale")
    _check_block_scales(p, "weight_scale", s, n, k, "weight_packed")
    shape = get("weight_shape", None)
    if shape is not None:
        got = [int(v) for v in np.array(shape).reshape(-1)]
        if got != [n, k]:
            raise _err(f"{p}.weight_shape expected [{n}, {k}] but got {got}.")
    out = {f"{p}.weight": w.view(mx.uint32), f"{p}.scales": s}
    g = get("weight_global_scale", None)
    if g is not None:
        g = _scalar(p, "weight_global_scale", g)
        # a divisor: alpha = 1 / weight_global_scale, one IEEE division in fp32.
        out[f"{p}.global_scale"] = mx.divide(mx.array(1.0, mx.float32), g, stream=mx.cpu)
    return out


def _mlx(p, w, get, exact_alpha):
    if get("biases", None) is not None:
        raise _err(f"{p}.biases present: {p} is affine-quantized, not nvfp4.")
    if w.dtype == mx.uint8:
        n, k = _packed_dims(p, "weight", w)
        w = w.view(mx.uint32)
    elif w.dtype == mx.uint32 and w.ndim == 2:
        n, k = w.shape[0], w.shape[1] * 8
    else:
        raise _err(f"{p}.weight expected uint32 [N, K/8] but got {_desc(w)}.")
    s = get("scales")
    if s.dtype == mx.uint8 and s.ndim == 2 and s.shape[0] == n and s.shape[1] * 32 == k:
        raise _err(
            f"{p}.scales expected uint8 [{n}, {k // GROUP_SIZE}] but got {_desc(s)}: "
            "group size 32 (mxfp4), not nvfp4."
        )
    _check_block_scales(p, "scales", s, n, k, "weight")
    out = {f"{p}.weight": w, f"{p}.scales": s}
    gs = get("global_scale", None)
    if gs is not None:
        gs = _scalar(p, "global_scale", gs)
        g = np.float32(gs.item())
        alpha = exact_alpha.get(p)
        if alpha is None or np.float32(np.float64(alpha) * E2M1_E4M3_MAX) != g:
            alpha = np.float32(np.float64(g) / E2M1_E4M3_MAX)
        out[f"{p}.global_scale"] = mx.array(alpha, dtype=mx.float32)
    return out


_DIALECT_KEYS = {
    "compressed-tensors": (
        "weight_packed",
        "weight_scale",
        "weight_global_scale",
        "input_global_scale",
        "weight_shape",
    ),
    "modelopt": ("weight", "weight_scale", "weight_scale_2", "input_scale"),
    "mlx": ("weight", "scales", "global_scale", "biases"),
}


_ACTIVATION_SCALES = ("input_scale", "input_global_scale", "k_scale", "v_scale")


def _classify(weights: dict) -> Dict[str, str]:
    """prefix -> dialect for every layer that looks NVFP4-quantized."""
    layers = {}
    for key in weights:
        p, _, name = key.rpartition(".")
        if not p or p in layers:
            continue
        if name == "weight_packed":
            layers[p] = "compressed-tensors"
        elif name == "weight_scale" and f"{p}.weight_packed" in weights:
            layers[p] = "compressed-tensors"
        elif name in ("weight_scale", "weight_scale_2") and f"{p}.weight" in weights:
            layers[p] = "modelopt"
        elif name == "scales" and f"{p}.weight" in weights and weights[f"{p}.weight"].ndim == 2:
            layers[p] = "mlx"
    return layers


def load_nvfp4(source: Source, *, config: Optional[dict] = None) -> NVFP4Weights:
    """Load an NVFP4 checkpoint into the MLX nvfp4 layout (see module doc).

    Args:
        source: a ``.safetensors`` file (its folder's ``config.json`` /
            ``hf_quant_config.json`` are read when present), a folder of them
            (``model.safetensors.index.json`` is honoured), or a dict of arrays
            (e.g. from ``mx.load``; an MLX ``global_scale`` in it is read in
            MLX's convention). An :class:`NVFP4Weights` is returned unchanged.
        config: the parsed ``config.json`` (or ``{"config": ..., "hf_quant_config":
            ...}``) to use instead of the files next to ``source``.

    No bytes are copied: packed weights are ``view``-ed as uint32 and scales
    are the loaded arrays. Shapes and dtypes are validated, and errors name
    the tensor. A quantized tensor in a module the config excludes
    (ModelOpt ``exclude_modules``, compressed-tensors ``ignore``; fnmatch
    wildcards or ``re:`` regexes) is an error; excluded modules' float tensors
    pass through.
    """
    if isinstance(source, NVFP4Weights):
        return source
    weights, metadata, cfgs = _read_source(source)
    if config is not None:
        cfgs = config if ("config" in config or "hf_quant_config" in config) else {"config": config}
    info = _quant_info(cfgs)
    exact_alpha = metadata.get(_ALPHA_META_KEY) or {}

    layers = _classify(weights)
    out = NVFP4Weights()
    consumed = set()
    done = set()
    for key in weights:
        if key in consumed:
            continue
        p, _, name = key.rpartition(".")
        dialect = layers.get(p)
        if dialect is None or name not in _DIALECT_KEYS[dialect]:
            if name in _ACTIVATION_SCALES and (
                dialect is not None or info["method"] in ("modelopt", "compressed-tensors")
            ):
                continue  # W4A4 / FP8-KV calibration scales: unused by W4A16
            out[key] = weights[key]
            continue
        if p in done:
            continue
        done.add(p)
        pat = _match(p, info["ignore"])
        if pat is not None:
            raise _err(
                f"{key} is NVFP4-quantized but module {p!r} matches the checkpoint's "
                f"exclude/ignore pattern {pat!r}."
            )
        if info["method"] == "compressed-tensors" and dialect != "compressed-tensors":
            raise _err(f"{key}: a {dialect} tensor in a compressed-tensors checkpoint.")
        if info["method"] == "modelopt" and dialect != "modelopt":
            raise _err(f"{key}: a {dialect} tensor in a ModelOpt checkpoint.")

        def get(name, *default, _p=p):
            k = f"{_p}.{name}"
            if k in weights:
                consumed.add(k)
                return weights[k]
            if default:
                return default[0]
            raise _err(f"{k} is missing (needed by the {dialect} layer {_p!r}).")

        if dialect == "modelopt":
            conv = _modelopt(p, get("weight"), get)
            get("input_scale", None)
        elif dialect == "compressed-tensors":
            conv = _compressed_tensors(p, get("weight_packed"), get)
            get("input_global_scale", None)
        else:
            conv = _mlx(p, get("weight"), get, exact_alpha)
        out.update(conv)
        out.dialects.add(dialect)
        out.quantized.append(p)
    return out


# --------------------------------------------------------------------------- #
# saving
# --------------------------------------------------------------------------- #
def _collect(weights) -> Dict[str, mx.array]:
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    if isinstance(weights, nn.Module):
        from .nn import global_scales

        arrays = dict(tree_flatten(weights.parameters()))
        arrays.update(global_scales(weights))
        return arrays
    if isinstance(weights, NVFP4Weights):
        return dict(weights)
    if isinstance(weights, Mapping):
        arrays = dict(weights)
        # a plain dict must already be in mlx_fp4's layout (multipliers)
        return arrays
    raise ValueError(
        f"[save_nvfp4] weights expected an nn.Module or a dict of arrays but got "
        f"{type(weights).__name__}."
    )


def _to_mlx_convention(arrays: Dict[str, mx.array]) -> Tuple[Dict[str, mx.array], dict]:
    out = {}
    exact = {}
    for key, v in arrays.items():
        if not isinstance(v, mx.array):
            raise ValueError(f"[save_nvfp4] {key} expected an mx.array but got {type(v).__name__}.")
        p, _, name = key.rpartition(".")
        w = arrays.get(f"{p}.weight")
        if name == "scales" and w is not None and w.ndim == 2:
            if w.dtype != mx.uint32:
                raise ValueError(f"[save_nvfp4] {p}.weight expected uint32 [N, K/8] but got {_desc(w)}.")
            n, k = w.shape[0], w.shape[1] * 8
            if v.dtype != mx.uint8 or list(v.shape) != [n, k // GROUP_SIZE]:
                raise ValueError(
                    f"[save_nvfp4] {key} expected uint8 [{n}, {k // GROUP_SIZE}] but got {_desc(v)}."
                )
        if name == "global_scale" and w is not None and w.ndim == 2 and f"{p}.scales" in arrays:
            if v.size != 1:
                raise ValueError(f"[save_nvfp4] {key} expected a scalar but got {_desc(v)}.")
            alpha = np.float32(v.astype(mx.float32).item())
            out[key] = mx.array(np.float32(np.float64(alpha) * E2M1_E4M3_MAX), dtype=mx.float32)
            exact[p] = float(alpha).hex()
            continue
        out[key] = v
    return out, exact


def save_nvfp4(
    path: Union[str, os.PathLike],
    weights,
    *,
    config: Optional[dict] = None,
    max_shard_bytes: int = 5 << 30,
    metadata: Optional[Dict[str, str]] = None,
) -> List[Path]:
    """Save NVFP4 weights in the MLX layout (what mlx-lm writes for nvfp4).

    Args:
        path: a ``*.safetensors`` file, or a folder: ``model.safetensors`` (or
            ``model-0000i-of-0000n.safetensors`` shards of at most
            ``max_shard_bytes``), ``model.safetensors.index.json`` and, when
            ``config`` is given, ``config.json`` with
            ``"quantization": {"group_size": 16, "bits": 4, "mode": "nvfp4"}``
            (duplicated as ``quantization_config``, replacing a ModelOpt or
            compressed-tensors one).
        weights: the dict :func:`load_nvfp4` returned (global scales as
            multipliers), or a model (its parameters plus its FP4Linear global
            scales).

    ``<p>.global_scale`` is written in MLX's convention (``alpha * 2688``, fp32)
    and the exact multipliers go in the metadata key ``mlx_fp4.alpha``, so
    :func:`load_nvfp4` returns the same arrays bit for bit. Scales are written
    as U8 (``mx.save_safetensors`` has no F8_E4M3). Returns the files written.
    """
    arrays, exact = _to_mlx_convention(_collect(weights))
    meta = {"format": "mlx"}
    if exact:
        meta[_ALPHA_META_KEY] = json.dumps(exact, sort_keys=True)
    if metadata:
        meta.update(metadata)
    path = Path(path)
    if path.suffix == ".safetensors":
        path.parent.mkdir(parents=True, exist_ok=True)
        mx.save_safetensors(str(path), arrays, metadata=meta)
        return [path]

    path.mkdir(parents=True, exist_ok=True)
    shards, cur, size = [], {}, 0
    for k, v in arrays.items():
        if cur and size + v.nbytes > max_shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = v
        size += v.nbytes
    shards.append(cur)
    files = []
    weight_map = {}
    for i, shard in enumerate(shards):
        name = (
            "model.safetensors"
            if len(shards) == 1
            else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        )
        shard_meta = dict(meta)
        if exact:
            mine = {p: a for p, a in exact.items() if f"{p}.global_scale" in shard}
            shard_meta[_ALPHA_META_KEY] = json.dumps(mine, sort_keys=True)
        mx.save_safetensors(str(path / name), shard, metadata=shard_meta)
        files.append(path / name)
        weight_map.update({k: name for k in shard})
    with open(path / "model.safetensors.index.json", "w") as f:
        json.dump(
            {
                "metadata": {"total_size": sum(v.nbytes for v in arrays.values())},
                "weight_map": dict(sorted(weight_map.items())),
            },
            f,
            indent=4,
        )
    if config is not None:
        cfg = dict(config)
        q = {"group_size": GROUP_SIZE, "bits": 4, "mode": "nvfp4"}
        cfg["quantization"] = q
        cfg["quantization_config"] = dict(q)
        with open(path / "config.json", "w") as f:
            json.dump(cfg, f, indent=4)
        files.append(path / "config.json")
    return files
