"""Drop-in NVFP4 layers and model conversion, under one name as ``mlx.nn`` is.

``mlx_fp4.nn`` only re-exports; the code lives in :mod:`mlx_fp4.layers` (the layers),
:mod:`mlx_fp4.convert` (quantize / dequantize a model), :mod:`mlx_fp4.checkpoints` (loading)
and :mod:`mlx_fp4.distributed` (tensor parallelism).
"""

from .checkpoints.models import load, load_model, load_weights
from .convert import dequantize, global_scales, quantize
from .distributed import shard_inplace, shard_linear
from .formats import BITS, GROUP_SIZE, MODE
from .layers import FP4Linear, FP4SwiGLU, FP4SwitchGLU, FP4SwitchLinear, fuse_swiglu, fuse_switch_glu, swiglu

__all__ = [
    "FP4Linear",
    "FP4SwiGLU",
    "FP4SwitchGLU",
    "FP4SwitchLinear",
    "fuse_switch_glu",
    "swiglu",
    "quantize",
    "dequantize",
    "fuse_swiglu",
    "load_weights",
    "load_model",
    "load",
    "global_scales",
    "shard_linear",
    "shard_inplace",
    "GROUP_SIZE",
    "BITS",
    "MODE",
]
