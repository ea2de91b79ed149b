"""``mlx_lm.convert``'s per-model quantization rules on an FP4 conversion (``mlx-fp4 convert -q``).

mlx-lm models may define ``quant_predicate`` (Qwen3-MoE, Qwen3.5, gpt-oss, ...: the MoE router
``mlp.gate`` / ``router`` at 8 bits, group 64). ``mlx_lm.utils.quantize_model`` honours it; so does
:func:`quantize_like_mlx_lm`: a layer the predicate skips stays float, one it wants in an FP4 mode
becomes an FP4 layer with those options, one it wants in another recipe (affine 8-bit) is quantized
by MLX exactly as mlx_lm.convert does (``nn.quantize``) and left to MLX's own layer.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional

import mlx.nn as nn
from mlx.utils import tree_flatten

from .convert import Predicate, QuantizeSummary, _kind, _skip_reason, quantize
from .formats import MODE_DEFAULTS

__all__ = ["model_predicate", "quantize_like_mlx_lm"]


def model_predicate(model: nn.Module) -> Optional[Callable]:
    """The model's own ``quant_predicate`` (an mlx-lm property, None for most dense models)."""
    return getattr(model, "quant_predicate", None)


def _is_fp4(options: dict) -> bool:
    return options.get("mode", "affine") in MODE_DEFAULTS


def quantize_like_mlx_lm(model: nn.Module, group_size: Optional[int], bits: Optional[int], *, mode: str,
                         global_scale, user_predicate: Optional[Predicate] = None,
                         progress: bool = True) -> QuantizeSummary:
    """``mx_fp4.nn.quantize`` with the user's predicate (False: keep the layer float) and then the
    model's ``quant_predicate``. Layers the latter sends to another recipe are quantized by MLX first
    and reported in ``summary.skipped`` (``MLX affine, 8 bits, group 64: the model's quant_predicate``)."""
    ours: Dict[str, object] = {}
    theirs: Dict[str, dict] = {}
    rule = model_predicate(model)
    for path, m in tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module):
        if _kind(m) is None or _skip_reason(path, m, mode) is not None:
            continue
        chosen = user_predicate(path, m) if user_predicate is not None else True
        if chosen and rule is not None:
            chosen = rule(path, m)
        if isinstance(chosen, dict) and not _is_fp4(chosen):
            theirs[path] = dict(chosen)
            chosen = False
        ours[path] = chosen
    if theirs:
        nn.quantize(model, class_predicate=lambda path, m: dict(theirs[path]) if path in theirs else False)
    summary = quantize(model, group_size, bits, mode=mode, global_scale=global_scale, progress=progress,
                       class_predicate=lambda path, m: ours.get(path, False))
    for path, options in theirs.items():
        summary.skipped[path] = (f"MLX {options.get('mode', 'affine')}, {options.get('bits')} bits, group "
                                 f"{options.get('group_size')}: the model's quant_predicate (as mlx_lm.convert)")
    return summary
