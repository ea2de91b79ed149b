"""Where a prefill's time goes on the GPU machine (run there; needs PyTorch for CUPTI).

For each variant of the decode bench (its `build_model`, one model at a time), the prefill forward as
mlx-lm's `generate_step` runs it (the bench's `prefill_forward_seconds`: the prompt but its last token
into a fresh KV cache, only the cache states evaluated; those tokens' logits are never computed). Prints the Python graph build and the
`mx.eval` wall time of 8 runs after 3 warm-ups, then, for one run under torch.profiler, the GPU
kernels: count, busy time (the union of their intervals), span and the top kernels by total time.
The bench's prefill tok/s is the time to the first token, which also holds the first decode step.

    python scripts/gpu_prefill_profile.py --variants dense fp4 mlx_nvfp4 --prompt 512 --out p.json
"""

import argparse
import gc
import json
import time

import mlx.core as mx

WARMUP = 3
RUNS = 8
TOP = 12


def busy_us(kernels):
    """Total time (us) covered by at least one kernel: overlapping kernels count once."""
    busy, end = 0.0, None
    for e in kernels:
        s, t = e.time_range.start, e.time_range.end
        if end is None or s > end:
            busy, end = busy + t - s, t
        elif t > end:
            busy, end = busy + t - end, t
    return busy


def profile_variant(variant, preset, layers, prompt_tokens):
    from torch.profiler import ProfilerActivity, profile

    from mlx_fp4.bench import decode

    model, _ = decode.build_model(preset, layers, variant, 0)
    vocab = decode.PRESETS[preset]["vocab_size"]
    prompt = mx.random.randint(0, vocab, (prompt_tokens,), key=mx.random.key(1))
    for _ in range(WARMUP):
        decode.prefill_forward_seconds(model, prompt)
    walls = [decode.prefill_forward_seconds(model, prompt) for _ in range(RUNS)]
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        profiled = decode.prefill_forward_seconds(model, prompt)
    ks = sorted((e for e in prof.events() if e.device_type.name == "CUDA"), key=lambda e: e.time_range.start)
    by_name = {}
    for e in ks:
        n, us = by_name.get(e.name[:80], (0, 0.0))
        by_name[e.name[:80]] = (n + 1, us + e.time_range.end - e.time_range.start)
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:TOP]
    return {"build_ms": [round(b * 1e3, 2) for b, _ in walls], "eval_ms": [round(e * 1e3, 2) for _, e in walls],
            "profiled_wall_ms": round(sum(profiled) * 1e3, 2), "kernels": len(ks),
            "gpu_busy_ms": round(busy_us(ks) / 1e3, 2),
            "gpu_span_ms": round((ks[-1].time_range.end - ks[0].time_range.start) / 1e3, 2) if ks else None,
            "top": [(k, n, round(us / 1e3, 3)) for k, (n, us) in top]}


def main():
    from mlx_fp4.bench import decode

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", nargs="+", default=["dense", "fp4", "mlx_nvfp4"], choices=decode.VARIANTS)
    p.add_argument("--preset", default="llama3-8b", choices=sorted(decode.PRESETS))
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--out", default=None, help="JSON file")
    args = p.parse_args()
    if args.prompt < 2:
        p.error(f"--prompt expected >= 2 tokens (one before the first token) but got {args.prompt}")
    try:
        import torch  # noqa: F401  (CUPTI through torch.profiler)
    except ImportError:
        p.error("needs PyTorch (torch.profiler records the GPU kernels)")
    mx.set_default_device(mx.gpu)
    out = {}
    for variant in args.variants:
        r = out[variant] = profile_variant(variant, args.preset, args.layers, args.prompt)
        print(variant, json.dumps({k: v for k, v in r.items() if k != "top"}), flush=True)
        for name, n, ms in r["top"]:
            print(f"   {ms:8.3f} ms {n:5d}x {name}", flush=True)
        gc.collect()
        mx.clear_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "variants": out}, f, indent=1)


if __name__ == "__main__":
    main()
