"""A checkpoint's quantization metadata checked against its tensors, so that a wrong config is a
clear error instead of being ignored: mlx-lm infers each layer's recipe from the tensor shapes, so
a ``quantization`` block saying group 32 / mxfp4 / 8 bits on NVFP4 tensors, or a float folder whose
config claims ModelOpt, used to load without a word."""

from __future__ import annotations

from typing import Mapping, Optional

import mlx.nn as nn

from ..formats import MODE_DEFAULTS
from .recipe import Setting, module_settings

MLX_FIELDS = ("quantization", "quantization_config")  # the blocks mlx-lm writes (no quant_method)


def config_error(msg):
    return ValueError(f"[mlx_fp4.load] {msg}")


def _source_of_method(configs: dict) -> str:
    """Where the quantization claim was read: the file and field, for error messages."""
    if "hf_quant_config" in configs:
        return "hf_quant_config.json"
    config = configs.get("config") or {}
    if "quantization_config" in config:
        return "config.json field 'quantization_config'"
    if "quantization_config" in (config.get("text_config") or {}):
        return "config.json field 'text_config.quantization_config'"
    return "config.json field 'quantization'"


def _describe(entry: dict) -> str:
    return (f"mode {entry.get('mode', 'affine')!r}, group_size {entry.get('group_size')}, "
            f"bits {entry.get('bits')}")


def _check_block(field: str, block: dict, settings: Mapping[str, Setting], folder) -> None:
    """Each FP4 layer as loaded against the block's entry for it (per-layer, else the top level)."""
    top = {k: block.get(k) for k in ("group_size", "bits", "mode") if k in block}
    for path, (group, bits, mode) in sorted(settings.items()):
        if mode not in MODE_DEFAULTS:
            continue
        entry = block.get(path) if isinstance(block.get(path), dict) else top
        where = f"'{field}.{path}'" if entry is not top else f"'{field}'"
        want = {"group_size": group, "bits": bits, "mode": mode}
        if any(entry.get(k, "affine" if k == "mode" else None) != v for k, v in want.items()):
            raise config_error(
                f"{folder}/config.json field {where} says {_describe(entry)}, but the tensors of {path} "
                f"are {_describe(want)}: fix or remove the field."
            )


def check_against_model(configs: dict, info: dict, model: nn.Module, folder) -> None:
    """The quantized layers of a loaded model (mlx-lm infers each one's recipe from its tensors)
    against the configs: the MLX blocks must describe the FP4 layers as they are, and a checkpoint
    that claims to be quantized must have a quantized layer."""
    settings = module_settings(model)
    config = configs.get("config") or {}
    for field in MLX_FIELDS:
        block = config.get(field)
        if isinstance(block, dict) and "quant_method" not in block:
            _check_block(field, block, settings, folder)
    method: Optional[str] = info.get("method")
    if method is not None and not settings:
        raise config_error(
            f"{folder}/{_source_of_method(configs)} says the checkpoint is quantized ({method}), but no "
            "tensor is: a float checkpoint? Remove that quantization metadata."
        )
