"""The Metal cost model: executed instructions per weight, by class, for our kernels and MLX's
own kernels, in both FP4 modes (nvfp4, mxfp4), counted the same way for both (ir_count.py +
src/counters.cpp).

A counting runner is the kernel translation unit as clang-19 -O2 optimizes it for a scalar
machine (no auto-vectorization), instrumented per basic block and per memory access, then run by
metal_sim on a real problem. Totals are over every thread of the dispatch, divided by N * K (the
weights of the problem): "instructions per weight" is the thread-instructions the GPU issues per
weight. See docs/metal.md for what it predicts and what it cannot.

Usage: python tests/metal_sim/costmodel.py [--quick] -> benchmarks/results/metal/cost_model.json
"""

import json
import os
from pathlib import Path

import ir_count

SPACES = ["private", "device", "constant", "threadgroup", "other"]


def read_counts(runner, count_file):
    blocks = json.loads((Path(runner).parent / "blocks.json").read_text())
    cls = {c: 0 for c in ir_count.CLASSES}
    mem = {}
    for line in Path(count_file).read_text().splitlines():
        f = line.split()
        if f[0] == "block":
            for c, n in blocks[int(f[1])].items():
                cls[c] += n * int(f[2])
        else:
            space, store, n, b = SPACES[int(f[1])], int(f[2]), int(f[3]), int(f[4])
            mem[(space, "store" if store else "load")] = (n, b)
    return cls, mem


def summarize(cls, mem, weights, threadgroup_threads):
    """The cost-model numbers of one dispatch (or a sum of dispatches)."""
    def acc(space, kind):
        return mem.get((space, kind), (0, 0))

    device_instr = sum(acc(s, k)[0] for s in ("device", "constant") for k in ("load", "store"))
    tg_instr = sum(acc("threadgroup", k)[0] for k in ("load", "store"))
    counted = {c: n for c, n in cls.items()}
    counted["device_access"] = device_instr
    counted["threadgroup_access"] = tg_instr
    total = sum(counted.values())
    per_w = {c: n / weights for c, n in counted.items()}
    return {
        "instructions_per_weight": total / weights,
        "device_bytes_per_weight": sum(acc("device", k)[1] for k in ("load", "store")) / weights,
        "threadgroup_bytes_per_weight":
            sum(acc("threadgroup", k)[1] for k in ("load", "store")) / weights,
        # counted once per threadgroup (every thread of it passes the barrier)
        "barriers_per_1k_weights": 1000.0 * cls["barrier"] / threadgroup_threads / weights,
        "by_class": per_w,
        "private_accesses_per_weight":
            sum(acc("private", k)[0] for k in ("load", "store")) / weights,
    }


def counting_env(count_file):
    return dict(os.environ, MSIM_COUNT_OUT=str(count_file))


# ---------------------------------------------------------------------------------------------
# The grid of issue 15: every M, three weight shapes, ours and MLX's (bf16 x and output), per mode.

GRID_M = [1, 2, 4, 8, 16, 32, 64, 256, 1024]
GRID_NK = [(4096, 4096), (14336, 4096), (4096, 14336)]
# Simulated weight rows. Per-weight numbers do not depend on N once N is a multiple of every
# kernel's N tile (ours: 16 for the GEMV, 64 for the GEMM; MLX's: 8, 4 and 32), since each
# threadgroup column does the same work: N = 64 gives the numbers of N = 4096 or 14336 exactly.
# The kernel choice (and MLX's split-K factor) is made for the real N.
SIM_N = 64
MLX_GPU = (16, "s")  # MLX's dispatch for an M4 Max-class GPU (architecture gen 16, 's')
# Our kernels the dispatch picks on the grid, bf16 in and out.
OUR_KERNELS = [f"mlx_fp4_w4a16_gemv_mt{mt}_xbf16_obf16" for mt in (1, 2, 4, 8, 16)] + [
    "mlx_fp4_w4a16_gemm_bm64_bk32_s0_xbf16_obf16", "mlx_fp4_w4a16_gemm_bm128_bk64_s1_xbf16_obf16",
    "mlx_fp4_w4a16_splitk_reduce_obf16"]
MODES = ["nvfp4", "mxfp4"]
ROW_KEYS = ["impl", "mode", "kernel", "m", "n", "k", "instructions_per_weight",
            "device_bytes_per_weight", "threadgroup_bytes_per_weight", "barriers_per_1k_weights"]


# Scale bytes of the counted problems: E4M3 0x20..0x47 (2^-5 .. 15), E8M0 120..135 (2^-7 .. 2^8).
SCALE_CODES = {"nvfp4": (0x20, 0x48, 16), "mxfp4": (120, 136, 32)}


