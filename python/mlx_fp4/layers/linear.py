"""FP4Linear: an ``mlx.nn.QuantizedLinear(mode="nvfp4" | "mxfp4")`` whose forward pass is
``mlx_fp4.w4a16_matmul``, and its LoRA class for mlx-lm. (mxfp4: ``scales`` ``[N, K/32]`` E8M0,
no global scale.)

``FP4Linear`` keeps QuantizedLinear's parameter names, dtypes and shapes (``weight`` uint32
``[N, K/8]``, ``scales`` uint8 ``[N, K/16]``, optional ``bias`` ``[N]``) and its
``group_size``, ``bits`` and ``mode`` attributes, so mlx-lm, LoRA and ``shard_linear`` see the
layer they expect. The bias is fused into the matmul epilogue.

The optional global scale is a *parameter*, ``global_scale`` fp32 ``[1]`` in MLX's convention
(the tensor amax, as ``mx.quantize``/``mx.dequantize`` and mlx-lm's ``QuantizedSwitchLinear``
take it; the weights decode as ``e2m1 * e4m3 * global_scale / 2688``). So every tool that walks
parameters carries it (``tree_flatten(model.parameters())``, ``mlx_lm.utils.save_model``), and
the tools that would drop it raise instead of computing without it: MLX's ``shard_linear``
(``global_scale`` cannot be split or put into MLX's sharded layer), ``mlx_lm.load`` of a saved
model (MLX's QuantizedLinear has no such parameter) and ``mlx_lm.utils.dequantize_model``
(reading ``biases`` of a layer with a global scale raises, see :class:`GlobalScaleMixin`).
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from .. import ops
from ..formats import (
    MODE,
    MODE_DEFAULTS,
    as_global_scale,
    check_config,
    check_no_global_scale,
    check_scales,
    device_resident,
    dtype_name,
)

__all__ = [
    "FP4Linear",
    "GlobalScaleMixin",
    "ResidentGlobalScale",
    "is_fp4_linear",
    "is_mlx_nvfp4",
    "linear_kind",
    "random_fp4_weight",
    "swap_modules",
    "to_fp4_linear",
]


def linear_kind(m) -> Optional[str]:
    """'linear' for nn.Linear, 'nvfp4' / 'mxfp4' for an MLX QuantizedLinear of that mode,
    'fp4' for FP4Linear, 'other' for other QuantizedLinear modes, else None."""
    if isinstance(m, FP4Linear):
        return "fp4"
    if isinstance(m, nn.QuantizedLinear):
        mode = getattr(m, "mode", None)
        if mode in MODE_DEFAULTS and m.get("biases") is None:
            return mode
        return "other"
    if isinstance(m, nn.Linear):
        return "linear"
    return None


# --------------------------------------------------------------------------- #
# FP4Linear
# --------------------------------------------------------------------------- #
class ResidentGlobalScale:
    """Stores an array assigned to ``global_scale`` (by attribute, ``update`` or
    ``load_weights``) through ``formats.device_resident``: the kernels then read it from device
    memory on MLX's CUDA backend."""

    def __setitem__(self, key, val):
        if key == "global_scale" and isinstance(val, mx.array):
            val = device_resident(val)
        super().__setitem__(key, val)


class GlobalScaleMixin(ResidentGlobalScale):
    """The ``global_scale`` parameter of an FP4 layer: set it to None, a float or a scalar
    array (MLX's convention, the amax); it is stored as a frozen fp32 ``[1]`` parameter, or
    not at all. ``biases`` is None (nvfp4 has no zero points) but reading it on a layer with a
    global scale raises: code that decodes ``(weight, scales, biases)`` itself, such as
    ``mlx_lm.utils.dequantize_model``, would silently drop the scale."""

    def __setattr__(self, key, val):
        if key == "global_scale":
            check_no_global_scale(getattr(self, "mode", MODE), val, f"{type(self).__name__}.global_scale")
            val = as_global_scale(val, f"{type(self).__name__}.global_scale")
            super().__setattr__(key, val)
            if val is not None:
                self.freeze(recurse=False, keys=["global_scale"])
            return
        super().__setattr__(key, val)

    @property
    def biases(self):
        if "global_scale" in self:
            raise ValueError(
                f"[{type(self).__name__}] this layer has a global_scale, which code reading "
                "(weight, scales, biases) such as mlx_lm.utils.dequantize_model would drop; "
                "use mlx_fp4.nn.dequantize(model) or layer.dequantized_weight()."
            )
        return None


