"""mlx_fp4's layers. Each module adds one family; this file only re-exports them."""

from .linear import (
    FP4Linear,
    is_fp4_linear,
    is_mlx_nvfp4,
    linear_kind,
    swap_modules,
    to_fp4_linear,
)
from .sharded import FP4AllToShardedLinear, FP4ShardedToAllLinear
from .swiglu import FP4SwiGLU, fuse_swiglu, swiglu

__all__ = [
    "FP4AllToShardedLinear",
    "FP4Linear",
    "FP4ShardedToAllLinear",
    "FP4SwiGLU",
    "fuse_swiglu",
    "is_fp4_linear",
    "is_mlx_nvfp4",
    "linear_kind",
    "swap_modules",
    "swiglu",
    "to_fp4_linear",
]
