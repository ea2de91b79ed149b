"""Mixture-of-experts checkpoints: per-expert NVFP4 tensors (ModelOpt, compressed-tensors, MLX
per-expert exports: ``...experts.<e>.<proj>.{weight, scales, global_scale, bias}``) stacked into
mlx-lm's ``switch_mlp`` layout, and switch layers swapped for :class:`FP4SwitchLinear`.

Where each expert group goes comes from the model's own ``sanitize`` (mlx-lm's per-architecture
naming): it is run on a probe holding one marker per group under the ``.weight`` names, and the
stacked key it produces names the destination. Only ``.weight`` needs to be understood by
``sanitize`` (Qwen3-MoE's stacks nothing else); scales, global scales and biases follow it.
Global scales arrive in MLX's convention (the amax; load_nvfp4 converts the dialects), the one
FP4SwitchLinear holds, as mlx-lm's ``QuantizedSwitchLinear`` does.
"""

from __future__ import annotations

import re
from collections import defaultdict

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from ..formats import describe
from ..layers.switch import FP4SwitchLinear, switch_kind

__all__ = ["stack_experts", "swap_switch_layers"]

_EXPERT_KEY = re.compile(r"^(?P<group>.*\.experts)\.(?P<e>\d+)\.(?P<proj>[^.]+)\.(?P<name>weight|scales|global_scale|bias)$")


def _groups(weights: dict) -> dict:
    """(experts prefix, proj) -> {expert: {name: key}} for groups that are NVFP4 (have scales)."""
    groups = defaultdict(lambda: defaultdict(dict))
    for key in weights:
        m = _EXPERT_KEY.match(key)
        if m:
            groups[(m["group"], m["proj"])][int(m["e"])][m["name"]] = key
    return {g: experts for g, experts in groups.items() if any("scales" in v for v in experts.values())}


def _destinations(model: nn.Module, groups: dict) -> dict:
    """group -> destination prefix, by running model.sanitize on markers (group id per expert)."""
    probe = {}
    ids = {}
    for gid, (g, experts) in enumerate(sorted(groups.items())):
        ids[gid] = g
        for e in experts:
            probe[f"{g[0]}.{e}.{g[1]}.weight"] = mx.array([float(gid)])
    out = model.sanitize(dict(probe)) if hasattr(model, "sanitize") else probe
    dest = {}
    for key, v in out.items():
        if key in probe or not key.endswith(".weight") or v.ndim != 2:
            continue
        gid = int(v[0, 0].item())
        if gid in ids:
            dest[ids[gid]] = key[: -len(".weight")]
    return dest


def stack_experts(model: nn.Module, weights: dict) -> dict:
    """Per-expert NVFP4 tensors of ``weights`` (mlx_fp4 layout, as load_nvfp4 returns) stacked
    under the names ``model.sanitize`` gives the experts' weights; other entries unchanged."""
    groups = _groups(weights)
    if not groups:
        return weights
    dest = _destinations(model, groups)
    weights = dict(weights)
    for g, experts in groups.items():
        where = f"{g[0]}.*.{g[1]}"
        if g not in dest:
            raise ValueError(
                f"[mlx_fp4.nn.load_weights] per-expert NVFP4 tensors {where} have no place in the model: "
                "its sanitize() does not stack their .weight into a switch layer."
            )
        count = max(experts) + 1
        missing = [e for e in range(count) if "scales" not in experts.get(e, {})]
        if missing:
            raise ValueError(f"[mlx_fp4.nn.load_weights] {where}: experts {missing} have no NVFP4 scales.")
        names = set().union(*(v.keys() for v in experts.values()))
        for name in sorted(names):
            keys = [experts[e].get(name) for e in range(count)]
            if None in keys:
                raise ValueError(f"[mlx_fp4.nn.load_weights] {where}.{name}: expert {keys.index(None)} is missing.")
            parts = [weights.pop(k) for k in keys]
            if name == "global_scale":  # load_nvfp4 gives MLX's convention already: [1] each -> [E]
                parts = [p.reshape(()).astype(mx.float32) for p in parts]
            weights[f"{dest[g]}.{name}"] = mx.stack(parts)
    return weights


def swap_switch_layers(model: nn.Module, weights: dict) -> None:
    """Every SwitchLinear / QuantizedSwitchLinear whose ``<path>.scales`` is in ``weights``
    (uint32 weight [E, N, K/8]) becomes an FP4SwitchLinear holding those arrays, in place."""
    swaps = []
    for path, m in model.named_modules():
        if not path or switch_kind(m) not in ("switch", "nvfp4-switch") or f"{path}.scales" not in weights:
            continue
        w = weights.get(f"{path}.weight")
        if w is None or w.dtype != mx.uint32 or w.ndim != 3:
            raise ValueError(
                f"[mlx_fp4.nn.load_weights] {path}.weight expected uint32 [E, N, K/8] next to its scales "
                f"but got {describe(w) if w is not None else 'nothing'}."
            )
        bias = weights.get(f"{path}.bias", m.get("bias"))
        where = f"mlx_fp4.nn.load_weights: {path}"
        swaps.append((path, FP4SwitchLinear.from_arrays(w, weights[f"{path}.scales"],
                                                        weights.get(f"{path}.global_scale"), bias, where)))
    if swaps:
        model.update_modules(tree_unflatten(swaps))
