"""Tensor parallelism for NVFP4 layers on MLX's own distributed stack.

Everything here runs on ``mx.distributed`` (ring, mpi, nccl, jaccl; started with
``mlx.launch``); there is no communication layer of our own.

Why this module exists: ``mlx.nn.layers.distributed.shard_linear`` sends any
module that is not an ``nn.Linear`` to MLX's ``QuantizedAllToShardedLinear`` /
``QuantizedShardedToAllLinear``. For an :class:`mlx_fp4.nn.FP4Linear` that
*works* (it is an ``nn.QuantizedLinear(mode="nvfp4")``) but the result calls
``mx.quantized_matmul``: our kernel is gone and the per-tensor global scale,
which is not a parameter, is silently dropped (wrong outputs by a factor
``1/global_scale``). The functions below keep FP4 layers FP4:

* :func:`shard_linear` / :func:`shard_inplace`: MLX's signatures. FP4 layers
  become :class:`FP4AllToShardedLinear` / :class:`FP4ShardedToAllLinear`
  (or are split in place block-aware); every other module is passed to MLX's
  own function unchanged.
* :func:`shard_model`: ``model.shard(group)`` of an mlx-lm model (Llama, Qwen,
  Mistral, ... anything whose ``shard`` calls ``shard_linear``/``shard_inplace``)
  with the two functions above swapped in for the duration of the call.
  :func:`fp4_sharding` is the same swap as a context manager (e.g. around
  ``mlx_lm.utils.sharded_load``).
* :func:`quantize`: the other order, a model sharded first (MLX's float or
  nvfp4 sharded layers) converted to FP4 after, bit-identical to
  converting first and sharding after.

Rules the sharded layers keep:

* the matmul is ``mlx_fp4.w4a16_matmul`` (never ``mx.quantized_matmul``);
* all-to-sharded (column parallel, rows of W split): the bias slice is fused in
  the epilogue; sharded-to-all (row parallel, K split): each rank computes a
  partial product in float32 (default; ``reduce_dtype``), ``all_sum`` adds the
  partials, the bias is added once after the sum, then one rounding to the
  output dtype, i.e. the same arithmetic as the unsharded layer up to the order
  of the fp32 sums;
* the global scale (a per-tensor multiplier, not a parameter) is copied to every
  shard and applied exactly once, inside each rank's kernel (the sum of partials
  is linear in it);
* K is split only on 16-element NVFP4 block boundaries: every split point (of
  every rank and every segment) must be a multiple of 16, else a ValueError that
  every rank raises the same way before any communication (no hang).
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
from typing import Callable, List, Optional, Sequence, Tuple, Union

import mlx.core as mx
import mlx.nn as nn
import mlx.nn.layers.distributed as _mlx_dist
from mlx.utils import tree_flatten, tree_unflatten

import mlx_fp4 as _core  # attributes are looked up at call time

__all__ = [
    "FP4AllToShardedLinear",
    "FP4ShardedToAllLinear",
    "shard_linear",
    "shard_inplace",
    "shard_model",
    "fp4_sharding",
    "quantize",
    "global_scales",
]

BLOCK = 16  # NVFP4 block (scale group) size
MODE = "nvfp4"

Segments = Union[int, Sequence[int], Sequence[float]]

# MLX's own functions, captured before anything can be patched.
_MLX_SHARD_LINEAR = _mlx_dist.shard_linear
_MLX_SHARD_INPLACE = _mlx_dist.shard_inplace
_sum_gradients = _mlx_dist.sum_gradients


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #
def _fp4_linear_cls():
    from .nn import FP4Linear

    return FP4Linear


def _is_fp4_linear(m) -> bool:
    return isinstance(m, _fp4_linear_cls())


def _is_mlx_nvfp4(m) -> bool:
    """An MLX nn.QuantizedLinear(mode="nvfp4") that is not an FP4Linear."""
    return (
        isinstance(m, nn.QuantizedLinear)
        and not _is_fp4_linear(m)
        and getattr(m, "mode", None) == MODE
        and m.get("biases") is None
    )


def _check_sharding(sharding, where):
    if sharding not in ("all-to-sharded", "sharded-to-all"):
        raise ValueError(
            f"[{where}] sharding expected 'all-to-sharded' or 'sharded-to-all' "
            f"but got {sharding!r}."
        )


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
                        f"and end on {block}-element NVFP4 block boundaries (each rank's "
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
    """(weight, scales, bias or None, global_scale or None, N, K) of an FP4 source layer."""
    w = layer["weight"]
    scales = layer["scales"]
    if w.ndim != 2 or w.dtype not in (mx.uint32, mx.uint8):
        raise ValueError(
            f"[{where}] weight expected packed uint32 [N, K/8] (or uint8 [N, K/2]) but got "
            f"{w.dtype} {tuple(w.shape)}."
        )
    per = 8 if w.dtype == mx.uint32 else 2
    n, k = w.shape[0], w.shape[1] * per
    if scales.dtype != mx.uint8 or tuple(scales.shape) != (n, k // BLOCK) or k % BLOCK:
        raise ValueError(
            f"[{where}] scales expected uint8 [{n}, {k // BLOCK}] for K={k} but got "
            f"{scales.dtype} {tuple(scales.shape)}."
        )
    gs = getattr(layer, "global_scale", None)
    return w, scales, layer.get("bias"), gs, n, k


def _shard_fp4_arrays(w, scales, bias, sharding, segments, group, where):
    """The local (weight, scales, bias) of this rank."""
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
        pieces = _rank_pieces(k, segments, n_ranks, where, "the input (K)", block=BLOCK)[r]
        w = _take(w, pieces, 1, unit=per)
        scales = _take(scales, pieces, 1, unit=BLOCK)
    return w, scales, bias


# --------------------------------------------------------------------------- #
# sharded layers
# --------------------------------------------------------------------------- #
class _FP4Sharded(nn.Module):
    """Shared parts of the two sharded FP4 layers (config, global scale, freezing)."""

    _sharding = ""

    def __init__(
        self,
        input_dims: int,
        output_dims: int,
        bias: bool = True,
        group_size: int = BLOCK,
        bits: int = 4,
        mode: str = MODE,
        group: Optional[mx.distributed.Group] = None,
        *,
        global_scale=None,
    ):
        super().__init__()
        name = type(self).__name__
        if mode != MODE or group_size not in (None, BLOCK) or bits not in (None, 4):
            raise ValueError(
                f"[{name}] expected group_size=16, bits=4, mode='nvfp4' but got "
                f"group_size={group_size}, bits={bits}, mode={mode!r}."
            )
        self.group_size = BLOCK
        self.bits = 4
        self.mode = MODE
        self.group = group or mx.distributed.init()
        n_ranks = self.group.size()
        if self._sharding == "all-to-sharded":
            _rank_pieces(output_dims, 1, n_ranks, name, "the output (N)")
            local_out, local_in = output_dims // n_ranks, input_dims
            if input_dims % BLOCK:
                raise ValueError(f"[{name}] input_dims expected a multiple of 16 but got {input_dims}.")
        else:
            _rank_pieces(input_dims, 1, n_ranks, name, "the input (K)", block=BLOCK)
            local_out, local_in = output_dims, input_dims // n_ranks
        scale = math.sqrt(1.0 / input_dims)
        wf = mx.random.uniform(low=-scale, high=scale, shape=(local_out, local_in))
        packed, scales = _core.quantize(wf)
        self.weight = packed.view(mx.uint32)
        self.scales = scales
        if bias:
            self.bias = mx.zeros((local_out if self._sharding == "all-to-sharded" else output_dims,))
        self.global_scale = global_scale
        self.freeze()

    # Parameters stay frozen (like MLX's quantized layers).
    def unfreeze(self, *args, **kwargs):
        super().unfreeze(*args, **kwargs)
        self.freeze(recurse=False)

    # The global scale is a plain attribute, never a parameter: MLX's _shard,
    # fully_shard and load_weights(strict=True) would otherwise split or reject it.
    @property
    def global_scale(self) -> Optional[mx.array]:
        """Per-tensor float32 multiplier (0-d array) or ``None``. Not a parameter."""
        return self.__dict__.get("_global_scale")

    def __setattr__(self, key, val):
        if key == "global_scale":
            from .nn import _as_global_scale  # nn imports this module at its end

            object.__setattr__(self, "_global_scale", _as_global_scale(val, f"{type(self).__name__}.global_scale"))
            return
        super().__setattr__(key, val)

    @property
    def _per(self) -> int:
        return 8 if self["weight"].dtype == mx.uint32 else 2

    def _extra_repr(self) -> str:
        return (
            f"input_dims={self.input_dims}, output_dims={self.output_dims}, "
            f"bias={'bias' in self}, group_size=16, bits=4, mode=nvfp4, "
            f"ranks={self.group.size()}"
            + (", global_scale=True" if self.global_scale is not None else "")
        )

    @classmethod
    def _blank(cls, group, global_scale):
        sl = cls.__new__(cls)
        nn.Module.__init__(sl)
        sl.group_size, sl.bits, sl.mode = BLOCK, 4, MODE
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
        ``QuantizedLinear(mode="nvfp4")``) for this rank. The local arrays are
        slices of the layer's bytes (no re-quantization); the global scale is
        copied. ``segments`` as in MLX (integer split indices are in logical
        units: output rows for all-to-sharded, K elements for sharded-to-all)."""
        name = f"{cls.__name__}.from_quantized_linear"
        m = quantized_linear_layer
        if not (_is_fp4_linear(m) or _is_mlx_nvfp4(m)):
            raise ValueError(
                f"[{name}] expected an FP4Linear or a QuantizedLinear with mode='nvfp4' "
                f"but got {type(m).__name__}"
                + (f" with mode={m.mode!r}" if hasattr(m, "mode") else "")
                + "."
            )
        group = group or mx.distributed.init()
        w, scales, bias, gs, _, _ = _fp4_arrays(m, name)
        w, scales, bias = _shard_fp4_arrays(w, scales, bias, cls._sharding, segments, group, name)
        sl = cls._blank(group, gs)
        sl.weight, sl.scales = w, scales
        if bias is not None:
            sl.bias = bias
        sl.freeze()
        return sl

    from_fp4_linear = from_quantized_linear

    def dequantized_weight(self, dtype=mx.float32) -> mx.array:
        """This rank's dense weight shard, global scale included."""
        k = self["weight"].shape[1] * self._per
        return _core.dequantize(
            self["weight"], self["scales"], k=k, global_scale=self.global_scale, dtype=dtype
        )


