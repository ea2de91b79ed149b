"""
mlx_fp4 C++ extension: NVFP4 (E2M1 + E4M3 block scales) W4A16 ops for MLX.
"""

import mlx.core


def w4a16_matmul(x: mlx.core.array, w: mlx.core.array, scales: mlx.core.array, *, global_scale: float | mlx.core.array | None = None, epilogue: list | None = None, out_dtype: mlx.core.Dtype | None = None, group_size: int | None = None, bits: int | None = None, mode: str = 'nvfp4', stream: mlx.core.Stream | mlx.core.Device | None = None) -> mlx.core.array:
    """
    W4A16 matmul: ``epilogue((global_scale / 2688) * (x @ dequantize(w, scales).T))``.

    Args:
        x: activations ``[..., K]``, float16, bfloat16 or float32.
        w: packed FP4 E2M1 weights, uint8 ``[N, ceil(K/2)]`` (low nibble = even k) or MLX's
           uint32 ``[N, ceil(K/8)]`` (as returned by ``mx.quantize(..., mode="nvfp4")``).
        scales: uint8 ``[N, ceil(K/16)]``, E4M3 bits, one per 16 weights along K (``mode="nvfp4"``),
           or ``[N, ceil(K/32)]`` E8M0 bits, one per 32 (``mode="mxfp4"``; 0xFF is NaN).
        global_scale: optional per-tensor scale in MLX's convention (as ``mx.quantize`` /
           ``mx.dequantize`` take it): the fp32 tensor amax, a Python float or a float32 scalar
           array. The weights decode as ``e2m1 * e4m3 * (global_scale / 2688)``; the multiplier
           is applied once in fp32 to the accumulator. nvfp4 only.
        epilogue: optional list of ops applied in order in fp32 before the final cast:
           ``("add", t)``, ``("mul", t)``, ``("scale", c)``, ``"relu"``, ``"silu"``, ``"gelu"``,
           ``"gelu_approx"``, ``"sigmoid"``, ``"tanh"``, ``("clamp", lo, hi)``; ``t`` broadcasts to
           the output (``[N]``, ``[..., 1]``, ``[..., N]``) or is a Python float.
        out_dtype: float16, bfloat16 or float32; default ``x.dtype``.
        group_size, bits: as in ``mx.quantized_matmul``: accepted when they match the mode
           (16 / 32 and 4), otherwise a ValueError.
        mode: ``"nvfp4"`` (default) or ``"mxfp4"`` (gpt-oss), as in ``mx.quantized_matmul``.
        stream: stream or device.

    Returns:
        ``[..., N]`` array in ``out_dtype``. Differentiable with respect to ``x`` and the
        epilogue operands.
    """

def w4a16_matmul_reference_ops(x: mlx.core.array, w: mlx.core.array, scales: mlx.core.array, *, global_scale: float | mlx.core.array | None = None, epilogue: list | None = None, out_dtype: mlx.core.Dtype | None = None, mode: str = 'nvfp4', stream: mlx.core.Stream | mlx.core.Device | None = None) -> mlx.core.array:
    """
    The same math as w4a16_matmul with plain MLX ops (dequantize, fp32 matmul, epilogue).
    """

def gather_w4a16_matmul(x: mlx.core.array, w: mlx.core.array, scales: mlx.core.array, *, lhs_indices: mlx.core.array | None = None, rhs_indices: mlx.core.array | None = None, global_scale: float | mlx.core.array | None = None, epilogue: list | None = None, out_dtype: mlx.core.Dtype | None = None, sorted_indices: bool = False, group_size: int | None = None, bits: int | None = None, mode: str = 'nvfp4', stream: mlx.core.Stream | mlx.core.Device | None = None) -> mlx.core.array:
    """
    Gathered W4A16 matmul for mixture-of-experts layers, with the semantics of
    ``mx.gather_qmm(x, w, scales, lhs_indices=, rhs_indices=, transpose=True, mode="nvfp4",
    global_scale=, sorted_indices=)``:
    ``out[b] = epilogue(global_scale[e] / 2688 * (x[lhs[b]] @ dequantize(w[e], scales[e]).T))``, ``e = rhs[b]``.

    Args:
        x: activations ``[..., M, K]``, float16, bfloat16 or float32.
        w: stacked experts, uint8 ``[..., N, ceil(K/2)]`` or MLX's uint32 ``[..., N, ceil(K/8)]``.
        scales: uint8 ``[..., N, ceil(K/16)]`` (E4M3 bits), the batch dims of ``w``.
        lhs_indices, rhs_indices: integer arrays that broadcast together to ``B``; flat indices into
           the batch dims of ``x`` and of ``w`` (default: every matrix in order). Out-of-range
           indices raise a ValueError when they are computed at the call; lazy ones (known only
           when the op runs) give NaN rows for their pairs on every backend, read through nothing.
        global_scale: MLX's nvfp4 tensor scale (the amax; the multiplier is ``global_scale / 2688``),
           a float32 scalar or one value per expert (shape ``w.shape[:-2]``).
        epilogue: the chain of ``w4a16_matmul``; operands broadcast to the output.
        out_dtype: float16, bfloat16 or float32; default ``x.dtype``.
        sorted_indices: a hint that ``rhs_indices`` is sorted (as in ``mx.gather_qmm``).
        group_size, bits, mode: as in ``mx.gather_qmm``: ``mode="mxfp4"`` takes E8M0 scales
           ``[..., N, ceil(K/32)]`` and no global scale.
        stream: stream or device.

    Returns:
        ``B + [M, N]`` in ``out_dtype``. Differentiable with respect to ``x`` and the epilogue
        operands; vmap and compile work.
    """

