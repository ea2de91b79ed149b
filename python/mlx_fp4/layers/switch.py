"""FP4SwitchLinear: mlx-lm's ``QuantizedSwitchLinear(mode="nvfp4" | "mxfp4")`` (the experts of an
MoE layer; mxfp4 for gpt-oss) with ``mlx_fp4.gather_w4a16_matmul`` as its forward pass.

Same parameters as mlx-lm's layer: ``weight`` uint32 ``[E, N, K/8]``, ``scales`` uint8
``[E, N, K/16]``, optional ``global_scale`` fp32 ``[E]`` (MLX's convention: each expert's amax,
multiplier ``global_scale / 2688``) and ``bias`` ``[E, N]``; same ``__call__(x, indices,
sorted_indices=False)``, so mlx-lm's ``SwitchGLU`` / ``SwitchMLP`` run it unchanged. The
expert bias is fused into the matmul epilogue. mlx-lm is imported only where its classes are
needed (it is an optional dependency).
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import mlx.core as mx
import mlx.nn as nn

from .. import ops
from ..formats import BITS, E2M1_E4M3_MAX, MODE, MODE_DEFAULTS, check_config, check_no_global_scale, describe
from .linear import ResidentGlobalScale, swap_modules

__all__ = ["FP4SwitchGLU", "FP4SwitchLinear", "fuse_switch_glu", "is_switch_linear", "switch_kind",
           "to_fp4_switch_linear"]


def switch_kind(m) -> Optional[str]:
    """'switch' for mlx-lm's SwitchLinear, 'nvfp4-switch' / 'mxfp4-switch' for its
    QuantizedSwitchLinear of that mode, 'fp4-switch' for FP4SwitchLinear, 'other-switch' for
    other quantized modes, else None."""
    if isinstance(m, FP4SwitchLinear):
        return "fp4-switch"
    try:
        from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear
    except ImportError:
        return None
    if isinstance(m, QuantizedSwitchLinear):
        return f"{m.mode}-switch" if m.mode in MODE_DEFAULTS and m.get("biases") is None else "other-switch"
    if isinstance(m, SwitchLinear):
        return "switch"
    return None


def is_switch_linear(m) -> bool:
    return switch_kind(m) is not None


def _quantize_experts(w: mx.array, global_scale: bool, mode: str = MODE):
    """Stacked [E, N, K] weights -> (uint32 weight, scales, global_scale [E] or None): the bytes
    mlx-lm's SwitchLinear.to_quantized(mode=...) makes (MLX's quantizer, per-expert amax)."""
    group, bits = MODE_DEFAULTS[mode]
    if not global_scale:
        q, s = mx.quantize(w, group, bits, mode=mode)[:2]
        return q, s, None
    check_no_global_scale(mode, global_scale, "FP4SwitchLinear")
    gs = mx.max(mx.abs(w), axis=(-2, -1)).astype(mx.float32)
    parts = [mx.quantize(w[e], group, bits, mode=mode, global_scale=gs[e])[:2] for e in range(w.shape[0])]
    return mx.stack([q for q, _ in parts]), mx.stack([s for _, s in parts]), gs


class FP4SwitchLinear(ResidentGlobalScale, nn.Module):
    """FP4 (NVFP4 or MXFP4) experts ``[E, N, K]`` backed by ``mlx_fp4.gather_w4a16_matmul``.

    Args:
        input_dims (int): K, a multiple of the group size (16 nvfp4, 32 mxfp4).
        output_dims (int): N.
        num_experts (int): E.
        bias (bool): one bias row per expert. Default ``True`` (as mlx-lm).
        group_size, bits, mode: as ``QuantizedSwitchLinear``: ``mode`` ``"nvfp4"`` (default) or
            ``"mxfp4"``; ``group_size`` and ``bits`` the mode's (or ``None``).
        global_scale (bool): keep a per-expert global scale (random init; nvfp4 only). Default ``False``.

    Like ``QuantizedSwitchLinear`` the parameters are frozen and filled with a quantized
    random weight.
    """

    def __init__(
        self,
        input_dims: int,
        output_dims: int,
        num_experts: int,
        bias: bool = True,
        group_size: Optional[int] = None,
        bits: Optional[int] = None,
        mode: str = MODE,
        global_scale: bool = False,
    ):
        super().__init__()
        group, bits = check_config(group_size, bits, mode, "FP4SwitchLinear")
        if input_dims % group != 0 or input_dims <= 0 or output_dims <= 0 or num_experts <= 0:
            raise ValueError(
                f"[FP4SwitchLinear] input_dims expected a positive multiple of {group} ({mode}) and output_dims, "
                f"num_experts > 0 but got {input_dims}, {output_dims}, {num_experts}."
            )
        self.group_size, self.bits, self.mode = group, bits, mode
        scale = math.sqrt(1 / input_dims)
        w = mx.random.uniform(-scale, scale, (num_experts, output_dims, input_dims))
        self.weight, self.scales, gs = _quantize_experts(w, global_scale, mode)
        self.global_scale = gs
        self.biases = None
        if bias:
            self.bias = mx.zeros((num_experts, output_dims))
        self.freeze()

    @classmethod
    def _check(cls, m: "FP4SwitchLinear", where: str) -> "FP4SwitchLinear":
        if m.weight.ndim != 3:
            raise ValueError(f"[{where}] weight expected uint32 [E, N, K/8] but got {describe(m.weight)}.")
        e, n, words = m.weight.shape
        k = words * 32 // BITS
        if m.weight.dtype != mx.uint32 or m.scales.dtype != mx.uint8 or m.scales.shape != (e, n, k // m.group_size):
            raise ValueError(
                f"[{where}] expected weight uint32 [E, N, K/8] and scales uint8 [E, N, K/{m.group_size}] "
                f"({m.mode}) but got {describe(m.weight)} and {describe(m.scales)}."
            )
        gs = m.get("global_scale")
        check_no_global_scale(m.mode, gs, where)
        if gs is not None and (gs.dtype != mx.float32 or gs.shape not in ((), (e,))):
            raise ValueError(f"[{where}] global_scale expected float32 [E] = [{e}] but got {describe(gs)}.")
        return m

    @classmethod
    def from_arrays(cls, weight, scales, global_scale=None, bias=None, where="FP4SwitchLinear.from_arrays",
                    mode=MODE):
        """A layer holding these arrays as they are (checked: uint32 weight [E, N, K/8], uint8
        scales [E, N, K/group], float32 global_scale [E] in MLX's convention or None (nvfp4 only),
        bias [E, N])."""
        m = cls.__new__(cls)
        nn.Module.__init__(m)
        m.group_size, m.bits = check_config(None, None, mode, where)
        m.mode = mode
        m.weight, m.scales, m.global_scale = weight, scales, global_scale
        m.biases = None
        if bias is not None:
            m.bias = bias
        m.freeze()
        return cls._check(m, where)

    @classmethod
    def from_quantized(cls, qsl: nn.Module) -> "FP4SwitchLinear":
        """Wrap an nvfp4 or mxfp4 ``QuantizedSwitchLinear`` without copying its arrays."""
        if switch_kind(qsl) not in ("nvfp4-switch", "mxfp4-switch"):
            raise ValueError(
                f"[FP4SwitchLinear.from_quantized] expected an nvfp4 or mxfp4 QuantizedSwitchLinear but got "
                f"{type(qsl).__name__} (mode {getattr(qsl, 'mode', None)!r})."
            )
        return cls.from_arrays(qsl["weight"], qsl["scales"], qsl.get("global_scale"), qsl.get("bias"),
                               "FP4SwitchLinear.from_quantized", mode=qsl.mode)

    @classmethod
    def from_switch_linear(cls, sl: nn.Module, global_scale: bool = False, mode: str = MODE) -> "FP4SwitchLinear":
        """Quantize an mlx-lm ``SwitchLinear`` (each expert on its own), as its
        ``to_quantized(mode=..., global_scale=...)`` does."""
        k = sl.weight.shape[-1]
        group = MODE_DEFAULTS[mode][0]
        if k % group:
            raise ValueError(
                f"[FP4SwitchLinear.from_switch_linear] input dims expected a multiple of {group} ({mode}) but got {k}."
            )
        q, s, gs = _quantize_experts(sl.weight, global_scale, mode)
        return cls.from_arrays(q, s, gs, sl.get("bias"), "FP4SwitchLinear.from_switch_linear", mode=mode)

    @property
    def input_dims(self) -> int:
        return self.scales.shape[2] * self.group_size

    @property
    def output_dims(self) -> int:
        return self.weight.shape[1]

    @property
    def num_experts(self) -> int:
        return self.weight.shape[0]

    def _extra_repr(self):
        gs = "" if self.get("global_scale") is None else ", global_scale=True"
        return f"{self.input_dims}, {self.output_dims}, {self.num_experts}, bias={'bias' in self}{gs}"

    def __call__(self, x: mx.array, indices: mx.array, sorted_indices: bool = False, epilogue=None) -> mx.array:
        """mlx-lm's call; ``epilogue``: more ops for the fused chain, after the expert bias."""
        if x.ndim == 0 or x.shape[-1] != self.input_dims:
            raise ValueError(
                f"[FP4SwitchLinear] x's last dimension expected input_dims = {self.input_dims} but got shape {x.shape}."
            )
        if "bias" in self:
            epilogue = [("add", mx.expand_dims(self["bias"][indices], -2))] + list(epilogue or [])
        return ops.gather_w4a16_matmul(
            x,
            self["weight"],
            self["scales"],
            rhs_indices=indices,
            global_scale=self.get("global_scale"),
            epilogue=epilogue,
            sorted_indices=sorted_indices,
            mode=self.mode,
        )

    def dequantized_weight(self, dtype=mx.float32) -> mx.array:
        """``[E, N, K]``: e2m1 * scale (* global_scale / 2688 per expert), in fp32 then cast."""
        w = ops.dequantize(self["weight"], self["scales"], k=self.input_dims, dtype=mx.float32, mode=self.mode)
        gs = self.get("global_scale")
        if gs is not None:
            w = w * (gs.reshape(-1, 1, 1) / mx.array(E2M1_E4M3_MAX, mx.float32))
        return w.astype(dtype)

    def to_switch_linear(self, dtype=mx.bfloat16) -> nn.Module:
        """An mlx-lm ``SwitchLinear`` with the dequantized weights."""
        from mlx_lm.models.switch_layers import SwitchLinear

        sl = SwitchLinear(self.input_dims, self.output_dims, self.num_experts, bias="bias" in self)
        sl.weight = self.dequantized_weight(dtype)
        if "bias" in self:
            sl.bias = self["bias"]
        return sl

    # -- mlx-lm LoRA hook ----------------------------------------------------
    def to_lora(self, r: int = 8, dropout: float = 0.0, scale: float = 20.0):
        """Used by ``mlx_lm.tuner.utils.linear_to_lora_layers`` (which otherwise leaves a layer it does
        not know alone): mlx-lm's ``LoRASwitchLinear`` over these experts, whose ``fuse()`` honours the
        global scale and re-quantizes to FP4SwitchLinear."""
        return _fp4_lora_switch_class().from_base(self, r=r, dropout=dropout, scale=scale)


