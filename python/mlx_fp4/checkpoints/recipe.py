"""The ``quantization`` block of a saved config.json, read off the layers being saved.

mlx-lm rebuilds a model from that block: the top-level ``group_size`` / ``bits`` / ``mode`` for
every layer with ``scales`` in the weights, a per-layer entry for layers quantized otherwise (an
8-bit router next to NVFP4 experts). Deriving it from the layers, not from the source's config,
keeps it true for mxfp4, mixed recipes and models with nothing quantized (no block at all).
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, Mapping, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ..formats import MODE_DEFAULTS, VALUES_PER_U32

Setting = Tuple[int, int, str]  # (group_size, bits, mode)


def _entry(setting: Setting) -> dict:
    group_size, bits, mode = setting
    return {"group_size": group_size, "bits": bits, "mode": mode}


def fp4_mode(weight: mx.array, scales: mx.array) -> Optional[str]:
    """'nvfp4' / 'mxfp4' for packed uint32 weights whose scales cover K in that mode's groups, else None."""
    if weight.dtype != mx.uint32 or scales.dtype != mx.uint8 or weight.ndim < 2 or scales.ndim != weight.ndim:
        return None
    k = weight.shape[-1] * VALUES_PER_U32
    for mode, (group, _) in MODE_DEFAULTS.items():
        if scales.shape[:-1] == weight.shape[:-1] and scales.shape[-1] * group == k:
            return mode
    return None


def module_settings(model: nn.Module) -> Dict[str, Setting]:
    """path -> (group_size, bits, mode) of every quantized leaf of a model (FP4 or MLX's own)."""
    out = {}
    for path, m in tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module):
        if "scales" in m and all(hasattr(m, a) for a in ("group_size", "bits")):
            out[path] = (int(m.group_size), int(m.bits), getattr(m, "mode", "affine"))
    return out


def _array_settings(arrays: Mapping[str, mx.array], source: dict) -> Dict[str, Setting]:
    """The same for a dict of arrays: FP4 layers from their shapes; an affine layer (``biases``) from
    its entry in the source's ``quantization`` block (its bits cannot be read off the shapes)."""
    out = {}
    for key, scales in arrays.items():
        if not key.endswith(".scales"):
            continue
        p = key[: -len(".scales")]
        entry = source.get(p)
        if f"{p}.biases" in arrays:
            if isinstance(entry, dict):
                out[p] = (entry["group_size"], entry["bits"], entry.get("mode", "affine"))
            continue
        w = arrays.get(f"{p}.weight")
        mode = fp4_mode(w, scales) if w is not None else None
        if mode is not None:
            out[p] = (*MODE_DEFAULTS[mode], mode)
    return out


def quantization_block(weights, source: Optional[dict]) -> Optional[dict]:
    """``config["quantization"]`` for ``weights`` (a model or a dict of arrays): the most common FP4
    setting on top (else the most common one), an entry for each layer quantized otherwise; None
    when nothing is quantized."""
    source = source if isinstance(source, dict) else {}
    settings = module_settings(weights) if isinstance(weights, nn.Module) else _array_settings(weights, source)
    if not settings:
        return None
    counts = Counter(settings.values())
    fp4 = [s for s in counts if s[2] in MODE_DEFAULTS]
    top = max(fp4 or counts, key=lambda s: counts[s])
    block = _entry(top)
    block.update({path: _entry(s) for path, s in sorted(settings.items()) if s != top})
    return block
