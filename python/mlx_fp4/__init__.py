"""mlx_fp4: FP4 (NVFP4) weight-only W4A16 matmul for MLX.

    import mlx_fp4 as mx_fp4
    packed, scales = mx_fp4.quantize(w)
    y = mx_fp4.w4a16_matmul(x, packed, scales, epilogue=[("add", bias), "silu"])
"""

import mlx.core as _mx  # loads libmlx before our extension needs it

from ._version_check import check_mlx_version as _check_mlx_version

_check_mlx_version()

from ._ext import (  # noqa: E402
    EPILOGUE_OPS,
    build_info,
    cpu_info,
    dequantize,
    gather_w4a16_matmul,
    gather_w4a16_matmul_reference_ops,
    quantize,
    w4a16_matmul,
    w4a16_matmul_reference_ops,
)

__all__ = [
    "EPILOGUE_OPS",
    "build_info",
    "cpu_info",
    "dequantize",
    "gather_w4a16_matmul",
    "gather_w4a16_matmul_reference_ops",
    "quantize",
    "w4a16_matmul",
    "w4a16_matmul_reference_ops",
]
from . import distributed, nn  # noqa: E402
from .checkpoints import NVFP4Weights, load_nvfp4, save_nvfp4  # noqa: E402

__all__ += ["distributed", "nn", "load_nvfp4", "save_nvfp4", "NVFP4Weights"]
__version__ = "0.1.0"
