"""The gathered (MoE) Metal kernel's cost at a sorted prefill, counted as costmodel.py counts the
dense kernels: cost (lane-cycles, costmodel_gpus.py), executed instructions and device bytes of
one dispatch, per pair and weight: one
GEMV pass per pair (no hint), runs of one expert within groups of kMetalGatherRun pairs (one GEMV
pass each), and the plan's choice with the sorted hint (the gathered GEMM from
kMetalGatherGemmMinRows pairs per expert); then runs against the GEMM, both forced, over pairs
per expert (the crossover). mlx-lm's layout: x [P, 1, K], rhs sorted, lhs the default; random
top-k routing.

Decode too: our plan's pair GEMV against mx.gather_qmm's own decode kernel (MLX 0.32.4's
gather_qmv, mlx_kernels.launch_gather) on the same bytes, one row of x per pair, unsorted top-k
routing, at 1 and 4 tokens.

Usage: python tests/metal_sim/gather_cost.py -> benchmarks/results/metal/gather_cost.json
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: common, gather_reference

import costmodel as cm  # noqa: E402
import costmodel_gpus as gpus  # noqa: E402
import simbuild  # noqa: E402
from simcase import BF16  # noqa: E402

# A prefill of Qwen3-30B-A3B's routing density scaled down: 16 experts, top-2, 256 tokens, so
# that an expert gets 32 pairs as at 512 tokens with 128 experts and top-8.
EXPERTS, TOP_K, TOKENS, N, K = 16, 2, 256, 64, 256


def counting_runner():
    exe = simbuild.host_tool("gather_plan")
    lines = subprocess.run([str(exe), "instantiations"], check=True, capture_output=True, text=True).stdout
    keep = [ln for ln in lines.splitlines() if "_xbf16_obf16" in ln]
    source = simbuild.embedded_msl(Path(tempfile.mkdtemp(prefix="gather-embed")))
    return exe, simbuild.build_source_runner("gather-count", source, keep, count=True)


def sorted_prefill(seed=0, experts=EXPERTS, top_k=TOP_K, tokens=TOKENS, n=N, k=K):
    """(x [P, 1, K], packed experts, scales, lhs, rhs) of a sorted prefill with random routing."""
    from common import rng
    from test_metal_sim_gather import experts as make_experts

    g = rng("gather-cost", seed)
    w_bytes, scales = make_experts(g, experts, n, k)
    rhs = np.sort(np.concatenate([g.choice(experts, top_k, replace=False) for _ in range(tokens)])).astype(np.uint32)
    pairs = len(rhs)
    x = g.standard_normal((pairs, 1, k)).astype(np.float32)
    return x, w_bytes, scales, np.arange(pairs, dtype=np.uint32), rhs


def count(sim, work, problem, sorted_hint, force=None):
    """Counted instructions and device bytes of one dispatch, per pair and weight of an expert."""
    from test_metal_sim_gather import run_gather

    x, w_bytes, scales, lhs, rhs = problem
    tag = f"{len(rhs)}-{int(sorted_hint)}-{force}"
    counts = Path(work) / f"counts-{tag}.txt"
    os.environ["MSIM_COUNT_OUT"] = str(counts)  # the counting runner writes its counts there
    launch = {}
    try:
        run_gather(sim, Path(work) / f"run-{tag}", x=x, w_bytes=w_bytes, scales=scales, lhs=lhs, rhs=rhs,
                   x_dtype=BF16, out_dtype=BF16, sorted_hint=sorted_hint, launch=launch, force=force)
    finally:
        del os.environ["MSIM_COUNT_OUT"]
    return per_pair(sim[1], counts, problem, int(launch["threads"]), kernel=launch["kernel"], grid=launch["grid"])


def per_pair(runner, counts, problem, threadgroup_threads, **fields):
    """`fields`, the pairs, and one dispatch's counted instructions and device bytes per pair and
    weight of an expert."""
    x, w_bytes, _, _, rhs = problem
    cls, mem = cm.read_counts(runner, counts)
    weights = len(rhs) * w_bytes.shape[1] * x.shape[-1]  # pairs x one expert's weights
    s = cm.summarize(cls, mem, weights, threadgroup_threads)
    return {**fields, "pairs": len(rhs), "cost_per_pair_weight": gpus.cost(s["by_class"], COST_GEN),
            "instructions_per_pair_weight": s["instructions_per_weight"],
            "device_bytes_per_pair_weight": s["device_bytes_per_weight"]}


# The generation whose lane-cycle weights cost the counts (costmodel_gpus.py: the same matrix
# rate on M1-M5, so any one gives the same numbers).
COST_GEN = 16


# Decode: Qwen3-30B-A3B's K (2048; MLX's fast kernel needs K % 512 == 0) and top-8, fewer
# experts and rows (the count is per pair and weight, one pass over each pair's expert).
DECODE_EXPERTS, DECODE_TOP_K, DECODE_N, DECODE_K, DECODE_TOKENS = 16, 8, 128, 2048, (1, 4)


def decode_problem(tokens, seed=0):
    """(x [T, 1, K], packed experts, scales, lhs, rhs): distinct top-k experts per token."""
    from common import rng
    from test_metal_sim_gather import experts as make_experts

    g = rng("gather-cost-decode", tokens, seed)
    w_bytes, scales = make_experts(g, DECODE_EXPERTS, DECODE_N, DECODE_K)
    rhs = np.concatenate([g.choice(DECODE_EXPERTS, DECODE_TOP_K, replace=False) for _ in range(tokens)])
    x = g.standard_normal((tokens, 1, DECODE_K)).astype(np.float32)
    lhs = np.arange(len(rhs), dtype=np.uint32) // DECODE_TOP_K
    return x, w_bytes, scales, lhs, rhs.astype(np.uint32)


def count_mlx_decode(runner, work, problem):
    """mx.gather_qmm's decode kernel on `problem`, counted like ours (bf16 x and output)."""
    import ml_dtypes
    import mlx_kernels as mk

    x, w_bytes, scales, lhs, rhs = problem
    counts = Path(work) / f"mlx-decode-{len(rhs)}.txt"
    kind, _ = mk.launch_gather(runner, Path(work) / f"mlx-decode-{len(rhs)}", x.astype(ml_dtypes.bfloat16), w_bytes,
                               scales, lhs, rhs, dtype="bfloat16", env=cm.counting_env(counts))
    return per_pair(runner, counts, problem, 64, kernel=f"mlx {kind}")  # 32 x 2 threads per group


