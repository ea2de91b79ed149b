"""Throughput of an FP4 MLP stack on one rank vs tensor-parallel over a group.

    python scripts/scale_out_bench.py --json one.json                  # 1 rank (no launcher)
    mlx.launch -n 2 --backend nccl scripts/scale_out_bench.py --json two.json

The stack is L residual SwiGLU blocks  x += down(silu(gate(x)) * up(x))  with hidden H and
intermediate I (default 8192 / 28672, the Llama-3-70B MLP), random NVFP4 weights (the
layers' own random init), no bias. One rank: mlx_fp4.nn.FP4Linear with the fused
mlx_fp4.nn.swiglu. A group of n: gate/up FP4AllToShardedLinear (I/n rows each, SwiGLU fused
through fp4_matmul), down FP4ShardedToAllLinear (I/n columns each, one all_sum per block).

For each token count M it times `--iters` forwards after `--warmup` (each forward ends in
mx.eval, so timings include the all_sums), and reports ms/forward, tokens/s and the weight
bytes streamed per second by each rank. Rank 0 writes the JSON. Weights are random, so this
measures speed only (tests/distributed_worker.py checks correctness).
"""

import argparse
import json
import os
import platform
import time

import mlx.core as mx

import mlx_fp4
from mlx_fp4 import distributed as D
from mlx_fp4 import nn as fnn
from mlx_fp4.bench.sharded import no_comm


def build(h, i, layers, group):
    n = group.size()
    blocks = []
    for _ in range(layers):
        if n == 1:
            g, u, d = fnn.FP4Linear(h, i, bias=False), fnn.FP4Linear(h, i, bias=False), fnn.FP4Linear(i, h, bias=False)
        else:
            g = D.FP4AllToShardedLinear(h, i, bias=False, group=group)
            u = D.FP4AllToShardedLinear(h, i, bias=False, group=group)
            d = D.FP4ShardedToAllLinear(i, h, bias=False, group=group)
        mx.eval(g.parameters(), u.parameters(), d.parameters())
        blocks.append((g, u, d))
    return blocks


def forward(blocks, x):
    for g, u, d in blocks:
        if isinstance(g, D.FP4AllToShardedLinear):
            hdn = g.fp4_matmul(x, epilogue=["silu", ("mul", u(x))])
        else:
            hdn = fnn.swiglu(x, g, u)
        x = x + d(hdn)
    return x


def weight_bytes(blocks):
    total = 0
    for layer in (m for b in blocks for m in b):
        total += layer["weight"].nbytes + layer["scales"].nbytes
    return total


def allsum_sweep(args, group, dtype):
    """ms per all_sum of [M, hidden] arrays alone (no compute around it), fp32 and ``dtype``: the
    cost the sharded-to-all layers add per block, to set against the stack's measured slowdown."""
    rows = []
    for m in [int(t) for t in args.allsum_sweep.split(",")]:
        for dt in dict.fromkeys([mx.float32, dtype]):
            x = mx.ones((m, args.hidden), dt)
            mx.eval(x)
            for _ in range(args.warmup):
                mx.eval(mx.distributed.all_sum(x, group=group))
            t0 = time.perf_counter()
            for _ in range(args.iters):
                x = mx.distributed.all_sum(x, group=group) * 0.5  # chained: no two in flight at once
                mx.eval(x)
            ms = (time.perf_counter() - t0) / args.iters * 1e3
            rows.append({"tokens": m, "dtype": str(dt), "bytes": x.nbytes, "ms": ms, "GBps": x.nbytes / ms / 1e6})
            if group.rank() == 0:
                print(f"all_sum [{m}, {args.hidden}] {dt}: {ms:.3f} ms ({x.nbytes / ms / 1e6:.1f} GB/s)", flush=True)
    if group.rank() == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"ranks": group.size(), "hidden": args.hidden, "mlx": mx.__version__, "host": platform.node(),
                       "allsum": rows}, f, indent=1)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--intermediate", type=int, default=28672)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokens", default="1,8,32,128,512,2048")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument(
        "--reduce",
        default="float32",
        choices=["float32", "output"],
        help="sharded-to-all reduce dtype: float32 (default) or the output dtype",
    )
    ap.add_argument("--device", default="gpu", choices=["gpu", "cpu"])
    ap.add_argument("--no-comm", action="store_true",
                    help="all_sum as the identity (compute only; with the real run: the communication time)")
    ap.add_argument("--allsum-sweep", default=None, metavar="M,...",
                    help="instead: time all_sum alone of [M, hidden] partials (fp32 and the activation dtype)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    dev = mx.gpu if args.device == "gpu" else mx.cpu
    mx.set_default_device(dev)
    group = mx.distributed.init()  # the launcher's backend; a singleton group without one
    n, rank = group.size(), group.rank()
    dtype = getattr(mx, args.dtype)
    mx.random.seed(1234 + rank)

    blocks = build(args.hidden, args.intermediate, args.layers, group)
    if n > 1:
        for _, _, d in blocks:
            d.reduce_dtype = None if args.reduce == "output" else mx.float32
    wbytes = weight_bytes(blocks)

    def barrier():
        if n > 1:
            mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group))

    if args.allsum_sweep:
        return allsum_sweep(args, group, dtype)
    rows = []
    for m in [int(t) for t in args.tokens.split(",")]:
        x = (mx.random.normal((m, args.hidden)) * 0.1).astype(dtype)
        mx.eval(x)
        for _ in range(args.warmup):
            mx.eval(forward(blocks, x))
        barrier()
        t0 = time.perf_counter()
        with no_comm(args.no_comm):
            for _ in range(args.iters):
                mx.eval(forward(blocks, x))
        barrier()
        dt = (time.perf_counter() - t0) / args.iters
        if n > 1:  # the slowest rank decides
            dt = D.group_max(mx.array(dt), group).item()
        rows.append(
            {
                "tokens": m,
                "ms_per_forward": dt * 1e3,
                "tokens_per_s": m / dt,
                "weight_GBps_per_rank": wbytes / dt / 1e9,
            }
        )
        if rank == 0:
            r = rows[-1]
            print(
                f"ranks={n} M={m:5d}  {r['ms_per_forward']:9.3f} ms  {r['tokens_per_s']:12.1f} tok/s  "
                f"{r['weight_GBps_per_rank']:8.1f} GB/s weights/rank",
                flush=True,
            )
    if rank == 0 and args.json:
        info = {
            "ranks": n,
            "device": args.device,
            "hidden": args.hidden,
            "intermediate": args.intermediate,
            "layers": args.layers,
            "dtype": args.dtype,
            "reduce": args.reduce if n > 1 else None,
            "no_comm": args.no_comm,
            "env": {k: os.environ[k] for k in ("MLX_USE_CUDA_GRAPHS", "NCCL_NVLS_ENABLE", "MLX_FP4_CUDA_PATH") if k in os.environ},
            "weight_bytes_per_rank": wbytes,
            "mlx": mx.__version__,
            "mlx_fp4": mlx_fp4.__version__,
            "host": platform.node(),
            "rows": rows,
        }
        with open(args.json, "w") as f:
            json.dump(info, f, indent=1)


if __name__ == "__main__":
    main()
