"""Reading and writing NVFP4 safetensors: ``load_nvfp4`` (any dialect -> mlx_fp4's layout)
and ``save_nvfp4`` (mlx_fp4's layout -> the MLX layout mlx-lm writes)."""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple, Union

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ..formats import GROUP_SIZE, VALUES_PER_U32, describe
from .dialects import (
    ACTIVATION_SCALES,
    DIALECT_KEYS,
    classify,
    from_compressed_tensors,
    load_error,
    match_pattern,
    from_mlx,
    from_modelopt,
    quant_info,
)

__all__ = ["load_nvfp4", "save_nvfp4", "NVFP4Weights"]

Source = Union[str, os.PathLike, Mapping[str, mx.array]]


class NVFP4Weights(dict):
    """``dict[str, mx.array]`` in mlx_fp4's layout (``global_scale`` entries in MLX's
    convention). Returned by :func:`load_nvfp4`; passing one back to
    :func:`load_nvfp4` or :func:`mlx_fp4.nn.load_weights` uses it as is.

    ``.dialects`` names the formats that were converted, ``.quantized`` lists
    the prefixes of the quantized linears.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.dialects = set()
        self.quantized = []


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
        raise load_error(f"cannot read {path}: {e}") from e
    return arrays, dict(metadata or {})


def _read_source(source) -> Tuple[dict, dict, dict]:
    """-> (weights, configs)."""
    if isinstance(source, Mapping):
        return dict(source), {}
    path = Path(source)
    if path.is_file():
        if path.suffix != ".safetensors":
            raise load_error(f"source expected a .safetensors file or a folder but got {path}.")
        weights, _ = _load_file(path)
        return weights, _read_configs(path.parent)
    if path.is_dir():
        index = _read_json(path / "model.safetensors.index.json")
        if index is not None and "weight_map" in index:
            files = sorted(set(index["weight_map"].values()))
            files = [path / f for f in files]
        else:
            files = sorted(Path(p) for p in glob.glob(str(path / "*.safetensors")))
        if not files:
            raise load_error(f"no .safetensors files in {path}.")
        weights = {}
        for f in files:
            w, _ = _load_file(f)
            dup = weights.keys() & w.keys()
            if dup:
                raise load_error(f"tensor {sorted(dup)[0]} appears in more than one file ({f.name}).")
            weights.update(w)
        return weights, _read_configs(path)
    raise load_error(f"source {str(path)!r} is neither a file, a folder nor a dict.")


def load_nvfp4(source: Source, *, config: Optional[dict] = None) -> NVFP4Weights:
    """Load an NVFP4 checkpoint into the MLX nvfp4 layout (see module doc).

    Args:
        source: a ``.safetensors`` file (its folder's ``config.json`` /
            ``hf_quant_config.json`` are read when present), a folder of them
            (``model.safetensors.index.json`` is honoured), or a dict of arrays
            (e.g. from ``mx.load``). An :class:`NVFP4Weights` is returned unchanged.
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
    weights, cfgs = _read_source(source)
    if config is not None:
        cfgs = config if ("config" in config or "hf_quant_config" in config) else {"config": config}
    info = quant_info(cfgs)

    layers = classify(weights)
    out = NVFP4Weights()
    consumed = set()
    done = set()
    for key in weights:
        if key in consumed:
            continue
        p, _, name = key.rpartition(".")
        dialect = layers.get(p)
        if dialect is None or name not in DIALECT_KEYS[dialect]:
            if name in ACTIVATION_SCALES and (
                dialect is not None or info["method"] in ("modelopt", "compressed-tensors")
            ):
                continue  # W4A4 / FP8-KV calibration scales: unused by W4A16
            out[key] = weights[key]
            continue
        if p in done:
            continue
        done.add(p)
        pat = match_pattern(p, info["ignore"])
        if pat is not None:
            raise load_error(
                f"{key} is NVFP4-quantized but module {p!r} matches the checkpoint's "
                f"exclude/ignore pattern {pat!r}."
            )
        if info["method"] == "compressed-tensors" and dialect != "compressed-tensors":
            raise load_error(f"{key}: a {dialect} tensor in a compressed-tensors checkpoint.")
        if info["method"] == "modelopt" and dialect != "modelopt":
            raise load_error(f"{key}: a {dialect} tensor in a ModelOpt checkpoint.")

        def get(name, *default, _p=p):
            k = f"{_p}.{name}"
            if k in weights:
                consumed.add(k)
                return weights[k]
            if default:
                return default[0]
            raise load_error(f"{k} is missing (needed by the {dialect} layer {_p!r}).")

        if dialect == "modelopt":
            conv = from_modelopt(p, get("weight"), get)
            get("input_scale", None)
        elif dialect == "compressed-tensors":
            conv = from_compressed_tensors(p, get("weight_packed"), get)
            get("input_global_scale", None)
        else:
            conv = from_mlx(p, get("weight"), get)
        out.update(conv)
        out.dialects.add(dialect)
        out.quantized.append(p)
    return out


def _collect(weights) -> Dict[str, mx.array]:
    if isinstance(weights, nn.Module):
        return dict(tree_flatten(weights.parameters()))  # global scales are parameters
    if isinstance(weights, Mapping):
        return dict(weights)
    raise ValueError(
        f"[save_nvfp4] weights expected an nn.Module or a dict of arrays but got "
        f"{type(weights).__name__}."
    )


def _check_layout(arrays: Dict[str, mx.array]) -> None:
    """Every quantized linear in mlx_fp4's layout, before anything is written."""
    for key, v in arrays.items():
        if not isinstance(v, mx.array):
            raise ValueError(f"[save_nvfp4] {key} expected an mx.array but got {type(v).__name__}.")
        p, _, name = key.rpartition(".")
        w = arrays.get(f"{p}.weight")
        if w is None or w.ndim != 2 or f"{p}.scales" not in arrays:
            continue
        if name == "scales" and arrays.get(f"{p}.biases") is None:
            if w.dtype != mx.uint32:
                raise ValueError(f"[save_nvfp4] {p}.weight expected uint32 [N, K/8] but got {describe(w)}.")
            n, k = w.shape[0], w.shape[1] * VALUES_PER_U32
            if v.dtype != mx.uint8 or list(v.shape) != [n, k // GROUP_SIZE]:
                raise ValueError(
                    f"[save_nvfp4] {key} expected uint8 [{n}, {k // GROUP_SIZE}] but got {describe(v)}."
                )
        if name == "global_scale" and v.size != 1:
            raise ValueError(f"[save_nvfp4] {key} expected a scalar but got {describe(v)}.")


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
        weights: the dict :func:`load_nvfp4` returned, or a model (its parameters,
            global scales included).

    ``<p>.global_scale`` is MLX's convention (the amax) in memory and on disk, so
    :func:`load_nvfp4` returns the same arrays bit for bit. Scales are written
    as U8 (``mx.save_safetensors`` has no F8_E4M3). Returns the files written.
    """
    arrays = _collect(weights)
    _check_layout(arrays)
    meta = {"format": "mlx"}
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
        mx.save_safetensors(str(path / name), shard, metadata=meta)
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
