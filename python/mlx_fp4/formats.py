"""Format facts shared by every Python module: modes, group sizes, the global-scale
convention and the argument checks. Defined once here; nothing in mlx_fp4 redefines them.

MXFP4 (``mode="mxfp4"``, gpt-oss) stores the same E2M1 values with one E8M0 scale (a power
of two) per 32 weights and has no global scale. NVFP4 stores E2M1 values with one E4M3 scale
per 16 weights. A per-tensor *global scale*
extends the E4M3 range: MLX (``mx.quantize``/``mx.dequantize``/``mx.gather_qmm``) takes it as
the tensor's fp32 ``amax`` and decodes ``w = e2m1 * e4m3 * multiplier`` with
``multiplier = global_scale / 2688`` (2688 = 6 * 448, the largest E2M1 value times the
largest E4M3 scale). ModelOpt stores the multiplier (``weight_scale_2``), compressed-tensors
its inverse (``weight_global_scale``); the checkpoint readers convert both.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx
import numpy as np

# mode -> (group_size, bits), as in mlx.nn.quantize / mlx_lm.utils.quantize_model.
MODE_DEFAULTS = {"nvfp4": (16, 4), "mxfp4": (32, 4)}
MODE = "nvfp4"  # the default mode (the kernels implement every mode of MODE_DEFAULTS)
MODES = tuple(MODE_DEFAULTS)
GROUP_SIZE, BITS = MODE_DEFAULTS[MODE]  # NVFP4's; mode-aware code uses group_size_of(mode)
VALUES_PER_U32 = 32 // BITS  # packed E2M1 values in one uint32 of `weight`

E2M1_MAX = 6.0
E4M3_MAX = 448.0
E2M1_E4M3_MAX = E2M1_MAX * E4M3_MAX  # 2688: global_scale (amax) = multiplier * 2688


def dtype_name(dtype) -> str:
    """``mlx.core.float32`` -> ``float32`` (for error messages)."""
    return str(dtype).rpartition(".")[2]


def describe(a: mx.array) -> str:
    """``uint8 [4, 2]``: dtype and shape of an array, for error messages."""
    return f"{dtype_name(a.dtype)} {list(a.shape)}"


def group_size_of(mode: str) -> int:
    """Weights per scale of a mode: 16 (nvfp4) or 32 (mxfp4)."""
    return MODE_DEFAULTS[mode][0]


def check_config(group_size, bits, mode, where: str):
    """Accept what mlx.nn.quantize would pass for nvfp4 or mxfp4 (None means the mode's
    default); returns the mode's (group_size, bits)."""
    if mode not in MODE_DEFAULTS:
        raise ValueError(
            f"[{where}] mode expected 'nvfp4' or 'mxfp4' but got {mode!r} "
            "(mlx_fp4's layers implement the FP4 modes only)."
        )
    want_group, want_bits = MODE_DEFAULTS[mode]
    if group_size not in (None, want_group):
        raise ValueError(f"[{where}] group_size expected {want_group} ({mode}) but got {group_size}.")
    if bits not in (None, want_bits):
        raise ValueError(f"[{where}] bits expected {want_bits} ({mode}) but got {bits}.")
    return want_group, want_bits


def check_no_global_scale(mode: str, global_scale, where: str) -> None:
    """mxfp4 has no tensor scale (as in mx.quantize): one given with it is a ValueError."""
    if mode != MODE and global_scale is not None and global_scale is not False:
        raise ValueError(f"[{where}] global_scale is only supported for mode 'nvfp4' but got one with {mode!r}.")


