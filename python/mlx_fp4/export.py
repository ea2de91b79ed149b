"""Export: ``mx.export_function`` of code that uses mx_fp4.

MLX serializes a graph through a closed table of its own primitives, so our W4A16Matmul node
(and the ``mx.contiguous`` copies it takes its inputs through) cannot be written to a
``.mlxfn`` file. Inside ``with mx_fp4.export_mode():`` the ops lower to MLX-native ops of the
same math instead, which ``mx.export_function`` writes and ``mx.import_function`` (Python,
C++, Swift) runs without mx_fp4 installed:

* ``w4a16_matmul``: ``mx.quantized_matmul(x in fp32, w, scales, mode="nvfp4")`` (MLX's own
  nvfp4 kernel, fp32 accumulation), ``* global_scale / 2688`` in fp32, the epilogue as MLX ops in
  fp32, one cast to the output dtype. K not a multiple of 16 (or a uint8 ``w`` whose rows are not
  whole uint32 words) lowers to ``w4a16_matmul_reference_ops`` (decode + fp32 matmul) instead.
* ``gather_w4a16_matmul``: ``mx.gather_qmm(x in fp32, ..., mode="nvfp4")`` without a global
  scale (MLX's takes one on the GPU only), then each output's expert multiplier, the epilogue and
  the cast as above.

MLX gives extensions no way to see that a trace is for export (its flag is internal to
libmlx), so the switch is explicit. Outside it nothing changes.
"""

from __future__ import annotations

import contextlib
import contextvars
import math

import mlx.core as mx

from . import _ext
from .formats import E2M1_E4M3_MAX, MODE_DEFAULTS, VALUES_PER_U32

__all__ = ["export_function", "export_mode", "exporting", "lowered_w4a16_matmul", "lowered_gather_w4a16_matmul"]

_EXPORTING = contextvars.ContextVar("mlx_fp4_exporting", default=False)


@contextlib.contextmanager
def export_mode(enabled: bool = True):
    """Within the block, mx_fp4's ops build MLX-native graphs that ``mx.export_function``
    can write (see the module doc); nests, and restores the previous mode on exit."""
    token = _EXPORTING.set(bool(enabled))
    try:
        yield
    finally:
        _EXPORTING.reset(token)


def export_function(file, fun, *args, **kwargs):
    """``mx.export_function(file, fun, *args, **kwargs)`` with mx_fp4's ops lowered (inside
    :func:`export_mode`). Plain ``mx.export_function`` of code that calls them fails inside MLX
    with ``Unable to serialize primitive Contiguous`` (or ``W4A16Matmul``): MLX writes only its
    own primitives, and gives extensions no hook to say more."""
    with export_mode():
        return mx.export_function(file, fun, *args, **kwargs)


def exporting() -> bool:
    """True inside :func:`export_mode`."""
    return _EXPORTING.get()


def _f32(t):
    return t.astype(mx.float32) if isinstance(t, mx.array) else t


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_UNARY = {
    "relu": lambda y: mx.maximum(y, 0.0),
    "silu": lambda y: y * mx.sigmoid(y),
    "gelu": lambda y: 0.5 * y * (1.0 + mx.erf(y / math.sqrt(2.0))),
    "gelu_approx": lambda y: 0.5 * y * (1.0 + mx.tanh(_SQRT_2_OVER_PI * (y + 0.044715 * y * y * y))),
    "sigmoid": mx.sigmoid,
    "tanh": mx.tanh,
}
_BINARY = {"add": mx.add, "mul": mx.multiply, "scale": mx.multiply}


def _epilogue(y: mx.array, epilogue) -> mx.array:
    """The epilogue chain on the fp32 accumulator, as MLX ops (the contract of EPILOGUE_OPS)."""
    for op in epilogue or ():
        name, *args = (op,) if isinstance(op, str) else op
        if name in _UNARY and not args:
            y = _UNARY[name](y)
        elif name in _BINARY and len(args) == 1:
            y = _BINARY[name](y, _f32(args[0]))
        elif name == "clamp" and len(args) == 2:
            y = mx.clip(y, args[0], args[1])
        else:
            raise ValueError(f"[mlx_fp4.export] epilogue op {op!r} is not one of {sorted(_ext.EPILOGUE_OPS)}.")
    return y


