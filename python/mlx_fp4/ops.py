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


def _x_and_w(args, kwargs):
    """The call's x and w, given by position or keyword (None when missing: the op then raises)."""
    return (list(args[:2]) + [kwargs.get("x"), kwargs.get("w")][len(args[:2]):])[:2]


def _routed(ext_fn, lowered_fn, tune):
    """``ext_fn`` with its signature (functools.wraps exposes it); inside export_mode() the call
    goes to the MLX-native ``lowered_fn``; on Apple GPUs ``tune(x, w, kwargs)`` runs first (the
    measured route, tuning.py)."""
    @functools.wraps(ext_fn)
    def op(*args, **kwargs):
        if _EXPORTING.get():
            return lowered_fn(*args, **kwargs)
        if _TUNING_POSSIBLE:
            x, w = _x_and_w(args, kwargs)
            if x is not None and w is not None:
                tune(x, w, kwargs)
        return ext_fn(*args, **kwargs)
    return op


w4a16_matmul = _routed(
    _ext.w4a16_matmul, lowered_w4a16_matmul,
    lambda x, w, kw: _tune_before(x, w, kw.get("mode", "nvfp4"), kw.get("stream")))
gather_w4a16_matmul = _routed(
    _ext.gather_w4a16_matmul, lowered_gather_w4a16_matmul,
    lambda x, w, kw: _tune_gather(x, w, kw.get("lhs_indices"), kw.get("rhs_indices"), kw.get("sorted_indices", False),
                                  kw.get("mode", "nvfp4"), kw.get("stream")))


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
