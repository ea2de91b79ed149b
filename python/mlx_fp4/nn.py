"""Drop-in NVFP4 layers and model conversion for mlx_fp4.

``FP4Linear`` is an ``mlx.nn.QuantizedLinear`` with ``mode="nvfp4"``: the same
parameter names, dtypes and shapes (``weight`` uint32 ``[N, K/8]``, ``scales``
uint8 ``[N, K/16]``, optional ``bias`` ``[N]``) and the same ``group_size``,
``bits`` and ``mode`` attributes, so mlx-lm, LoRA and ``shard_linear`` see the
layer they expect. Its forward pass is ``mlx_fp4.w4a16_matmul`` with the bias
fused into the epilogue and an optional per-tensor global scale (a float32
multiplier, ModelOpt's ``weight_scale_2`` convention).

The global scale is deliberately *not* a parameter: it is absent from
``parameters()``, so ``shard_linear``/``fully_shard`` (which split every
parameter) and ``Module.load_weights(strict=True)`` do not see it. Use
:func:`load_weights` (or set ``layer.global_scale``) to load it and
``mlx_fp4.checkpoints.save_nvfp4`` to save it.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
from pathlib import Path
from typing import Callable, Dict, Optional, Union

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

import mlx_fp4 as _core  # attributes are looked up at call time (no import cycle)

__all__ = [
    "FP4Linear",
    "FP4SwiGLU",
    "swiglu",
    "quantize",
    "dequantize",
    "fuse_swiglu",
    "load_weights",
    "load_model",
    "global_scales",
]

GROUP_SIZE = 16
BITS = 4
MODE = "nvfp4"

Predicate = Callable[[str, nn.Module], Union[bool, dict]]


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #
def _check_config(group_size, bits, mode, where):
    if mode != MODE:
        raise ValueError(
            f"[{where}] mode expected 'nvfp4' but got {mode!r} "
            "(FP4Linear only implements NVFP4)."
        )
    if group_size not in (None, GROUP_SIZE):
        raise ValueError(
            f"[{where}] group_size expected 16 (nvfp4) but got {group_size}."
        )
    if bits not in (None, BITS):
        raise ValueError(f"[{where}] bits expected 4 (nvfp4) but got {bits}.")


def _as_global_scale(value, where="FP4Linear.global_scale"):
    """None, a python number or a one-element float array -> fp32 0-d array."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"[{where}] expected a float or a float32 scalar array but got a bool.")
    if isinstance(value, (int, float)):
        return mx.array(float(value), dtype=mx.float32)
    if isinstance(value, mx.array):
        if value.size != 1:
            raise ValueError(
                f"[{where}] expected a scalar (one element) but got shape {tuple(value.shape)}."
            )
        if not mx.issubdtype(value.dtype, mx.floating):
            raise ValueError(
                f"[{where}] expected a floating dtype but got {_dt(value.dtype)}."
            )
        return value.reshape(()).astype(mx.float32)
    raise ValueError(
        f"[{where}] expected None, a float or an mx.array but got {type(value).__name__}."
    )


def _dt(dtype) -> str:
    return str(dtype).rpartition(".")[2]


def _linear_kind(m) -> Optional[str]:
    """'linear' for nn.Linear, 'nvfp4' for an MLX nvfp4 QuantizedLinear,
    'fp4' for FP4Linear, 'other' for other QuantizedLinear modes, else None."""
    if isinstance(m, FP4Linear):
        return "fp4"
    if isinstance(m, nn.QuantizedLinear):
        if getattr(m, "mode", None) == MODE and m.get("biases") is None:
            return "nvfp4"
        return "other"
    if isinstance(m, nn.Linear):
        return "linear"
    return None


