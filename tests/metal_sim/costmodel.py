"""The Metal cost model: executed instructions per weight, by class, for our kernels and MLX's
own kernels, in both FP4 modes (nvfp4, mxfp4), counted the same way for both (ir_count.py +
src/counters.cpp).

A counting runner is the kernel translation unit as clang-19 -O2 optimizes it for a scalar
machine (no auto-vectorization), instrumented per basic block and per memory access, then run by
metal_sim on a real problem. Totals are over every thread of the dispatch, divided by N * K (the
weights of the problem): "instructions per weight" is the thread-instructions the GPU issues per
weight; "cost per weight" weights them per GPU generation (costmodel_gpus.py: a simdgroup
multiply is its 512 FMAs). See docs/metal.md for what it predicts and what it cannot.

Usage: python tests/metal_sim/costmodel.py [--quick] [--out DIR] (--help)
"""

import argparse
import json
import os
import subprocess
from pathlib import Path

import costmodel_gpus as gpus
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
    """The cost-model numbers of one dispatch (or a sum of dispatches). by_class is per weight;
    instructions_per_weight leaves out in-simdgroup barriers (costmodel_gpus.py)."""
    def acc(space, kind):
        return mem.get((space, kind), (0, 0))

    device_instr = sum(acc(s, k)[0] for s in ("device", "constant") for k in ("load", "store"))
    tg_instr = sum(acc("threadgroup", k)[0] for k in ("load", "store"))
    counted = {c: n for c, n in cls.items()}
    counted["device_access"] = device_instr
    counted["threadgroup_access"] = tg_instr
    per_w = {c: n / weights for c, n in counted.items()}
    return {
        "instructions_per_weight": sum(n for c, n in per_w.items() if c != "simd_barrier"),
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
# The grid: every M (dense at the vector/matrix crossovers), three weight shapes, every GPU
# generation, ours and MLX's (bf16 x and output), per mode.

GRID_M = [1, 2, 4, 8, 9, 12, 16, 24, 32, 48, 64, 128, 256, 512, 1024]
GRID_NK = [(4096, 4096), (14336, 4096), (4096, 14336)]
QUICK_M = [1, 9, 16, 64]
# Simulated weight rows. Per-weight numbers do not depend on N once N is a multiple of every
# kernel's N tile (ours: 16 for the GEMV, 64 for the GEMM; MLX's: 8, 4 and 32), since each
# threadgroup column does the same work: N = 64 gives the numbers of N = 4096 or 14336 exactly.
# The kernel choice (and MLX's split-K factor) is made for the real N.
SIM_N = 64
# Our kernels the dispatch picks on the grid, bf16 in and out.
OUR_KERNELS = [f"mlx_fp4_w4a16_gemv_mt{mt}_xbf16_obf16" for mt in (1, 2, 4, 8, 16)] + [
    "mlx_fp4_w4a16_gemm_bm64_bk32_s0_xbf16_obf16", "mlx_fp4_w4a16_gemm_bm128_bk64_s1_xbf16_obf16",
    "mlx_fp4_w4a16_splitk_reduce_obf16"]
MODES = ["nvfp4", "mxfp4"]
ROW_KEYS = ["gpu", "impl", "mode", "kernel", "route", "m", "n", "k", "cost_per_weight",
            "instructions_per_weight", "device_bytes_per_weight", "threadgroup_bytes_per_weight",
            "barriers_per_1k_weights"]
NUMBERS = ROW_KEYS[ROW_KEYS.index("cost_per_weight"):]
NAX = "qmm_nax"  # MLX's M5 kernel: not in the simulator (no public MSL of the accelerators)


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


def mlx_row(runner, work, m, n, k, mode, kind, params):
    import mlx_kernels as mk

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
        w = SIM_N * k
        per_out = m * SIM_N / w
        s["by_class"]["device_access"] += (split + 1) * per_out
        s["by_class"]["float_alu"] += split * per_out
        s["instructions_per_weight"] += (2 * split + 1) * per_out
        s["device_bytes_per_weight"] += (4 * split + 2) * per_out
        kind = f"qmm_t_splitk{split}"
    return kind, s


def production_route(runner, arch, m, n, k):
    """csrc/metal/w4a16_route.h's auto route for bf16 x (the runner's `route` command)."""
    r = subprocess.run([str(runner), "route", arch, str(m), str(n), str(k), "0"],
                       capture_output=True, text=True, check=True)
    return dict(line.split() for line in r.stdout.splitlines())


def mlx_choice(route, m, n, k, gen, size, mode):
    """(kind, params) of MLX's kernel on the GPU; NAX where the production header says MLX runs it
    (and MLX's batch limit transcribed twice, here and in C++, checked equal)."""
    import mlx_kernels as mk

    limit = mk.get_qmv_batch_limit(k, n, (gen, size))
    assert int(route["mlx_batch_limit"]) == limit, (route, limit, gen, size, n, k)
    if route["mlx_nax"] == "1":
        return NAX, {}
    return mk.mlx_plan(m, n, k, gpu=(gen, size), mode=mode)


def compute(grid_m=GRID_M, grid_nk=GRID_NK, work=None, log=print, modes=MODES, gpu_names=None):
    """(rows, by-class rows): one row per GPU, implementation, mode, shape and M; each counted
    kernel is simulated once and costed per generation."""
    import tempfile

    import mlx_kernels as mk
    import simbuild

    ours = simbuild.build_runner("ours-count", count=True, only=list(OUR_KERNELS))
    mlx = mk.build_runner(count=True)
    work = Path(work or tempfile.mkdtemp(prefix="costmodel"))
    rows, classes, counted = [], [], {}

    def count(impl, mode, m, n, k, kind=None, params=None):
        key = (impl, mode, m, n, k, kind, tuple(sorted((params or {}).items())))
        if key not in counted:
            res = (ours_row(ours, work, m, n, k, mode) if impl == "mlx_fp4"
                   else mlx_row(mlx, work, m, n, k, mode, kind, params))
            counted[key] = res
            classes.append({"impl": impl, "mode": mode, "kernel": res[0], "m": m, "n": n, "k": k,
                            **res[1]["by_class"],
                            "private_accesses_per_weight": res[1]["private_accesses_per_weight"]})
        return counted[key]

    for gpu in gpu_names or list(gpus.GPUS):
        arch = gpus.GPUS[gpu]
        gen, size = gpus.gpu_id(arch)
        for mode in modes:
            for n, k in grid_nk:
                for m in grid_m:
                    route = production_route(ours, arch, m, n, k)
                    kind, params = mlx_choice(route, m, n, k, gen, size, mode)
                    theirs = None if kind == NAX else count("mlx", mode, m, n, k, kind, params)
                    mine = count("mlx_fp4", mode, m, n, k)
                    for impl, res in (("mlx_fp4", mine), ("mlx", theirs)):
                        row = _row(gpu, gen, impl, mode, res, m, n, k,
                                   route["route"] if impl == "mlx_fp4" else "mlx",
                                   NAX if res is None else None)
                        rows.append(row)
                        c = row["cost_per_weight"]
                        log(f"{gpu:5s} {impl:8s} {mode} {row['kernel']:26s} m={m:5d} n={n:5d} "
                            f"k={k:5d} route {row['route']:4s} cost/w "
                            f"{'-' if c is None else f'{c:8.2f}'}")
    return rows, classes


def _row(gpu, gen, impl, mode, counted, m, n, k, route, missing):
    """The cost_model.json row of one counted dispatch on one GPU (numbers None: not simulated)."""
    if counted is None:
        return dict(zip(ROW_KEYS, [gpu, impl, mode, missing, route, m, n, k] + [None] * len(NUMBERS)))
    kernel, s = counted
    return dict(zip(ROW_KEYS, [gpu, impl, mode, kernel, route, m, n, k,
                               gpus.cost(s["by_class"], gen), s["instructions_per_weight"],
                               s["device_bytes_per_weight"], s["threadgroup_bytes_per_weight"],
                               s["barriers_per_1k_weights"]]))


RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "metal"


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="costmodel.py", description=__doc__.split("\n\n")[0],
        epilog="Writes cost_model.json (one row per GPU, implementation, mode, shape, M) and "
               "cost_model_by_class.json (each counted kernel by instruction class).")
    ap.add_argument("--quick", action="store_true",
                    help=f"M in {QUICK_M}, 4096 x 4096, nvfp4 only; written to a scratch directory "
                         "(never over the committed results) unless --out is given")
    ap.add_argument("--out", type=Path, default=None,
                    help=f"output directory (default: {RESULTS}; with --quick a temporary one)")
    return ap.parse_args(argv)


def main(argv):
    import sys
    import tempfile

    args = parse_args(argv)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    if args.quick:
        out = args.out or Path(tempfile.mkdtemp(prefix="costmodel-quick"))
        rows, classes = compute(grid_m=QUICK_M, grid_nk=GRID_NK[:1], modes=MODES[:1], log=log)
    else:
        out = args.out or RESULTS
        rows, classes = compute(log=log)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cost_model.json").write_text(json.dumps(rows, indent=1) + "\n")
    (out / "cost_model_by_class.json").write_text(json.dumps(classes, indent=1) + "\n")
    print(out / "cost_model.json")
    return 0


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main(sys.argv[1:]))