class FP4Linear(GlobalScaleMixin, nn.QuantizedLinear):
    """FP4 (NVFP4 or MXFP4) weight-only linear layer backed by ``mlx_fp4.w4a16_matmul``.

    Args:
        input_dims (int): K, a multiple of the group size (16 nvfp4, 32 mxfp4).
        output_dims (int): N.
        bias (bool): add a bias (fused into the matmul epilogue). Default ``True``.
        group_size, bits, mode: as ``QuantizedLinear``: ``mode`` ``"nvfp4"`` (default) or
            ``"mxfp4"``; ``group_size`` and ``bits`` must be the mode's (or ``None``).
        global_scale: optional per-tensor scale in MLX's convention (the amax, a float or
            an fp32 scalar); the dequantized weight is ``e2m1 * e4m3 * global_scale / 2688``.

    Like ``QuantizedLinear`` the parameters are frozen and the constructor
    fills them with a quantized random weight.
    """

    def __init__(
        self,
        input_dims: int,
        output_dims: int,
        bias: bool = True,
        group_size: Optional[int] = None,
        bits: Optional[int] = None,
        mode: str = MODE,
        *,
        global_scale=None,
    ):
        nn.Module.__init__(self)
        self._init_config(group_size, bits, mode, input_dims, output_dims)
        self.weight, self.scales = random_fp4_weight(output_dims, input_dims, input_dims, mode)
        if bias:
            self.bias = mx.zeros((output_dims,))
        self.global_scale = global_scale
        self.freeze()

    # -- construction helpers ------------------------------------------------
    def _init_config(self, group_size, bits, mode, input_dims, output_dims):
        group, bits = check_config(group_size, bits, mode, "FP4Linear")
        if input_dims <= 0 or output_dims <= 0:
            raise ValueError(
                f"[FP4Linear] input_dims and output_dims expected > 0 but got "
                f"{input_dims} and {output_dims}."
            )
        if input_dims % group != 0:
            raise ValueError(
                f"[FP4Linear] input_dims expected a multiple of {group} ({mode} block) "
                f"but got {input_dims}."
            )
        self.group_size = group
        self.bits = bits
        self.mode = mode
        self.global_scale = None

    @classmethod
    def _empty(cls, input_dims, output_dims, mode=MODE):
        """An instance with config set but no weight (filled by the caller)."""
        ql = cls.__new__(cls)
        nn.Module.__init__(ql)
        ql._init_config(None, None, mode, input_dims, output_dims)
        return ql

    @classmethod
    def from_linear(
        cls,
        linear_layer: nn.Module,
        group_size: Optional[int] = None,
        bits: Optional[int] = None,
        mode: str = MODE,
        *,
        global_scale=False,
    ) -> "FP4Linear":
        """Quantize an ``nn.Linear`` (nvfp4: round-to-nearest-even E2M1, E4M3 scales; mxfp4:
        the bytes of ``mx.quantize(mode="mxfp4")``, no global scale).

        ``global_scale=True`` also computes the per-tensor scale ``amax(|W|)`` (MLX's
        convention), which keeps small-magnitude tensors away from the E4M3 underflow
        range; a value (e.g. the amax of the whole tensor this one is a shard of) is used as
        given.
        """
        check_config(group_size, bits, mode, "FP4Linear.from_linear")
        output_dims, input_dims = linear_layer.weight.shape
        ql = cls._empty(input_dims, output_dims, mode)
        if global_scale is True:
            check_no_global_scale(mode, global_scale, "FP4Linear.from_linear")
            packed, scales, gs = ops.quantize(linear_layer.weight, global_scale=True)
            ql.global_scale = gs
        elif global_scale is False or global_scale is None:
            packed, scales = ops.quantize(linear_layer.weight, mode=mode)
        else:
            ql.global_scale = global_scale  # checked here, before any work
            # The value as given (the stored one is a lazy padded view, whose value quantize
            # could check only at eval).
            given = as_global_scale(global_scale, "FP4Linear.from_linear")
            packed, scales = ops.quantize(linear_layer.weight, global_scale=given)
        ql.weight = packed.view(mx.uint32)
        ql.scales = scales
        if "bias" in linear_layer:
            ql.bias = linear_layer.bias
        ql.freeze()
        return ql

    @classmethod
    def from_quantized(cls, qlinear: nn.Module, *, global_scale=None) -> "FP4Linear":
        """Wrap an MLX ``QuantizedLinear(mode="nvfp4" | "mxfp4")`` without copying bytes.

        The new layer holds the very same ``weight``/``scales``/``bias`` arrays.
        ``global_scale`` (MLX's convention, the amax) may be attached; an ``FP4Linear``
        input keeps its own unless one is given.
        """
        kind = linear_kind(qlinear)
        if kind not in ("nvfp4", "mxfp4", "fp4"):
            mode = getattr(qlinear, "mode", None)
            raise ValueError(
                "[FP4Linear.from_quantized] qlinear expected a QuantizedLinear with "
                f"mode='nvfp4' or 'mxfp4' but got {type(qlinear).__name__}"
                + (f" with mode={mode!r}" if mode is not None else "")
                + "."
            )
        w = qlinear.weight
        if w.dtype != mx.uint32 or w.ndim != 2:
            raise ValueError(
                "[FP4Linear.from_quantized] weight expected uint32 [N, K/8] but got "
                f"{dtype_name(w.dtype)} {list(w.shape)}."
            )
        output_dims, input_dims = w.shape[0], w.shape[1] * 8
        ql = cls._empty(input_dims, output_dims, qlinear.mode)
        check_scales(qlinear.scales, output_dims, input_dims, "FP4Linear.from_quantized", mode=qlinear.mode)
        ql.weight = w
        ql.scales = qlinear.scales
        if "bias" in qlinear:
            ql.bias = qlinear.bias
        if global_scale is None and kind == "fp4":
            global_scale = qlinear.get("global_scale")
        ql.global_scale = global_scale
        ql.freeze()
        return ql

    # -- attributes ----------------------------------------------------------
    @property
    def input_dims(self) -> int:
        return self.weight.shape[1] * 32 // self.bits

    @property
    def output_dims(self) -> int:
        return self.weight.shape[0]

    def _extra_repr(self):
        s = super()._extra_repr()
        if "global_scale" in self:
            s += ", global_scale=True"
        return s

    # -- math ----------------------------------------------------------------
    def __call__(self, x: mx.array) -> mx.array:
        # The op accepts any x that fills the same words and blocks (K = 57 on a K = 64 weight);
        # the layer knows its input features and refuses such x, as nn.QuantizedLinear does.
        if x.ndim == 0 or x.shape[-1] != self.input_dims:
            raise ValueError(
                f"[FP4Linear] x's last dimension expected input_dims = {self.input_dims} but got shape {x.shape}."
            )
        bias = self.get("bias")
        if bias is None:
            return ops.w4a16_matmul(
                x, self["weight"], self["scales"], global_scale=self.get("global_scale"), mode=self.mode
            )
        # nn.QuantizedLinear computes (x @ W^T) in x.dtype, then `+ bias`, which
        # promotes; keep that output dtype but add the bias in fp32, fused.
        return ops.w4a16_matmul(
            x,
            self["weight"],
            self["scales"],
            global_scale=self.get("global_scale"),
            epilogue=[("add", bias)],
            out_dtype=mx.result_type(x.dtype, bias.dtype),
            mode=self.mode,
        )

    def dequantized_weight(self, dtype=mx.float32) -> mx.array:
        """The dense ``[N, K]`` weight, global scale included."""
        return ops.dequantize(
            self["weight"],
            self["scales"],
            k=self.input_dims,
            global_scale=self.get("global_scale"),
            dtype=dtype,
            mode=self.mode,
        )

    def to_linear(self, dtype=mx.bfloat16) -> nn.Linear:
        """An ``nn.Linear`` holding the dequantized weight (and the bias)."""
        has_bias = "bias" in self
        lin = nn.Linear(self.input_dims, self.output_dims, bias=has_bias)
        lin.weight = self.dequantized_weight(dtype)
        if has_bias:
            lin.bias = self.bias
        return lin

    # -- mlx-lm LoRA hook ----------------------------------------------------
    def to_lora(self, r: int = 8, dropout: float = 0.0, scale: float = 20.0):
        """Used by ``mlx_lm.tuner.utils.linear_to_lora_layers``: a ``LoRALinear``
        whose ``fuse()`` honours the global scale and re-quantizes to FP4Linear."""
        return _fp4_lora_class().from_base(self, r=r, dropout=dropout, scale=scale)


