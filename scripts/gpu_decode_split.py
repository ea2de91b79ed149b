"""Where a GPU decode step's time goes: host-bound or GPU-bound, and which kernels (issue 37).

    PYTHONPATH=python python3 scripts/gpu_decode_split.py --variants fp4 floor --out DIR
    MLX_MAX_OPS_PER_BUFFER=100000 MLX_MAX_MB_PER_BUFFER=1000000 ... (one CUDA graph per step: the
        host profile's wait is then the step's whole GPU time, launch gaps included)
    ncu --profile-from-start off --metrics gpu__time_duration.sum[,...] --csv --clock-control none \\
        python3 scripts/gpu_decode_split.py --variants fp4 --ncu-steps 2 > log.csv
    python3 scripts/gpu_decode_split.py --parse log.csv --out DIR   (kernel time per kernel name)

Per variant (the decode bench's models, bench/decode_build.py): pipelined tok/s through mlx-lm's
generate_step, and the host profile of single synchronous steps (build, encode, wait). With
--ncu-steps, only those synchronous steps run between cuProfilerStart and cuProfilerStop, so
Nsight Compute times each of their kernels alone (cold caches: its default cache control).
"""

import argparse
import csv
import ctypes
import json
import os
import sys
from collections import defaultdict

PROMPT = 64
TOKENS = 48


def _profiler(start: bool) -> None:
    lib = ctypes.CDLL("libcuda.so.1")
    rc = (lib.cuProfilerStart if start else lib.cuProfilerStop)()
    if rc != 0:
        raise RuntimeError(f"cuProfiler{'Start' if start else 'Stop'} returned {rc}")


def run_variants(args) -> dict:
    import mlx.core as mx

    from mlx_fp4.bench.decode import time_generation
    from mlx_fp4.bench.decode_build import build_model, step_weight_bytes
    from mlx_fp4.bench.decode_host import _filled_cache, decode_step, host_profile

    mx.set_default_device(mx.gpu if mx.cuda.is_available() else mx.cpu)  # cpu: a dry run of the script
    doc = {"env": {k: v for k, v in os.environ.items() if k.startswith("MLX")}, "variants": {}}
    for variant in args.variants:
        model, notes = build_model(args.preset, args.layers, variant, args.seed)
        prompt = mx.random.randint(0, model.args.vocab_size, (PROMPT,), key=mx.random.key(args.seed))
        time_generation(model, prompt, 8)  # warm-up: kernels loaded, allocator filled
        if args.ncu_steps:
            from mlx_lm.generate import generation_stream

            with mx.stream(generation_stream):
                cache, y = _filled_cache(model, prompt)
                mx.synchronize()
                _profiler(True)
                for _ in range(args.ncu_steps):
                    y, lp = decode_step(model, y, cache)
                    mx.eval(y, lp)
                mx.synchronize()
                _profiler(False)
            continue
        rates = [time_generation(model, prompt, TOKENS)[2] for _ in range(args.repeats)]
        prof = host_profile(model, prompt, 16)
        doc["variants"][variant] = {"decode_tok_s": rates, "host_profile": prof, "notes": notes,
                                    "weight_mb_per_step": step_weight_bytes(model) / 1e6}
        print(f"{variant}: decode {sorted(rates)} tok/s; sync step build {prof['build_ms']:.2f} encode "
              f"{prof['encode_ms']:.2f} wait {prof['wait_ms']:.2f} ms", flush=True)
        del model
        mx.clear_cache()
    return doc


EXTRA_METRICS = ("launch__registers_per_thread", "sm__warps_active.avg.pct_of_peak_sustained_active",
                 "dram__throughput.avg.pct_of_peak_sustained_elapsed")


def parse_ncu(path: str, steps: int) -> dict:
    """ncu --csv output -> total and per-kernel (name and grid) microseconds per step, with the
    means of EXTRA_METRICS where the log has them."""
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]
    per = defaultdict(lambda: {"count": 0, "us": 0.0, **{m: [] for m in EXTRA_METRICS}})
    for r in csv.DictReader(lines):
        # The grid tells one product shape from another for the same kernel.
        name = r["Kernel Name"].split("(")[0][:90] + " grid " + r.get("Grid Size", "?")
        metric, value = r.get("Metric Name"), float(r["Metric Value"].replace(",", "") or "nan")
        if metric == "gpu__time_duration.sum":
            scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(r.get("Metric Unit", "nsecond"), 1e-3)
            per[name]["count"] += 1
            per[name]["us"] += value * scale
        elif metric in EXTRA_METRICS:
            per[name][metric].append(value)
    kernels = sorted(({"kernel": k, "count_per_step": d["count"] / steps, "us_per_step": d["us"] / steps,
                       **{m: sum(d[m]) / len(d[m]) for m in EXTRA_METRICS if d[m]}}
                      for k, d in per.items()), key=lambda d: -d["us_per_step"])
    return {"steps": steps, "total_us_per_step": sum(d["us_per_step"] for d in kernels),
            "kernels_per_step": sum(d["count_per_step"] for d in kernels), "kernels": kernels}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--variants", nargs="+", default=["fp4", "floor"])
    p.add_argument("--preset", default="llama3-8b")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ncu-steps", type=int, default=0)
    p.add_argument("--parse", help="an ncu --csv log to sum up (no GPU work)")
    p.add_argument("--tag", default="split")
    p.add_argument("--out", default="gpu-check-out")
    args = p.parse_args()
    doc = parse_ncu(args.parse, args.ncu_steps or 2) if args.parse else run_variants(args)
    if args.ncu_steps and not args.parse:
        return 0
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"decode_{args.tag}.json"), "w") as f:
        json.dump(doc, f, indent=1)
    if args.parse:
        print(f"total {doc['total_us_per_step']:.0f} us of kernels per step, {doc['kernels_per_step']:.0f} kernels")
        for d in doc["kernels"][:25]:
            extra = " ".join(f"{d[m]:.0f}" for m in EXTRA_METRICS if m in d)
            print(f"  {d['us_per_step']:9.1f} us  x{d['count_per_step']:5.0f}  [{extra}]  {d['kernel']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