class FP4AllToShardedLinear(_FP4Sharded):
    """Column-parallel NVFP4 linear: every rank holds rows ``[r*N/n, (r+1)*N/n)``
    of W (and of the bias) and returns its slice of the output; the input is
    the same on every rank. Gradients w.r.t. the input are summed over the group
    (``sum_gradients``), as in ``mlx.nn.AllToShardedLinear``.

    Args: as ``mlx.nn.QuantizedAllToShardedLinear`` (``group_size``/``bits``/
    ``mode`` must be 16/4/"nvfp4"), plus keyword ``global_scale``.
    """

    _sharding = "all-to-sharded"

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
        ops = list(epilogue)
        bias = self.get("bias")
        if bias is not None:
            ops = [("add", bias)] + ops
            if out_dtype is None:
                out_dtype = mx.result_type(x.dtype, bias.dtype)
        return _core.w4a16_matmul(
            x,
            self["weight"],
            self["scales"],
            global_scale=self.global_scale,
            epilogue=ops or None,
            out_dtype=out_dtype,
        )

    def __call__(self, x: mx.array) -> mx.array:
        return self.fp4_matmul(x)

    def to_linear(self, dtype=mx.bfloat16) -> nn.Module:
        """An ``mlx.nn.AllToShardedLinear`` with this shard dequantized."""
        has_bias = "bias" in self
        lin = _mlx_dist.AllToShardedLinear(self.input_dims, self.output_dims, has_bias, self.group)
        lin.weight = self.dequantized_weight(dtype)
        if has_bias:
            lin.bias = self.bias
        return lin


