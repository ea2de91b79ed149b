"""Tensor parallelism for FP4 layers (nvfp4, mxfp4) on MLX's own distributed stack.

Everything here runs on ``mx.distributed`` (ring, mpi, nccl, jaccl; started with
``mlx.launch``); there is no communication layer of our own.

Why this module exists: ``mlx.nn.layers.distributed.shard_linear`` sends any module that is
not an ``nn.Linear`` to MLX's ``QuantizedAllToShardedLinear`` / ``QuantizedShardedToAllLinear``,
which call ``mx.quantized_matmul``: our kernel and the per-tensor global scale would be gone.
The functions below keep FP4 layers FP4:

* :func:`shard_linear` / :func:`shard_inplace`: MLX's signatures. FP4 layers become
  :class:`~mlx_fp4.layers.FP4AllToShardedLinear` / :class:`~mlx_fp4.layers.FP4ShardedToAllLinear`
  (or are split in place block-aware); every other module goes to MLX's own function.
* :func:`shard_model`: ``model.shard(group)`` of an mlx-lm model (anything whose ``shard``
  calls MLX's ``shard_linear``/``shard_inplace``): the FP4 layers are handed to the model's
  plan as MLX nvfp4 layers over the same bytes, and what MLX made of them is turned back into
  FP4 layers (global scales re-attached). Nothing is patched.
* :func:`quantize`: the other order, a model sharded first (MLX's float or nvfp4 sharded
  layers) converted to FP4 after, bit-identical to converting first and sharding after.
"""

from __future__ import annotations

from typing import Callable, Optional, Union

import mlx.core as mx
import mlx.nn as nn
import mlx.nn.layers.distributed as _mlx_dist
from mlx.utils import tree_flatten, tree_unflatten

from . import convert, ops
from .convert import global_scales, progress_bar
from .formats import BITS, MODE, MODE_DEFAULTS, check_config, check_no_global_scale
from .layers import FP4AllToShardedLinear, FP4Linear, FP4ShardedToAllLinear, is_fp4_linear
from .layers.sharded import (
    Segments,
    _CLASSES,
    _FP4Sharded,
    _fp4_arrays,
    _rank_pieces,
    _shard_fp4_arrays,
    _take,
)
from .layers.sharded_switch import quantize_experts_with_amax, shard_switch_arrays
from .layers.switch import FP4SwitchLinear, switch_kind

__all__ = [
    "FP4AllToShardedLinear",
    "FP4ShardedToAllLinear",
    "shard_linear",
    "shard_inplace",
    "shard_model",
    "quantize",
    "global_scales",
    "group_max",
]


def _check_sharding(sharding, where):
    if sharding not in ("all-to-sharded", "sharded-to-all"):
        raise ValueError(
            f"[{where}] sharding expected 'all-to-sharded' or 'sharded-to-all' "
            f"but got {sharding!r}."
        )


def shard_linear(
    module: nn.Module,
    sharding: str,
    *,
    segments: Segments = 1,
    group: Optional[mx.distributed.Group] = None,
):
    """``mlx.nn.layers.distributed.shard_linear`` that keeps FP4 layers on our kernel.

    An :class:`mlx_fp4.nn.FP4Linear` becomes an :class:`FP4AllToShardedLinear` or
    :class:`FP4ShardedToAllLinear` (same bytes, sliced; global scale kept).
    Any other module goes to MLX's ``shard_linear`` unchanged. Raises ValueError
    (on every rank) when K cannot be split on the mode's block boundaries (16 / 32 elements).
    """
    _check_sharding(sharding, "mlx_fp4.distributed.shard_linear")
    if isinstance(module, _FP4Sharded):
        raise ValueError(
            f"[mlx_fp4.distributed.shard_linear] module is already sharded "
            f"({type(module).__name__})."
        )
    if is_fp4_linear(module):
        return _CLASSES[sharding].from_quantized_linear(module, segments=segments, group=group)
    return _mlx_dist.shard_linear(module, sharding, segments=segments, group=group)


def _mlx_predicate(sharding, segments):
    if sharding == "all-to-sharded":
        return lambda path, w: (-1, segments) if path.endswith("bias") else (max(w.ndim - 2, 0), segments)
    return lambda path, w: None if path.endswith("bias") else (-1, segments)


