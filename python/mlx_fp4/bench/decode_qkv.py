"""A fused QKV projection for the decode benchmark, wired into mlx-lm's attention without forking it.

mlx-lm's attention computes ``self.q_proj(x), self.k_proj(x), self.v_proj(x)`` in that order on
the same ``x``. :func:`fuse_qkv` replaces the three ``FP4Linear`` with views of one ``FP4Linear``
whose rows are q's, k's and v's concatenated (exact: output rows are independent): ``q_proj``
runs the fused product and one ``mx.split`` (a single multi-output node) and keeps the parts;
``k_proj`` / ``v_proj`` return their part when called on that very ``x`` object, and otherwise
(any other caller, any other input) compute the fused product themselves, so they are never
wrong. Three W4A16 nodes become one W4A16 node and one Split.
"""

import mlx.core as mx
import mlx.nn as nn

from ..layers.linear import FP4Linear

PROJECTIONS = ("q_proj", "k_proj", "v_proj")


class _Shared:
    """State of one attention block's fused product (a plain object: not a module child, so the
    fused weights appear once in the parameter tree, under q_proj)."""

    def __init__(self, fused: FP4Linear, sizes):
        self.fused, self.sizes = fused, sizes
        self.x, self.parts = None, None

    def compute(self, x):
        offsets = [self.sizes[0], self.sizes[0] + self.sizes[1]]
        return mx.split(self.fused(x), offsets, axis=-1)


class FusedQProj(nn.Module):
    """q_proj of a fused QKV block: owns the fused FP4Linear (child ``fused``)."""

    def __init__(self, shared: _Shared):
        super().__init__()
        self.fused = shared.fused
        self._shared = shared

    def __call__(self, x):
        s = self._shared
        s.x, s.parts = x, s.compute(x)
        return s.parts[0]


class FusedPart(nn.Module):
    """k_proj (index 1) or v_proj (index 2) of a fused QKV block."""

    def __init__(self, shared: _Shared, index: int):
        super().__init__()
        self._shared, self._index = shared, index

    def __call__(self, x):
        s = self._shared
        if s.x is x and s.parts is not None:
            part = s.parts[self._index]
            if self._index == len(PROJECTIONS) - 1:
                s.x, s.parts = None, None  # v is the last reader: release x and the parts
            return part
        return s.compute(x)[self._index]  # not q_proj's input: correct, at the full cost


def _same_global_scale(layers) -> bool:
    gs = [m.get("global_scale") for m in layers]
    if all(g is None for g in gs):
        return True
    if any(g is None for g in gs):
        return False
    return all(mx.array_equal(g, gs[0]).item() for g in gs[1:])


def fuse_qkv_block(q: FP4Linear, k: FP4Linear, v: FP4Linear):
    """The three projections as (FusedQProj, FusedPart k, FusedPart v), or None when they cannot be
    one product (different input sizes, modes, global scales, or biases on some only)."""
    layers = (q, k, v)
    if not all(type(m) is FP4Linear for m in layers):
        return None
    if len({m.input_dims for m in layers}) != 1 or len({m.mode for m in layers}) != 1:
        return None
    biases = ["bias" in m for m in layers]
    if any(biases) and not all(biases):
        return None
    if not _same_global_scale(layers):
        return None
    fused = FP4Linear._empty(q.input_dims, sum(m.output_dims for m in layers), q.mode)
    fused.weight = mx.concatenate([m["weight"] for m in layers], axis=0)
    fused.scales = mx.concatenate([m["scales"] for m in layers], axis=0)
    if all(biases):
        fused.bias = mx.concatenate([m["bias"] for m in layers], axis=0)
    if q.get("global_scale") is not None:
        fused.global_scale = q["global_scale"]
    fused.freeze()
    shared = _Shared(fused, [m.output_dims for m in layers])
    return FusedQProj(shared), FusedPart(shared, 1), FusedPart(shared, 2)


def fuse_qkv(model: nn.Module) -> dict:
    """Fuse every module that has FP4Linear ``q_proj``, ``k_proj`` and ``v_proj`` children, in place.
    Returns {"fused": count, "left_unfused": [paths]} (unfused: see :func:`fuse_qkv_block`)."""
    fused, left = 0, []
    for path, m in list(model.named_modules()):
        if not all(isinstance(m.get(p), FP4Linear) for p in PROJECTIONS):
            continue
        block = fuse_qkv_block(*(m[p] for p in PROJECTIONS))
        if block is None:
            left.append(path)
            continue
        for name, layer in zip(PROJECTIONS, block):
            setattr(m, name, layer)
        fused += 1
    mx.eval(model.parameters())
    return {"fused": fused, "left_unfused": left}