class FP4ShardedToAllLinear(_FP4Sharded):
    """Row-parallel NVFP4 linear: every rank holds K columns
    ``[r*K/n, (r+1)*K/n)`` of W (on 16-element block boundaries) and the matching
    slice of the input; the partial products are ``all_sum``-ed and the bias
    (not split) is added once after the sum, so every rank returns the full output.

    ``reduce_dtype`` (default ``mx.float32``): dtype of the partial products and of
    the ``all_sum``. float32 keeps the unsharded arithmetic (fp32 accumulation, bias
    in fp32, one rounding to the output dtype); ``None`` reduces in the output dtype
    (half the bytes on the wire, one extra rounding per rank, MLX's behaviour).
    """

    _sharding = "sharded-to-all"
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
            return _core.w4a16_matmul(
                x,
                self["weight"],
                self["scales"],
                global_scale=self.global_scale,
                epilogue=None if bias is None else [("add", bias)],
                out_dtype=out_dtype,
            )
        part_dtype = out_dtype if self.reduce_dtype is None else self.reduce_dtype
        y = _core.w4a16_matmul(
            x,
            self["weight"],
            self["scales"],
            global_scale=self.global_scale,  # applied once: sum_r gs*P_r = gs*sum_r P_r
            out_dtype=part_dtype,
        )
        y = mx.distributed.all_sum(y, group=self.group)
        if bias is not None:
            y = y + bias.astype(y.dtype)  # once, after the sum
        return y.astype(out_dtype)

    def to_linear(self, dtype=mx.bfloat16) -> nn.Module:
        """An ``mlx.nn.ShardedToAllLinear`` with this shard dequantized."""
        has_bias = "bias" in self
        lin = _mlx_dist.ShardedToAllLinear(self.input_dims, self.output_dims, has_bias, self.group)
        lin.weight = self.dequantized_weight(dtype)
        if has_bias:
            lin.bias = self.bias
        return lin