# --------------------------------------------------------------------------- #
# FP4Linear
# --------------------------------------------------------------------------- #
class FP4Linear(nn.QuantizedLinear):
    """NVFP4 weight-only linear layer backed by ``mlx_fp4.w4a16_matmul``.

    Args:
        input_dims (int): K, a multiple of 16.
        output_dims (int): N.
        bias (bool): add a bias (fused into the matmul epilogue). Default ``True``.
        group_size, bits, mode: accepted for ``QuantizedLinear`` compatibility;
            must be ``16``, ``4`` and ``"nvfp4"`` (or ``None``).
        global_scale: optional per-tensor multiplier (float or fp32 scalar);
            the dequantized weight is ``e2m1 * e4m3 * global_scale``.

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
        scale = math.sqrt(1 / input_dims)
        w = mx.random.uniform(low=-scale, high=scale, shape=(output_dims, input_dims))
        packed, scales = _core.quantize(w)
        self.weight = packed.view(mx.uint32)
        self.scales = scales
        if bias:
            self.bias = mx.zeros((output_dims,))
        self.global_scale = global_scale
        self.freeze()

    # -- construction helpers ------------------------------------------------
    def _init_config(self, group_size, bits, mode, input_dims, output_dims):
        _check_config(group_size, bits, mode, "FP4Linear")
        if input_dims <= 0 or output_dims <= 0:
            raise ValueError(
                f"[FP4Linear] input_dims and output_dims expected > 0 but got "
                f"{input_dims} and {output_dims}."
            )
        if input_dims % GROUP_SIZE != 0:
            raise ValueError(
                f"[FP4Linear] input_dims expected a multiple of 16 (nvfp4 block) "
                f"but got {input_dims}."
            )
        self.group_size = GROUP_SIZE
        self.bits = BITS
        self.mode = MODE
        # QuantizedLinear keeps `biases` (affine zero points); nvfp4 has none.
        self.biases = None
        self._global_scale = None

    @classmethod
    def _empty(cls, input_dims, output_dims):
        """An instance with config set but no weight (filled by the caller)."""
        ql = cls.__new__(cls)
        nn.Module.__init__(ql)
        ql._init_config(None, None, MODE, input_dims, output_dims)
        return ql

    @classmethod
    def from_linear(
        cls,
        linear_layer: nn.Module,
        group_size: Optional[int] = None,
        bits: Optional[int] = None,
        mode: str = MODE,
        *,
        global_scale: bool = False,
    ) -> "FP4Linear":
        """Quantize an ``nn.Linear`` (round-to-nearest-even E2M1, E4M3 scales).

        ``global_scale=True`` also computes a per-tensor multiplier
        ``amax(|W|)/2688`` (ModelOpt convention), which keeps small-magnitude
        tensors away from the E4M3 underflow range.
        """
        _check_config(group_size, bits, mode, "FP4Linear.from_linear")
        output_dims, input_dims = linear_layer.weight.shape
        ql = cls._empty(input_dims, output_dims)
        if global_scale:
            packed, scales, gs = _core.quantize(linear_layer.weight, global_scale=True)
            ql.global_scale = gs
        else:
            packed, scales = _core.quantize(linear_layer.weight)
        ql.weight = packed.view(mx.uint32)
        ql.scales = scales
        if "bias" in linear_layer:
            ql.bias = linear_layer.bias
        ql.freeze()
        return ql

    @classmethod
    def from_quantized(cls, qlinear: nn.Module, *, global_scale=None) -> "FP4Linear":
        """Wrap an MLX ``QuantizedLinear(mode="nvfp4")`` without copying bytes.

        The new layer holds the very same ``weight``/``scales``/``bias`` arrays.
        ``global_scale`` (a multiplier) may be attached; an ``FP4Linear`` input
        keeps its own unless one is given.
        """
        kind = _linear_kind(qlinear)
        if kind not in ("nvfp4", "fp4"):
            mode = getattr(qlinear, "mode", None)
            raise ValueError(
                "[FP4Linear.from_quantized] qlinear expected a QuantizedLinear with "
                f"mode='nvfp4' but got {type(qlinear).__name__}"
                + (f" with mode={mode!r}" if mode is not None else "")
                + "."
            )
        w = qlinear.weight
        if w.dtype != mx.uint32 or w.ndim != 2:
            raise ValueError(
                "[FP4Linear.from_quantized] weight expected uint32 [N, K/8] but got "
                f"{_dt(w.dtype)} {list(w.shape)}."
            )
        output_dims, input_dims = w.shape[0], w.shape[1] * 8
        ql = cls._empty(input_dims, output_dims)
        _check_scales(qlinear.scales, output_dims, input_dims, "FP4Linear.from_quantized")
        ql.weight = w
        ql.scales = qlinear.scales
        if "bias" in qlinear:
            ql.bias = qlinear.bias
        if global_scale is None and kind == "fp4":
            global_scale = qlinear.global_scale
        ql.global_scale = global_scale
        ql.freeze()
        return ql

    # -- attributes ----------------------------------------------------------
    @property
    def global_scale(self) -> Optional[mx.array]:
        """Per-tensor float32 multiplier (0-d array) or ``None``. Not a parameter."""
        return self.__dict__.get("_global_scale")

    def __setattr__(self, key, val):
        if key == "global_scale":
            object.__setattr__(self, "_global_scale", _as_global_scale(val))
            return
        super().__setattr__(key, val)

    @property
    def input_dims(self) -> int:
        return self.weight.shape[1] * 32 // self.bits

    @property
    def output_dims(self) -> int:
        return self.weight.shape[0]

    def _extra_repr(self):
        s = super()._extra_repr()
        if self.global_scale is not None:
            s += ", global_scale=True"
        return s

    # -- math ----------------------------------------------------------------
    def __call__(self, x: mx.array) -> mx.array:
        bias = self.get("bias")
        if bias is None:
            return _core.w4a16_matmul(
                x, self["weight"], self["scales"], global_scale=self.global_scale
            )
        # nn.QuantizedLinear computes (x @ W^T) in x.dtype, then `+ bias`, which
        # promotes; keep that output dtype but add the bias in fp32, fused.
        return _core.w4a16_matmul(
            x,
            self["weight"],
            self["scales"],
            global_scale=self.global_scale,
            epilogue=[("add", bias)],
            out_dtype=mx.result_type(x.dtype, bias.dtype),
        )

    def dequantized_weight(self, dtype=mx.float32) -> mx.array:
        """The dense ``[N, K]`` weight, global scale included."""
        return _core.dequantize(
            self["weight"],
            self["scales"],
            k=self.input_dims,
            global_scale=self.global_scale,
            dtype=dtype,
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


def _check_scales(scales, n, k, where, name="scales"):
    want = (n, k // GROUP_SIZE)
    if scales.dtype != mx.uint8 or tuple(scales.shape) != want:
        raise ValueError(
            f"[{where}] {name} expected uint8 {list(want)} but got "
            f"{_dt(scales.dtype)} {list(scales.shape)}."
        )


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
            return FP4Linear.from_linear(fused, global_scale=linear.global_scale is not None)

    return FP4LoRALinear


# --------------------------------------------------------------------------- #
# SwiGLU
# --------------------------------------------------------------------------- #
def swiglu(x: mx.array, gate_proj: FP4Linear, up_proj: FP4Linear) -> mx.array:
    """``silu(x W_g^T + b_g) * (x W_u^T + b_u)`` in two kernel launches.

    The up projection runs first; the gate projection then applies its bias,
    ``silu`` and the product with the up output on its fp32 accumulator (one
    rounding to the output dtype instead of three). Falls back to the unfused
    form when either projection is not an :class:`FP4Linear` (e.g. LoRA-wrapped).
    """
    if not (isinstance(gate_proj, FP4Linear) and isinstance(up_proj, FP4Linear)):
        g = gate_proj(x)
        return nn.silu(g) * up_proj(x)
    u = up_proj(x)
    epilogue = []
    out_dtype = u.dtype
    if "bias" in gate_proj:
        epilogue.append(("add", gate_proj.bias))
        out_dtype = mx.result_type(out_dtype, gate_proj.bias.dtype)
    epilogue += ["silu", ("mul", u)]
    return _core.w4a16_matmul(
        x,
        gate_proj["weight"],
        gate_proj["scales"],
        global_scale=gate_proj.global_scale,
        epilogue=epilogue,
        out_dtype=out_dtype,
    )


class FP4SwiGLU(nn.Module):
    """A SwiGLU MLP ``down(silu(gate(x)) * up(x))`` with the fused :func:`swiglu`.

    Child names are ``gate_proj``, ``up_proj`` and ``down_proj`` (the mlx-lm /
    Hugging Face names), so checkpoints load unchanged.
    """

    def __init__(self, dims: int, hidden_dims: int, bias: bool = False):
        super().__init__()
        self.gate_proj = FP4Linear(dims, hidden_dims, bias=bias)
        self.up_proj = FP4Linear(dims, hidden_dims, bias=bias)
        self.down_proj = FP4Linear(hidden_dims, dims, bias=bias)

    @classmethod
    def from_mlp(cls, mlp: nn.Module, *, global_scale: bool = False) -> "FP4SwiGLU":
        """Reuse ``mlp.gate_proj/up_proj/down_proj``; float or MLX-nvfp4 ones are
        converted (FP4Linear ones are shared, not copied)."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        for name in ("gate_proj", "up_proj", "down_proj"):
            new[name] = _convert(getattr(mlp, name), {"global_scale": global_scale}, name)
        return new

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(swiglu(x, self.gate_proj, self.up_proj))


