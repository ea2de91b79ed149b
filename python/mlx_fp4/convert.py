"""Model conversion: ``quantize`` a model's linears to FP4 layers, ``dequantize`` them back,
the default predicate and ``global_scales``."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Union

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from .formats import MODE, check_config, group_size_of
from .layers import FP4Linear, linear_kind, swap_modules, to_fp4_linear
from .layers.sharded import _FP4Sharded
from .layers.switch import FP4SwitchLinear, switch_kind, to_fp4_switch_linear

__all__ = ["QuantizeSummary", "bits_per_weight", "dequantize", "global_scales", "progress_bar", "quantize"]

Predicate = Callable[[str, nn.Module], Union[bool, dict]]


# How each leaf kind is handled: (float source, converted by default).
_FLOAT_KINDS = ("linear", "switch")
_WRAP_KINDS = ("nvfp4", "nvfp4-switch", "mxfp4", "mxfp4-switch")
_KEEP_KINDS = ("fp4", "fp4-switch")
# global_scale="auto" keeps a global scale only where it lowers the relative weight error by
# more than this fraction: elsewhere (weights of magnitude ~0.1 and up) both errors are equal
# and the layer stays loadable by stock MLX / mlx-lm, which have no global scale for linears.
# On a real model (SmolLM2, per-layer gains -0.4..+0.6%) keeping or dropping the scale changes
# the KL to bf16 no more than two equally good draws do (docs/benchmarks.md, "Quality").
AUTO_MIN_GAIN = 0.01


def _kind(m) -> Optional[str]:
    return linear_kind(m) or switch_kind(m)


def _skip_reason(path: str, m: nn.Module, mode: str = MODE) -> Optional[str]:
    """Why the default predicate leaves ``m`` alone (None: it converts it)."""
    kind = _kind(m)
    if kind in _FLOAT_KINDS:
        k, group = m.weight.shape[-1], group_size_of(mode)
        return None if k % group == 0 else f"input dims K={k} not a multiple of {group} ({mode})"
    if kind in _WRAP_KINDS or kind in _KEEP_KINDS:
        return None
    if kind == "other":
        return f"MLX QuantizedLinear mode={getattr(m, 'mode', None)!r}: left to MLX"
    if hasattr(m, "to_quantized"):
        return f"{type(m).__name__}: no FP4 layer for it (left as is)"
    return None


def _options(params: dict, path: str, default_mode: str = MODE):
    """The predicate's / caller's options for one layer, checked: -> (global_scale, mode).
    mxfp4 has no global scale: "auto" means none there, True is a ValueError."""
    params = dict(params)
    where = f"mlx_fp4.nn.quantize: {path}"
    if params.pop("quantize_input", False):
        raise ValueError(
            f"[mlx_fp4.nn.quantize] {path}: quantize_input=True (W4A4) is not supported; "
            "FP4Linear is weight-only (W4A16)."
        )
    mode = params.pop("mode", default_mode)
    check_config(params.pop("group_size", None), params.pop("bits", None), mode, where)
    global_scale = params.pop("global_scale", "auto")
    if params:
        raise ValueError(f"[mlx_fp4.nn.quantize] unknown options for {path}: {sorted(params)}.")
    _check_global_scale_option(global_scale, where)
    if mode != MODE:
        if global_scale is not False and not isinstance(global_scale, str):
            raise ValueError(f"[{where}] global_scale is only supported for mode 'nvfp4' but got one with {mode!r}.")
        global_scale = False
    return global_scale, mode


def _check_global_scale_option(global_scale, where):
    """True, False, "auto", or a value (MLX's convention) to quantize against / attach."""
    if isinstance(global_scale, str) and global_scale != "auto":
        raise ValueError(f"[{where}] global_scale expected True, False or 'auto' but got {global_scale!r}.")
    if global_scale is None:
        raise ValueError(f"[{where}] global_scale expected True, False or 'auto' but got None.")


def _to_fp4(m: nn.Module, global_scale: bool, path: str, mode: str = MODE) -> nn.Module:
    where = f"mlx_fp4.nn.quantize: {path}"
    if switch_kind(m) is not None:
        return to_fp4_switch_linear(m, global_scale, where, mode)
    return to_fp4_linear(m, global_scale, where, mode)


def _relative_error(source: nn.Module, q: nn.Module) -> float:
    w = source.weight.astype(mx.float32)
    d = q.dequantized_weight(mx.float32)
    return (mx.linalg.norm((d - w).reshape(-1)) / mx.maximum(mx.linalg.norm(w.reshape(-1)), 1e-30)).item()


def _underflow(source: nn.Module, q: nn.Module) -> float:
    """Fraction of 16-weight blocks with nonzero weights whose block scale is zero: weights
    that decode as 0 (E4M3 underflow, what a global scale prevents). E8M0 (mxfp4) has no zero."""
    if q.mode != MODE:
        return 0.0
    w = source.weight
    blocks = mx.max(mx.abs(w.reshape(*w.shape[:-1], -1, group_size_of(MODE))), axis=-1)
    nonzero = blocks > 0
    lost = mx.logical_and(nonzero, q["scales"] == 0)
    return (mx.sum(lost) / mx.maximum(mx.sum(nonzero), 1)).item()


def _global_scale_note(layer: nn.Module) -> str:
    """' + global scale' when the layer holds one (what QuantizeSummary.with_global_scale counts)."""
    return " + global scale" if isinstance(layer.get("global_scale"), mx.array) else ""


def _convert(m: nn.Module, global_scale, path: str, report: "QuantizeSummary", mode: str = MODE) -> nn.Module:
    """One layer to FP4, recording what was done in ``report``."""
    kind = _kind(m)
    if kind in _KEEP_KINDS:  # its global scale, if any, stays whatever global_scale says
        report.converted[path] = "kept (already FP4)" + _global_scale_note(m)
        return m
    if kind not in _FLOAT_KINDS:  # bytes kept: a global scale *value* may be attached
        new = _to_fp4(m, False if isinstance(global_scale, str) else global_scale, path)
        report.converted[path] = f"wrapped MLX {m.mode} (same bytes)" + _global_scale_note(new)
        return new
    candidates = [False, True] if isinstance(global_scale, str) else [global_scale]
    best = None
    for gs in candidates:
        new = _to_fp4(m, gs, path, mode)
        mx.eval(new.parameters())
        err = _relative_error(m, new)
        if best is None or err < best[1] * (1 - AUTO_MIN_GAIN):
            best = (new, err, gs)
    new, err, gs = best
    report.converted[path] = "quantized" + ("" if gs is False else " + global scale")
    report.errors[path] = err
    lost = _underflow(m, new)
    if lost > 0:
        report.underflow[path] = lost
    return new


@dataclass
class QuantizeSummary:
    """What :func:`quantize` did (``str()`` of it is the line it prints).

    ``converted``: path -> how; ``skipped``: path -> why; ``errors``: path -> relative weight
    error ``||W - dequantize(Q(W))|| / ||W||`` of layers quantized from float weights;
    ``underflow``: path -> fraction of nonzero 16-weight blocks whose E4M3 scale is 0 (those
    weights decode as 0); ``bits_per_weight``: the whole model's, as mlx-lm counts it.
    """

    model: nn.Module
    converted: Dict[str, str] = field(default_factory=dict)
    skipped: Dict[str, str] = field(default_factory=dict)
    errors: Dict[str, float] = field(default_factory=dict)
    underflow: Dict[str, float] = field(default_factory=dict)
    bits_per_weight: float = 0.0
    mode: str = MODE

    @property
    def with_global_scale(self) -> int:
        return sum(how.endswith("global scale") for how in self.converted.values())

    def __str__(self) -> str:
        worst = max(self.errors.values(), default=None)
        return (
            f"[mlx_fp4] converted {len(self.converted)} layers to {self.mode.upper()} "
            f"({self.with_global_scale} with a global scale), skipped {len(self.skipped)}"
            + (f", max relative weight error {worst:.3f}" if worst is not None else "")
            + f"; {self.bits_per_weight:.3f} bits per weight."
        )


def bits_per_weight(model: nn.Module) -> float:
    """Bits of all parameters per model weight, counting a quantized weight as
    ``weight.size * 32 / bits`` values (mlx_lm.utils.compute_bits_per_weight's rule)."""
    total_bits, weights = 0, 0
    for _, m in tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module):
        params = tree_flatten(m.parameters())
        total_bits += sum(v.nbytes * 8 for _, v in params)
        if "scales" in m and hasattr(m, "bits"):
            weights += m["weight"].size * 32 // m.bits + (m["bias"].size if "bias" in m else 0)
        else:
            weights += sum(v.size for _, v in params)
    return total_bits / max(weights, 1)