_CLASSES = {
    "all-to-sharded": FP4AllToShardedLinear,
    "sharded-to-all": FP4ShardedToAllLinear,
}


# --------------------------------------------------------------------------- #
# MLX-compatible entry points
# --------------------------------------------------------------------------- #
def shard_linear(
    module: nn.Module,
    sharding: str,
    *,
    segments: Segments = 1,
    group: Optional[mx.distributed.Group] = None,
):
    """``mlx.nn.layers.distributed.shard_linear`` that keeps FP4 layers on our kernel.

    An :class:`mlx_fp4.nn.FP4Linear` becomes an :class:`FP4AllToShardedLinear` or
    :class:`FP4ShardedToAllLinear` (same bytes, sliced; global scale kept).
    Any other module goes to MLX's ``shard_linear`` unchanged. Raises ValueError
    (on every rank) when K cannot be split on 16-element block boundaries.
    """
    _check_sharding(sharding, "mlx_fp4.distributed.shard_linear")
    if isinstance(module, _FP4Sharded):
        raise ValueError(
            f"[mlx_fp4.distributed.shard_linear] module is already sharded "
            f"({type(module).__name__})."
        )
    if _is_fp4_linear(module):
        return _CLASSES[sharding].from_quantized_linear(module, segments=segments, group=group)
    return _MLX_SHARD_LINEAR(module, sharding, segments=segments, group=group)


def _mlx_predicate(sharding, segments):
    if sharding == "all-to-sharded":
        return lambda path, w: (-1, segments) if path.endswith("bias") else (max(w.ndim - 2, 0), segments)
    return lambda path, w: None if path.endswith("bias") else (-1, segments)