def shard_inplace(
    module: nn.Module,
    sharding: Union[str, Callable],
    *,
    segments: Segments = 1,
    group: Optional[mx.distributed.Group] = None,
):
    """``mlx.nn.layers.distributed.shard_inplace`` that splits FP4 layers block-aware.

    Parameters of :class:`mlx_fp4.nn.FP4Linear` and :class:`mlx_fp4.nn.FP4SwitchLinear`
    layers inside ``module`` (or ``module`` itself) are split consistently: the predicate is
    asked about ``<layer>.weight`` only; its axis and segments are applied to ``weight``
    (packed columns), ``scales`` (one per 16 K elements, 32 in mxfp4) and ``bias`` together. FP4Linear:
    0/-2 rows (bias split with them), 1/-1 K (bias whole). FP4SwitchLinear ``[E, N, K/8]``
    (mlx-lm's MoE plan: gate/up "all-to-sharded" = rows, down "sharded-to-all" = K):
    1/-2 rows, 2/-1 K, 0/-3 experts (layers/sharded_switch.py). K splits only on the mode's
    blocks. The global scale stays whole (per-expert scales are split only with the
    experts). Every other parameter is split exactly as MLX does. As with MLX, the module
    does not change type, so it computes a partial result and does no communication.
    """
    where = "mlx_fp4.distributed.shard_inplace"
    if isinstance(sharding, str):
        _check_sharding(sharding, where)
        predicate = _mlx_predicate(sharding, segments)
    elif callable(sharding):
        predicate = sharding
    else:
        raise ValueError(f"[{where}] sharding expected a string or a callable.")
    group = group or mx.distributed.init()
    n_ranks, r = group.size(), group.rank()

    fp4 = {
        path: m
        for path, m in module.named_modules()
        if is_fp4_linear(m) or isinstance(m, (_FP4Sharded, FP4SwitchLinear))
    }
    for path, m in fp4.items():
        if isinstance(m, _FP4Sharded):
            raise ValueError(f"[{where}] {path or 'module'} is already sharded ({type(m).__name__}).")

    def owner(p):
        prefix, _, leaf = p.rpartition(".")
        return (prefix, leaf) if prefix in fp4 else (None, None)

    # Decide and validate everything first (every rank raises the same error).
    plans = {}
    for path, m in fp4.items():
        wpath = f"{path}.weight" if path else "weight"
        s = predicate(wpath, m["weight"])
        if s is None:
            continue
        axis, segs = (s, 1) if isinstance(s, int) else s
        if isinstance(m, FP4SwitchLinear):
            plans[path] = shard_switch_arrays(m, axis, segs, group, f"{where}: {path or 'module'}")
            continue
        if axis in (0, -2):
            kind = "all-to-sharded"
        elif axis in (1, -1):
            kind = "sharded-to-all"
        else:
            raise ValueError(f"[{where}] {wpath}: axis {axis} is not an axis of a 2-D weight.")
        w, scales, bias, _, _, _ = _fp4_arrays(m, f"{where}: {path or 'module'}")
        w, scales, bias = _shard_fp4_arrays(w, scales, bias, kind, segs, group, f"{where}: {path or 'module'}",
                                            block=m.group_size)
        plans[path] = {"weight": w, "scales": scales, "bias": bias}

    new = []
    for p, a in tree_flatten(module.parameters()):
        if not isinstance(a, mx.array):
            continue
        prefix, leaf = owner(p)
        if prefix is not None and leaf in ("weight", "scales", "bias", "global_scale"):
            if prefix in plans and plans[prefix].get(leaf) is not None:
                a = plans[prefix][leaf]  # a global_scale not in the plan stays whole
            new.append((p, a))
            continue
        s = predicate(p, a)
        if s is None:
            new.append((p, a))
            continue
        axis, segs = (s, 1) if isinstance(s, int) else s
        total = a.shape[axis]
        pieces = _rank_pieces(total, segs, n_ranks, f"{where}: {p}", "the parameter")[r]
        new.append((p, _take(a, pieces, axis)))
    module.update(tree_unflatten(new))


