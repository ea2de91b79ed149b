"""What one W4A16 product costs through MLX on the GPU, next to its kernel time (issue 13).

    PYTHONPATH=python python3 scripts/gpu_op_overhead.py --out DIR [--quick]

1. Host cost per call: a dependent chain of tiny products (N = K = 256, M = 1; a few microseconds
   of GPU work each) in one mx.eval. Wall time / chain length is then the host's cost to build and
   encode one call (Python, graph node, MLX's eval and CUDA-graph bookkeeping), for ours, MLX's
   nvfp4, dense mx.matmul, and a plain elementwise MLX op for scale.
2. Real products in a dependent chain, as in a model (each product's input is the previous output),
   cold weights (copies cycled over > 400 MB so L2 never holds the next weights), M = 1, 4, 16 on
   8192^2 and the 14336x4096 / 4096x14336 pair (alternating): wall time / products per eval, median
   of the timed evals. Compare with the kernel harness (kernel_harness bench).
"""

import argparse
import json
import os
import statistics
import sys
import time

import mlx.core as mx

import mlx_fp4 as mx_fp4
from mlx_fp4.formats import device_resident

ROTATE_BYTES = 400 * 10**6
IMPLS = ("mlx_fp4", "mlx_fp4_gs", "mlx_fp4_gs_padded", "mlx_fp4_own", "mlx_fp4_own_gs", "mlx_nvfp4", "dense_bf16")


def _weights(w):
    """impl -> the arrays its product reads, built from the float weight w (lazily)."""
    qw, qs = mx.quantize(w, mode="nvfp4", group_size=16, bits=4)[:2]
    gs = mx.max(mx.abs(w)).astype(mx.float32).reshape(1)
    return {
        "mlx_nvfp4": lambda: (qw, qs),
        "mlx_fp4": lambda: (qw, qs),  # the same bytes: ours reads MLX's uint32 layout
        # The same bytes with a global scale (MLX's amax convention): the scale's own cost, in a
        # 4-byte buffer (MLX CUDA's managed small-allocation pool) and as the layers store it.
        "mlx_fp4_gs": lambda: (qw, qs, gs),
        "mlx_fp4_gs_padded": lambda: (qw, qs, device_resident(gs)),
        # What mx_fp4.quantize gives (uint8 layout, its own amax with global_scale=True).
        "mlx_fp4_own": lambda: tuple(mx_fp4.quantize(w, global_scale=False)),
        "mlx_fp4_own_gs": lambda: tuple(mx_fp4.quantize(w, global_scale=True)),
        "dense_bf16": lambda: (w.astype(mx.bfloat16),),
    }


def quantized_sets(n, k, copies, seed, impls=IMPLS):
    """`copies` random weights [N, K] (scaled 1/sqrt(K): chains keep their magnitude) in each
    format of `impls`."""
    sets = {impl: [] for impl in impls}
    for c in range(copies):
        w = mx.random.normal((n, k), key=mx.random.key(seed * 1000 + c)) * (k ** -0.5)
        build = _weights(w)
        for impl in impls:
            sets[impl].append(build[impl]())
        mx.eval(*(sets[impl][-1] for impl in impls))
    return sets


def product(impl, x, wts):
    if impl.startswith("mlx_fp4"):
        return mx_fp4.w4a16_matmul(x, wts[0], wts[1], global_scale=wts[2] if len(wts) > 2 else None)
    if impl == "mlx_nvfp4":
        return mx.quantized_matmul(x, wts[0], wts[1], transpose=True, group_size=16, bits=4, mode="nvfp4")
    return x @ wts[0].T


def timed_chain(impl, x0, layers, count, repeats):
    """Median seconds per product of `count` chained products cycling through `layers`."""
    def run():
        x = x0
        for i in range(count):
            x = product(impl, x, layers[i % len(layers)])
        t0 = time.perf_counter()
        mx.eval(x)
        mx.synchronize()
        return time.perf_counter() - t0

    run()  # warm-up (kernel loading, JIT)
    times = [run() / count for _ in range(repeats)]
    return {"us_median": statistics.median(times) * 1e6, "us_min": min(times) * 1e6, "us_max": max(times) * 1e6}


def host_cost(repeats, count):
    n = k = 256
    sets = quantized_sets(n, k, 1, seed=7)
    x = mx.random.normal((1, k)).astype(mx.bfloat16)
    out = {}
    for impl in IMPLS:
        out[impl] = timed_chain(impl, x, sets[impl], count, repeats)
        # Graph building alone (Python + op construction), no eval.
        y = x
        t0 = time.perf_counter()
        for _ in range(count):
            y = product(impl, y, sets[impl][0])
        out[impl]["build_us"] = (time.perf_counter() - t0) / count * 1e6
        mx.eval(y)

    def elementwise():
        y = x
        for _ in range(count):
            y = y * 1.0001
        t0 = time.perf_counter()
        mx.eval(y)
        mx.synchronize()
        return (time.perf_counter() - t0) / count * 1e6

    elementwise()
    out["mlx_multiply"] = {"us_median": statistics.median(elementwise() for _ in range(repeats))}
    return out


def real_chains(ms, repeats, quick):
    shapes = [("8192x8192", [(8192, 8192)])] + ([] if quick else [("14336x4096+4096x14336", [(14336, 4096), (4096, 14336)])])
    res = []
    for name, pair in shapes:
        fp4_bytes = sum(n * k // 2 + n * k // 16 for n, k in pair)
        dense_bytes = sum(2 * n * k for n, k in pair)
        for impl in IMPLS:
            per = dense_bytes if impl == "dense_bf16" else fp4_bytes
            copies = max(1, -(-ROTATE_BYTES // per))
            layers = []
            for c in range(copies):
                parts = [quantized_sets(n, k, 1, seed=100 * c + j, impls=(impl,))[impl][0] for j, (n, k) in enumerate(pair)]
                layers += parts
            for m in ms:
                x = mx.random.normal((m, pair[0][1])).astype(mx.bfloat16)
                count = len(layers) * max(1, 240 // len(layers))
                r = timed_chain(impl, x, layers, count, repeats)
                r.update({"shape": name, "impl": impl, "m": m, "weight_copies": copies, "products_per_eval": count})
                res.append(r)
                print(f"  {name} {impl} M={m}: {r['us_median']:.1f} us per product", flush=True)
            del layers
            mx.clear_cache()
    return res


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="gpu-check-out")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--m", nargs="+", type=int, default=[1, 4, 16])
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    mx.set_default_device(mx.gpu)
    doc = {"env": {k: v for k, v in os.environ.items() if k.startswith("MLX_")}, "mlx": mx.__version__}
    doc["host_cost_per_call_us"] = host_cost(args.repeats, 2000)
    for k, v in doc["host_cost_per_call_us"].items():
        print(f"host cost {k}: {v['us_median']:.2f} us per call" + (f", build {v['build_us']:.2f}" if v.get("build_us") else ""))
    doc["chains"] = real_chains(args.m, args.repeats, args.quick)
    os.makedirs(args.out, exist_ok=True)
    tag = os.environ.get("MLX_FP4_CUDA_ALLOC", "default")
    with open(os.path.join(args.out, f"op_overhead_{tag}.json"), "w") as f:
        json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
