"""Read NVFP4 checkpoints as they exist in the wild; save them in MLX layout.

:func:`load_nvfp4` turns a checkpoint into the MLX nvfp4 layout consumed by
:class:`mlx_fp4.nn.FP4Linear`. For every quantized linear with prefix ``p``:

* ``p.weight``       uint32 ``[N, K/8]`` (the checkpoint's packed bytes, viewed)
* ``p.scales``       uint8  ``[N, K/16]`` (raw E4M3 bits, unchanged)
* ``p.global_scale`` float32 ``[1]`` in MLX's convention (the amax, as ``mx.dequantize``
  takes it): ``w = e2m1 * e4m3 * global_scale / 2688`` (absent when the checkpoint has none)
* ``p.bias``         when present.

Every other tensor passes through unchanged. Dialects, recognised per layer by
their tensor names (and checked against the config files when present):

================== ======================= ==================== ===========================
dialect            packed weight           block scales         per-tensor scale
================== ======================= ==================== ===========================
NVIDIA ModelOpt    ``weight`` u8 [N,K/2]   ``weight_scale`` F8  ``weight_scale_2`` multiplier: * 2688
compressed-tensors ``weight_packed`` u8    ``weight_scale`` F8  ``weight_global_scale`` divisor: 2688 / d
MLX nvfp4          ``weight`` u32 [N,K/8]  ``scales`` u8        ``global_scale`` (the amax): as is
================== ======================= ==================== ===========================

Activation scales of W4A4 exports (``input_scale``, ``input_global_scale``) are
dropped: this is a weight-only (W4A16) path.

The conversions are one fp32 operation each; the kernels' multiplier ``global_scale / 2688``
is then the source's own multiplier exactly for most values (87% of random ModelOpt scales)
and within one fp32 ulp otherwise.

:func:`save_nvfp4` writes the MLX layout back to safetensors (``global_scale`` as is), so
``load_nvfp4(save_nvfp4(w)) == w`` bit for bit.
"""

from ..formats import E2M1_E4M3_MAX
from .io import NVFP4Weights, load_nvfp4, save_nvfp4
from .models import load, load_model, load_weights

__all__ = ["load_nvfp4", "save_nvfp4", "NVFP4Weights", "E2M1_E4M3_MAX", "load", "load_model", "load_weights"]
