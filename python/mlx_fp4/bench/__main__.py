"""CLI: python -m mlx_fp4.bench [--device cpu|gpu] [--quick] [--shapes NxK ...] [--m M ...] [--out DIR].

python -m mlx_fp4.bench decode [...]: the end-to-end decode benchmark (bench/decode.py).
python -m mlx_fp4.bench metal-report [...]: correctness + speed report for Apple GPUs (bench/metal_report.py).
python -m mlx_fp4.bench moe [...]: one mixture-of-experts MLP, Qwen3-30B-A3B shapes (bench/moe.py).
python -m mlx_fp4.bench quality [...]: perplexity and bits per weight of 4-bit variants of one model (bench/quality.py).
python -m mlx_fp4.bench sharded [...]: tensor-parallel decode/prefill under mlx.launch (bench/sharded.py)."""

import argparse
import math
import os
import sys
import time

import mlx.core as mx
import numpy as np

from . import baselines, plot, report, shapes, timing

OURS = "mlx_fp4"
STEM = "w4a16_matmul"
SHARE_X_ENV = "MLX_FP4_CUDA_WGMMA_SHARE_X"


def _gpu_available() -> bool:
    return mx.metal.is_available() or mx.cuda.is_available()


def parse_args(argv=None, prog="python -m mlx_fp4.bench"):
    p = argparse.ArgumentParser(
        prog=prog,
        description="Benchmark mlx_fp4.w4a16_matmul against mx.quantized_matmul(nvfp4), dense bf16 "
        "and the rooflines on real layer shapes.",
    )
    p.add_argument("--device", choices=("cpu", "gpu"), default=None, help="default: gpu when MLX has one, else cpu")
    p.add_argument("--quick", action="store_true", help="one shape (4096x4096), M in {1, 64}, 5 repeats, 10 s budget")
    p.add_argument("--shapes", nargs="+", metavar="NxK", help="layer shapes N x K (default: Llama-3-8B layers + 8192^2)")
    p.add_argument("--m", nargs="+", type=int, metavar="M", help="rows of x (default: 1..256 on cpu, 1..8192 on gpu)")
    p.add_argument("--out", default="bench-out", help="output folder for the JSON, table and PNG")
    p.add_argument("--repeats", type=int, help="timed evals per point (default 10 cpu, 20 gpu, 5 quick)")
    p.add_argument("--budget", type=float, help="seconds per (point, implementation); longer ones are skipped "
                   "(default 30 cpu, 10 gpu and quick; 0 = no limit)")
    p.add_argument("--impls", nargs="+", choices=list(baselines.IMPLS), help="implementations to run (default all)")
    p.add_argument("--rotate-mb", type=float, help="rotate weight copies spanning this many MB to defeat caches "
                   "(default 2x last-level cache on cpu, 256 on gpu; 0 = one copy)")
    p.add_argument("--max-products", type=int, help="most independent products per mx.eval (128 gpu, 32 cpu)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mode", choices=tuple(shapes.MODE_GROUP), default="nvfp4",
                   help="FP4 format of ours and of MLX's kernel (mlx_nvfp4 runs mx.quantized_matmul in this mode)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    return p.parse_args(argv)


# Subcommands, each a module of this package with its own main(argv).
SUBCOMMANDS = {"decode": "decode", "metal-report": "metal_report", "moe": "moe", "quality": "quality",
               "sharded": "sharded"}


def main(argv=None, prog="python -m mlx_fp4.bench") -> int:
    argv_list = sys.argv[1:] if argv is None else list(argv)
    if argv_list[:1] and argv_list[0] in SUBCOMMANDS:
        import importlib

        module = importlib.import_module(f".{SUBCOMMANDS[argv_list[0]]}", __package__)
        return module.main(argv_list[1:])
    args = parse_args(argv, prog)
    device = args.device or ("gpu" if _gpu_available() else "cpu")
    if device == "gpu" and not _gpu_available():
        print("[bench] --device gpu expected an MLX build with Metal or CUDA but got a CPU-only MLX.", file=sys.stderr)
        return 2
    mx.set_default_device(mx.gpu if device == "gpu" else mx.cpu)
    # Each timed product here reads the same x: CUDA's reuse of the permuted x between products of
    # one x (csrc/cuda/wgmma_x_cache.h) would drop the permutation from all but the first. A product
    # is timed alone, permutation included, unless the caller set the variable.
    os.environ.setdefault(SHARE_X_ENV, "0")

    group = shapes.MODE_GROUP[args.mode]
    shape_list = ([shapes.parse_shape(s, group) for s in args.shapes] if args.shapes
                  else shapes.default_shapes(args.quick, group))
    m_list = sorted(set(args.m)) if args.m else shapes.default_m(device, args.quick)
    if any(m <= 0 for m in m_list):
        raise SystemExit(f"[bench] --m expected positive integers but got {m_list}")
    budget = args.budget if args.budget is not None else (10.0 if args.quick or device == "gpu" else 30.0)
    cfg = timing.TimingConfig(
        repeats=args.repeats or (5 if args.quick else (20 if device == "gpu" else 10)),
        budget_s=budget if budget > 0 else math.inf,
        max_products=max(1, args.max_products or (128 if device == "gpu" else 32)),
    )
    impl_names = args.impls or baselines.default_impls(device)
    if device == "gpu" and "numpy_fp32" in impl_names:
        impl_names = [n for n in impl_names if n != "numpy_fp32"]
    impls = []
    for name in impl_names:
        try:
            impls.append(baselines.IMPLS[name]())
        except ImportError as e:
            print(f"[bench] cannot run {name}: {e}. Build the extension (bash tools/dev-build.sh) or pass "
                  f"--impls without {name}.", file=sys.stderr)
            return 2

    info = report.system_info(device)
    llc = info["llc_bytes"]
    if args.rotate_mb is not None:
        rotate_bytes = int(args.rotate_mb * 1e6)
    else:
        rotate_bytes = (2 * llc if llc else 64 << 20) if device == "cpu" else 256 << 20
    mem_cap = info["memory_available_bytes"] // 8
    threads = info["threads"]["cpus"]
    os.makedirs(args.out, exist_ok=True)

    print(f"mlx_fp4 bench: {device} ({info['device_name']}), mlx {info['versions']['mlx']}, "
          f"commit {(info['git']['commit'] or 'unknown')[:12]}; threads: {threads} CPUs, "
          f"mlx_fp4 {info['threads']['mlx_fp4']}, numpy BLAS {info['threads']['numpy_blas']['threads']} "
          f"({info['numpy_blas']['name']} {info['numpy_blas']['core'] or ''})"
          + (f"; mlx_fp4 CPU loops {info['mlx_fp4_cpu']['hot_loops']}" if (info["mlx_fp4_cpu"] or {}).get("hot_loops") else ""))
    print(f"timing: {cfg.describe()}")
    llc_note = f" (CPU last-level cache {llc / 2**20:.0f} MiB)" if device == "cpu" and llc else ""
    print(f"cache defeat: weight copies rotated over >= {rotate_bytes / 1e6:.0f} MB{llc_note}, at most "
          f"{baselines.MAX_COPIES} copies and {mem_cap / 1e9:.1f} GB per implementation")

    load = info["load_average_1m_at_start"]
    if device == "cpu" and load is not None and load > max(1.0, 0.25 * threads):
        print(f"WARNING: 1-minute load average is {load} before the run: other processes share the CPU, "
              "so CPU numbers will be noisy.", file=sys.stderr)
    rooflines = {}
    if device == "gpu":
        print("measuring GPU rooflines (copy bandwidth, dense bf16 peak) ...", flush=True)
        rooflines["bandwidth"] = baselines.gpu_copy_roofline((256 if args.quick else 1024) << 20, cfg)
        rooflines["compute"] = baselines.gpu_dense_peak(4096 if args.quick else 8192, cfg)
        ways = ", ".join(f"{k} {v['gbps']:.4g}" for k, v in rooflines["bandwidth"]["ways"].items())
        print(f"  bandwidth {rooflines['bandwidth']['gbps']:.4g} GB/s (best of {ways}), "
              f"dense bf16 {rooflines['compute']['tflops']:.4g} TFLOP/s")

    from tqdm import tqdm

    bar = tqdm(total=len(shape_list) * len(m_list) * len(impls), unit="pt", file=sys.stderr,
               disable=True if args.no_progress else None, dynamic_ncols=True)
    extrap = timing.Extrapolator()
    points, checks = [], {}
    for shape in shape_list:
        ws = baselines.WeightSet(shape, seed=args.seed, mode=args.mode)
        if device == "cpu":
            bar.set_postfix_str(f"{shape.name} copy roofline")
            roof = baselines.cpu_copy_roofline(shape.weight_bytes, threads, rotate_bytes, mem_cap, cfg)
            rooflines.setdefault("bandwidth_per_shape", {})[shape.name] = roof
            bw_gbps = roof["gbps"]
        else:
            bw_gbps = rooflines["bandwidth"]["gbps"]
        inputs = {}

        def x_for(m):
            if m not in inputs:
                x = mx.random.normal((m, shape.k), key=mx.random.key(args.seed * 100003 + m)).astype(mx.bfloat16)
                mx.eval(x)
                inputs[m] = (x, np.array(x.astype(mx.float32)) if device == "cpu" else None)
            return inputs[m]

        by_m = {m: {"shape": shape.name, "n": shape.n, "k": shape.k, "m": m, "flops": shape.flops(m),
                    "weight_bytes": shape.weight_bytes, "traffic_bytes": shape.traffic_bytes(m),
                    "weights_fit_llc": (shape.weight_bytes <= llc) if (device == "cpu" and llc) else None,
                    "results": {}} for m in m_list}
        for impl in impls:
            copies = baselines.copies_for(impl.weight_bytes(shape), rotate_bytes, mem_cap)
            bar.set_postfix_str(f"{shape.name} {impl.name} setup ({copies} copies)")
            impl.setup(ws, copies)
            for m in m_list:
                bar.set_postfix_str(f"{shape.name} {impl.name} M={m}")
                key = (shape.name, impl.name)
                try:
                    if not extrap.known(key) and m > 1 and math.isfinite(cfg.budget_s):
                        # Seed the budget's prediction with one product at M=1 (after a warm one).
                        extrap.record(key, 1, timing.seed_seconds(impl.runner(impl.make_input(*x_for(1)))))
                    meas = timing.measure(impl.runner(impl.make_input(*x_for(m))), cfg, extrap.predict(key, m))
                except Exception as e:  # a missing kernel must not hide the other numbers
                    meas = timing.Measurement(status=f"error: {type(e).__name__}: {e}")
                    print(f"\n[bench] {impl.name} {shape.name} M={m}: {meas.status}", file=sys.stderr)
                extrap.record(key, m, meas.seconds)
                entry = report.result_entry(impl, meas, shape, m)
                entry["weight_copies"] = copies
                by_m[m]["results"][impl.name] = entry
                bar.update()
            if impl.name == OURS:  # after timing: its NumPy BLAS threads would disturb our first products
                checks[shape.name] = correctness_check(impl, ws, shape, args.seed)
            impl.release()
        for m in m_list:
            p = by_m[m]
            if device == "cpu":
                np_res = p["results"].get("numpy_fp32", {})
                report.finish_point(p, OURS, bw_gbps, np_res.get("tflops"), "numpy_fp32 at the same point")
            else:
                report.finish_point(p, OURS, bw_gbps, rooflines["compute"]["tflops"], rooflines["compute"]["method"])
            points.append(p)
        del ws, inputs
    bar.close()

    info["load_average_1m_at_end"] = report.load_average()
    doc = {
        "schema": 1,
        "command": "python -m mlx_fp4.bench " + " ".join(sys.argv[1:] if argv is None else argv),
        "device": info,
        "config": {"shapes": [s.name for s in shape_list], "m": m_list, "quick": args.quick,
                   "repeats": cfg.repeats, "budget_s": cfg.budget_s if math.isfinite(cfg.budget_s) else None,
                   "seed": args.seed, "mode": args.mode},
        "timing_method": {
            "description": cfg.describe(),
            "statistic": "median over repeats of (eval wall time / products per eval)",
            "launch_overhead": "each timed mx.eval evaluates products_per_eval independent products; the time per "
            "product divides the eval's wall time by that count, so one eval's fixed cost is shared",
            "cache": f"weight copies rotated over >= {rotate_bytes} bytes (2x last-level cache on cpu), "
            f"at most {baselines.MAX_COPIES} copies; each product reads the next copy",
            "rotate_bytes": rotate_bytes,
            "target_eval_s": cfg.target_eval_s,
            "max_products_per_eval": cfg.max_products,
            "weights": "random FP4 codes and E4M3 scale codes 0x08..0x27 (values do not change the timing)",
            "cuda_share_permuted_x": os.environ[SHARE_X_ENV] != "0",
        },
        "rooflines": rooflines,
        "implementations": {i.name: i.label.replace('"nvfp4"', f'"{args.mode}"') for i in impls},
        "ours": OURS,
        "checks": checks,
        "points": points,
    }
    base = os.path.join(args.out, f"{STEM}_{device}" + ("" if args.mode == "nvfp4" else f"_{args.mode}"))
    text = report.table(points, OURS, [i.name for i in impls], args.mode)
    print()
    print(text)
    print(report.roofline_lines(doc))
    print(report.LEGEND)
    for name, c in checks.items():
        if not c["ok"]:
            print(f"WARNING: {name}: mlx_fp4 relative error {c['rel_err']:.2e} vs float64 NumPy", file=sys.stderr)
    report.write_json(base + ".json", doc)
    with open(base + ".md", "w") as f:
        f.write(f"`{doc['command']}` on {info['device_name']} ({device}), mlx {info['versions']['mlx']}, "
                f"commit {(info['git']['commit'] or 'unknown')[:12]}\n\n{text}\n\n"
                f"{report.roofline_lines(doc)}\n\n{report.LEGEND}\n")
    written = [base + ".json", base + ".md"]
    if not args.no_plot and plot.plot(doc, base + ".png"):
        written.append(base + ".png")
    print("wrote " + ", ".join(written))
    return 0


def correctness_check(impl, ws, shape, seed: int, m: int = 3) -> dict:
    """Relative L2 error of our product vs float64 NumPy on the MLX-decoded weight (guards the numbers)."""
    x = mx.random.normal((m, shape.k), key=mx.random.key(seed + 7)).astype(mx.bfloat16)
    y = impl.output(x)
    ref = np.array(x.astype(mx.float32)).astype(np.float64) @ ws.dense_f32_np.T.astype(np.float64)
    rel = float(np.linalg.norm(y - ref) / max(np.linalg.norm(ref), 1e-30))
    # bf16 output rounding alone gives ~2^-9 relative error.
    return {"m": m, "rel_err": rel, "ok": bool(rel < 1e-2), "reference": f"float64 numpy on mx.dequantize({ws.mode})"}


if __name__ == "__main__":
    sys.exit(main())
