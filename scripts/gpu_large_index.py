"""One real run past 2^31 elements on the GPU (issue 7): x with more than 2^31 elements, and an
output with more than 2^31 elements through the fused epilogue.

x is R distinct rows repeated M / R times, so every output row has a known expected value: the
same op on the R-row problem, checked against the MLX-ops reference. All M rows are compared on
the device. Usage: python scripts/gpu_large_index.py [--out DIR]
"""

import argparse
import json
import time

import mlx.core as mx

import mlx_fp4 as mx_fp4

R = 4
M = 2**18 + R  # 262148 rows: M * 8192 and M * 8200 both exceed 2^31


def case(name, k, n, out_dtype, epilogue_bias):
    mx.random.seed(0)
    w = mx.random.normal((n, k)) * 0.05
    packed, scales = mx_fp4.quantize(w)
    x0 = mx.random.normal((R, k)).astype(mx.bfloat16)
    b = mx.random.normal((n,)) if epilogue_bias else None
    ep = [("add", b)] if epilogue_bias else None
    y0 = mx_fp4.w4a16_matmul_reference_ops(x0, packed, scales, epilogue=ep, out_dtype=mx.float32)
    x = mx.broadcast_to(x0[None], (M // R, R, k)).reshape(M, k)
    t0 = time.perf_counter()
    y = mx_fp4.w4a16_matmul(x, packed, scales, epilogue=ep, out_dtype=out_dtype)
    mx.eval(y)
    dt = time.perf_counter() - t0
    diff = mx.abs(y.reshape(M // R, R, n).astype(mx.float32) - y0[None])
    rel = mx.max(diff / (mx.abs(y0[None]) + 0.05))  # relative, with a floor for values near 0
    finite = mx.all(mx.isfinite(y))
    mx.eval(rel, finite)
    res = dict(case=name, m=M, n=n, k=k, x_elements=M * k, out_elements=M * n, out_dtype=str(out_dtype),
               seconds=round(dt, 3), max_rel_err=float(rel), all_finite=bool(finite))
    # bf16/fp16 outputs round once (at most 2^-8 relative for bf16), plus fp32 accumulation-order noise.
    res["ok"] = res["all_finite"] and res["max_rel_err"] < 8e-3
    print(json.dumps(res), flush=True)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    print("device", mx.default_device(), flush=True)
    results = [
        case("x past 2^31 elements", k=8192, n=64, out_dtype=mx.bfloat16, epilogue_bias=False),
        case("output past 2^31 elements, epilogue", k=16, n=8200, out_dtype=mx.float16, epilogue_bias=True),
    ]
    if args.out:
        with open(f"{args.out}/large_index.json", "w") as f:
            json.dump(results, f, indent=1)
    raise SystemExit(0 if all(r["ok"] for r in results) else 1)


if __name__ == "__main__":
    main()
