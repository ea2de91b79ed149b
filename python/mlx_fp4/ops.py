"""The core ops, as the rest of the package calls them.

Layers call ``ops.w4a16_matmul`` (looked up at call time) rather than the extension
directly, so that there is one place where a call can be routed elsewhere.
"""

from ._ext import (  # noqa: F401
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