@functools.lru_cache(maxsize=None)
def _fp4_lora_class():
    from mlx_lm.tuner.lora import LoRALinear

    class FP4LoRALinear(LoRALinear):
        """mlx-lm ``LoRALinear`` over an :class:`FP4Linear` base."""

        @staticmethod
        def from_base(linear, r: int = 8, dropout: float = 0.0, scale: float = 20.0):
            lora = FP4LoRALinear(
                input_dims=linear.input_dims,
                output_dims=linear.output_dims,
                r=r,
                dropout=dropout,
                scale=scale,
            )
            lora.linear = linear
            return lora

        def fuse(self, dequantize: bool = False):
            linear = self.linear
            if not isinstance(linear, FP4Linear):
                return super().fuse(dequantize)
            w = linear.dequantized_weight(mx.float32)
            delta = (self.scale * self.lora_b.T.astype(mx.float32)) @ self.lora_a.T.astype(
                mx.float32
            )
            dtype = self.lora_a.dtype
            fused = nn.Linear(linear.input_dims, linear.output_dims, bias="bias" in linear)
            fused.weight = (w + delta).astype(dtype)
            if "bias" in linear:
                fused.bias = linear.bias
            if dequantize:
                return fused
            return FP4Linear.from_linear(fused, mode=linear.mode, global_scale="global_scale" in linear)

    return FP4LoRALinear