def _as_words(w: mx.array, k: int, group_size: int):
    """w as MLX's uint32 [N, K/8] when mx.quantized_matmul can take it, else None."""
    if k % group_size:
        return None
    if w.dtype == mx.uint32:
        return w
    if w.dtype == mx.uint8 and w.shape[-1] * 2 == k:  # K % 16 == 0: whole words per row
        return w.view(mx.uint32)
    return None


def lowered_w4a16_matmul(x, w, scales, *, global_scale=None, epilogue=None, out_dtype=None, group_size=None,
                         bits=None, mode="nvfp4", stream=None):
    """``w4a16_matmul`` as MLX-native ops (arguments checked by the extension first)."""
    # Validation (and the errors users see) stay the extension's: build and drop its node.
    _ext.w4a16_matmul(x, w, scales, global_scale=global_scale, epilogue=epilogue, out_dtype=out_dtype,
                      group_size=group_size, bits=bits, mode=mode, stream=stream)
    k = x.shape[-1]
    group_size = MODE_DEFAULTS[mode][0]
    words = _as_words(w, k, group_size)
    if words is None:
        return _ext.w4a16_matmul_reference_ops(x, w, scales, global_scale=global_scale, epilogue=epilogue,
                                               out_dtype=out_dtype, mode=mode, stream=stream)
    y = mx.quantized_matmul(x.astype(mx.float32), words, scales, transpose=True, group_size=group_size,
                            bits=32 // VALUES_PER_U32, mode=mode, stream=stream)
    if global_scale is not None:
        gs = global_scale if isinstance(global_scale, mx.array) else mx.array(global_scale, mx.float32)
        y = y * (gs.reshape(()).astype(mx.float32) / mx.array(E2M1_E4M3_MAX, mx.float32))
    return _epilogue(y, epilogue).astype(out_dtype or x.dtype)


def lowered_gather_w4a16_matmul(x, w, scales, *, lhs_indices=None, rhs_indices=None, global_scale=None,
                                epilogue=None, out_dtype=None, sorted_indices=False, group_size=None, bits=None,
                                mode="nvfp4", stream=None):
    """``gather_w4a16_matmul`` as MLX-native ops: ``mx.gather_qmm`` in fp32 without a global
    scale (MLX takes one on the GPU only), then each pair's multiplier, the epilogue, one cast."""
    _ext.gather_w4a16_matmul(x, w, scales, lhs_indices=lhs_indices, rhs_indices=rhs_indices,
                             global_scale=global_scale, epilogue=epilogue, out_dtype=out_dtype,
                             sorted_indices=sorted_indices, group_size=group_size, bits=bits, mode=mode,
                             stream=stream)
    k = x.shape[-1]
    group_size = MODE_DEFAULTS[mode][0]
    words = _as_words(w, k, group_size)
    if words is None:
        return _ext.gather_w4a16_matmul_reference_ops(x, w, scales, lhs_indices=lhs_indices, rhs_indices=rhs_indices,
                                                      global_scale=global_scale, epilogue=epilogue,
                                                      out_dtype=out_dtype, mode=mode, stream=stream)
    y = mx.gather_qmm(x.astype(mx.float32), words, scales, lhs_indices=lhs_indices, rhs_indices=rhs_indices,
                      transpose=True, group_size=group_size, bits=32 // VALUES_PER_U32, mode=mode,
                      sorted_indices=sorted_indices, stream=stream)
    if global_scale is not None:
        gs = global_scale if isinstance(global_scale, mx.array) else mx.array(global_scale, mx.float32)
        m = gs.astype(mx.float32) / mx.array(E2M1_E4M3_MAX, mx.float32)
        if m.ndim > 0:  # one per expert: the multiplier of each output's expert
            m = m.reshape(-1)
            m = mx.take(m, rhs_indices) if rhs_indices is not None else m.reshape(w.shape[:-2])
            m = mx.expand_dims(m, (-2, -1))
        y = y * m
    return _epilogue(y, epilogue).astype(out_dtype or x.dtype)
