"""Where the MoE MLP's decode time goes on the GPU, kernel by kernel, inside MLX's graph.

    PYTHONPATH=python python3 scripts/gpu_moe_decode_profile.py [--tokens 1] > log

The bench's MoE MLP (python -m mlx_fp4.bench moe: Qwen3-30B-A3B experts, device routing, 64
independent layer calls per mx.eval) for ours and mx.gather_qmm(mode="nvfp4"), and each
projection alone with fixed indices (only its own kernels), under PyTorch's profiler: CUPTI records
every kernel of the process, MLX's included, with its GPU duration. Prints per case the kernels'
mean durations and the GPU span and busy time per layer call. Needs torch with CUDA (the device
machine has it); the kernel harness (gather_kernel_harness bench) times the same kernels alone.
With --serial each call is evaluated on its own (nothing overlaps: each kernel's duration is its
own, as in a model's decode, layer after layer) and every projection routes to fresh random
experts (cold weights); without it the 64 calls run concurrently and the fixed-index projections
find their experts in L2.
"""

import argparse

import mlx.core as mx
import numpy as np

CALLS = 64  # independent layer calls per mx.eval, as the bench batches them
WARMUP = 3


def profile_case(name, make, serial=False):
    from torch.profiler import ProfilerActivity, profile

    for _ in range(WARMUP):
        mx.eval([make() for _ in range(CALLS)])
    outs = [make() for _ in range(CALLS)]  # built outside the profile: GPU work only below
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for group in ([o] for o in outs) if serial else [outs]:
            mx.eval(group)
            mx.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type.name == "CUDA"), key=lambda e: e.time_range.start)
    print(f"===== {name}: {CALLS} calls")
    by_name = {}
    for e in kernels:
        by_name.setdefault(e.name[:90], []).append(e.time_range.end - e.time_range.start)
    for k, v in sorted(by_name.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {sum(v) / CALLS:8.2f} us/call  {len(v) / CALLS:4.1f}x  mean {np.mean(v):7.2f} us  {k}")
    if kernels:
        span = kernels[-1].time_range.end - kernels[0].time_range.start
        busy = sum(e.time_range.end - e.time_range.start for e in kernels)
        if serial:  # the span holds the host's gaps between evals: only the kernels' own time counts
            print(f"  per call: kernels busy {busy / CALLS:.1f} us (serial, nothing overlaps)")
        else:
            print(f"  per call: GPU span {span / CALLS:.1f} us, kernels busy {busy / CALLS:.1f} us")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=1)
    p.add_argument("--serial", action="store_true", help="one call per mx.eval, fresh experts for every call")
    args = p.parse_args()
    import torch

    from mlx_fp4.bench import moe

    torch.zeros(1, device="cuda")  # CUDA context for CUPTI
    cfg = dict(moe.QWEN3_30B_A3B)
    experts = moe.Experts(cfg, 0, False)
    rng = np.random.default_rng(0)
    t = args.tokens
    x = (mx.random.normal((t, cfg["hidden"])) * 0.5).astype(mx.bfloat16)
    idx = moe.routing(t, cfg, rng, "device")
    h = (mx.random.normal((t, cfg["top_k"], 1, cfg["moe_intermediate"])) * 0.5).astype(mx.bfloat16)
    mx.eval(x, idx, h)
    serial = args.serial
    fixed = "fresh" if serial else "fixed"

    def indices():
        if not serial:
            return idx
        fresh = moe.routing(t, cfg, rng, "device")
        mx.eval(fresh)  # routing outside the profiled kernels
        return fresh

    for impl in ("mlx_fp4", "mlx_nvfp4"):
        mm = moe.matmul_fn(impl, experts)
        profile_case(f"{impl}: MoE MLP, routing on the device",
                     lambda: moe.switch_glu(mm, x, moe.routing(t, cfg, rng, "device")), serial)
        profile_case(f"{impl}: gate projection alone (K = {cfg['hidden']}), {fixed} indices",
                     lambda: moe.one_matmul(mm, x, indices()), serial)
        profile_case(f"{impl}: down projection alone (K = {cfg['moe_intermediate']}), {fixed} indices",
                     lambda: mm("down", h, indices(), False), serial)


if __name__ == "__main__":
    main()
