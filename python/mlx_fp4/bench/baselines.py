"""What is timed: our op, the baselines and the rooflines, each on rotated weight copies.

Implementations (name -> what one product is):
  mlx_fp4         mlx_fp4.w4a16_matmul(x, packed_uint8, scales)                      (ours)
  mlx_nvfp4       mx.quantized_matmul(x, packed_uint32, scales, mode=<--mode>, ...)  (MLX's own, in the
                  bench's mode: nvfp4 by default, mxfp4 with --mode mxfp4)
  mlx_dense_bf16  mx.matmul(x, w_bf16.T) on the dequantized weight                     (dense)
  numpy_fp32      numpy.matmul(x, w_fp32.T) on the dequantized weight (CPU only; compute roofline)
Rooflines: CPU: a threaded numpy copy of a buffer the size of the packed weights + scales;
GPU: an MLX copy of a large buffer, and the dense bf16 mx.matmul peak on a large square problem.

Weights are random codes, not quantized floats: timing does not depend on the values, and
mx.quantize(mode="nvfp4") takes seconds per layer on the CPU. FP4 nibbles are uniform over all
16 codes; scale bytes are E4M3 codes 0x08..0x27 (2^-6 .. 2^-2), never the NaN codes 0x7F/0xFF
(mxfp4: E8M0 codes 121..126, 2^-6 .. 2^-1).
"""

import dataclasses
import itertools
import math
import time
from concurrent.futures import ThreadPoolExecutor

import mlx.core as mx
import numpy as np

from . import timing
from .shapes import GROUP_SIZE, Shape

MAX_COPIES = 128  # at most this many rotated copies of one weight
_UINT_OF_SIZE = {1: mx.uint8, 2: mx.uint16, 4: mx.uint32, 8: mx.uint64}


def mx_clone(a):
    """A new buffer with the same bits, made on the current device (no host round trip)."""
    u = _UINT_OF_SIZE[a.dtype.size]
    return mx.add(a.view(u), 0).view(a.dtype)


def touch(arrays) -> None:
    """Read every byte once, untimed: on some VMs the first pass over fresh memory is several
    times slower than later ones, which would otherwise land in the first timed products."""
    views = [a.view(mx.uint32) if (a.shape[-1] * a.dtype.size) % 4 == 0 else a.view(mx.uint8) for a in arrays]
    for i in range(0, len(views), 16):
        mx.eval([mx.max(v) for v in views[i : i + 16]])


def roofline_config(cfg: timing.TimingConfig) -> timing.TimingConfig:
    """Rooflines take the best of more, longer evals (the STREAM convention: peak, not typical)."""
    return dataclasses.replace(cfg, repeats=max(cfg.repeats, 10), target_eval_s=max(cfg.target_eval_s, 0.02))


