"""The core ops, as the package exports and calls them.

``w4a16_matmul`` and ``gather_w4a16_matmul`` are the extension's, except inside
``mx_fp4.export_mode()``, where they lower to MLX-native ops that ``mx.export_function`` can
write (:mod:`mlx_fp4.export`). Layers call ``ops.w4a16_matmul`` (looked up at call time), so
this is the one place where a call is routed.
"""

import functools

from . import _ext
from ._ext import (  # noqa: F401
    EPILOGUE_OPS,
    build_info,
    cpu_info,
    dequantize,
    gather_w4a16_matmul_reference_ops,
    quantize,
    w4a16_matmul_reference_ops,
)
from .export import _EXPORTING, export_function, export_mode, exporting, lowered_gather_w4a16_matmul, lowered_w4a16_matmul


# Same signatures as the extension's functions (functools.wraps exposes them); inside export_mode()
# the calls go to the MLX-native lowering instead.
@functools.wraps(_ext.w4a16_matmul)
def w4a16_matmul(*args, **kwargs):
    fn = lowered_w4a16_matmul if _EXPORTING.get() else _ext.w4a16_matmul
    return fn(*args, **kwargs)


@functools.wraps(_ext.gather_w4a16_matmul)
def gather_w4a16_matmul(*args, **kwargs):
    fn = lowered_gather_w4a16_matmul if _EXPORTING.get() else _ext.gather_w4a16_matmul
    return fn(*args, **kwargs)


__all__ = [
    "EPILOGUE_OPS",
    "build_info",
    "cpu_info",
    "dequantize",
    "export_function",
    "export_mode",
    "exporting",
    "gather_w4a16_matmul",
    "gather_w4a16_matmul_reference_ops",
    "quantize",
    "w4a16_matmul",
    "w4a16_matmul_reference_ops",
]
