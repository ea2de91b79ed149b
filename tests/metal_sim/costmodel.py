"""The Metal cost model: executed instructions per weight, by class, for our kernels and MLX's
own nvfp4 kernels, counted the same way for both (ir_count.py + src/counters.cpp).

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
