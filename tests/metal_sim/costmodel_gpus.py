"""The Apple GPU generations of the cost model: what a counted instruction costs on each, and
which kernel MLX runs there (its host code's choice per generation).

Cost = lane-cycles per weight: every counted thread-instruction is one lane-cycle, except
- a simdgroup matrix multiply (8x8x8, counted once per lane): its 512 FMAs are
  MATRIX_FMAS / SIMD = 16 FMAs per lane, at FMA_PER_LANE_CYCLE of them per lane-cycle;
- an in-simdgroup barrier (simdgroup_barrier): 0, a simdgroup runs in lockstep (reported, not
  added; an assumption, not measured).
The matrix rate is an estimate (Philip Turner's metal-benchmarks: simdgroup_matrix FP32 at about
the ALU's FMA rate on M1); M5's neural accelerators are not reachable from simdgroup_matrix, so
its rate is assumed the same. Not measured on any GPU here.
"""

import re
from pathlib import Path

TILING = Path(__file__).resolve().parents[2] / "csrc" / "shared" / "tiling_metal.h"


def tiling_constant(name):
    """An `FP4_CONST int name = <int>;` of csrc/shared/tiling_metal.h (the one definition)."""
    m = re.search(rf"FP4_CONST int {name} = (\d+);", TILING.read_text())
    if not m:
        raise KeyError(f"{name} not in {TILING}")
    return int(m.group(1))


SIMD = tiling_constant("kMetalSimdWidth")
FRAG = tiling_constant("kMetalFrag")
MATRIX_FMAS = FRAG ** 3  # one simdgroup_multiply_accumulate

# label -> MLX's architecture string (device_info "architecture"): generation and size letter
# ('g' base; 'd' Ultra takes another branch of MLX's batch limit; 's'/'c' choose like 'g').
GPUS = {
    "M1": "applegpu_g13g",
    "M2": "applegpu_g14g",
    "M3": "applegpu_g15g",
    "M4": "applegpu_g16g",
    "M5": "applegpu_g17g",
    "Ultra": "applegpu_g14d",
}
# FMAs per lane-cycle of simdgroup_matrix, per generation (estimates, see above).
FMA_PER_LANE_CYCLE = {13: 1.0, 14: 1.0, 15: 1.0, 16: 1.0, 17: 1.0}


def gpu_id(arch):
    """(generation, size letter) of an architecture string, as w4a16_route.h parses it."""
    m = re.match(r"^applegpu_g(\d+)(\w)$", arch)
    return int(m.group(1)), m.group(2)


def class_weights(gen):
    """Lane-cycles per counted instruction of each class on generation gen."""
    w = {"simdgroup_matrix": MATRIX_FMAS / SIMD / FMA_PER_LANE_CYCLE[gen], "simd_barrier": 0.0}
    return lambda cls: w.get(cls, 1.0)


def cost(by_class, gen):
    """Lane-cycles per weight of a by-class count (per weight) on generation gen."""
    weight = class_weights(gen)
    return sum(n * weight(c) for c, n in by_class.items())