def _problem(m, n, k, mode="nvfp4"):
    import ml_dtypes
    import numpy as np

    lo, hi, block = SCALE_CODES[mode]
    g = np.random.default_rng([m, n, k] + ([] if mode == "nvfp4" else [block]))
    packed = g.integers(0, 256, size=(n, k // 2), dtype=np.uint8)
    scales = g.integers(lo, hi, size=(n, k // block), dtype=np.uint8)
    x = g.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    return x, packed, scales


def ours_row(runner, work, m, n, k, mode="nvfp4"):
    import simcase as sc

    plan = sc.run_plan(runner, m, n, k, sc.BF16, sc.BF16)
    kernel = plan["kernel"][0]
    name = kernel[len("mlx_fp4_w4a16_"):].rsplit("_x", 1)[0]
    # the same kernel (and split-K factor) at the simulated N
    split = int(plan["split"][0])
    force = {"gemm_bm64_bk32_s0": "gemm64", "gemm_bm128_bk64_s1": "gemm128s"}.get(name)
    force = f"{force}k{split}" if force else "gemv" + name[len("gemv_mt"):]
    if split > 1:
        name += f"_splitk{split}"
    x, packed, scales = _problem(m, SIM_N, k, mode)
    count = Path(work) / "ours.counts"
    os.environ["MSIM_COUNT_OUT"] = str(count)
    try:
        _, sim_plan = sc.run_case(runner, Path(work) / "ours", m=m, n=SIM_N, k=k,
                                  x=x.astype("float32"), w_packed=packed, scales=scales,
                                  x_dtype=sc.BF16, out_dtype=sc.BF16, guard="aligned",
                                  force=force, mode=MODES.index(mode))
    finally:
        del os.environ["MSIM_COUNT_OUT"]
    assert sim_plan["kernel"][0] == kernel, (sim_plan, kernel)
    cls, mem = read_counts(runner, count)
    s = summarize(cls, mem, SIM_N * k, int(plan["threads"][0]))
    return name, s


def mlx_row(runner, work, m, n, k, mode="nvfp4"):
    import mlx_kernels as mk

    kind, params = mk.mlx_plan(m, n, k, gpu=MLX_GPU, mode=mode)
    x, packed, scales = _problem(m, SIM_N, k, mode)
    count = Path(work) / "mlx.counts"
    mk.launch(runner, Path(work) / "mlx", x, packed, scales, kind=kind, dtype="bfloat16",
              env=counting_env(count), mode=mode, **params)
    cls, mem = read_counts(runner, count)
    threads = 128 if kind.startswith("qmm") else 64
    s = summarize(cls, mem, SIM_N * k, threads)
    if kind == "qmm_t_splitk":
        # MLX sums the fp32 partials in a separate strided-reduce kernel: one 4-byte load and one
        # add per partial, one 2-byte store per output (added here, not simulated).
        split = params["split_k"]
        outs = m * SIM_N
        w = SIM_N * k
        s["instructions_per_weight"] += (2 * split + 1) * outs / w
        s["device_bytes_per_weight"] += (4 * split + 2) * outs / w
        kind = f"qmm_t_splitk{split}"
    return kind, s


def compute(grid_m=GRID_M, grid_nk=GRID_NK, work=None, log=print, modes=MODES):
    import tempfile

    import mlx_kernels as mk
    import simbuild

    ours = simbuild.build_runner("ours-count", count=True, only=[
        n for n in OUR_KERNELS])
    mlx = mk.build_runner(count=True)
    work = Path(work or tempfile.mkdtemp(prefix="costmodel"))
    rows, classes = [], []
    for mode in modes:
        for n, k in grid_nk:
            for m in grid_m:
                for impl, fn, runner in (("mlx_fp4", ours_row, ours), ("mlx", mlx_row, mlx)):
                    row, cls = _row(impl, mode, fn(runner, work, m, n, k, mode), m, n, k)
                    rows.append(row)
                    classes.append(cls)
                    log(f"{impl:8s} {mode} {row['kernel']:22s} m={m:5d} n={n:5d} k={k:5d} "
                        f"instr/w {row['instructions_per_weight']:8.2f} "
                        f"dev B/w {row['device_bytes_per_weight']:6.3f} "
                        f"tg B/w {row['threadgroup_bytes_per_weight']:6.2f}")
    return rows, classes


def _row(impl, mode, counted, m, n, k):
    """The cost_model.json row and the by-class row of one counted dispatch."""
    kernel, s = counted
    row = dict(zip(ROW_KEYS, [impl, mode, kernel, m, n, k, s["instructions_per_weight"],
                              s["device_bytes_per_weight"], s["threadgroup_bytes_per_weight"],
                              s["barriers_per_1k_weights"]]))
    cls = {"impl": impl, "mode": mode, "kernel": kernel, "m": m, "n": n, "k": k, **s["by_class"],
           "private_accesses_per_weight": s["private_accesses_per_weight"]}
    return row, cls


def main(argv):
    import sys

    out = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "metal"
    out.mkdir(parents=True, exist_ok=True)
    rows, classes = compute(log=lambda s: print(s, file=sys.stderr, flush=True))
    (out / "cost_model.json").write_text(json.dumps(rows, indent=1) + "\n")
    (out / "cost_model_by_class.json").write_text(json.dumps(classes, indent=1) + "\n")
    print(out / "cost_model.json")
    return 0


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main(sys.argv))
