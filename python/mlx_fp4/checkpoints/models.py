"""Loading NVFP4 weights into models: ``load_weights`` (any dialect, into any model),
``load_model`` / ``load`` (mlx-lm's own loaders with FP4 layers)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Optional

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from ..formats import BITS, GROUP_SIZE, MODE
from ..layers import FP4Linear, FP4SwitchLinear, linear_kind, swap_modules, switch_kind
from .config_check import check_against_model
from .dialects import quant_info
from .experts import stack_experts, swap_switch_layers
from .gguf import is_gguf, load_gguf
from .io import NVFP4Weights, checked_shapes, load_nvfp4, read_configs
from .source import resolve

__all__ = ["load", "load_model", "load_weights"]

MLX_LM_WEIGHT_FILES = "model*.safetensors"  # what mlx_lm.utils.load_model reads (its glob)


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


def _checkpoint_class(base: type, configs: dict, aside: dict) -> type:
    """``base`` (an mlx-lm model class) whose ``sanitize`` first converts the checkpoint to
    mlx_fp4's layout (any dialect; per-expert tensors stacked) and sets aside the global scales
    of dense linears (MLX's QuantizedLinear, which mlx-lm builds, has no such parameter; they are
    attached when the layer becomes an FP4Linear). The hook is ``mlx_lm.utils.load_model``'s own
    ``get_model_classes``; nothing in mlx-lm is patched."""

    class Checkpoint(base):
        def sanitize(self, weights):
            weights = stack_experts(self, dict(load_nvfp4(weights, config=configs)))
            if hasattr(base, "sanitize"):
                weights = base.sanitize(self, weights)
            for key in [k for k in weights if k.endswith(".global_scale")]:
                prefix = key[: -len(".global_scale")]
                w = weights.get(f"{prefix}.weight")
                if w is not None and w.ndim == 2:
                    aside[prefix] = weights.pop(key)
            return weights

    Checkpoint.__name__, Checkpoint.__qualname__ = base.__name__, base.__qualname__
    Checkpoint.__module__ = base.__module__
    return Checkpoint


def _to_fp4_layers(model: nn.Module, aside: dict, strict: bool) -> None:
    """MLX nvfp4 / mxfp4 layers mlx-lm built -> FP4 layers over the same bytes, global scales
    attached (nvfp4)."""

    def swap(path, m):
        if linear_kind(m) in ("nvfp4", "mxfp4"):
            return FP4Linear.from_quantized(m, global_scale=aside.pop(path, None))
        if switch_kind(m) in ("nvfp4-switch", "mxfp4-switch"):
            return FP4SwitchLinear.from_quantized(m)
        return None

    swap_modules(model, swap)
    if aside and strict:
        raise ValueError(
            f"[mlx_fp4.nn.load_model] {sorted(aside)[0]}.global_scale: the checkpoint has a global "
            "scale for a layer that is not NVFP4-quantized in the model."
        )


def load_model(path, lazy: bool = False, strict: bool = True, model_config: Optional[dict] = None):
    """``mlx_lm.utils.load_model`` for NVFP4 and MXFP4 checkpoints: ``(model, config)`` with FP4
    layers. MXFP4: gpt-oss as published (``quant_method: mxfp4``, the ``*_blocks`` /
    ``*_scales`` experts, read by mlx-lm's own ``sanitize``) and mlx-community mxfp4 folders.

    mlx-lm reads ``config.json`` (and ``hf_quant_config.json``), builds the architecture,
    honours ``config["quantization"]`` (per-layer recipes, quantized embeddings, affine layers:
    all left to MLX) and loads the weights; a ModelOpt, compressed-tensors or MLX checkpoint is
    first converted to the MLX layout in the model's ``sanitize`` step. Then every MLX nvfp4 / mxfp4
    ``QuantizedLinear`` / ``QuantizedSwitchLinear`` becomes an :class:`FP4Linear` /
    :class:`FP4SwitchLinear` holding the same bytes and its global scale. Needs mlx-lm.
    """
    from mlx_lm import utils as lm

    path = Path(path)
    configs = read_configs(path)
    for f in sorted(path.glob(MLX_LM_WEIGHT_FILES)):  # mlx-lm mx.loads them: the headers first
        checked_shapes(f)
    model_config = dict(model_config or {})
    if "quantization" not in configs.get("config", {}) and quant_info(configs)["method"] in (
        "modelopt",
        "compressed-tensors",
    ):
        # ModelOpt / compressed-tensors: the MLX recipe mlx-lm follows for the converted
        # tensors (layers with scales after sanitize are nvfp4; the rest stays float).
        model_config.setdefault("quantization", {"group_size": GROUP_SIZE, "bits": BITS, "mode": MODE})
    default_classes = inspect.signature(lm.load_model).parameters["get_model_classes"].default
    aside: dict = {}

    def classes(config):
        model_class, args_class = default_classes(config)
        return _checkpoint_class(model_class, configs, aside), args_class

    model, config = lm.load_model(path, lazy=True, strict=strict, model_config=model_config,
                                  get_model_classes=classes)
    _to_fp4_layers(model, aside, strict)
    check_against_model(configs, quant_info(configs), model, path)
    if not lazy:
        mx.eval(model.parameters())
    return model, config


def load(path_or_hf_repo: str, tokenizer_config: Optional[dict] = None, model_config: Optional[dict] = None,
         adapter_path: Optional[str] = None, lazy: bool = False, return_config: bool = False,
         revision: Optional[str] = None):
    """``mlx_lm.load`` with FP4 layers: ``(model, tokenizer)`` (``+ config`` with
    ``return_config``) from a local folder or a Hugging Face repo, any NVFP4 dialect. A path
    ending in ``.gguf`` is read by :func:`mlx_fp4.checkpoints.gguf.load_gguf` (Llama family; its
    Q4_0/Q4_1/Q8_0 layers stay MLX affine layers: convert it to FP4 with ``mlx-fp4 convert``)."""
    from mlx_lm import utils as lm

    if is_gguf(path_or_hf_repo):
        resolve(path_or_hf_repo, "mlx_fp4.load", download=False)  # missing: FileNotFoundError naming it
        if model_config or tokenizer_config:
            raise ValueError("[mlx_fp4.load] model_config / tokenizer_config are not supported for GGUF files.")
        model, tokenizer, config = load_gguf(path_or_hf_repo, lazy=lazy, return_config=True)
        if adapter_path is not None:
            model = lm.load_adapters(model, adapter_path)
            model.eval()
        return (model, tokenizer, config) if return_config else (model, tokenizer)

    model_path = resolve(path_or_hf_repo, "mlx_fp4.load", revision)
    model, config = load_model(model_path, lazy, model_config=model_config)
    if adapter_path is not None:
        model = lm.load_adapters(model, adapter_path)
        model.eval()
    tokenizer = lm.load_tokenizer(model_path, tokenizer_config, eos_token_ids=config.get("eos_token_id", None))
    return (model, tokenizer, config) if return_config else (model, tokenizer)


def _is_loaded_layout(weights: dict) -> bool:
    """True for the dict load_nvfp4 returns (already in mlx_fp4's layout)."""
    return isinstance(weights, NVFP4Weights)
