"""mlx_fp4: FP4 (NVFP4) weight-only W4A16 matmul for MLX.

    import mlx_fp4 as mx_fp4
    packed, scales = mx_fp4.quantize(w)
    y = mx_fp4.w4a16_matmul(x, packed, scales, epilogue=[("add", bias), "silu"])
"""

from ._version_check import mlx_import_hint as _mlx_import_hint

try:
    import mlx.core as _mx  # loads libmlx before our extension needs it
except ImportError as _e:  # Linux: the mlx wheel alone has no backend library (libmlx.so)
    raise ImportError(_mlx_import_hint(_e)) from _e

from ._version_check import check_mlx_version as _check_mlx_version  # noqa: E402

_check_mlx_version()

from . import ops as _ops  # noqa: E402
from .ops import *  # noqa: E402,F401,F403  (the core ops: w4a16_matmul, quantize, ...)

__all__ = list(_ops.__all__)
from . import checkpoints, convert, distributed, formats, layers, nn  # noqa: E402
from .checkpoints import NVFP4Weights, load, load_model, load_nvfp4, save_nvfp4  # noqa: E402
from ._version import __version__  # noqa: E402,F401

__all__ += ["checkpoints", "convert", "distributed", "formats", "layers", "nn"]
__all__ += ["load", "load_model", "load_nvfp4", "save_nvfp4", "NVFP4Weights"]
