"""The decode benchmark's summary table: one row per (layers, variant) with decode tok/s, its ratio to
each reference (MLX nvfp4, MLX affine 4-bit; of the medians, and paired per round when interleaved),
the graph nodes of one decode step and the weight bytes it reads. Every variant that ran has its
node count here (bench/decode_host.step_graph), in separate processes and interleaved alike."""

from .decode_build import LABELS, REFERENCES

REF_NAMES = {"mlx_nvfp4": "MLX nvfp4", "affine4": "affine4"}


def _ratio(e, ref) -> str:
    x = e.get(f"decode_x_{ref}")
    if x is None:
        return "-"
    c = f"{x:.2f}x"
    pr = e.get(f"paired_vs_{ref}")
    if pr:
        c += f" (paired {pr['median']:.2f}x, {pr['min']:.2f}-{pr['max']:.2f})"
    return c


def summary_table(points, variants) -> str:
    head = ("| layers | variant | decode tok/s median (min-max) | "
            + " | ".join(f"x {REF_NAMES[r]}" for r in REFERENCES)
            + " | nodes/step | nodes/layer | weight MB/step |")
    lines = [head, "|---" * (5 + len(REFERENCES)) + "|"]
    for p in points:
        for v in variants:
            e = p["variants"].get(v, {})
            d = e.get("decode_tok_s")
            if not d:
                lines.append(f"| {p['layers']} | {LABELS[v]} | error |" + " - |" * (3 + len(REFERENCES)))
                continue
            tok = f"{d['median']:.1f} ({d['min']:.1f}-{d['max']:.1f})"
            ratios = " | ".join(_ratio(e, r) for r in REFERENCES)
            nodes = e.get("nodes_per_step")
            per = e.get("nodes_per_layer")
            mb = e.get("weight_bytes_per_step")
            lines.append(f"| {p['layers']} | {LABELS[v]} | {tok} | {ratios} | "
                         f"{'-' if nodes is None else nodes} | {'-' if per is None else per} | "
                         f"{'-' if mb is None else f'{mb / 1e6:.4g}'} |")
    return "\n".join(lines)