_SWIGLU_FORMS = {
    "self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))",
    "self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))",
    "self.down_proj(silu(self.gate_proj(x)) * self.up_proj(x))",
}


@functools.lru_cache(maxsize=None)
def _is_swiglu_call(call) -> bool:
    """True when ``call`` is ``def __call__(self, x): return <one of _SWIGLU_FORMS>``
    (a docstring allowed, nothing else)."""
    import ast
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(call)))
    except (OSError, TypeError, SyntaxError):
        return False
    fn = tree.body[0] if tree.body else None
    if not isinstance(fn, ast.FunctionDef):
        return False
    a = fn.args
    if [x.arg for x in a.args] != ["self", "x"] or a.vararg or a.kwarg or a.kwonlyargs:
        return False
    body = [
        st
        for st in fn.body
        if not (isinstance(st, ast.Expr) and isinstance(getattr(st, "value", None), ast.Constant))
    ]
    if len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None:
        return False
    return ast.unparse(body[0].value) in _SWIGLU_FORMS


def _is_swiglu_mlp(m: nn.Module) -> bool:
    """True for modules whose forward is exactly ``down(silu(gate(x)) * up(x))``."""
    if isinstance(m, FP4SwiGLU):
        return False
    if not all(isinstance(m.get(n), nn.Module) for n in ("gate_proj", "up_proj", "down_proj")):
        return False
    return _is_swiglu_call(type(m).__call__)


