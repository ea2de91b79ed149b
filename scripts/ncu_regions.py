"""Where the wgmma kernel's warps stall, by code region, from Nsight Compute exports.

    python scripts/ncu_regions.py SOURCE_CSV RAW_CSV

SOURCE_CSV: `ncu --import R.ncu-rep --page source --csv --print-source sass`; RAW_CSV:
`ncu --import R.ncu-rep --page raw --csv` (scripts/gpu_check.sh ncu writes both). For each
profiled launch: duration, tensor-pipe and issue activity, then the warp-stall samples of the
K loop (the span of the HGMMA, else HMMA, instructions; the whole kernel without either), of the
code before it and of the code after it (epilogue, producer).
Samples count warps, idle ones included: producer warps parked at a barrier show as "barrier".
"""
import collections
import csv
import sys

# Instructions before the first and after the last HGMMA still belong to the K loop (barrier wait,
# decode of the first half; release of the slot), in bytes of SASS.
LOOP_HEAD_BYTES, LOOP_TAIL_BYTES = 0xC00, 0x400
METRICS = {
    "gpu__time_duration.sum": "us",
    "launch__grid_size": "blocks",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor pipe %",
    "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue active %",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed": "L2 %",
}


def launches(source_csv):
    lines = open(source_csv).read().split("\n")
    starts = [i for i, line in enumerate(lines) if line.startswith('"Kernel Name"')]
    for begin, end in zip(starts, starts[1:] + [len(lines)]):
        rows = list(csv.reader(lines[begin + 1:end]))
        header = rows[0]
        yield header, [r for r in rows[1:] if len(r) == len(header)]


def regions(header, rows):
    col = {h: i for i, h in enumerate(header)}
    samples = col["Warp Stall Sampling (All Samples)"]
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    base = int(rows[0][0], 16)
    # The K loop spans the tensor-core instructions (HGMMA, else mma.sync's HMMA); a kernel with
    # neither is reported as one region.
    mma = [int(r[0], 16) - base for r in rows if "HGMMA" in r[1]] or \
        [int(r[0], 16) - base for r in rows if "HMMA" in r[1]]
    lo, hi = (min(mma) - LOOP_HEAD_BYTES, max(mma) + LOOP_TAIL_BYTES) if mma else (0, int(rows[-1][0], 16) - base)
    total, by_reason = collections.Counter(), collections.defaultdict(collections.Counter)
    for r in rows:
        off = int(r[0], 16) - base
        name = ("K loop" if mma else "whole kernel") if lo <= off <= hi else \
            ("before the loop" if off < lo else "after the loop")
        total[name] += int(r[samples])
        for reason in reasons:
            if r[col[reason]] not in ("", "0"):
                by_reason[name][reason[len("stall_"):]] += int(r[col[reason]])
    return total, by_reason


def main(source_csv, raw_csv):
    raw = list(csv.reader(open(raw_csv)))
    metric_rows = [dict(zip(raw[0], r)) for r in raw[2:]]  # row 1 holds the units
    for (header, rows), metrics in zip(launches(source_csv), metric_rows):
        total, by_reason = regions(header, rows)
        n = sum(total.values())
        print(", ".join(f"{label} {metrics.get(key, '?')}" for key, label in METRICS.items()) + f", samples {n}")
        for name, count in total.most_common():
            top = ", ".join(f"{reason} {c}" for reason, c in by_reason[name].most_common(5))
            print(f"  {name:16s} {100 * count / n:5.1f}%  {top}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