def copies_for(bytes_per_copy: int, rotate_bytes: int, mem_cap_bytes: int) -> int:
    """Enough copies to span rotate_bytes (so a reused copy is out of cache), within the memory cap."""
    want = max(1, math.ceil(rotate_bytes / max(bytes_per_copy, 1)))
    fit = max(1, mem_cap_bytes // max(bytes_per_copy, 1))
    return int(min(want, fit, MAX_COPIES))


E8M0_CODES = (121, 127)  # [lo, hi): 2^-6 .. 2^-1


class WeightSet:
    """One layer's FP4 weight (``mode`` nvfp4 or mxfp4) in every form the implementations need
    (built lazily)."""

    def __init__(self, shape: Shape, seed: int = 0, mode: str = "nvfp4"):
        self.shape = shape
        self.mode = mode
        rng = np.random.default_rng(seed)
        n, k = shape.n, shape.k
        blocks = (k + shape.group - 1) // shape.group
        self.packed_np = rng.integers(0, 256, size=(n, (k + 1) // 2), dtype=np.uint8)
        if mode == "mxfp4":
            self.scales_np = rng.integers(*E8M0_CODES, size=(n, blocks), dtype=np.uint8)
        else:
            exp = rng.integers(1, 5, size=(n, blocks), dtype=np.uint8)
            mant = rng.integers(0, 8, size=exp.shape, dtype=np.uint8)
            self.scales_np = (exp << 3) | mant
        self.packed = mx.array(self.packed_np)
        self.scales = mx.array(self.scales_np)
        mx.eval(self.packed, self.scales)
        self._dense = None
        self._dense_f32 = None

    @property
    def packed_u32(self):
        """The same bytes as MLX's nvfp4 layout: uint32 [N, K/8], low nibble first."""
        return self.packed.view(mx.uint32)

    @property
    def dense_bf16(self):
        if self._dense is None:
            self._dense = mx.dequantize(
                self.packed_u32, self.scales, group_size=self.shape.group, bits=4, mode=self.mode, dtype=mx.bfloat16
            )
            mx.eval(self._dense)
        return self._dense

    @property
    def dense_f32_np(self):
        if self._dense_f32 is None:
            self._dense_f32 = np.array(self.dense_bf16.astype(mx.float32))
        return self._dense_f32


class MlxImpl:
    """Base for MLX implementations: rotated weight copies and a batched, synchronized runner."""

    name = ""
    label = ""
    is_baseline = True

    def __init__(self):
        self.copies = []
        self._next = itertools.count()
        self.mode, self.group = "nvfp4", GROUP_SIZE  # set from the WeightSet in setup

    def weight_bytes(self, shape: Shape) -> int:
        return shape.weight_bytes

    def sources(self, ws: WeightSet) -> tuple:
        raise NotImplementedError

    def product(self, x, weights: tuple):
        raise NotImplementedError

    def setup(self, ws: WeightSet, copies: int) -> None:
        self.mode, self.group = ws.mode, ws.shape.group
        src = self.sources(ws)
        self.copies = []
        for _ in range(copies):
            c = tuple(mx_clone(a) for a in src)
            mx.eval(*c)
            self.copies.append(c)
        touch([a for c in self.copies for a in c])
        self._next = itertools.count()  # start at the oldest copy, the one most likely out of cache

    def release(self) -> None:
        self.copies = []

    def make_input(self, x_bf16, x_f32_np):
        return x_bf16

    def runner(self, x):
        def run(count: int) -> float:
            outs = [self.product(x, self.copies[next(self._next) % len(self.copies)]) for _ in range(count)]
            t0 = time.perf_counter()
            mx.eval(outs)
            mx.synchronize()
            return time.perf_counter() - t0

        return run

    def output(self, x):
        """One evaluated product as float64 NumPy (for the correctness check)."""
        y = self.product(x, self.copies[0])
        return np.array(y.astype(mx.float32)).astype(np.float64)


class Fp4Impl(MlxImpl):
    name = "mlx_fp4"
    label = "mlx_fp4.w4a16_matmul (ours)"
    is_baseline = False

    def __init__(self):
        super().__init__()
        from mlx_fp4 import w4a16_matmul  # the extension; fails loudly if it is not built

        self._op = w4a16_matmul

    def sources(self, ws):
        return (ws.packed, ws.scales)

    def product(self, x, w):
        return self._op(x, w[0], w[1], mode=self.mode)


class MlxNvfp4Impl(MlxImpl):
    name = "mlx_nvfp4"
    label = 'mx.quantized_matmul(mode="nvfp4")'

    def sources(self, ws):
        return (ws.packed_u32, ws.scales)

    def product(self, x, w):
        return mx.quantized_matmul(x, w[0], w[1], transpose=True, group_size=self.group, bits=4, mode=self.mode)


class MlxDenseImpl(MlxImpl):
    name = "mlx_dense_bf16"
    label = "dequantized bf16 + mx.matmul"

    def weight_bytes(self, shape):
        return shape.n * shape.k * 2

    def sources(self, ws):
        return (ws.dense_bf16,)

    def product(self, x, w):
        return mx.matmul(x, w[0].T)


class NumpyImpl:
    """numpy fp32 matmul of the dequantized weight: OpenBLAS sgemm, the CPU compute roofline."""

    name = "numpy_fp32"
    label = "numpy fp32 matmul (dequantized)"
    is_baseline = True

    def __init__(self):
        self.copies = []
        self._next = itertools.count()

    def weight_bytes(self, shape):
        return shape.n * shape.k * 4

    def setup(self, ws: WeightSet, copies: int) -> None:
        base = ws.dense_f32_np
        self.copies = [base] + [base.copy() for _ in range(copies - 1)]  # rotation starts at the oldest
        for w in self.copies:  # untimed first pass, as touch() does for MLX arrays
            w.view(np.uint32).max()
        self._next = itertools.count()

    def release(self):
        self.copies = []

    def make_input(self, x_bf16, x_f32_np):
        return x_f32_np

    def runner(self, x):
        out = np.empty((x.shape[0], self.copies[0].shape[0]), np.float32)

        def run(count: int) -> float:
            ws = [self.copies[next(self._next) % len(self.copies)] for _ in range(count)]
            t0 = time.perf_counter()
            for w in ws:
                np.matmul(x, w.T, out=out)
            return time.perf_counter() - t0

        return run


IMPLS = {c.name: c for c in (Fp4Impl, MlxNvfp4Impl, MlxDenseImpl, NumpyImpl)}


def default_impls(device: str) -> list:
    names = ["mlx_fp4", "mlx_nvfp4", "mlx_dense_bf16"]
    return names + (["numpy_fp32"] if device == "cpu" else [])


# ---- rooflines ----------------------------------------------------------------------------------


def cpu_copy_roofline(nbytes: int, threads: int, rotate_bytes: int, mem_cap: int, cfg: timing.TimingConfig) -> dict:
    """Copy bandwidth for a buffer of nbytes with `threads` threads (numpy copyto drops the GIL).

    GB/s counts bytes read + bytes written (STREAM convention); the time to stream the weights
    once at this rate is the bandwidth-bound time of a product.
    """
    copies = copies_for(2 * nbytes, rotate_bytes, mem_cap)
    # np.full writes every page now, so no page fault lands inside the clock (np.zeros would not).
    pairs = [(np.full(nbytes, 1, np.uint8), np.full(nbytes, 2, np.uint8)) for _ in range(copies)]
    for src, dst in pairs:  # one untimed pass: the first pass over fresh memory is slow on some VMs
        np.copyto(dst, src)
    bounds = [(i * nbytes // threads, (i + 1) * nbytes // threads) for i in range(threads)]
    nxt = itertools.count()
    with ThreadPoolExecutor(threads) as pool:

        def run(count: int) -> float:
            chosen = [pairs[next(nxt) % copies] for _ in range(count)]

            def work(lo_hi):
                lo, hi = lo_hi
                for src, dst in chosen:
                    np.copyto(dst[lo:hi], src[lo:hi])

            t0 = time.perf_counter()
            list(pool.map(work, bounds))
            return time.perf_counter() - t0

        meas = timing.measure(run, roofline_config(cfg))
    return {
        "method": f"numpy.copyto of {nbytes} bytes (packed weights + scales) split over {threads} threads, "
        f"{copies} rotated buffer pairs; GB/s = (read + written bytes) / best time",
        "bytes": nbytes,
        "threads": threads,
        "copies": copies,
        "gbps": 2 * nbytes / meas.seconds_min / 1e9,
        "gbps_median": 2 * nbytes / meas.seconds / 1e9,
        "measurement": meas.as_dict(),
    }


def gpu_copy_roofline(nbytes: int, cfg: timing.TimingConfig) -> dict:
    """GPU memory bandwidth through MLX ops on a large buffer, two rotated sources.

    Three ways, the best one is the roofline: a binary copy (uint32 x + 0) and a unary copy
    (abs of int32 x), counted as bytes read + written, and a read-only max reduction, counted as
    bytes read. MLX's copy kernels may not reach the memory's peak; the best of them is the
    strictest bound available through MLX.
    """
    srcs = [mx.zeros((nbytes // 4,), mx.uint32) + i for i in range(2)]
    mx.eval(*srcs)
    touch(srcs)
    ways = {
        "copy_add": (lambda a: mx.add(a, 0), 2),
        "copy_abs": (lambda a: mx.abs(a.view(mx.int32)), 2),
        "read_max": (lambda a: mx.max(a), 1),
    }
    results = {}
    # Each copy allocates an nbytes output: few per eval.
    rcfg = dataclasses.replace(roofline_config(cfg), max_products=min(cfg.max_products, 4))
    for name, (op, passes) in ways.items():
        nxt = itertools.count()

        def run(count: int, op=op, nxt=nxt) -> float:
            outs = [op(srcs[next(nxt) % 2]) for _ in range(count)]
            t0 = time.perf_counter()
            mx.eval(outs)
            mx.synchronize()
            return time.perf_counter() - t0

        meas = timing.measure(run, rcfg)
        results[name] = {"gbps": passes * nbytes / meas.seconds_min / 1e9,
                         "gbps_median": passes * nbytes / meas.seconds / 1e9, "measurement": meas.as_dict()}
    best = max(results, key=lambda k: results[k]["gbps"])
    return {
        "method": f"best of MLX copy (uint32 x + 0; abs of int32 x; GB/s = read + written bytes / best time) and "
        f"read-only max reduction (GB/s = read bytes / best time) of {nbytes} bytes: {best}",
        "bytes": nbytes,
        "gbps": results[best]["gbps"],
        "ways": results,
    }


def gpu_dense_peak(size: int, cfg: timing.TimingConfig) -> dict:
    """Dense bf16 mx.matmul on a size^3 problem: the GPU compute roofline."""
    a = mx.random.normal((size, size)).astype(mx.bfloat16)
    ws = [mx.random.normal((size, size)).astype(mx.bfloat16) for _ in range(2)]
    mx.eval(a, *ws)
    nxt = itertools.count()

    def run(count: int) -> float:
        outs = [mx.matmul(a, ws[next(nxt) % 2].T) for _ in range(count)]
        t0 = time.perf_counter()
        mx.eval(outs)
        mx.synchronize()
        return time.perf_counter() - t0

    meas = timing.measure(run, roofline_config(cfg))
    return {
        "method": f"mx.matmul bf16 {size}x{size}x{size} (best time)",
        "tflops": 2 * size**3 / meas.seconds_min / 1e12,
        "tflops_median": 2 * size**3 / meas.seconds / 1e12,
        "measurement": meas.as_dict(),
    }
