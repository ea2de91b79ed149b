"""GPU stress test of the CUDA glue: threads x streams x compile x grads (issue 13).

    PYTHONPATH=python python3 scripts/gpu_stress.py [--threads 8] [--iterations 500] [--seed 0]

Each thread owns an mx.new_stream(mx.gpu) and loops over random problems that take every path
(M from 1 to 300: staged / register-prefetch tensor cores, dequantize + cuBLASLt; ragged K;
bf16/fp16/fp32 x; epilogues with operands; global scale), in four forms: eager, mx.compile,
mx.grad through the product, and a compiled grad. Every result is checked against
mlx_fp4.w4a16_matmul_reference_ops (plain MLX ops on the same stream). Exits 1 on any mismatch or
exception; meant to run under compute-sanitizer (memcheck, racecheck, synccheck) with fewer iterations.
"""

import argparse
import os
import sys
import threading
import time
import traceback

# The fp32 reference goes through mx.matmul, which uses TF32 on CUDA unless told not to (its ~2e-4
# error would exceed the fp32 tolerance below); set before MLX reads it.
os.environ.setdefault("MLX_ENABLE_TF32", "0")

import mlx.core as mx  # noqa: E402

import mlx_fp4 as mx_fp4  # noqa: E402

SHAPES_M = (1, 2, 7, 16, 33, 64, 300)
SHAPES_K = (64, 256, 520, 1024)
SHAPES_N = (48, 256, 1001)
DTYPES = (mx.bfloat16, mx.float16, mx.float32)
# Relative L2 error allowed vs the fp32 MLX-ops reference: output rounding of the dtype plus fp32
# accumulation-order differences (bf16 output ~2^-9; grads pass through one more bf16 rounding).
REL_TOL = {mx.bfloat16: 2e-2, mx.float16: 4e-3, mx.float32: 1e-4}


def rel_err(a, b):
    a = a.astype(mx.float32)
    b = b.astype(mx.float32)
    return (mx.linalg.norm(a - b) / mx.maximum(mx.linalg.norm(b), 1e-30)).item()


def one_problem(rng_key, stream, form):
    ks = mx.random.split(rng_key, 6)
    pick = lambda seq, i: seq[int(mx.random.randint(0, len(seq), (), key=ks[i]).item())]  # noqa: E731
    m, k, n, dt = pick(SHAPES_M, 0), pick(SHAPES_K, 1), pick(SHAPES_N, 2), pick(DTYPES, 3)
    with mx.stream(stream):
        w = mx.random.normal((n, k), key=ks[4]) * (k ** -0.5)
        packed, scales = mx_fp4.quantize(w)
        x = mx.random.normal((m, k), key=ks[5]).astype(dt)
        bias = mx.random.normal((n,), key=ks[5]).astype(dt)
        gs = mx.array(1.5, mx.float32) if m % 2 else None
        epi = [("add", bias), "silu"] if n % 2 == 0 else []

        def f(x_):
            return mx_fp4.w4a16_matmul(x_, packed, scales, global_scale=gs, epilogue=epi)

        def ref(x_):
            return mx_fp4.w4a16_matmul_reference_ops(x_, packed, scales, global_scale=gs, epilogue=epi)

        if form == "eager":
            got, want = f(x), ref(x)
        elif form == "compile":
            got, want = mx.compile(f)(x), ref(x)
        elif form == "grad":
            got = mx.grad(lambda x_: f(x_).astype(mx.float32).sum())(x)
            want = mx.grad(lambda x_: ref(x_).astype(mx.float32).sum())(x)
        else:  # compiled grad
            got = mx.compile(mx.grad(lambda x_: f(x_).astype(mx.float32).sum()))(x)
            want = mx.grad(lambda x_: ref(x_).astype(mx.float32).sum())(x)
        mx.eval(got, want)
        err = rel_err(got, want)
    return err, REL_TOL[dt], (form, m, k, n, str(dt), gs is not None, len(epi))


def worker(tid, args, failures, counts):
    stream = mx.new_stream(mx.gpu)
    forms = ("eager", "compile", "grad", "compiled_grad")
    key = mx.random.key(args.seed * 7919 + tid)
    for it in range(args.iterations):
        key, sub = mx.random.split(key)
        form = forms[(it + tid) % len(forms)]
        try:
            err, tol, desc = one_problem(sub, stream, form)
            if not err <= tol:  # NaN fails too
                failures.append(f"thread {tid} iter {it} {desc}: rel err {err:.3g} > {tol:g}")
        except Exception:  # noqa: BLE001 - every failure is reported
            failures.append(f"thread {tid} iter {it} {form}: {traceback.format_exc(limit=3)}")
        counts[tid] += 1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--iterations", type=int, default=500, help="problems per thread")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if not mx.cuda.is_available():
        print("gpu_stress: needs MLX's CUDA build", file=sys.stderr)
        return 2
    failures, counts = [], [0] * args.threads
    t0 = time.time()
    threads = [threading.Thread(target=worker, args=(i, args, failures, counts)) for i in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    mx.synchronize()
    total = sum(counts)
    print(f"gpu_stress: {args.threads} threads, {total} problems in {time.time() - t0:.1f} s, "
          f"{len(failures)} failures; active memory {mx.get_active_memory() / 2**20:.1f} MiB")
    for f in failures[:20]:
        print("FAIL", f)
    return 1 if failures or total != args.threads * args.iterations else 0


if __name__ == "__main__":
    sys.exit(main())