# --------------------------------------------------------------------------- #
# mlx-lm models
# --------------------------------------------------------------------------- #
class _ShardProxy(nn.QuantizedLinear):
    """MLX's nvfp4 / mxfp4 ``QuantizedLinear`` over an FP4Linear's bytes (no global scale), for the
    duration of ``model.shard()``: MLX's ``shard_linear``/``shard_inplace`` split it as their
    own, and :func:`shard_model` turns the result back into an FP4 layer. Reading ``.weight``
    (MLX's sharded constructors start there) or ``parameters()`` notes the path, so a failed
    split is reported with the layer's name."""

    def __init__(self, layer: FP4Linear, path: str, log: list):
        nn.Module.__init__(self)
        self.group_size, self.bits, self.mode = layer.group_size, layer.bits, layer.mode
        self.biases = None
        self.weight, self.scales = layer.weight, layer.scales
        if "bias" in layer:
            self.bias = layer.bias
        self.freeze()
        object.__setattr__(self, "_fp4_path", path)
        object.__setattr__(self, "_fp4_log", log)

    def __getattr__(self, key):
        if key == "weight":
            self._fp4_log.append(self._fp4_path)
        return super().__getattr__(key)

    def parameters(self):
        self._fp4_log.append(self._fp4_path)
        return super().parameters()


class _SwitchShardProxy(nn.Module):
    """An FP4SwitchLinear's ``weight``/``scales``/``bias`` without its per-expert global scale,
    for the duration of ``model.shard()``: mlx-lm's MoE plan splits it in place with MLX's
    ``shard_inplace`` (which would split ``global_scale [E]`` along the experts), whatever the
    model does to the bias (gpt-oss divides it) happens here, and :func:`shard_model` turns it
    back into an FP4SwitchLinear with the whole global scale. ``parameters()`` notes the path."""

    def __init__(self, layer: FP4SwitchLinear, path: str, log: list):
        super().__init__()
        self.weight, self.scales = layer["weight"], layer["scales"]
        if "bias" in layer:
            self.bias = layer["bias"]
        self.freeze()
        object.__setattr__(self, "_fp4_path", path)
        object.__setattr__(self, "_fp4_log", log)

    def parameters(self):
        self._fp4_log.append(self._fp4_path)
        return super().parameters()