def shard_inplace(
    module: nn.Module,
    sharding: Union[str, Callable],
    *,
    segments: Segments = 1,
    group: Optional[mx.distributed.Group] = None,
):
    """``mlx.nn.layers.distributed.shard_inplace`` that splits FP4 layers block-aware.

    Parameters of :class:`mlx_fp4.nn.FP4Linear` layers inside ``module`` (or
    ``module`` itself) are split consistently: the predicate is asked about
    ``<layer>.weight`` only; its axis (0/-2: rows, 1/-1: K) and segments are
    applied to ``weight`` (packed columns), ``scales`` (one per 16 K elements) and
    ``bias`` (split with the rows, kept whole on a K split) together. The global
    scale is not a parameter and stays as it is. Every other parameter is split
    exactly as MLX does. As with MLX, the module does not change type, so it
    computes a partial result and does no communication.
    """
    where = "mlx_fp4.distributed.shard_inplace"
    if isinstance(sharding, str):
        _check_sharding(sharding, where)
        predicate = _mlx_predicate(sharding, segments)
    elif callable(sharding):
        predicate = sharding
    else:
        raise ValueError(f"[{where}] sharding expected a string or a callable.")
    group = group or mx.distributed.init()
    n_ranks, r = group.size(), group.rank()

    fp4 = {
        path: m
        for path, m in module.named_modules()
        if _is_fp4_linear(m) or isinstance(m, _FP4Sharded)
    }
    for path, m in fp4.items():
        if isinstance(m, _FP4Sharded):
            raise ValueError(f"[{where}] {path or 'module'} is already sharded ({type(m).__name__}).")

    def owner(p):
        prefix, _, leaf = p.rpartition(".")
        return (prefix, leaf) if prefix in fp4 else (None, None)

    # Decide and validate everything first (every rank raises the same error).
    plans = {}
    for path, m in fp4.items():
        wpath = f"{path}.weight" if path else "weight"
        s = predicate(wpath, m["weight"])
        if s is None:
            continue
        axis, segs = (s, 1) if isinstance(s, int) else s
        if axis in (0, -2):
            kind = "all-to-sharded"
        elif axis in (1, -1):
            kind = "sharded-to-all"
        else:
            raise ValueError(f"[{where}] {wpath}: axis {axis} is not an axis of a 2-D weight.")
        w, scales, bias, _, _, _ = _fp4_arrays(m, f"{where}: {path or 'module'}")
        plans[path] = _shard_fp4_arrays(w, scales, bias, kind, segs, group, f"{where}: {path or 'module'}")

    new = []
    for p, a in tree_flatten(module.parameters()):
        if not isinstance(a, mx.array):
            continue
        prefix, leaf = owner(p)
        if prefix is not None and leaf in ("weight", "scales", "bias"):
            if prefix in plans:
                w, scales, bias = plans[prefix]
                a = {"weight": w, "scales": scales, "bias": bias}[leaf]
            new.append((p, a))
            continue
        s = predicate(p, a)
        if s is None:
            new.append((p, a))
            continue
        axis, segs = (s, 1) if isinstance(s, int) else s
        total = a.shape[axis]
        pieces = _rank_pieces(total, segs, n_ranks, f"{where}: {p}", "the parameter")[r]
        new.append((p, _take(a, pieces, axis)))
    module.update(tree_unflatten(new))


# --------------------------------------------------------------------------- #
# mlx-lm models
# --------------------------------------------------------------------------- #
_patch_lock = threading.RLock()


def _named(fn, names):
    """fn, with the module's path (from ``names``: id -> path) prefixed to its errors."""

    def wrapper(module, *args, **kwargs):
        try:
            return fn(module, *args, **kwargs)
        except ValueError as e:
            name = names.get(id(module))
            if name is None:
                raise
            raise ValueError(f"{name}: {e}") from e

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


