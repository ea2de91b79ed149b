"""Fused SwiGLU on FP4 layers: ``swiglu``, the ``FP4SwiGLU`` block and ``fuse_swiglu``."""

from __future__ import annotations

import functools
import inspect
from typing import Callable, Optional

import mlx.core as mx
import mlx.nn as nn

from .. import ops
from .linear import FP4Linear, swap_modules, to_fp4_linear

__all__ = ["FP4SwiGLU", "fuse_swiglu", "swiglu"]


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
    return ops.w4a16_matmul(
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
            new[name] = to_fp4_linear(getattr(mlp, name), global_scale, f"FP4SwiGLU.from_mlp: {name}")
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
    return swap_modules(model, lambda path, m: FP4SwiGLU.from_mlp(m) if pred(path, m) else None)
