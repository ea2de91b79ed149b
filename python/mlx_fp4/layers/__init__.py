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
from .switch import (
    FP4SwitchGLU,
    FP4SwitchLinear,
    fuse_switch_glu,
    is_switch_linear,
    switch_kind,
    to_fp4_switch_linear,
)
from .swiglu import FP4SwiGLU, fuse_swiglu, swiglu

__all__ = [
    "FP4AllToShardedLinear",
    "FP4Linear",
    "FP4ShardedToAllLinear",
    "FP4SwiGLU",
    "FP4SwitchGLU",
    "FP4SwitchLinear",
    "fuse_swiglu",
    "fuse_switch_glu",
    "is_fp4_linear",
    "is_mlx_nvfp4",
    "is_switch_linear",
    "linear_kind",
    "swap_modules",
    "swiglu",
    "switch_kind",
    "to_fp4_linear",
    "to_fp4_switch_linear",
]
