"""Quickstart: quantize a weight to NVFP4, run the fused W4A16 matmul, check it, time it.

    python examples/quickstart.py [--m 16] [--n 4096] [--k 4096]
"""

import argparse
import time

import mlx.core as mx
import numpy as np

import mlx_fp4 as mx_fp4


def median_ms(fn, repeats=5):
    mx.eval(fn())  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        mx.eval(fn())
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--m", type=int, default=16)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=4096)
    args = ap.parse_args()
    m, n, k = args.m, args.n, args.k
    mx.random.seed(0)

    w = mx.random.normal((n, k)) * 0.02
    packed, scales, gs = mx_fp4.quantize(w, global_scale=True)  # uint8 [N, K/2], uint8 [N, K/16], fp32 amax
    x = mx.random.normal((m, k)).astype(mx.bfloat16)
    bias = mx.random.normal((n,))
    up = mx.random.normal((m, n))
    epilogue = [("add", bias), "silu", ("mul", up)]

    y = mx_fp4.w4a16_matmul(x, packed, scales, global_scale=gs, epilogue=epilogue, out_dtype=mx.float32)

    # Float64 reference from the exactly decoded weights.
    # global_scale is MLX's convention (the amax): the weights decode with gs / 2688
    wd = np.array(mx_fp4.dequantize(packed, scales, dtype=mx.float32), dtype=np.float64) * (float(gs.item()) / 2688)
    xd = np.array(x.astype(mx.float32), dtype=np.float64)
    pre = xd @ wd.T + np.array(bias, dtype=np.float64)
    ref = pre / (1.0 + np.exp(-pre)) * np.array(up, dtype=np.float64)
    err = np.abs(np.array(y, dtype=np.float64) - ref)
    print(f"w4a16_matmul  M={m} N={n} K={k}  epilogue=add(bias)->silu->mul(up)  device={mx.default_device()}")
    print(f"max |error| vs float64 reference: {err.max():.3e}  (max |y| = {np.abs(ref).max():.3f})")
    print(f"quantization error of the weights: rel. Frobenius {np.linalg.norm(wd - np.array(w, np.float64)) / np.linalg.norm(np.array(w, np.float64)):.4f}")

    # Timing against MLX's own nvfp4 matmul (same bytes, no global scale, no epilogue).
    wq, sq = mx.quantize(w, group_size=16, bits=4, mode="nvfp4")
    mx.eval(wq, sq, x)
    ours = median_ms(lambda: mx_fp4.w4a16_matmul(x, wq, sq))
    fused = median_ms(lambda: mx_fp4.w4a16_matmul(x, packed, scales, global_scale=gs, epilogue=epilogue))
    theirs = median_ms(
        lambda: mx.quantized_matmul(x, wq, sq, transpose=True, group_size=16, bits=4, mode="nvfp4"), repeats=2
    )
    print(f"mx_fp4.w4a16_matmul:            {ours:9.3f} ms")
    print(f"  + global scale + 3-op epilogue: {fused:9.3f} ms")
    print(f"mx.quantized_matmul(nvfp4):     {theirs:9.3f} ms   -> {theirs / ours:.1f}x")


if __name__ == "__main__":
    main()
