"""`kernel_harness bench --decode` output -> the fastest tile of each shape as an MLX_FP4_CUDA_TC
per-shape list (stdout), and a table of every tile against the plan's (stderr).

    build/gpu/kernel_harness bench --decode > kbench.txt
    MLX_FP4_CUDA_TC="$(python3 scripts/m1_best_tiles.py kbench.txt)" python3 -m mlx_fp4.bench decode ...
"""

import re
import sys

LINE = re.compile(r"decode,(\d+x\d+),(plan|tile),(\d+)/(\d+)/(\d+),us=([\d.]+)")


def main(path: str) -> int:
    plan, tiles = {}, {}
    with open(path) as f:
        for line in f:
            m = LINE.match(line)
            if not m:
                continue
            shape, kind, mt, rt, kw, us = m.groups()
            entry = (float(us), f"{mt},{rt},{kw}")
            if kind == "plan":
                plan[shape] = entry
            else:
                tiles.setdefault(shape, []).append(entry)
    if not tiles:
        print(f"no 'decode,...' lines in {path}", file=sys.stderr)
        return 1
    for shape, rows in tiles.items():
        best = min(rows)
        p = plan.get(shape)
        gain = f", {p[0] / best[0]:.2f}x the plan's {p[1]} ({p[0]:.2f} us)" if p else ""
        print(f"{shape}: best {best[1]} {best[0]:.2f} us{gain}; " + " ".join(f"{c}:{u:.2f}" for u, c in rows),
              file=sys.stderr)
    print(";".join(f"{min(rows)[1]}@{shape}" for shape, rows in tiles.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