def check_scales(scales: mx.array, n: int, k: int, where: str, name: str = "scales", mode: str = MODE) -> None:
    want = (n, k // group_size_of(mode))
    if scales.dtype != mx.uint8 or tuple(scales.shape) != want:
        raise ValueError(
            f"[{where}] {name} expected uint8 {list(want)} but got {describe(scales)}."
        )


GLOBAL_SCALE_SHAPE = (1,)  # one per matrix, as mlx-lm's QuantizedSwitchLinear has one per expert


# MLX's CUDA allocator keeps buffers of at most 8 bytes in a managed-memory pool that kernels
# read across the host bus: a layer's global scale there cost ~14 us more per product at decode
# on an H100 (scripts/gpu_op_overhead.py: 34.9 vs 20.6 us on 8192^2, M = 1). Layers therefore
# store a scale that small as a view of a RESIDENT_BYTES buffer (free on every backend).
SMALL_POOL_MAX_BYTES = 8
RESIDENT_BYTES = 16


def device_resident(value: mx.array) -> mx.array:
    """``value`` (same shape, dtype and values), as a view of a buffer too large for MLX's CUDA
    small-allocation pool when it would fit there; else ``value`` itself."""
    if value.nbytes > SMALL_POOL_MAX_BYTES:
        return value
    pad = RESIDENT_BYTES // value.itemsize - value.size
    flat = mx.concatenate([value.reshape(-1), mx.zeros((pad,), value.dtype)])
    return flat[: value.size].reshape(value.shape)


def as_global_scale(value, where: str) -> Optional[mx.array]:
    """None, a Python number or a one-element float array -> an fp32 array of shape (1,)
    holding MLX's global_scale (the tensor amax), or None.

    A bool, a non-float dtype or more than one element is a ValueError naming ``where``.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"[{where}] expected a float or a float32 scalar array but got a bool.")
    if isinstance(value, (int, float, np.floating, np.integer)):
        # A known value that is not finite and > 0 in fp32 (also as the multiplier, value / 2688)
        # would give NaN, sign-flipped or zero layers.
        with np.errstate(over="ignore", under="ignore"):
            v32 = np.float32(value)
            multiplier = v32 / np.float32(E2M1_E4M3_MAX)
        if not (np.isfinite(v32) and multiplier > 0):
            raise ValueError(f"[{where}] global_scale must be finite and > 0 (also / {E2M1_E4M3_MAX:g} in "
                             f"fp32) but got {float(value)!r}.")
        return mx.array([float(value)], dtype=mx.float32)
    if isinstance(value, mx.array):
        if value.size != 1:
            raise ValueError(
                f"[{where}] expected a scalar (one element) but got shape {tuple(value.shape)}."
            )
        if not mx.issubdtype(value.dtype, mx.floating):
            raise ValueError(
                f"[{where}] expected a floating dtype but got {dtype_name(value.dtype)}."
            )
        return value.reshape(GLOBAL_SCALE_SHAPE).astype(mx.float32)
    raise ValueError(
        f"[{where}] expected None, a float or an mx.array but got {type(value).__name__}."
    )


# The loaders' conversions to MLX's convention, in fp32 on the CPU stream (IEEE rounding,
# whatever the default device). The kernels decode with global_scale / 2688, which gives the
# source's multiplier back exactly in most cases and within one fp32 ulp otherwise.
def global_scale_from_multiplier(multiplier: mx.array) -> mx.array:
    """ModelOpt's ``weight_scale_2`` (w = e2m1 * e4m3 * multiplier) -> MLX's global_scale."""
    m = multiplier.astype(mx.float32).reshape(GLOBAL_SCALE_SHAPE)
    return mx.multiply(m, mx.array(E2M1_E4M3_MAX, mx.float32), stream=mx.cpu)


def global_scale_from_divisor(divisor: mx.array) -> mx.array:
    """compressed-tensors' ``weight_global_scale`` (w = e2m1 * e4m3 / divisor) -> MLX's."""
    d = divisor.astype(mx.float32).reshape(GLOBAL_SCALE_SHAPE)
    return mx.divide(mx.array(E2M1_E4M3_MAX, mx.float32), d, stream=mx.cpu)


def multiplier(global_scale: mx.array) -> mx.array:
    """MLX's global_scale -> the decode multiplier, one fp32 division by 2688 (as the ops)."""
    return mx.divide(global_scale.astype(mx.float32), mx.array(E2M1_E4M3_MAX, mx.float32), stream=mx.cpu)
