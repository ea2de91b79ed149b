"""python -m mlx_fp4.bench metal-report: one JSON + Markdown report from any Mac.

1. The GPU: name, architecture (generation: M1 = 13 ... M5 = 17), macOS, MLX and mlx_fp4 versions.
2. Correctness: every Metal kernel configuration forced in turn (MLX_FP4_METAL_KERNEL) on ragged
   and aligned shapes, each dtype, against mlx_fp4 on the CPU (an independent implementation);
   the automatic choice and the route to MLX (MLX_FP4_METAL_ROUTE=mlx) too.
3. Speed at M = 1 ... 16 and the cost model's grid above (benchmarks/results/metal/cost_model.json)
   against mx.quantized_matmul(mode="nvfp4") on the same bytes, as ratios measured in the same run:
   the op as a user calls it (its route: ours or MLX's, by the tuner or the static table) and our
   kernel forced (MLX_FP4_METAL_ROUTE=ours); each row names the route and our kernel. Weight copies
   spanning 4x the largest system-level cache are cycled, so every call reads cold weights. Only on
   an Apple7+ GPU: a paravirtual or other GPU gets no speed table (the reason instead). Then the
   tuner's table (mx_fp4.metal_tuning()) and our own configurations forced where the cost model
   calls them close (CONFIG_TIMINGS).
4. The end-to-end decode benchmark (python -m mlx_fp4.bench decode, 8 layers; needs mlx-lm;
   --no-decode skips it), its JSON next to this report.
5. The MoE benchmark (python -m mlx_fp4.bench moe: Qwen3-30B-A3B MoE MLP at 1 and 16 tokens and a
   512-token sorted prefill, against mx.gather_qmm(mode="nvfp4") and bf16 mx.gather_mm; --no-moe
   skips it), then ours alone with the GEMV over runs of 8 pairs and with the gathered GEMM forced
   (MLX_FP4_METAL_GATHER) at 64, 256, 512 and 1024 tokens (4 to 64 pairs per expert): the
   simulator's cost model puts their crossover between 16 and 32 pairs per expert (docs/metal.md),
   which only a Mac can time. The
   correctness part checks each gathered kernel forced too.

Without an Apple GPU (or with a Metal device lacking what the kernels need) it writes a report
saying so and what would run instead, and exits 0: the report is the result either way.
"""

import argparse
import json
import os
import platform
import sys
import time

import mlx.core as mx
import numpy as np

from . import baselines, report, shapes, timing

CONFIGS = ["gemv1", "gemv2", "gemv4", "gemv8", "gemv16", "gemm64", "gemm64s", "gemm128", "gemm128s"]
GEMV_MAX_M = 16  # the GEMV configurations take up to 16 rows (csrc/shared/tiling_metal.h)
CHECK_SHAPES = [(1, 70, 37), (3, 64, 256), (8, 130, 200), (16, 96, 512), (70, 65, 37), (150, 128, 256)]
# every row count of the vector path, then the cost model's grid (tests/metal_sim/costmodel.py)
GRID_M = list(range(1, GEMV_MAX_M + 1)) + [24, 32, 48, 64, 128, 256, 512, 1024]
SLC_ROTATIONS = 4  # weight bytes cycled = this many times the largest SLC (tuning.SLC_MAX_BYTES)
# Our own alternatives where the cost model calls it close (docs/metal.md), timed forced at
# 4096 x 4096: the GEMV against the GEMM at the vector path's last row count, the staged
# single-buffer BM = 128 pipeline (the default, from the seed's M5 numbers) against the
# double-buffered one at large M.
CONFIG_TIMINGS = {16: ["gemv16", "gemm64"], 256: ["gemm128s", "gemm128"], 1024: ["gemm128s", "gemm128"]}
MOE_TOKENS = ["1", "16", "512"]  # decode, the plan path, a sorted prefill
# The sorted prefill's gathered kernels forced in turn (MLX_FP4_METAL_GATHER) around the rule's
# crossover (kMetalGatherGemmMinRows = 32 pairs per expert: 512 tokens of 128 experts, top-8).
MOE_CROSSOVER_TOKENS = ["64", "256", "512", "1024"]
GATHER_KERNELS = [None, "pairs", "runs", "gemm"]  # the plan's choice, then each forced
GATHER_SHAPE = (8, 70, 200, 160)  # experts, N, K, pairs: a sorted prefill of 20 pairs per expert
DTYPES = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}
# Relative error bound of a GPU result against the CPU one (fp32 output): accumulation order
# only, first order K * 2^-24 of sum |x w|, times a safety factor of 4.
SAFETY = 4.0