def fuse_swiglu(model: nn.Module, *, class_predicate: Optional[Callable[[str, nn.Module], bool]] = None) -> nn.Module:
    """Replace SwiGLU MLP blocks by :class:`FP4SwiGLU` (in place; returns model).

    By default a block qualifies when it has ``gate_proj``/``up_proj``/``down_proj``
    children, the first two FP4Linear, and its ``__call__(self, x)`` is the single
    statement ``return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))``
    (the mlx-lm Llama/Qwen/Mistral MLP) or the ``nn.silu(...) * ...`` spelling.
    Anything else (gated GELU in Gemma, extra statements) is left alone.
    Parameter names do not change.
    """

    def default(path, m):
        return _is_swiglu_mlp(m) and all(
            isinstance(m.get(n), FP4Linear) for n in ("gate_proj", "up_proj")
        )

    pred = class_predicate or default
    replaced = [
        (path, FP4SwiGLU.from_mlp(m))
        for path, m in model.named_modules()
        if path and pred(path, m)
    ]
    if replaced:
        model.update_modules(tree_unflatten(replaced))
    return model


# --------------------------------------------------------------------------- #
# model conversion
# --------------------------------------------------------------------------- #
def _default_predicate(path: str, m: nn.Module) -> bool:
    kind = _linear_kind(m)
    if kind == "linear":
        return m.weight.shape[-1] % GROUP_SIZE == 0
    return kind == "nvfp4"