def random_fp4_weight(rows: int, cols: int, fan_in: int, mode: str = MODE):
    """(weight uint32, scales): a uniform(+-1/sqrt(fan_in)) weight quantized, the way
    QuantizedLinear's constructor fills a new layer."""
    bound = math.sqrt(1.0 / fan_in)
    w = mx.random.uniform(low=-bound, high=bound, shape=(rows, cols))
    packed, scales = ops.quantize(w, mode=mode)
    return packed.view(mx.uint32), scales


def swap_modules(model: nn.Module, make) -> nn.Module:
    """Replace every sub-module ``m`` at ``path`` for which ``make(path, m)`` returns a
    module (None: keep); in place, returns ``model``."""
    new = []
    for path, m in model.named_modules():
        if path:
            r = make(path, m)
            if r is not None:
                new.append((path, r))
    if new:
        model.update_modules(tree_unflatten(new))
    return model


def is_fp4_linear(m) -> bool:
    return isinstance(m, FP4Linear)


def is_mlx_nvfp4(m) -> bool:
    """An MLX nn.QuantizedLinear(mode="nvfp4") that is not an FP4Linear."""
    return linear_kind(m) == "nvfp4"


def to_fp4_linear(m: nn.Module, global_scale, where: str, mode: str = MODE) -> nn.Module:
    """One linear as an FP4Linear: an ``nn.Linear`` is quantized in ``mode`` (``global_scale``
    True: compute one, a value: use it), an MLX nvfp4 / mxfp4 ``QuantizedLinear`` wrapped without
    copying bytes (nvfp4: ``global_scale`` a value to attach, a bool: none), an FP4Linear
    returned as is."""
    kind = linear_kind(m)
    if kind == "fp4":
        return m
    if kind == "linear":
        k = m.weight.shape[-1]
        group = MODE_DEFAULTS[mode][0]
        if k % group != 0:
            raise ValueError(
                f"[{where}] weight input dims expected a multiple of {group} ({mode}) but got {k}."
            )
        return FP4Linear.from_linear(m, mode=mode, global_scale=global_scale)
    if kind == "mxfp4":
        return FP4Linear.from_quantized(m)
    if kind == "nvfp4":
        # bytes are kept as they are: a *value* may be attached, True cannot be computed
        if isinstance(global_scale, bool) or global_scale is None:
            return FP4Linear.from_quantized(m)
        return FP4Linear.from_quantized(m, global_scale=global_scale)
    raise ValueError(
        f"[{where}] unable to convert {type(m).__name__}"
        + (f" (mode={m.mode!r})" if kind == "other" else "")
        + " to FP4Linear."
    )