def decode(sim, work):
    import mlx_kernels as mk

    mlx = mk.build_runner(count=True, only=[mk.name("gather_qmv_fast", "bfloat16")])
    rows = []
    for tokens in DECODE_TOKENS:
        p = decode_problem(tokens)
        rows.append({"tokens": tokens, "ours": count(sim, work, p, False), "mlx": count_mlx_decode(mlx, work, p)})
    return {"problem": {"experts": DECODE_EXPERTS, "top_k": DECODE_TOP_K, "n": DECODE_N, "k": DECODE_K,
                        "x": "bf16", "out": "bf16", "mode": "nvfp4", "routing": "unsorted"}, "points": rows}


# Pairs per expert of the crossover sweep (runs of 8 pairs vs the GEMM, both forced): tokens =
# rows x EXPERTS / TOP_K.
SWEEP_ROWS = (2, 4, 8, 16, 32)


def compute(work=None):
    sim = counting_runner()
    work = Path(work or tempfile.mkdtemp(prefix="gather-cost"))
    problem = sorted_prefill()
    sweep = []
    for rows in SWEEP_ROWS:
        p = sorted_prefill(tokens=rows * EXPERTS // TOP_K)
        sweep.append({"pairs_per_expert": rows, "runs": count(sim, work, p, True, "runs"),
                      "gemm": count(sim, work, p, True, "gemm")})
    return {"problem": {"experts": EXPERTS, "top_k": TOP_K, "tokens": TOKENS, "n": N, "k": K,
                        "x": "bf16", "out": "bf16", "mode": "nvfp4"},
            "per_pair": count(sim, work, problem, False), "runs": count(sim, work, problem, True, "runs"),
            "plan": count(sim, work, problem, True), "crossover": sweep, "decode": decode(sim, work)}


def main():
    doc = compute()
    out = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "metal" / "gather_cost.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