@contextlib.contextmanager
def fp4_sharding(_names: Optional[dict] = None):
    """Within the block, ``shard_linear``/``shard_inplace`` mean ours everywhere.

    mlx-lm model files bind ``from mlx.nn.layers.distributed import shard_linear``
    at import time, so this swaps the name in ``mlx.nn.layers.distributed`` and in
    every loaded module that holds MLX's original function (all imported
    ``mlx_lm.models.*``), and restores them on exit. Use it around code that calls
    ``model.shard()`` itself, e.g. ``mlx_lm.utils.sharded_load`` after the
    model has FP4 layers. Holds a process-wide lock; not for concurrent use with
    code that shards models in other threads.
    """
    replacements = {_MLX_SHARD_LINEAR: shard_linear, _MLX_SHARD_INPLACE: shard_inplace}
    if _names:
        replacements = {k: _named(v, _names) for k, v in replacements.items()}
    with _patch_lock:
        patched = []
        for mod in list(sys.modules.values()):
            d = getattr(mod, "__dict__", None)
            if not isinstance(d, dict) or mod is sys.modules[__name__]:
                continue
            for name in ("shard_linear", "shard_inplace"):
                old = d.get(name)
                try:
                    hit = old in replacements
                except TypeError:
                    hit = False
                if hit:
                    d[name] = replacements[old]
                    patched.append((d, name, old))
        try:
            yield
        finally:
            for d, name, old in reversed(patched):
                d[name] = old


def shard_model(model: nn.Module, group: Optional[mx.distributed.Group] = None) -> nn.Module:
    """Tensor-parallel shard an mlx-lm model that has FP4 layers; returns ``model``.

    Exactly ``model.shard(group)`` (the model's own plan: q/k/v/gate/up
    all-to-sharded, o/down sharded-to-all, heads divided) with
    :func:`shard_linear`/:func:`shard_inplace` in place of MLX's, so FP4Linear
    layers become FP4 sharded layers and everything else is sharded by MLX.
    Works before or after ``mlx_fp4.nn.quantize``; for a model sharded first use
    :func:`quantize` to convert it. If a layer cannot be split (e.g. K not on
    16-element blocks) every rank raises ValueError and the model is left
    partly sharded: rebuild it.
    """
    shard = getattr(model, "shard", None)
    if not callable(shard):
        raise ValueError(
            f"[mlx_fp4.distributed.shard_model] {type(model).__name__} has no shard() "
            "method (mlx-lm models that support tensor parallelism define one)."
        )
    group = group or mx.distributed.init()
    names = {id(m): path for path, m in model.named_modules() if path}
    with fp4_sharding(names):
        shard(group)
    return model


# --------------------------------------------------------------------------- #
# shard first, convert after
# --------------------------------------------------------------------------- #
def _sharded_kind(m) -> Optional[str]:
    if isinstance(m, _FP4Sharded):
        return None
    if isinstance(m, (_mlx_dist.AllToShardedLinear, _mlx_dist.ShardedToAllLinear)):
        return "float"
    if isinstance(m, (_mlx_dist.QuantizedAllToShardedLinear, _mlx_dist.QuantizedShardedToAllLinear)):
        if getattr(m, "mode", None) == MODE and m.get("biases") is None:
            return "nvfp4"
    return None


