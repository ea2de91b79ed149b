"""Tensor-parallel splits of FP4SwitchLinear experts, the way mlx-lm's MoE ``shard()`` does it.

mlx-lm shards an MoE block in place (``shard_inplace`` on ``switch_mlp.gate_proj``/``up_proj``
"all-to-sharded", ``down_proj`` "sharded-to-all") and the MoE block itself ``all_sum``-s its
output once, after the experts' outputs are weighted and added. So a sharded switch layer keeps
its type and computes this rank's part:

* rows (axis 1 of ``weight [E, N, K/8]``; MLX's "all-to-sharded"): ``weight``, ``scales`` and
  ``bias [E, N]`` lose the same output rows of every expert;
* K (axis 2; "sharded-to-all"): ``weight`` words and ``scales`` blocks of every expert, only on
  block boundaries (16 elements in nvfp4, 32 in mxfp4; else a ValueError on every rank before
  any communication);
  the bias stays whole, as MLX leaves it (the model's plan divides it, e.g. gpt-oss);
* experts (axis 0): every per-expert array, ``global_scale [E]`` included, loses the same experts.

On a row or K split the per-expert global scales are kept whole: expert e's multiplier applies
to all its rows and, being a factor of every partial product, to the sum of the K parts once.
MLX's own ``shard_inplace`` would split ``global_scale [E]`` along the experts instead.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx

from ..formats import BITS, GROUP_SIZE, MODE
from .sharded import Segments, _rank_pieces, _take
from .switch import FP4SwitchLinear

__all__ = ["EXPERT_AXES", "ROW_AXES", "K_AXES", "shard_switch_arrays", "quantize_experts_with_amax"]

# Axes of the 3-D ``weight [E, N, K/8]`` a sharding predicate may name.
EXPERT_AXES, ROW_AXES, K_AXES = (0, -3), (1, -2), (2, -1)
_WORD = 32 // BITS  # FP4 codes per uint32 word


def shard_switch_arrays(
    layer: FP4SwitchLinear,
    axis: int,
    segments: Segments,
    group: mx.distributed.Group,
    where: str,
) -> dict:
    """This rank's ``{"weight", "scales", "bias", "global_scale"}`` of ``layer`` split along
    ``axis`` of its weight (module docstring); absent entries stay absent. Validates for every
    rank first, so every rank raises the same ValueError."""
    n_ranks, r = group.size(), group.rank()
    e, n, words = layer["weight"].shape
    k = words * _WORD
    bias, gs = layer.get("bias"), layer.get("global_scale")
    out = {"weight": layer["weight"], "scales": layer["scales"], "bias": bias, "global_scale": gs}
    if axis in ROW_AXES:
        pieces = _rank_pieces(n, segments, n_ranks, where, "the output (N) of the experts")[r]
        out["weight"] = _take(out["weight"], pieces, 1)
        out["scales"] = _take(out["scales"], pieces, 1)
        if bias is not None:
            out["bias"] = _take(bias, pieces, -1)
    elif axis in K_AXES:
        group_size = layer.group_size  # 16 (nvfp4) or 32 (mxfp4): one scale per block
        pieces = _rank_pieces(k, segments, n_ranks, where, "the input (K) of the experts", block=group_size)[r]
        out["weight"] = _take(out["weight"], pieces, 2, unit=_WORD)
        out["scales"] = _take(out["scales"], pieces, 2, unit=group_size)
    elif axis in EXPERT_AXES:
        pieces = _rank_pieces(e, segments, n_ranks, where, "the experts (E)")[r]
        for key in ("weight", "scales", "bias", "global_scale"):
            a = out[key]
            if a is not None and a.ndim >= 1 and a.shape[0] == e:
                out[key] = _take(a, pieces, 0)
    else:
        raise ValueError(
            f"[{where}] axis {axis} is not an axis of the experts' 3-D weight [E, N, K/8] "
            "(0: experts, 1: output rows, 2: K)."
        )
    return {key: a for key, a in out.items() if a is not None}


def quantize_experts_with_amax(w: mx.array, amax: Optional[mx.array]):
    """Stacked float experts ``[E, N, K]`` -> (uint32 weight, uint8 scales) quantized by MLX with
    the given per-expert amax ``[E]`` as each expert's global scale (None: no global scale); the
    bytes ``FP4SwitchLinear.from_switch_linear`` makes when ``amax`` is the experts' own."""
    if amax is None:
        q, s = mx.quantize(w, GROUP_SIZE, BITS, mode=MODE)[:2]
        return q, s
    parts = [mx.quantize(w[i], GROUP_SIZE, BITS, mode=MODE, global_scale=amax[i])[:2] for i in range(w.shape[0])]
    return mx.stack([q for q, _ in parts]), mx.stack([s for _, s in parts])
