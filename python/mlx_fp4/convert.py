"""Model conversion: ``quantize`` a model's linears to FP4 layers, ``dequantize`` them back,
the default predicate and ``global_scales``."""

from __future__ import annotations

import sys
from typing import Callable, Dict, Optional, Union

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from .formats import GROUP_SIZE, MODE, check_config
from .layers import FP4Linear, linear_kind, swap_modules, to_fp4_linear
from .layers.sharded import _FP4Sharded
from .layers.switch import FP4SwitchLinear, switch_kind, to_fp4_switch_linear

__all__ = ["quantize", "dequantize", "global_scales", "progress_bar", "quantize_report"]

Predicate = Callable[[str, nn.Module], Union[bool, dict]]


def _default_predicate(path: str, m: nn.Module) -> bool:
    kind = linear_kind(m) or switch_kind(m)
    if kind == "switch":  # mixture-of-experts weights [E, N, K]
        return m.weight.shape[-1] % GROUP_SIZE == 0
    if kind == "nvfp4-switch":
        return True
    if kind == "linear":
        return m.weight.shape[-1] % GROUP_SIZE == 0
    return kind == "nvfp4"


def _convert(m: nn.Module, params: dict, path: str) -> nn.Module:
    params = dict(params)
    group_size = params.pop("group_size", None)
    bits = params.pop("bits", None)
    mode = params.pop("mode", MODE)
    if params.pop("quantize_input", False):
        raise ValueError(
            f"[mlx_fp4.nn.quantize] {path}: quantize_input=True (W4A4) is not supported; "
            "FP4Linear is weight-only (W4A16)."
        )
    check_config(group_size, bits, mode, f"mlx_fp4.nn.quantize: {path}")
    global_scale = params.pop("global_scale", False)
    if params:
        raise ValueError(
            f"[mlx_fp4.nn.quantize] unknown options for {path}: {sorted(params)}."
        )
    if switch_kind(m) is not None:
        return to_fp4_switch_linear(m, global_scale, f"mlx_fp4.nn.quantize: {path}")
    return to_fp4_linear(m, global_scale, f"mlx_fp4.nn.quantize: {path}")


def progress_bar(items, desc, enabled=True):
    """`items` wrapped in a tqdm bar over layers (tqdm is a dependency), or as is."""
    if not (enabled and items):
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit="layer")


def quantize(
    model: nn.Module,
    *,
    class_predicate: Optional[Predicate] = None,
    global_scale: bool = False,
    progress: bool = True,
) -> nn.Module:
    """Convert the linear layers of ``model`` to :class:`FP4Linear` in place.

    Mirrors ``mlx.nn.quantize(model, mode="nvfp4")``: ``nn.Linear`` layers are
    quantized (input dims a multiple of 16), existing nvfp4
    ``nn.QuantizedLinear`` layers are wrapped without copying bytes, FP4Linear
    layers are kept. ``class_predicate(path, module)`` is called on every
    ``nn.Linear``/``nn.QuantizedLinear`` leaf and returns ``False`` (skip),
    ``True`` or a dict of options (``{"global_scale": True}``; ``group_size``,
    ``bits`` and ``mode`` are accepted when they say 16/4/"nvfp4"). Other modules
    (embeddings, norms) are never touched. ``global_scale=True`` gives every
    newly quantized layer a per-tensor scale. A tqdm bar counts the layers and, with
    ``progress``, one line says what was converted and which linear / expert layers were left
    alone (the same text as ``model.fp4_quantize_report``).

    Returns ``model``.
    """
    pred = class_predicate or _default_predicate
    leaves = tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module)
    todo, left = [], []
    for path, m in leaves:
        kind = linear_kind(m) or switch_kind(m)
        if kind is None:
            continue
        sel = pred(path, m)
        if sel is False or sel is None:
            left.append((path, kind))
            continue
        if sel is True:
            params = {"global_scale": global_scale}
        elif isinstance(sel, dict):
            params = {"global_scale": global_scale, **sel}
        else:
            raise ValueError(
                "[mlx_fp4.nn.quantize] class_predicate must return a bool or a dict "
                f"of options but returned {type(sel).__name__} for {path}."
            )
        todo.append((path, m, params))

    it = progress_bar(todo, "mlx_fp4: quantizing", progress)
    converted = []
    for path, m, params in it:
        new = _convert(m, params, path)
        if new is not m:
            mx.eval(new.parameters())
            converted.append((path, new))
    if converted:
        model.update_modules(tree_unflatten(converted))
    report = quantize_report([(p, linear_kind(m) or switch_kind(m)) for p, m, _ in todo], left)
    object.__setattr__(model, "fp4_quantize_report", report)
    if progress:
        print(report, file=sys.stderr)
    return model


_KIND_NAMES = {"linear": "nn.Linear", "nvfp4": "nvfp4 QuantizedLinear", "fp4": "FP4Linear",
               "other": "QuantizedLinear (not nvfp4)", "switch": "SwitchLinear",
               "nvfp4-switch": "nvfp4 QuantizedSwitchLinear", "fp4-switch": "FP4SwitchLinear",
               "other-switch": "QuantizedSwitchLinear (not nvfp4)"}


def quantize_report(done, left, shown: int = 3) -> str:
    """One line: counts of the converted layer kinds, then the left-alone ones with a few paths."""
    def counts(items, paths):
        by = {}
        for path, kind in items:
            by.setdefault(_KIND_NAMES.get(kind, kind), []).append(path)
        parts = []
        for name, ps in sorted(by.items()):
            more = f", +{len(ps) - shown} more" if len(ps) > shown else ""
            parts.append(f"{len(ps)} {name}" + (f" ({', '.join(ps[:shown])}{more})" if paths else ""))
        return ", ".join(parts) or "nothing"

    return f"[mlx_fp4.nn.quantize] converted {counts(done, False)}; left alone {counts(left, True)}."


def dequantize(model: nn.Module, dtype=mx.bfloat16) -> nn.Module:
    """Replace every :class:`FP4Linear` by an ``nn.Linear`` with the dequantized
    weight (global scale applied) in place; returns model. Unlike
    ``mlx_lm.utils.dequantize_model`` it honours the global scale."""
    def undo(path, m):
        if isinstance(m, FP4SwitchLinear):
            return m.to_switch_linear(dtype)
        return m.to_linear(dtype) if isinstance(m, FP4Linear) else None

    return swap_modules(model, undo)


def global_scales(model: nn.Module) -> Dict[str, mx.array]:
    """``{"<path>.global_scale": fp32 [1]}`` (MLX's convention, the amax) for every FP4Linear
    and FP4 sharded layer that has one: the parameters of that name."""
    return {
        f"{path}.global_scale": m["global_scale"]
        for path, m in model.named_modules()
        if isinstance(m, (FP4Linear, _FP4Sharded)) and "global_scale" in m
    }