def quantize(
    model: nn.Module,
    *,
    class_predicate=None,
    global_scale: bool = False,
    progress: bool = True,
) -> nn.Module:
    """Convert a model that was sharded first (``model.shard()``) to FP4; in place.

    MLX's sharded layers become FP4 sharded layers:
    ``AllToShardedLinear``/``ShardedToAllLinear`` (float) are quantized shard by
    shard; nvfp4 ``QuantizedAllToShardedLinear``/``QuantizedShardedToAllLinear``
    are wrapped without copying bytes. Then :func:`mlx_fp4.nn.quantize` converts
    the remaining (unsharded) linears. ``class_predicate(path, module)`` and
    ``global_scale`` as in :func:`mlx_fp4.nn.quantize`.

    The result equals converting first and sharding after, bit for bit, when
    the earlier split of K was on 16-element boundaries: blocks never straddle
    ranks, and with ``global_scale=True`` the per-tensor scale is the amax over
    the whole tensor (one ``all_gather`` of the local amaxes per group, all layers
    batched),
    not over the local shard. Every rank must call this (collective when
    ``global_scale`` is requested).
    """
    where = "mlx_fp4.distributed.quantize"
    todo = []
    for path, m in model.named_modules():
        kind = _sharded_kind(m)
        if kind is None:
            continue
        sel = True if class_predicate is None else class_predicate(path, m)
        if sel is False or sel is None:
            continue
        opts = {"global_scale": global_scale, **(sel if isinstance(sel, dict) else {})}
        for key, want in (("group_size", BLOCK), ("bits", 4), ("mode", MODE)):
            if key in opts and opts.pop(key) not in (None, want):
                raise ValueError(f"[{where}] {path}: only nvfp4 (16/4/'nvfp4') is supported.")
        gs = bool(opts.pop("global_scale"))
        if opts:
            raise ValueError(f"[{where}] unknown options for {path}: {sorted(opts)}.")
        sharding = (
            "all-to-sharded"
            if isinstance(m, (_mlx_dist.AllToShardedLinear, _mlx_dist.QuantizedAllToShardedLinear))
            else "sharded-to-all"
        )
        if kind == "float":
            k = m.weight.shape[-1]
            if k % BLOCK:
                raise ValueError(
                    f"[{where}] {path}: the local K slice has {k} elements, not a multiple of "
                    f"16 (NVFP4 blocks); shard on 16-element block boundaries."
                )
        todo.append((path, m, kind, sharding, gs))

    # One collective per group for all global scales (batched; same order on every rank).
    amax = {}
    by_group = {}
    for path, m, kind, sharding, gs in todo:
        if kind == "float" and gs:
            by_group.setdefault(id(m.group), (m.group, []))[1].append(path)
    mods = {p: m for p, m, *_ in todo}
    for group, paths in by_group.values():
        local = mx.stack([mx.max(mx.abs(mods[p].weight.astype(mx.float32))) for p in paths])
        # all_gather + max rather than all_max: all_gather exists on every backend.
        total = (
            mx.max(mx.distributed.all_gather(local[None], group=group), axis=0)
            if group.size() > 1
            else local
        )
        mx.eval(total)
        for i, p in enumerate(paths):
            amax[p] = total[i]

    from .nn import progress_bar

    it = progress_bar(todo, "mlx_fp4: quantizing shards", progress)
    converted = []
    for path, m, kind, sharding, gs in it:
        cls = _CLASSES[sharding]
        if kind == "nvfp4":
            new = cls._blank(m.group, None)
            new.weight, new.scales = m.weight, m.scales
        else:
            w = m.weight
            if gs:
                # Quantize with the group-wide amax: an extra row [amax, 0, ...] makes
                # the core compute gs = amax/2688 exactly as for the unsharded tensor;
                # rows are quantized independently, so the real rows are unaffected.
                extra = mx.zeros((1, w.shape[1]), dtype=mx.float32)
                extra[0, 0] = amax[path]
                packed, scales, g = _core.quantize(
                    mx.concatenate([w.astype(mx.float32), extra], axis=0), global_scale=True
                )
                packed, scales = packed[:-1], scales[:-1]
            else:
                packed, scales = _core.quantize(w)
                g = None
            new = cls._blank(m.group, g)
            new.weight = mx.contiguous(packed).view(mx.uint32)
            new.scales = mx.contiguous(scales)
        if "bias" in m:
            new.bias = m.bias
        new.freeze()
        mx.eval(new.parameters(), *([new.global_scale] if new.global_scale is not None else []))
        converted.append((path, new))
    if converted:
        model.update_modules(tree_unflatten(converted))

    from . import nn as fnn

    fnn.quantize(model, class_predicate=class_predicate, global_scale=global_scale, progress=progress)
    return model


def global_scales(model: nn.Module) -> dict:
    """``{"<path>.global_scale": fp32 scalar}`` for every FP4Linear and FP4 sharded
    layer that has one (the sharded form of :func:`mlx_fp4.nn.global_scales`)."""
    out = {}
    for path, m in model.named_modules():
        if (_is_fp4_linear(m) or isinstance(m, _FP4Sharded)) and m.global_scale is not None:
            out[f"{path}.global_scale"] = m.global_scale
    return out