def gpu_info():
    if not mx.metal.is_available():
        return {"metal": False}
    info = dict(mx.device_info(mx.gpu))
    arch = str(info.get("architecture", ""))
    gen = int("".join(ch for ch in arch.split("_g")[-1] if ch.isdigit()) or 0) if "_g" in arch else 0
    # the route of csrc/ops.cpp: kernels from Apple7 (M1 = 13) on, MLX's NAX kernel on M5 (>= 17)
    apple = arch.startswith("applegpu_g") and gen >= 13
    why = None if apple else (
        f"GPU architecture '{arch}' is not an Apple7+ Apple GPU (a paravirtual GPU, e.g. a macOS "
        "VM, or another vendor's): the op runs on the CPU there, so timing it against MLX's GPU "
        "kernel would compare a CPU with a GPU")
    return {"metal": True, "device_name": info.get("device_name"), "architecture": arch,
            "generation": gen, "macos": platform.mac_ver()[0],
            "memory_bytes": info.get("memory_size"), "kernels_run": apple,
            "neural_accelerators": gen >= 17, "no_speed_table": why}


def _problem(m, n, k, dtype, seed):
    g = np.random.default_rng([m, n, k, seed])
    packed = mx.array(g.integers(0, 256, size=(n, (k + 1) // 2), dtype=np.uint8))
    scales = mx.array(g.integers(0x20, 0x48, size=(n, (k + 15) // 16), dtype=np.uint8))
    x = mx.array(g.standard_normal((m, k)).astype(np.float32)).astype(dtype)
    return x, packed, scales


def _with_env(name, value, fn):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        return fn()
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def _evaluated_under(name, value, fn):
    """fn() evaluated with the environment variable set (eval_gpu reads it at evaluation)."""
    def run():
        y = fn()
        mx.eval(y)
        return y

    return _with_env(name, value, run) if value else run()


def check_one(m, n, k, dtype, config=None, route=None):
    """(max |gpu - cpu| / bound, NaNs agree) for one problem, fp32 output."""
    import mlx_fp4

    x, packed, scales = _problem(m, n, k, dtype, 0)
    cpu = mlx_fp4.w4a16_matmul(x, packed, scales, out_dtype=mx.float32, stream=mx.cpu)
    wabs = mx.abs(mlx_fp4.dequantize(packed, scales, k=k, dtype=mx.float32, stream=mx.cpu))
    mag = mx.matmul(mx.abs(x.astype(mx.float32)), wabs.T, stream=mx.cpu)

    def gpu_run():
        return mlx_fp4.w4a16_matmul(x, packed, scales, out_dtype=mx.float32, stream=mx.gpu)

    if route:
        gpu = _evaluated_under("MLX_FP4_METAL_ROUTE", route, gpu_run)
    else:
        gpu = _evaluated_under("MLX_FP4_METAL_KERNEL", config, gpu_run)
    # MLX's route rounds the product to x's dtype once (docs/metal.md)
    rounding = 2.0 ** -8 if route == "mlx" and dtype != mx.float32 else 0.0
    return _error_over_bound(gpu, cpu, mag, k, rounding)


def _error_over_bound(gpu, cpu, mag, k, rounding=0.0):
    """(max |gpu - cpu| / bound, NaNs agree): the bound is SAFETY x (K 2^-24 + rounding) x mag."""
    mx.eval(cpu, mag)
    g, c = np.array(gpu), np.array(cpu)
    bound = SAFETY * (k * 2.0 ** -24 + rounding) * np.array(mag) + 1e-30
    nan_ok = bool(np.array_equal(np.isnan(g), np.isnan(c)))
    with np.errstate(invalid="ignore"):
        ratio = np.abs(g - c) / bound
    return (float(np.nanmax(ratio)) if ratio.size else 0.0), nan_ok


def check_gather_one(kernel, dtype, stream=None):
    """check_one for the gathered op on a sorted prefill (GATHER_SHAPE, one row per pair), with
    `kernel` forced (None: the plan's choice), on `stream` (default the GPU) against the CPU."""
    import mlx_fp4

    e, n, k, pairs = GATHER_SHAPE
    g = np.random.default_rng([e, n, k, pairs])
    w = mx.array(g.integers(0, 256, size=(e, n, (k + 1) // 2), dtype=np.uint8))
    s = mx.array(g.integers(0x20, 0x48, size=(e, n, (k + 15) // 16), dtype=np.uint8))
    x = mx.array(g.standard_normal((pairs, 1, k)).astype(np.float32)).astype(dtype)
    rhs = mx.array(np.sort(g.integers(0, e, size=pairs)).astype(np.uint32))

    def run(st):
        return mlx_fp4.gather_w4a16_matmul(x, w, s, rhs_indices=rhs, sorted_indices=True, out_dtype=mx.float32,
                                           stream=st)

    cpu = run(mx.cpu)
    wabs = mx.abs(mlx_fp4.dequantize(w, s, k=k, dtype=mx.float32, stream=mx.cpu))[rhs]
    mag = mx.matmul(mx.abs(x.astype(mx.float32)), wabs.swapaxes(-1, -2), stream=mx.cpu)
    gpu = _evaluated_under("MLX_FP4_METAL_GATHER", kernel, lambda: run(stream or mx.gpu))
    return _error_over_bound(gpu, cpu, mag, k)


def gather_correctness():
    rows = []
    for kernel in GATHER_KERNELS:
        for dname, dt in DTYPES.items():
            config = f"gather_{kernel or 'auto'}"
            try:
                ratio, nan_ok = check_gather_one(kernel, dt)
                rows.append({"config": config, "dtype": dname, "error_over_bound": ratio, "ok": ratio <= 1.0 and nan_ok})
            except Exception as e:  # report, do not stop
                rows.append({"config": config, "dtype": dname, "ok": False, "error": f"{type(e).__name__}: {e}"})
    return rows


def correctness():
    rows = []
    cases = [(c, None) for c in CONFIGS] + [(None, None), (None, "mlx")]
    for config, route in cases:
        for m, n, k in CHECK_SHAPES:
            if config and config.startswith("gemv") and m > GEMV_MAX_M:
                continue
            if route == "mlx" and k % 16 != 0:
                continue  # MLX's nvfp4 layout needs K % 16 == 0
            for dname, dt in DTYPES.items():
                try:
                    ratio, nan_ok = check_one(m, n, k, dt, config, route)
                    ok = ratio <= 1.0 and nan_ok
                    rows.append({"config": config or ("route_mlx" if route else "auto"), "m": m,
                                 "n": n, "k": k, "dtype": dname, "error_over_bound": ratio,
                                 "ok": ok})
                except Exception as e:  # report, do not stop: the report is the product
                    rows.append({"config": config or route or "auto", "m": m, "n": n, "k": k,
                                 "dtype": dname, "ok": False, "error": f"{type(e).__name__}: {e}"})
    return rows


def speed(grid_nk, grid_m, cfg, memory_bytes=None):
    """Rows of (M, N, K): the op as called (its route), our kernel forced, MLX's, in microseconds."""
    from mlx_fp4 import _ext, tuning

    ours, theirs = baselines.Fp4Impl(), baselines.MlxNvfp4Impl()
    rows = []
    for n, k in grid_nk:
        ws = baselines.WeightSet(shapes.Shape(f"{n}x{k}", n, k))
        copies = baselines.copies_for(ws.shape.weight_bytes, SLC_ROTATIONS * tuning.SLC_MAX_BYTES,
                                      (memory_bytes or 16 << 30) // 4)
        for impl in (ours, theirs):
            impl.setup(ws, copies)
        for m in grid_m:
            x = mx.array(np.random.default_rng(m).standard_normal((m, k)).astype(np.float32))
            x = x.astype(mx.bfloat16)
            row = {"m": m, "n": n, "k": k, "weight_copies": copies,
                   "kernel": _ext._metal_kernel(m, n, k, mx.bfloat16)}
            try:
                a = timing.measure(ours.runner(x), cfg).seconds  # tunes the bucket on first use
                row["route"] = _ext._metal_route_get(m, n, k, mx.bfloat16, "nvfp4") or \
                    _ext._metal_static_route(mx.device_info()["architecture"], m, n, k, mx.bfloat16)
                forced = _with_env("MLX_FP4_METAL_ROUTE", "ours",
                                   lambda: timing.measure(ours.runner(x), cfg).seconds)
                b = timing.measure(theirs.runner(x), cfg).seconds
            except Exception as e:  # e.g. MLX's own kernels on a GPU it does not support
                rows.append({**row, "error": f"{type(e).__name__}: {e}"})
                continue
            rows.append({**row, "mlx_fp4_us": a and a * 1e6, "kernel_us": forced and forced * 1e6,
                         "mlx_nvfp4_us": b and b * 1e6,
                         "speedup_vs_mlx": (b / a) if a and b else None,
                         "kernel_speedup_vs_mlx": (b / forced) if forced and b else None,
                         "weight_gbps": (ws.shape.weight_bytes / a / 1e9) if a else None})
        for impl in (ours, theirs):
            impl.release()
    return rows


def config_speed(cfg, memory_bytes=None, n=4096, k=4096):
    """Our kernel configurations forced (MLX_FP4_METAL_KERNEL, route ours) at CONFIG_TIMINGS."""
    from mlx_fp4 import tuning

    ours = baselines.Fp4Impl()
    ws = baselines.WeightSet(shapes.Shape(f"{n}x{k}", n, k))
    ours.setup(ws, baselines.copies_for(ws.shape.weight_bytes, SLC_ROTATIONS * tuning.SLC_MAX_BYTES,
                                        (memory_bytes or 16 << 30) // 4))
    rows = []
    for m, configs in CONFIG_TIMINGS.items():
        x = mx.array(np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)).astype(mx.bfloat16)
        for config in configs:
            def run(c=config):
                return _with_env("MLX_FP4_METAL_KERNEL", c, lambda: timing.measure(ours.runner(x), cfg).seconds)
            try:
                t = _with_env("MLX_FP4_METAL_ROUTE", "ours", run)
                rows.append({"m": m, "n": n, "k": k, "config": config, "us": t and t * 1e6})
            except Exception as e:  # report, do not stop
                rows.append({"m": m, "n": n, "k": k, "config": config, "error": f"{type(e).__name__}: {e}"})
    ours.release()
    return rows


def markdown(doc):
    g = doc["gpu"]
    out = [f"# mlx_fp4 Metal report\n",
           f"`{doc['command']}`: {g.get('device_name')} ({g.get('architecture')}), macOS "
           f"{g.get('macos')}, mlx {doc['versions']['mlx']}, mlx_fp4 {doc['versions']['mlx_fp4']}\n"]
    if not g.get("metal"):
        out.append(f"\n{doc['note']}\n")
        return "".join(out)
    if not g.get("kernels_run"):
        out.append("\n**This GPU is not Apple7 or later: the op ran on the CPU (the fallback), not on "
                   "the Metal kernels.**\n")
    c = doc["correctness"]
    bad = [r for r in c if not r["ok"]]
    out.append(f"\n## Correctness: {len(c) - len(bad)} of {len(c)} checks pass\n\n")
    out.append("forced kernel configurations (MLX_FP4_METAL_KERNEL), the automatic choice and the "
               "route to MLX, and each gathered kernel forced (MLX_FP4_METAL_GATHER), each dtype, against "
               "mlx_fp4 on the CPU\n\n")
    for r in bad[:20]:
        out.append(f"- FAIL {r}\n")
    if g.get("no_speed_table"):
        out.append(f"\n## No speed table\n\n{g['no_speed_table']}.\n")
    else:
        out.append(_speed_markdown(doc.get("speed", [])))
        out.append(_tuning_markdown(doc.get("tuning")))
        out.append(_configs_markdown(doc.get("configs", [])))
    for name in ("decode", "moe", "moe_runs", "moe_gemm"):
        if name in doc:
            out.append(f"\n{name.capitalize()} benchmark: exit code {doc[name]['exit_code']}, results in "
                       f"`{doc[name]['files']}`\n")
    out.append("\nPlease attach metal_report.json to an issue: it is how the cost model "
               "(docs/metal.md) gets checked against real Apple GPUs.\n")
    return "".join(out)


def _speed_markdown(rows):
    out = ["\n## Speed vs mx.quantized_matmul(mode=\"nvfp4\"), bf16, same run\n\n",
           "`ours` is the op as called (its route), `kernel` our kernel forced "
           "(MLX_FP4_METAL_ROUTE=ours); speedups are MLX's time over ours.\n\n",
           "| N x K | M | route | our kernel | ours (us) | kernel (us) | MLX (us) | speedup | "
           "kernel speedup | weight GB/s |\n|---|---|---|---|---|---|---|---|---|---|\n"]
    fmt = lambda v, p: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
    for r in rows:
        head = f"| {r['n']}x{r['k']} | {r['m']} | {r.get('route', '-')} | {r.get('kernel', '-')} |"
        if "error" in r:
            out.append(f"{head} {r['error']} | | | | | |\n")
            continue
        out.append(f"{head} {fmt(r['mlx_fp4_us'], 1)} | {fmt(r.get('kernel_us'), 1)} | "
                   f"{fmt(r['mlx_nvfp4_us'], 1)} | {fmt(r['speedup_vs_mlx'], 2)} | "
                   f"{fmt(r.get('kernel_speedup_vs_mlx'), 2)} | {fmt(r['weight_gbps'], 0)} |\n")
    return "".join(out)


def _tuning_markdown(t):
    if not t:
        return ""
    out = [f"\n## Measured routes (mx_fp4.metal_tuning(): {'on' if t['enabled'] else 'off'}, "
           f"{t.get('state')}, `{t['path']}`)\n\n",
           "| M bucket | N | K | dtype | mode | route | ours (us) | MLX (us) |\n|---|---|---|---|---|---|---|---|\n"]
    for e in t["decisions"]:
        out.append(f"| {e['bucket']} | {e['n']} | {e['k']} | {e['dtype']} | {e['mode']} | {e['route']} | "
                   f"{e['ours_s'] * 1e6:.1f} | {e['mlx_s'] * 1e6:.1f} |\n")
    return "".join(out)


def _configs_markdown(rows):
    if not rows:
        return ""
    out = ["\n## Our configurations forced, 4096x4096, bf16 (where the cost model calls them close)\n\n",
           "| M | config | us |\n|---|---|---|\n"]
    for r in rows:
        us = r.get("us")
        cell = r.get("error") or ("-" if us is None else f"{us:.1f}")
        out.append(f"| {r['m']} | {r['config']} | {cell} |\n")
    return "".join(out)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m mlx_fp4.bench metal-report", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench-out")
    p.add_argument("--quick", action="store_true", help="4096x4096 only, fewer repeats")
    p.add_argument("--no-decode", action="store_true", help="skip the decode benchmark (needs mlx-lm)")
    p.add_argument("--no-moe", action="store_true", help="skip the MoE benchmark")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[2:] if argv is None else argv)
    import mlx_fp4

    doc = {"schema": 1, "command": "python -m mlx_fp4.bench metal-report " + " ".join(argv or []),
           "gpu": gpu_info(), "versions": {"mlx": mx.__version__,
                                            "mlx_fp4": getattr(mlx_fp4, "__version__", None)},
           "system": report.system_info("gpu" if mx.metal.is_available() else "cpu"),
           "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if not doc["gpu"]["metal"]:
        doc["note"] = ("No Apple GPU (Metal) in this MLX: nothing ran on a GPU. mlx_fp4 runs its CPU "
                       "kernels here; on a Mac this report checks and times the Metal kernels.")
    else:
        doc["correctness"] = correctness() + gather_correctness()
        grid_nk = [(4096, 4096)] if args.quick else [(4096, 4096), (14336, 4096), (4096, 14336)]
        cfg = timing.TimingConfig(repeats=5 if args.quick else 20, budget_s=10.0, max_products=128)
        mx.set_default_device(mx.gpu)
        if not doc["gpu"]["no_speed_table"]:
            doc["speed"] = speed(grid_nk, GRID_M, cfg, doc["gpu"].get("memory_bytes"))
            doc["tuning"] = mlx_fp4.metal_tuning()
            doc["configs"] = config_speed(cfg, doc["gpu"].get("memory_bytes"))
        if not args.no_decode:
            from . import decode

            code = decode.main(["--out", args.out, "--layers", "8", "--no-plot"])
            doc["decode"] = {"exit_code": code, "files": os.path.join(args.out, "decode_*_gpu.*")}
        if not args.no_moe:
            from . import moe

            code = moe.main(["--device", "gpu", "--tokens", *MOE_TOKENS, "--budget", "3", "--out", args.out])
            doc["moe"] = {"exit_code": code, "files": os.path.join(args.out, "moe_gpu.*")}
            for kernel in ("runs", "gemm"):  # the crossover of the sorted prefill's two kernels
                out = os.path.join(args.out, f"moe_{kernel}")
                code = _with_env("MLX_FP4_METAL_GATHER", kernel, lambda o=out: moe.main(
                    ["--device", "gpu", "--tokens", *MOE_CROSSOVER_TOKENS, "--impls", "mlx_fp4", "--budget", "3",
                     "--out", o]))
                doc[f"moe_{kernel}"] = {"exit_code": code, "files": os.path.join(out, "moe_gpu.*")}
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, "metal_report")
    with open(base + ".json", "w") as f:
        json.dump(doc, f, indent=1, default=str)
    with open(base + ".md", "w") as f:
        f.write(markdown(doc))
    print(markdown(doc))
    print(f"[metal-report] wrote {base}.json and {base}.md")
    ok = all(r["ok"] for r in doc.get("correctness", []))
    return 0 if ok else 1