def gather_w4a16_matmul_reference_ops(x: mlx.core.array, w: mlx.core.array, scales: mlx.core.array, *, lhs_indices: mlx.core.array | None = None, rhs_indices: mlx.core.array | None = None, global_scale: float | mlx.core.array | None = None, epilogue: list | None = None, out_dtype: mlx.core.Dtype | None = None, mode: str = 'nvfp4', stream: mlx.core.Stream | mlx.core.Device | None = None) -> mlx.core.array:
    """
    The same math as gather_w4a16_matmul with plain MLX ops (decode, fp32 gather_mm, epilogue).
    """

def quantize(w: mlx.core.array, *, global_scale: bool | float | mlx.core.array | None = False, group_size: int | None = None, bits: int | None = None, mode: str = 'nvfp4', stream: mlx.core.Stream | mlx.core.Device | None = None) -> tuple:
    """
    Quantize ``w [N, K]`` to NVFP4.

    Returns:
        ``(packed, scales)``: uint8 ``[N, ceil(K/2)]`` (low nibble = even k, padding nibbles 0)
        and uint8 ``[N, ceil(K/16)]`` E4M3 bits: the bytes of ``mx.quantize(w, mode="nvfp4")`` on
        MLX's GPUs (fp32: block scale E4M3(amax / 6 * enc), values E2M1(w * (enc / scale)), both
        round-to-nearest-even, scales saturating at 448; enc = 2688 / global_scale, 1 without).

        ``global_scale=True`` also returns ``global_scale``, the float32 scalar ``amax(|w|)`` in
        MLX's convention, and quantizes against it: ``w ~= dequantize(packed, scales,
        global_scale=global_scale)``, i.e. block scales relative to ``global_scale / 2688``.
        A given ``global_scale`` (float or float32 scalar array, e.g. the amax of the whole tensor
        ``w`` is a shard of) is used as is and only ``(packed, scales)`` is returned, as from
        ``mx.quantize(w, mode="nvfp4", global_scale=...)``.

    With ``mode="mxfp4"`` (group_size 32, no global scale): the bytes of ``mx.quantize(w,
    mode="mxfp4")`` on MLX's Metal GPUs (as uint8): E8M0 scales 2^ceil(log2(amax / 6)) (the quotient
    in fp32; byte 0 for an all-zero block), values w / scale rounded to nearest even E2M1, -0 kept.
    """

def dequantize(packed: mlx.core.array, scales: mlx.core.array, *, k: int | None = None, global_scale: float | mlx.core.array | None = None, dtype: mlx.core.Dtype = mlx.core.bfloat16, group_size: int | None = None, bits: int | None = None, mode: str = 'nvfp4', stream: mlx.core.Stream | mlx.core.Device | None = None) -> mlx.core.array:
    """
    Decode NVFP4 weights to ``[N, k]`` (``k`` defaults to ``2 * packed bytes per row``).

    ``global_scale`` as in ``mx.dequantize``: the tensor amax; the multiplier ``global_scale / 2688``
    is applied in fp32 to the exact ``e2m1 * e4m3`` value before the one cast. Exact in bfloat16,
    float16 and float32 without a global scale. E4M3 codes 0x7F and 0xFF are NaN. ``mode="mxfp4"``: E8M0
    scales per 32 weights (2^(byte - 127); 0xFF is NaN, where MLX decodes +Inf), no global scale.
    """

EPILOGUE_OPS: dict = ...

def build_info() -> dict: ...

def cpu_info() -> dict: ...