def _switch_back(m: nn.Module, source: FP4SwitchLinear, path: str) -> Optional[nn.Module]:
    """What the model's plan made of a switch proxy, as an FP4SwitchLinear (None: replaced)."""
    if not isinstance(m, _SwitchShardProxy):
        return None
    w, scales, bias = m["weight"], m["scales"], m.get("bias")
    if w is source["weight"] and scales is source["scales"] and bias is source.get("bias"):
        return source  # not split
    where = f"{path}: [mlx_fp4.distributed.shard_model]"
    e, n, words = w.shape
    if scales.shape[:2] != (e, n) or scales.shape[2] * source.group_size != words * (32 // BITS):
        raise ValueError(
            f"{where} the model's plan split the experts' weight {tuple(w.shape)} and scales "
            f"{tuple(scales.shape)} inconsistently (K off the {source.group_size}-element {source.mode} "
            "blocks); split K on block boundaries."
        )
    gs = source.get("global_scale")
    if gs is not None and e != source.num_experts:
        raise ValueError(
            f"{where} the model's plan split the experts ({source.num_experts} -> {e}); the "
            "per-expert global scales cannot follow it here: use mlx_fp4.distributed.shard_inplace."
        )
    return FP4SwitchLinear.from_arrays(w, scales, gs, bias, f"mlx_fp4.distributed.shard_model: {path}", mode=source.mode)


def _split_error(path: str, layer: FP4Linear, n_ranks: int, err: Exception) -> ValueError:
    """The error of a failed ``model.shard()`` at ``path``, in shard_linear's words."""
    try:
        _rank_pieces(layer.input_dims, 1, n_ranks, "mlx_fp4.distributed.shard_model",
                     "the input (K)", block=layer.group_size)
    except ValueError as e:
        return ValueError(f"{path}: {e}")
    return ValueError(f"{path}: {err}")


def _back_to_fp4(m: nn.Module, source: FP4Linear, path: str) -> Optional[nn.Module]:
    """What MLX made of a proxy, as an FP4 layer (None: not one of MLX's results)."""
    if isinstance(m, _ShardProxy):
        if m["weight"] is source["weight"] and m["scales"] is source["scales"]:
            return source  # not split
        cls = None
    elif _sharded_kind(m) == source.mode:
        cls = _CLASSES[
            "all-to-sharded"
            if isinstance(m, _mlx_dist.QuantizedAllToShardedLinear)
            else "sharded-to-all"
        ]
    else:
        return None
    k = m["weight"].shape[1] * (32 // BITS)
    if m["scales"].shape[1] * source.group_size != k:
        raise ValueError(
            f"{path}: [mlx_fp4.distributed.shard_model] the model's plan split K off the "
            f"{source.group_size}-element {source.mode} block boundaries (weight holds {k} K "
            f"elements, scales {m['scales'].shape[1]} blocks); split K on block boundaries."
        )
    if cls is None:  # split in place by shard_inplace: still an unsharded layer type
        return FP4Linear.from_quantized(m, global_scale=source.get("global_scale"))
    new = cls._blank(m.group, source.get("global_scale"), source.mode)
    new.weight, new.scales = m["weight"], m["scales"]
    if "bias" in m:
        new.bias = m["bias"]
    new.freeze()
    return new


def _restore(model: nn.Module, sources: dict) -> None:
    """Every proxy (or what MLX made of it) back as an FP4 layer."""
    modules = dict(model.named_modules())
    new = []
    for p, src in sources.items():
        m = modules.get(p)
        back = _switch_back if isinstance(src, FP4SwitchLinear) else _back_to_fp4
        fp4 = back(m, src, p) if m is not None else None
        if fp4 is not None:
            new.append((p, fp4))
    if new:
        model.update_modules(tree_unflatten(new))


def shard_model(model: nn.Module, group: Optional[mx.distributed.Group] = None) -> nn.Module:
    """Tensor-parallel shard an mlx-lm model that has FP4 layers; returns ``model``.

    Runs the model's own plan, ``model.shard(group)`` (q/k/v/gate/up all-to-sharded,
    o/down sharded-to-all, heads divided; MoE experts split in place, gate/up by rows and down
    along K, with one ``all_sum`` in the MoE block). Every FP4Linear is handed to it as an MLX
    ``QuantizedLinear`` of its mode over the same bytes, every FP4SwitchLinear as its arrays without
    the per-expert global scales; afterwards what MLX's ``shard_linear`` made of a linear
    becomes an :class:`FP4AllToShardedLinear`/:class:`FP4ShardedToAllLinear`, what
    ``shard_inplace`` split stays an FP4Linear / FP4SwitchLinear, each with its global
    scale(s) whole. Everything else is sharded by MLX. Works before or after ``mlx_fp4.nn.quantize``; for a model sharded first
    use :func:`quantize`. If a layer cannot be split (e.g. K not on the mode's blocks) every
    rank raises ValueError naming the layer and the model is left partly sharded: rebuild it.
    """
    shard = getattr(model, "shard", None)
    if not callable(shard):
        raise ValueError(
            f"[mlx_fp4.distributed.shard_model] {type(model).__name__} has no shard() "
            "method (mlx-lm models that support tensor parallelism define one)."
        )
    group = group or mx.distributed.init()
    sources = {p: m for p, m in model.named_modules() if p and isinstance(m, (FP4Linear, FP4SwitchLinear))}
    log: list = []
    if sources:
        def proxy(p, m):
            return (_SwitchShardProxy if isinstance(m, FP4SwitchLinear) else _ShardProxy)(m, p, log)

        model.update_modules(tree_unflatten([(p, proxy(p, m)) for p, m in sources.items()]))
    try:
        shard(group)
    except ValueError as e:
        _restore(model, sources)
        if not log:
            raise
        raise _split_error(log[-1], sources[log[-1]], group.size(), e) from e
    _restore(model, sources)
    return model


# --------------------------------------------------------------------------- #
# shard first, convert after
# --------------------------------------------------------------------------- #
def _sharded_kind(m) -> Optional[str]:
    if isinstance(m, _FP4Sharded):
        return None
    if isinstance(m, (_mlx_dist.AllToShardedLinear, _mlx_dist.ShardedToAllLinear)):
        return "float"
    if isinstance(m, (_mlx_dist.QuantizedAllToShardedLinear, _mlx_dist.QuantizedShardedToAllLinear)):
        mode = getattr(m, "mode", None)
        if mode in MODE_DEFAULTS and m.get("biases") is None:
            return mode  # "nvfp4" or "mxfp4"
    return None


def group_max(local: mx.array, group: mx.distributed.Group) -> mx.array:
    """Elementwise max of ``local`` over the ranks, exactly, through one ``all_sum``: every rank
    fills its own row of an otherwise zero [ranks, ...] array (adding zeros is exact). all_sum is
    the one collective every backend has (some NCCL builds of MLX lack all_gather and all_max)."""
    n = group.size()
    if n == 1:
        return local
    rows = mx.zeros((n, *local.shape), local.dtype)
    rows[group.rank()] = local
    return mx.max(mx.distributed.all_sum(rows, group=group), axis=0)


def _switch_shards(model, class_predicate, global_scale, group, where, mode=MODE) -> None:
    """The experts of a model sharded first, before convert.quantize: mlx-lm's plan split them in
    place (type unchanged), so each rank holds row or K slices of every expert. Without a global
    scale convert.quantize's per-shard quantization is already the sliced bytes (blocks never
    straddle a block-aligned split); with one, each expert's amax is taken over the group (max of
    the ranks' slices; a replicated layer gives its own), as when converting first. An nvfp4
    QuantizedSwitchLinear whose global scales MLX split along the experts is refused."""
    todo = []
    for path, m in model.named_modules():
        kind = switch_kind(m)
        gs = m.get("global_scale") if kind == "nvfp4-switch" else None
        if gs is not None and gs.shape != (m["weight"].shape[0],):
            raise ValueError(
                f"[{where}] {path}: global_scale {tuple(gs.shape)} no longer has one entry per expert "
                f"({m['weight'].shape[0]}): MLX's shard_inplace split the per-expert global scales along "
                "the experts. Shard FP4 experts with mlx_fp4.distributed.shard_model / shard_inplace."
            )
        if kind != "switch":
            continue
        sel = True if class_predicate is None else class_predicate(path, m)
        if sel is False or sel is None:
            continue
        opts = sel if isinstance(sel, dict) else {}
        if opts.get("mode", mode) != MODE:
            continue  # no global scale outside nvfp4: convert.quantize's per-shard bytes are exact
        gs = opts.get("global_scale", global_scale)
        if not isinstance(gs, bool):
            raise ValueError(f"[{where}] {path}: global_scale expected True or False but got {gs!r}.")
        if gs:
            todo.append((path, m))
    if not todo:
        return
    local = mx.concatenate([mx.max(mx.abs(m.weight), axis=(-2, -1)).astype(mx.float32) for _, m in todo])
    amax = group_max(local, group)
    mx.eval(amax)
    new, start = [], 0
    for path, m in todo:
        e = m.weight.shape[0]
        g = amax[start : start + e]
        start += e
        q, sc = quantize_experts_with_amax(m.weight, g)
        new.append((path, FP4SwitchLinear.from_arrays(q, sc, g, m.get("bias"), f"{where}: {path}")))
    model.update_modules(tree_unflatten(new))


def quantize(
    model: nn.Module,
    *,
    mode: str = MODE,
    class_predicate=None,
    global_scale: bool = False,
    progress: bool = True,
    group: Optional[mx.distributed.Group] = None,
) -> nn.Module:
    """Convert a model that was sharded first (``model.shard()``) to FP4; in place.

    MLX's sharded layers become FP4 sharded layers:
    ``AllToShardedLinear``/``ShardedToAllLinear`` (float) are quantized shard by
    shard; nvfp4 ``QuantizedAllToShardedLinear``/``QuantizedShardedToAllLinear``
    are wrapped without copying bytes (mxfp4 ones too). Then :func:`mlx_fp4.nn.quantize` converts
    the remaining (unsharded) linears. ``mode`` (``"nvfp4"`` or ``"mxfp4"``, no global scale),
    ``class_predicate(path, module)`` and ``global_scale`` as in :func:`mlx_fp4.nn.quantize`.

    The result equals converting first and sharding after, bit for bit, when
    the earlier split of K was on 16-element boundaries: blocks never straddle
    ranks, and with ``global_scale=True`` the per-tensor scale is the amax over
    the whole tensor (one ``all_sum`` of the local amaxes per group, all layers
    batched),
    not over the local shard. Every rank must call this (collective when
    ``global_scale`` is requested). mlx-lm MoE experts split in place by the model's plan
    (``SwitchLinear``, type unchanged) are converted the same way: with ``global_scale`` each
    expert's amax is taken over ``group`` (default: ``mx.distributed.init()``), so the bytes
    and per-expert scales are those of converting first.
    """
    where = "mlx_fp4.distributed.quantize"
    if not isinstance(global_scale, bool):
        # "auto" would compare errors over the whole tensor, which no rank holds: not offered.
        raise ValueError(f"[{where}] global_scale expected True or False but got {global_scale!r}.")
    todo = []
    for path, m in model.named_modules():
        kind = _sharded_kind(m)
        if kind is None:
            continue
        sel = True if class_predicate is None else class_predicate(path, m)
        if sel is False or sel is None:
            continue
        opts = {"global_scale": global_scale, "mode": mode, **(sel if isinstance(sel, dict) else {})}
        layer_mode = kind if kind in MODE_DEFAULTS else opts["mode"]  # MLX's quantized: its bytes
        group_size, _ = check_config(opts.pop("group_size", None), opts.pop("bits", None), opts.pop("mode"),
                                     f"{where}: {path}")
        if kind in MODE_DEFAULTS:
            group_size = MODE_DEFAULTS[kind][0]
        gs = opts.pop("global_scale")
        if not isinstance(gs, bool):
            raise ValueError(f"[{where}] {path}: global_scale expected True or False but got {gs!r}.")
        if kind == "float":
            check_no_global_scale(layer_mode, gs, f"{where}: {path}")
        if opts:
            raise ValueError(f"[{where}] unknown options for {path}: {sorted(opts)}.")
        sharding = (
            "all-to-sharded"
            if isinstance(m, (_mlx_dist.AllToShardedLinear, _mlx_dist.QuantizedAllToShardedLinear))
            else "sharded-to-all"
        )
        if kind == "float":
            k = m.weight.shape[-1]
            if k % group_size:
                raise ValueError(
                    f"[{where}] {path}: the local K slice has {k} elements, not a multiple of "
                    f"{group_size} ({layer_mode} blocks); shard on {group_size}-element block boundaries."
                )
        todo.append((path, m, kind, sharding, gs, layer_mode))

    # One collective per group for all global scales (batched; same order on every rank).
    amax = {}
    by_group = {}
    for path, m, kind, sharding, gs, _ in todo:
        if kind == "float" and gs:
            by_group.setdefault(id(m.group), (m.group, []))[1].append(path)
    mods = {p: m for p, m, *_ in todo}
    for group, paths in by_group.values():
        local = mx.stack([mx.max(mx.abs(mods[p].weight.astype(mx.float32))) for p in paths])
        total = group_max(local, group)
        mx.eval(total)
        for i, p in enumerate(paths):
            amax[p] = total[i]

    it = progress_bar(todo, "mlx_fp4: quantizing shards", progress)
    converted = []
    for path, m, kind, sharding, gs, layer_mode in it:
        cls = _CLASSES[sharding]
        if kind in MODE_DEFAULTS:  # MLX's nvfp4 / mxfp4 sharded layer: same bytes
            new = cls._blank(m.group, None, kind)
            new.weight, new.scales = m.weight, m.scales
        else:
            w = m.weight
            # With a global scale: the amax of the whole (group-wide) tensor, as unsharded.
            g = amax[path] if gs else None
            # An all-zero tensor (amax 0; quantize refuses 0 as a given scale) has zero bytes either way.
            plain = g is None or float(g.item()) == 0.0
            packed, scales = ops.quantize(w, mode=layer_mode) if plain else ops.quantize(w, global_scale=g)
            new = cls._blank(m.group, g, layer_mode)
            new.weight = packed.view(mx.uint32)
            new.scales = scales
        if "bias" in m:
            new.bias = m.bias
        new.freeze()
        mx.eval(new.parameters())
        converted.append((path, new))
    if converted:
        model.update_modules(tree_unflatten(converted))

    _switch_shards(model, class_predicate, global_scale, group or mx.distributed.init(), where, mode)
    convert.quantize(model, mode=mode, class_predicate=class_predicate, global_scale=global_scale, progress=progress)
    return model