@functools.lru_cache(maxsize=None)
def _fp4_lora_switch_class():
    from mlx_lm.tuner.lora import LoRASwitchLinear

    class FP4LoRASwitchLinear(LoRASwitchLinear):
        """mlx-lm ``LoRASwitchLinear`` (per-expert ``lora_a [E, r, K]``, ``lora_b [E, N, r]``, the
        same forward) over an :class:`FP4SwitchLinear` base."""

        @staticmethod
        def from_base(linear, r: int = 8, dropout: float = 0.0, scale: float = 20.0):
            lora = FP4LoRASwitchLinear(linear.input_dims, linear.output_dims, linear.num_experts, r=r,
                                       dropout=dropout, scale=scale)
            lora.linear = linear
            return lora

        def fuse(self, dequantize: bool = False):
            """The experts with ``scale * lora_b @ lora_a`` added in fp32 to the decoded weights (global
            scale included; mlx-lm's own fuse would drop it), as a ``SwitchLinear`` in the LoRA dtype or,
            re-quantized, an FP4SwitchLinear of the same mode (with per-expert global scales if the base
            had them)."""
            linear = self.linear
            if not isinstance(linear, FP4SwitchLinear):
                return super().fuse(dequantize)
            fused = linear.to_switch_linear(mx.float32)  # the decoded experts (and the bias)
            delta = self.scale * (self.lora_b.astype(mx.float32) @ self.lora_a.astype(mx.float32))
            fused.weight = (fused.weight + delta).astype(self.lora_a.dtype)
            if dequantize:
                return fused
            return FP4SwitchLinear.from_switch_linear(fused, global_scale=linear.get("global_scale") is not None,
                                                      mode=linear.mode)

    return FP4LoRASwitchLinear


