"""Tensor-parallel FP4 layers (``FP4AllToShardedLinear``, ``FP4ShardedToAllLinear``; nvfp4 or
mxfp4) and the arithmetic that splits packed FP4 arrays on block boundaries.

Rules the sharded layers keep:

* the matmul is ``mlx_fp4.w4a16_matmul`` (never ``mx.quantized_matmul``);
* all-to-sharded (column parallel, rows of W split): the bias slice is fused in the epilogue;
  sharded-to-all (row parallel, K split): each rank computes a partial product in float32
  (default; ``reduce_dtype``), ``all_sum`` adds the partials, the bias is added once after the
  sum, then one rounding to the output dtype, i.e. the arithmetic of the unsharded layer up to
  the order of the fp32 sums;
* the global scale (nvfp4 only; mxfp4 has none) is copied to every shard and applied exactly
  once, inside each rank's kernel (the sum of partials is linear in it);
* K is split only on block boundaries (16 elements in nvfp4, 32 in mxfp4: each scale covers one
  block): every split point (of every rank and every segment) must be a multiple of the block,
  else a ValueError that every rank raises the same way before any communication (no hang).
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Union

import mlx.core as mx
import mlx.nn as nn
import mlx.nn.layers.distributed as _mlx_dist

from .. import ops
from ..formats import GROUP_SIZE, MODE, MODE_DEFAULTS, check_config, group_size_of
from .linear import GlobalScaleMixin, is_fp4_linear, linear_kind, random_fp4_weight

__all__ = ["FP4AllToShardedLinear", "FP4ShardedToAllLinear", "Segments"]

Segments = Union[int, Sequence[int], Sequence[float]]
_sum_gradients = _mlx_dist.sum_gradients


def _segment_bounds(total: int, segments: Segments, where: str) -> List[int]:
    """Segment boundaries [0, ..., total] on the logical axis.

    Same meaning as MLX's ``segments``: an int (equal segments), a list of
    split indices, or a list of fractions of ``total``. Integer indices are in
    logical units (output rows, or K elements), never in packed columns.
    """
    if isinstance(segments, int):
        if segments < 1 or total % segments != 0:
            raise ValueError(
                f"[{where}] segments={segments} expected to divide the sharded "
                f"dimension ({total}) evenly."
            )
        step = total // segments
        return [i * step for i in range(segments + 1)]
    segments = list(segments)
    if not segments:
        return [0, total]
    if all(isinstance(s, int) for s in segments):
        inner = segments
    else:
        inner = [int(s * total) for s in segments]
    bounds = [0, *inner, total]
    if any(b1 < b0 for b0, b1 in zip(bounds, bounds[1:])):
        raise ValueError(
            f"[{where}] segments {segments} expected increasing split points within "
            f"[0, {total}]."
        )
    return bounds


def _rank_pieces(total: int, segments: Segments, n: int, where: str, what: str, block: int = 1):
    """For every rank, the list of [start, stop) pieces of the logical axis it owns.

    Each segment is split into ``n`` equal parts (MLX's semantics); rank r gets
    part r of every segment, concatenated. With ``block > 1`` every piece
    boundary must be a multiple of ``block``; the check covers all ranks so that
    every rank raises the same error.
    """
    bounds = _segment_bounds(total, segments, where)
    pieces = [[] for _ in range(n)]
    for s0, s1 in zip(bounds, bounds[1:]):
        length = s1 - s0
        if length % n != 0:
            raise ValueError(
                f"[{where}] cannot shard {what} of size {total} across {n} ranks: "
                f"segment [{s0}, {s1}) of size {length} is not divisible by {n}."
            )
        part = length // n
        for r in range(n):
            pieces[r].append((s0 + r * part, s0 + (r + 1) * part))
    if block > 1:
        for r in range(n):
            for a, b in pieces[r]:
                if a % block or b % block:
                    raise ValueError(
                        f"[{where}] cannot shard K={total} across {n} ranks"
                        + (f" with segments={segments!r}" if segments != 1 else "")
                        + f": rank {r} would own K elements [{a}, {b}), which do not start "
                        f"and end on {block}-element {'NVFP4' if block == GROUP_SIZE else 'MXFP4'} block boundaries (each rank's "
                        f"K slice, {part if isinstance(segments, int) else b - a} elements, "
                        f"must be a multiple of {block}; K split only on block boundaries)."
                    )
    return pieces


def _take(a: mx.array, pieces, axis: int, unit: int = 1) -> mx.array:
    """Concatenate slices [start/unit, stop/unit) of ``a`` along ``axis``."""
    axis = axis % a.ndim
    parts = []
    for start, stop in pieces:
        idx = [slice(None)] * a.ndim
        idx[axis] = slice(start // unit, stop // unit)
        parts.append(a[tuple(idx)])
    out = parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=axis)
    return mx.contiguous(out)


def _fp4_arrays(layer, where):
    """(weight, scales, bias or None, global_scale or None, N, K) of an FP4 source layer
    (nvfp4: scales per 16 K elements; mxfp4: per 32)."""
    mode = getattr(layer, "mode", MODE)
    if mode not in MODE_DEFAULTS:
        raise ValueError(f"[{where}] expected an nvfp4 or mxfp4 layer but got mode={mode!r}.")
    block = group_size_of(mode)
    w = layer["weight"]
    scales = layer["scales"]
    if w.ndim != 2 or w.dtype not in (mx.uint32, mx.uint8):
        raise ValueError(
            f"[{where}] weight expected packed uint32 [N, K/8] (or uint8 [N, K/2]) but got "
            f"{w.dtype} {tuple(w.shape)}."
        )
    per = 8 if w.dtype == mx.uint32 else 2
    n, k = w.shape[0], w.shape[1] * per
    if scales.dtype != mx.uint8 or tuple(scales.shape) != (n, k // block) or k % block:
        raise ValueError(
            f"[{where}] scales expected uint8 [{n}, {k // block}] for K={k} ({mode}) but got "
            f"{scales.dtype} {tuple(scales.shape)}."
        )
    return w, scales, layer.get("bias"), layer.get("global_scale"), n, k


def _shard_fp4_arrays(w, scales, bias, sharding, segments, group, where, block=GROUP_SIZE):
    """The local (weight, scales, bias) of this rank; ``block``: K elements per scale."""
    n_ranks, r = group.size(), group.rank()
    per = 8 if w.dtype == mx.uint32 else 2
    n, k = w.shape[0], w.shape[1] * per
    if sharding == "all-to-sharded":
        pieces = _rank_pieces(n, segments, n_ranks, where, "the output (N)")[r]
        w = _take(w, pieces, 0)
        scales = _take(scales, pieces, 0)
        if bias is not None:
            bias = _take(bias, pieces, -1)
    else:
        pieces = _rank_pieces(k, segments, n_ranks, where, "the input (K)", block=block)[r]
        w = _take(w, pieces, 1, unit=per)
        scales = _take(scales, pieces, 1, unit=block)
    return w, scales, bias


# --------------------------------------------------------------------------- #
# sharded layers
# --------------------------------------------------------------------------- #
class _FP4Sharded(GlobalScaleMixin, nn.Module):
    """Shared parts of the two sharded FP4 layers (config, global scale, freezing)."""

    _sharding = ""
    _dense = None  # MLX's float sharded class of the same kind (to_linear)

    def __init__(
        self,
        input_dims: int,
        output_dims: int,
        bias: bool = True,
        group_size: Optional[int] = None,
        bits: Optional[int] = None,
        mode: str = MODE,
        group: Optional[mx.distributed.Group] = None,
        *,
        global_scale=None,
    ):
        super().__init__()
        name = type(self).__name__
        block, self.bits = check_config(group_size, bits, mode, name)
        self.group_size, self.mode = block, mode
        self.group = group or mx.distributed.init()
        n_ranks = self.group.size()
        if self._sharding == "all-to-sharded":
            _rank_pieces(output_dims, 1, n_ranks, name, "the output (N)")
            local_out, local_in = output_dims // n_ranks, input_dims
            if input_dims % block:
                raise ValueError(
                    f"[{name}] input_dims expected a multiple of {block} ({mode}) but got {input_dims}."
                )
        else:
            _rank_pieces(input_dims, 1, n_ranks, name, "the input (K)", block=block)
            local_out, local_in = output_dims, input_dims // n_ranks
        self.weight, self.scales = random_fp4_weight(local_out, local_in, input_dims, mode)
        if bias:
            self.bias = mx.zeros((local_out if self._sharding == "all-to-sharded" else output_dims,))
        self.global_scale = global_scale
        self.freeze()

    # Parameters stay frozen (like MLX's quantized layers).
    def unfreeze(self, *args, **kwargs):
        super().unfreeze(*args, **kwargs)
        self.freeze(recurse=False)

    @property
    def _per(self) -> int:
        return 8 if self["weight"].dtype == mx.uint32 else 2

    def _extra_repr(self) -> str:
        return (
            f"input_dims={self.input_dims}, output_dims={self.output_dims}, "
            f"bias={'bias' in self}, group_size={self.group_size}, bits={self.bits}, mode={self.mode}, "
            f"ranks={self.group.size()}"
            + (", global_scale=True" if "global_scale" in self else "")
        )

    @classmethod
    def _blank(cls, group, global_scale, mode=MODE):
        sl = cls.__new__(cls)
        nn.Module.__init__(sl)
        sl.group_size, sl.bits = MODE_DEFAULTS[mode]
        sl.mode = mode
        sl.group = group
        sl.global_scale = global_scale
        return sl

    @classmethod
    def from_quantized_linear(
        cls,
        quantized_linear_layer: nn.Module,
        *,
        segments: Segments = 1,
        group: Optional[mx.distributed.Group] = None,
    ):
        """Shard an :class:`mlx_fp4.nn.FP4Linear` (or an MLX
        ``QuantizedLinear(mode="nvfp4" | "mxfp4")``) for this rank. The local arrays are
        slices of the layer's bytes (no re-quantization); the global scale is
        copied. ``segments`` as in MLX (integer split indices are in logical
        units: output rows for all-to-sharded, K elements for sharded-to-all, the latter
        on the mode's block boundaries)."""
        name = f"{cls.__name__}.from_quantized_linear"
        m = quantized_linear_layer
        if not (is_fp4_linear(m) or linear_kind(m) in MODE_DEFAULTS):
            raise ValueError(
                f"[{name}] expected an FP4Linear or a QuantizedLinear with mode='nvfp4' or "
                f"'mxfp4' but got {type(m).__name__}"
                + (f" with mode={m.mode!r}" if hasattr(m, "mode") else "")
                + "."
            )
        group = group or mx.distributed.init()
        w, scales, bias, gs, _, _ = _fp4_arrays(m, name)
        w, scales, bias = _shard_fp4_arrays(w, scales, bias, cls._sharding, segments, group, name,
                                            block=m.group_size)
        sl = cls._blank(group, gs, m.mode)
        sl.weight, sl.scales = w, scales
        if bias is not None:
            sl.bias = bias
        sl.freeze()
        return sl

    from_fp4_linear = from_quantized_linear

    def to_linear(self, dtype=mx.bfloat16) -> nn.Module:
        """MLX's float sharded layer of the same kind with this shard dequantized."""
        has_bias = "bias" in self
        lin = self._dense(self.input_dims, self.output_dims, has_bias, self.group)
        lin.weight = self.dequantized_weight(dtype)
        if has_bias:
            lin.bias = self.bias
        return lin

    def _local_matmul(self, x, epilogue, out_dtype):
        """This rank's product with its own bytes and global scale."""
        return ops.w4a16_matmul(
            x,
            self["weight"],
            self["scales"],
            global_scale=self.get("global_scale"),
            epilogue=epilogue or None,
            out_dtype=out_dtype,
            mode=self.mode,
        )

    def dequantized_weight(self, dtype=mx.float32) -> mx.array:
        """This rank's dense weight shard, global scale included."""
        k = self["weight"].shape[1] * self._per
        return ops.dequantize(
            self["weight"], self["scales"], k=k, global_scale=self.get("global_scale"), dtype=dtype,
            mode=self.mode,
        )


class FP4AllToShardedLinear(_FP4Sharded):
    """Column-parallel FP4 (nvfp4 or mxfp4) linear: every rank holds rows ``[r*N/n, (r+1)*N/n)``
    of W (and of the bias) and returns its slice of the output; the input is
    the same on every rank. Gradients w.r.t. the input are summed over the group
    (``sum_gradients``), as in ``mlx.nn.AllToShardedLinear``.

    Args: as ``mlx.nn.QuantizedAllToShardedLinear`` (``mode`` "nvfp4" or "mxfp4";
    ``group_size``/``bits`` the mode's or None), plus keyword ``global_scale`` (nvfp4).
    """

    _sharding = "all-to-sharded"
    _dense = _mlx_dist.AllToShardedLinear

    @property
    def input_dims(self) -> int:
        return self["weight"].shape[1] * self._per

    @property
    def output_dims(self) -> int:
        return self["weight"].shape[0] * self.group.size()

    def fp4_matmul(self, x: mx.array, epilogue=(), out_dtype=None) -> mx.array:
        """This layer's local product with more epilogue ops after its own bias.

        Valid because the output is not reduced: any elementwise op on the local
        slice equals that op on the full output, sliced. (Hook for fused SwiGLU.)
        """
        x = _sum_gradients(self.group)(x)
        epi = list(epilogue)
        bias = self.get("bias")
        if bias is not None:
            epi = [("add", bias)] + epi
            if out_dtype is None:
                out_dtype = mx.result_type(x.dtype, bias.dtype)
        return self._local_matmul(x, epi, out_dtype)

    def __call__(self, x: mx.array) -> mx.array:
        return self.fp4_matmul(x)


class FP4ShardedToAllLinear(_FP4Sharded):
    """Row-parallel FP4 (nvfp4 or mxfp4) linear: every rank holds K columns
    ``[r*K/n, (r+1)*K/n)`` of W (on block boundaries: 16 / 32 elements) and the matching
    slice of the input; the partial products are ``all_sum``-ed and the bias
    (not split) is added once after the sum, so every rank returns the full output.

    ``reduce_dtype`` (default ``mx.float32``): dtype of the partial products and of
    the ``all_sum``. float32 keeps the unsharded arithmetic (fp32 accumulation, bias
    in fp32, one rounding to the output dtype); ``None`` reduces in the output dtype
    (half the bytes on the wire, one extra rounding per rank, MLX's behaviour).
    """

    _sharding = "sharded-to-all"
    _dense = _mlx_dist.ShardedToAllLinear
    reduce_dtype = mx.float32

    @property
    def input_dims(self) -> int:
        return self["weight"].shape[1] * self._per * self.group.size()

    @property
    def output_dims(self) -> int:
        return self["weight"].shape[0]

    def __call__(self, x: mx.array) -> mx.array:
        bias = self.get("bias")
        out_dtype = x.dtype if bias is None else mx.result_type(x.dtype, bias.dtype)
        if self.group.size() == 1:  # nothing to reduce: the fused unsharded form
            return self._local_matmul(x, [] if bias is None else [("add", bias)], out_dtype)
        part_dtype = out_dtype if self.reduce_dtype is None else self.reduce_dtype
        # the global scale is applied once per rank: sum_r gs*P_r = gs*sum_r P_r
        y = self._local_matmul(x, [], part_dtype)
        y = mx.distributed.all_sum(y, group=self.group)
        if bias is not None:
            y = y + bias.astype(y.dtype)  # once, after the sum
        return y.astype(out_dtype)


_CLASSES = {
    "all-to-sharded": FP4AllToShardedLinear,
    "sharded-to-all": FP4ShardedToAllLinear,
}