def progress_bar(items, desc, enabled=True):
    """`items` wrapped in a tqdm bar over layers (tqdm is a dependency), or as is."""
    if not (enabled and items):
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit="layer")


def quantize(
    model: nn.Module,
    group_size: Optional[int] = None,
    bits: Optional[int] = None,
    *,
    mode: str = MODE,
    quantize_input: bool = False,
    class_predicate: Optional[Predicate] = None,
    global_scale: Union[bool, str] = "auto",
    progress: bool = True,
) -> QuantizeSummary:
    """Convert the linear (and mlx-lm switch) layers of ``model`` to FP4 layers in place.

    ``mlx.nn.quantize``'s signature: ``mode`` ``"nvfp4"`` (default) or ``"mxfp4"`` (gpt-oss:
    E8M0 scales per 32 weights, no global scale), ``group_size``/``bits`` the mode's (16 or 32,
    4, or None); anything else is a ValueError, as is ``quantize_input=True`` (W4A4).
    ``nn.Linear`` layers are quantized (K a multiple of the group size), MLX nvfp4 / mxfp4
    ``QuantizedLinear`` layers wrapped without copying bytes, FP4 layers kept; other quantized
    modes, embeddings and norms are left alone. ``class_predicate(path, module)`` is called on
    the linear/switch leaves and returns ``False`` (skip), ``True`` or a dict of options
    (``group_size``, ``bits``, ``mode``, ``global_scale``).

    ``global_scale``: ``True`` gives every newly quantized layer a per-tensor scale, ``False``
    none (stock mlx-lm can then load a saved model), ``"auto"`` (default) quantizes both ways
    and keeps the global scale where it lowers the relative weight error by more than 1%
    (``AUTO_MIN_GAIN``; docs/benchmarks.md, "Quality": how the rule was chosen on a real model).

    Returns a :class:`QuantizeSummary` (converted, skipped and why, errors, bits per weight)
    and prints its line when ``progress``; warns when a layer's block scales underflow
    (nonzero weights decoded as zero).
    """
    check_config(group_size, bits, mode, "mlx_fp4.nn.quantize")
    if mode != MODE and global_scale is True:
        raise ValueError("[mlx_fp4.nn.quantize] global_scale is only supported for mode 'nvfp4' but got True with "
                         f"{mode!r}.")
    if quantize_input:
        raise ValueError(
            "[mlx_fp4.nn.quantize] quantize_input=True (W4A4) is not supported; "
            "FP4Linear is weight-only (W4A16)."
        )
    _check_global_scale_option(global_scale, "mlx_fp4.nn.quantize")
    report = QuantizeSummary(model, mode=mode)
    todo = []
    for path, m in tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module):
        kind = _kind(m)
        reason = _skip_reason(path, m, mode)
        if kind is None or (kind == "other" and class_predicate is None):
            if reason is not None:
                report.skipped[path] = reason
            continue
        sel = class_predicate(path, m) if class_predicate is not None else reason is None
        if sel is False or sel is None:
            report.skipped[path] = reason or "class_predicate returned False"
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
        todo.append((path, m, _options(params, path, mode)))

    converted = []
    for path, m, (gs, layer_mode) in progress_bar(todo, "mlx_fp4: quantizing", progress):
        new = _convert(m, gs, path, report, layer_mode)
        if new is not m:
            mx.eval(new.parameters())
            converted.append((path, new))
    if converted:
        model.update_modules(tree_unflatten(converted))
    report.bits_per_weight = bits_per_weight(model)
    if report.underflow:
        worst = sorted(report.underflow.items(), key=lambda kv: -kv[1])[:3]
        warnings.warn(
            f"mlx_fp4.nn.quantize: in {len(report.underflow)} layer(s) nonzero weights got zero "
            "E4M3 block scales and decode as 0 ("
            + ", ".join(f"{p}: {f:.1%} of blocks" for p, f in worst)
            + "); quantize with global_scale=True or 'auto'.",
            UserWarning,
            stacklevel=2,
        )
    if progress:
        print(report)
    return report


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
