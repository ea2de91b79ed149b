"""Fused SwiGLU on FP4 layers: ``swiglu``, the ``FP4SwiGLU`` block and ``fuse_swiglu``."""

from __future__ import annotations

from typing import Callable, Iterable, Optional

import mlx.core as mx
import mlx.nn as nn

from .. import ops
from .linear import FP4Linear, swap_modules, to_fp4_linear

__all__ = ["FP4SwiGLU", "SWIGLU_MLPS", "fuse_swiglu", "swiglu"]


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
        global_scale=gate_proj.get("global_scale"),
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


# mlx-lm MLP classes whose forward is exactly
# ``self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))`` (tests/test_nn.py reads
# their source to check this list against the installed mlx-lm). Named, not imported.
SWIGLU_MLPS = frozenset(
    f"mlx_lm.models.{name}"
    for name in (
        "cohere.MLP", "cohere2.MLP", "deepseek.DeepseekMLP", "ernie4_5.MLP", "exaone4.MLP",
        "granite.MLP", "helium.HeliumMLP", "internlm3.MLP", "llama.MLP", "mimo.MLP",
        "minicpm.MLP", "ministral3.MLP", "olmo2.MLP", "olmo3.Olmo3MLP", "qwen2.MLP",
        "qwen2_moe.MLP", "qwen3.MLP", "qwen3_moe.MLP", "seed_oss.MLP", "stablelm.MLP",
    )
)

_PROJ = ("gate_proj", "up_proj", "down_proj")


def _type_name(m) -> str:
    return f"{type(m).__module__}.{type(m).__qualname__}"


def fuse_swiglu(
    model: nn.Module,
    mlp_types: Optional[Iterable[type]] = None,
    *,
    class_predicate: Optional[Callable[[str, nn.Module], bool]] = None,
) -> nn.Module:
    """Replace SwiGLU MLP blocks by :class:`FP4SwiGLU` (in place; returns model).

    Opt-in by type: a block is fused when its class is one of ``mlp_types`` (default: the
    mlx-lm MLPs in :data:`SWIGLU_MLPS`, e.g. Llama, Qwen 2/3, Mistral's ministral3, Cohere,
    OLMo 2) and its ``gate_proj``/``up_proj`` are FP4Linear. Pass your own classes when
    their ``__call__(x)`` is ``down_proj(silu(gate_proj(x)) * up_proj(x))`` and nothing
    else. ``class_predicate(path, module) -> bool`` replaces the whole test. The fusion
    changes no parameter names; other blocks (gated GELU, extra steps) are never guessed at.
    """
    types = tuple(mlp_types) if mlp_types is not None else None

    def default(path, m):
        if isinstance(m, FP4SwiGLU):
            return False
        known = isinstance(m, types) if types is not None else _type_name(m) in SWIGLU_MLPS
        return known and all(isinstance(m.get(n), FP4Linear) for n in _PROJ[:2]) and isinstance(
            m.get("down_proj"), nn.Module
        )

    pred = class_predicate or default
    return swap_modules(model, lambda path, m: FP4SwiGLU.from_mlp(m) if pred(path, m) else None)