def _convert(m: nn.Module, params: dict, path: str) -> nn.Module:
    kind = _linear_kind(m)
    params = dict(params)
    group_size = params.pop("group_size", None)
    bits = params.pop("bits", None)
    mode = params.pop("mode", MODE)
    if params.pop("quantize_input", False):
        raise ValueError(
            f"[mlx_fp4.nn.quantize] {path}: quantize_input=True (W4A4) is not supported; "
            "FP4Linear is weight-only (W4A16)."
        )
    _check_config(group_size, bits, mode, f"mlx_fp4.nn.quantize: {path}")
    global_scale = params.pop("global_scale", False)
    if params:
        raise ValueError(
            f"[mlx_fp4.nn.quantize] unknown options for {path}: {sorted(params)}."
        )
    if kind == "fp4":
        return m
    if kind == "linear":
        k = m.weight.shape[-1]
        if k % GROUP_SIZE != 0:
            raise ValueError(
                f"[mlx_fp4.nn.quantize] {path}.weight input dims expected a multiple "
                f"of 16 but got {k}."
            )
        return FP4Linear.from_linear(m, global_scale=bool(global_scale))
    if kind == "nvfp4":
        # bytes are kept as they are: a *value* may be attached, True cannot be computed
        if isinstance(global_scale, bool) or global_scale is None:
            return FP4Linear.from_quantized(m)
        return FP4Linear.from_quantized(m, global_scale=global_scale)
    raise ValueError(
        f"[mlx_fp4.nn.quantize] unable to convert {path} of type {type(m).__name__}"
        + (f" (mode={m.mode!r})" if kind == "other" else "")
        + " to FP4Linear."
    )



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
    newly quantized layer a per-tensor scale. A tqdm bar counts the layers.

    Returns ``model``.
    """
    pred = class_predicate or _default_predicate
    leaves = tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module)
    todo = []
    for path, m in leaves:
        if _linear_kind(m) is None:
            continue
        sel = pred(path, m)
        if sel is False or sel is None:
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
            mx.eval(new.parameters(), *([new.global_scale] if new.global_scale is not None else []))
            converted.append((path, new))
    if converted:
        model.update_modules(tree_unflatten(converted))
    return model


def dequantize(model: nn.Module, dtype=mx.bfloat16) -> nn.Module:
    """Replace every :class:`FP4Linear` by an ``nn.Linear`` with the dequantized
    weight (global scale applied) in place; returns model. Unlike
    ``mlx_lm.utils.dequantize_model`` it honours the global scale."""
    new = [
        (path, m.to_linear(dtype))
        for path, m in model.named_modules()
        if path and isinstance(m, FP4Linear)
    ]
    if new:
        model.update_modules(tree_unflatten(new))
    return model


# --------------------------------------------------------------------------- #
# weights with global scales
# --------------------------------------------------------------------------- #
def global_scales(model: nn.Module) -> Dict[str, mx.array]:
    """``{"<path>.global_scale": fp32 scalar}`` for every FP4Linear that has one."""
    return {
        f"{path}.global_scale": m.global_scale
        for path, m in model.named_modules()
        if isinstance(m, FP4Linear) and m.global_scale is not None
    }


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
    takes. A plain dict is read as a raw checkpoint (an MLX ``global_scale`` in it is
    MLX's ``amax`` convention); the :class:`~mlx_fp4.checkpoints.NVFP4Weights` that
    ``load_nvfp4`` returns is used as is (its global scales are multipliers). Then:

    1. ``model.sanitize(weights)`` is applied when the model has one (mlx-lm
       models: drops rotary buffers, tied ``lm_head``...), unless ``sanitize=False``;
    2. every ``nn.Linear``/``nn.QuantizedLinear`` whose ``<path>.scales`` is in
       the weights becomes an :class:`FP4Linear` (no random-weight quantization);
    3. ``<path>.global_scale`` entries are attached to those layers (they are not
       parameters), the rest goes through ``model.load_weights(strict=strict)``.
    """
    from .checkpoints import load_nvfp4

    if isinstance(weights, (list, tuple)):
        weights = dict(weights)
    if not isinstance(weights, dict) or not _is_loaded_layout(weights):
        weights = load_nvfp4(weights)
    weights = dict(weights)
    if sanitize and hasattr(model, "sanitize"):
        weights = model.sanitize(weights)

    # 2. swap layers
    swaps = []
    for path, m in model.named_modules():
        if not path or f"{path}.scales" not in weights:
            continue
        if _linear_kind(m) not in ("linear", "nvfp4"):
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

    # 3. global scales, then parameters
    modules = dict(model.named_modules())
    params = []
    for key, value in weights.items():
        if key.endswith(".global_scale"):
            prefix = key[: -len(".global_scale")]
            target = modules.get(prefix)
            if isinstance(target, FP4Linear):
                target.global_scale = _as_global_scale(value, key)
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
    """True for the dict load_nvfp4 returns (global scales are multipliers)."""
    from .checkpoints import NVFP4Weights

    return isinstance(weights, NVFP4Weights)

# Tensor-parallel helpers under the names of mlx.nn.layers.distributed (see mlx_fp4.distributed).
from .distributed import shard_inplace, shard_linear  # noqa: E402,F401