def to_fp4_switch_linear(m: nn.Module, global_scale: bool, where: str, mode: str = MODE) -> nn.Module:
    """The FP4 form of an mlx-lm switch layer: SwitchLinear quantized in ``mode``, nvfp4 / mxfp4
    QuantizedSwitchLinear wrapped, FP4SwitchLinear kept; anything else is a ValueError."""
    kind = switch_kind(m)
    if kind == "fp4-switch":
        return m
    if kind in ("nvfp4-switch", "mxfp4-switch"):
        return FP4SwitchLinear.from_quantized(m)
    if kind == "switch":
        return FP4SwitchLinear.from_switch_linear(m, global_scale, mode)
    raise ValueError(
        f"[{where}] expected a SwitchLinear or an nvfp4 / mxfp4 QuantizedSwitchLinear but got {type(m).__name__}."
    )


SORT_MIN_PAIRS = 64  # mlx-lm's SwitchGLU sorts the (token, expert) pairs by expert from this many on


def sort_pairs(x: mx.array, indices: mx.array):
    """mlx-lm's sorted path: x [..., 1, 1, K] and indices [..., top_k] -> (x rows [P, 1, K] ordered
    by expert, the sorted expert of each, the inverse order)."""
    top = indices.shape[-1]
    order = mx.argsort(indices.flatten())
    return x.flatten(0, -3)[order // top], indices.flatten()[order], mx.argsort(order)


def unsort_pairs(y: mx.array, inv_order: mx.array, shape) -> mx.array:
    return mx.unflatten(y[inv_order], 0, shape)


class FP4SwitchGLU(nn.Module):
    """mlx-lm's ``SwitchGLU`` (gate, up, SwiGLU, down over the routed experts) on FP4SwitchLinear
    experts with the SwiGLU fused: the gate's epilogue applies ``silu``, the up projection's
    multiplies by it on its fp32 accumulator (one kernel and one rounding fewer per layer).
    Same children (``gate_proj``, ``up_proj``, ``down_proj``) and the same sort rule as mlx-lm."""

    def __init__(self, glu: nn.Module):
        super().__init__()
        for name in ("gate_proj", "up_proj", "down_proj"):
            setattr(self, name, to_fp4_switch_linear(getattr(glu, name), False, f"FP4SwitchGLU: {name}"))

    def __call__(self, x: mx.array, indices: mx.array) -> mx.array:
        x = mx.expand_dims(x, (-2, -3))
        indices = mx.stop_gradient(indices)
        do_sort = indices.size >= SORT_MIN_PAIRS
        idx, inv_order = indices, None
        if do_sort:
            x, idx, inv_order = sort_pairs(x, indices)
        gate = self.gate_proj(x, idx, sorted_indices=do_sort, epilogue=["silu"])
        h = self.up_proj(x, idx, sorted_indices=do_sort, epilogue=[("mul", gate)])
        y = self.down_proj(h, idx, sorted_indices=do_sort)
        if do_sort:
            y = unsort_pairs(y, inv_order, indices.shape)
        return y.squeeze(-2)


def fuse_switch_glu(model: nn.Module) -> nn.Module:
    """Replace every mlx-lm ``SwitchGLU`` with the SwiGLU activation (the default) by an
    :class:`FP4SwitchGLU` sharing its (FP4 or converted) experts, in place; returns ``model``."""
    from mlx_lm.models.switch_layers import SwiGLU, SwitchGLU

    return swap_modules(
        model, lambda path, m: FP4SwitchGLU(m) if isinstance(m, SwitchGLU) and isinstance(m.activation, SwiGLU) else None
    )
