"""Loading NVFP4 weights into models: ``load_weights`` (any dialect, into any model) and
``load_model`` (an mlx-lm architecture from a checkpoint folder)."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from ..layers import FP4Linear, linear_kind
from .experts import stack_experts, swap_switch_layers
from .io import NVFP4Weights, load_nvfp4

__all__ = ["load_model", "load_weights"]


def load_weights(
    model: nn.Module,
    weights,
    *,
    strict: bool = True,
    sanitize: bool = True,
) -> nn.Module:
    """Load NVFP4 weights into ``model``, converting its linears as needed.

    ``weights`` is anything :func:`mlx_fp4.checkpoints.load_nvfp4` accepts (a
    safetensors file, a checkpoint folder, a dict) in any supported dialect
    (ModelOpt, compressed-tensors, MLX), or the list of pairs ``Module.load_weights``
    takes. A plain dict is read as a raw checkpoint; the
    :class:`~mlx_fp4.checkpoints.NVFP4Weights` that ``load_nvfp4`` returns is used as is.
    Global scales are MLX's convention (the amax) either way. Then:

    1. ``model.sanitize(weights)`` is applied when the model has one (mlx-lm
       models: drops rotary buffers, tied ``lm_head``...), unless ``sanitize=False``;
    2. every ``nn.Linear``/``nn.QuantizedLinear`` whose ``<path>.scales`` is in
       the weights becomes an :class:`FP4Linear` (no random-weight quantization);
    3. ``<path>.global_scale`` entries become those layers' ``global_scale`` parameters
       (checked), and everything goes through ``model.load_weights(strict=strict)``.
    """
    if isinstance(weights, (list, tuple)):
        weights = dict(weights)
    if not isinstance(weights, dict) or not _is_loaded_layout(weights):
        weights = load_nvfp4(weights)
    weights = stack_experts(model, dict(weights))  # per-expert tensors -> switch_mlp layout
    if sanitize and hasattr(model, "sanitize"):
        weights = model.sanitize(weights)

    # 2. swap layers
    swaps = []
    for path, m in model.named_modules():
        if not path or f"{path}.scales" not in weights:
            continue
        if linear_kind(m) not in ("linear", "nvfp4"):
            continue
        if f"{path}.biases" in weights:
            continue  # affine-quantized in the checkpoint: not ours
        w = weights.get(f"{path}.weight")
        if w is None or w.dtype != mx.uint32 or w.ndim != 2:
            continue
        n, k = w.shape[0], w.shape[1] * 8
        new = FP4Linear._empty(k, n)
        new.weight = w
        new.scales = weights[f"{path}.scales"]
        if f"{path}.bias" in weights or "bias" in m:
            new.bias = weights.get(f"{path}.bias", m.get("bias"))
        new.freeze()
        swaps.append((path, new))
    if swaps:
        model.update_modules(tree_unflatten(swaps))
    swap_switch_layers(model, weights)

    # 3. global scales, then parameters
    modules = dict(model.named_modules())
    params = []
    for key, value in weights.items():
        if key.endswith(".global_scale"):
            prefix = key[: -len(".global_scale")]
            target = modules.get(prefix)
            if isinstance(target, FP4Linear):
                target.global_scale = value  # creates the parameter (checked); loaded below
                params.append((key, target["global_scale"]))
                continue
            if target is not None and isinstance(target.get("global_scale"), mx.array):
                params.append((key, value))  # a real parameter (e.g. switch layers)
                continue
            if strict:
                raise ValueError(
                    f"[mlx_fp4.nn.load_weights] {key}: no FP4Linear at {prefix!r} "
                    "to receive the global scale."
                )
            continue
        params.append((key, value))
    model.load_weights(params, strict=strict)
    return model


def load_model(path, *, strict: bool = True, lazy: bool = False):
    """Build the mlx-lm architecture named by ``path/config.json`` and load an NVFP4
    checkpoint (ModelOpt, compressed-tensors or MLX) into it with :func:`load_weights`.

    Needs mlx-lm (for the architecture). ``path`` is a local folder. Returns
    ``(model, config)``; the tokenizer is ``mlx_lm.utils.load_tokenizer(path)``.
    """
    from mlx_lm import utils as lm_utils

    path = Path(path)
    config = lm_utils.load_config(path)
    get_classes = getattr(lm_utils, "_get_classes", None) or getattr(lm_utils, "get_model_classes")
    model_class, args_class = get_classes(config=config)
    model = model_class(args_class.from_dict(config))
    load_weights(model, path, strict=strict)
    model.eval()
    if not lazy:
        mx.eval(model.parameters())
    return model, config


def _is_loaded_layout(weights: dict) -> bool:
    """True for the dict load_nvfp4 returns (already in mlx_fp4's layout)."""
    return isinstance(weights, NVFP4Weights)
