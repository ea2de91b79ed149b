"""The core ops, as the package exports and calls them.

``w4a16_matmul`` and ``gather_w4a16_matmul`` are the extension's, except inside
``mx_fp4.export_mode()``, where they lower to MLX-native ops that ``mx.export_function`` can
write (:mod:`mlx_fp4.export`). Layers call ``ops.w4a16_matmul`` (looked up at call time), so
this is the one place where a call is routed.
"""

import functools

import mlx.core as mx

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
from .tuning import before_gather as _tune_gather, before_matmul as _tune_before, metal_tuning


# The measured route exists only on Apple GPUs; elsewhere the hook is skipped before any argument
# handling (a decode step makes hundreds of calls: ~1 us each adds up on CUDA).
_TUNING_POSSIBLE = mx.metal.is_available()


# Same signatures as the extension's functions (functools.wraps exposes them); inside export_mode()
# the calls go to the MLX-native lowering instead.
@functools.wraps(_ext.w4a16_matmul)
def w4a16_matmul(*args, **kwargs):
    if _EXPORTING.get():
        return lowered_w4a16_matmul(*args, **kwargs)
    if not _TUNING_POSSIBLE:
        return _ext.w4a16_matmul(*args, **kwargs)
    x, w = (list(args[:2]) + [kwargs.get("x"), kwargs.get("w")][len(args[:2]):])[:2]
    if x is not None and w is not None:  # Apple GPUs: the measured route (tuning.py)
        _tune_before(x, w, kwargs.get("mode", "nvfp4"), kwargs.get("stream"))
    return _ext.w4a16_matmul(*args, **kwargs)


@functools.wraps(_ext.gather_w4a16_matmul)
def gather_w4a16_matmul(*args, **kwargs):
    if _EXPORTING.get():
        return lowered_gather_w4a16_matmul(*args, **kwargs)
    if not _TUNING_POSSIBLE:
        return _ext.gather_w4a16_matmul(*args, **kwargs)
    x, w = (list(args[:2]) + [kwargs.get("x"), kwargs.get("w")][len(args[:2]):])[:2]
    if x is not None and w is not None:  # Apple GPUs: the measured route (tuning.py)
        _tune_gather(x, w, kwargs.get("lhs_indices"), kwargs.get("rhs_indices"),
                     kwargs.get("sorted_indices", False), kwargs.get("mode", "nvfp4"), kwargs.get("stream"))
    return _ext.gather_w4a16_matmul(*args, **kwargs)


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
    "metal_tuning",
    "quantize",
    "w4a16_matmul",
    "w4a16_matmul_reference_ops",
]
