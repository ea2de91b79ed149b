"""Memory: 10,000 w4a16_matmul calls, each building a fresh graph (new activations, epilogue
operands, global scale arrays; plain, mx.compile'd and differentiated calls) and evaluating it,
keep the process RSS and MLX's active memory flat. Small shapes: about 1 s natively, 15 s to 2
minutes under arm64 emulation (tools/test_arm64.sh); no timing is asserted (CI machines differ).

RSS is read from /proc/self/statm (resident pages; Linux) or, elsewhere, from
resource.getrusage's peak RSS (which can only reveal growth of the peak).
"""

import os
import resource
import sys
import time

import mlx.core as mx
import pytest

import mlx_fp4 as mx_fp4
from common import rand_weights, rand_x, rng

CALLS = 10_000
# Allowed RSS growth between the end of warm-up and the end (allocator noise, MLX's buffer cache
# settling); a leak of one 1 KiB buffer per call would be ~10 MiB, one graph node per call more.
RSS_SLACK_MIB = 6.0


def rss_mib():
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def make_calls():
    g = rng("memory")
    m, n, k = 6, 48, 64
    x0 = rand_x((m, k), mx.bfloat16, g)
    xb = rand_x((40, k), mx.float32, g)  # GEMM path
    w, scales, _ = rand_weights(n, k, g)
    bias = rand_x((n,), mx.float32, g)
    compiled = mx.compile(lambda a, b: mx_fp4.w4a16_matmul(a, w, scales, epilogue=[("add", b), "gelu"]))

    def loss(a, r):
        y = mx_fp4.w4a16_matmul(a, w, scales, epilogue=[("mul", r), "silu"], out_dtype=mx.float32)
        return y.sum()

    grad = mx.grad(loss, argnums=(0, 1))

    def call(i):
        x = x0 * (1 + (i % 7))  # a new array and graph every call
        kind = i % 5
        if kind == 0:
            return mx_fp4.w4a16_matmul(x, w, scales)
        if kind == 1:
            resid = mx.full((m, n), float(i % 3), dtype=mx.float16)
            gs = mx.array(0.5 + (i % 4), dtype=mx.float32)
            return mx_fp4.w4a16_matmul(x, w, scales, global_scale=gs,
                                       epilogue=[("add", bias), "silu", ("add", resid)],
                                       out_dtype=mx.float32)
        if kind == 2:
            return mx_fp4.w4a16_matmul(xb + i, w, scales, epilogue=[("clamp", -1.0, 1.0)])
        if kind == 3:
            return compiled(x, bias + i)
        if i % 50 == 4:
            return grad(x.astype(mx.float32), mx.ones((m, n)))
        return mx_fp4.w4a16_matmul_reference_ops(x, w, scales, epilogue=["relu"])

    return call


def test_rss_flat_over_10000_calls(device):
    call = make_calls()
    t0 = time.perf_counter()
    warm = 1000
    for i in range(warm):
        mx.eval(call(i))
    rss_warm = rss_mib()
    active_warm = mx.get_active_memory()
    samples = []
    for i in range(warm, CALLS):
        mx.eval(call(i))
        if i % 1000 == 999:
            samples.append(rss_mib())
    growth = rss_mib() - rss_warm
    active_growth = mx.get_active_memory() - active_warm
    trace = ", ".join(f"{s:.1f}" for s in samples)
    assert growth < RSS_SLACK_MIB, f"RSS grew {growth:.2f} MiB after warm-up (MiB per 1000 calls: {trace})"
    # MLX's own accounting: no arrays kept alive by the op (0 up to allocator granularity).
    assert active_growth < 64 * 1024, f"MLX active memory grew by {active_growth} bytes"
    print(f"\n{CALLS} calls in {time.perf_counter() - t0:.1f} s; RSS {rss_warm:.1f} -> {rss_mib():.1f} MiB; "
          f"samples {trace}")
