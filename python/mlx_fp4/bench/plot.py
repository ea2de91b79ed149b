"""PNG of throughput (TFLOP/s) vs M, one panel per shape: ours, baselines and the rooflines."""

import math

STYLE = {
    "mlx_fp4": dict(color="tab:red", marker="o", linewidth=2.2, zorder=5),
    "mlx_nvfp4": dict(color="tab:blue", marker="s"),
    "mlx_dense_bf16": dict(color="tab:green", marker="^"),
    "numpy_fp32": dict(color="tab:purple", marker="v"),
}


INSTALL_HINT = 'plot skipped: matplotlib is not installed (pip install matplotlib; from a clone: pip install ".[bench]")'


def pyplot():
    """matplotlib.pyplot with the Agg backend, or None (and one line saying how to get it): the
    plot is optional, the JSON and Markdown are the results."""
    try:
        import matplotlib
    except ImportError:
        print(INSTALL_HINT)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(doc: dict, path: str) -> bool:
    """Write the PNG; False (after the install hint) without matplotlib."""
    plt = pyplot()
    if plt is None:
        return False

    points = doc["points"]
    shapes = list(dict.fromkeys(p["shape"] for p in points))
    cols = min(2, len(shapes))
    rows = math.ceil(len(shapes) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.4 * cols, 4.6 * rows), squeeze=False)
    for ax, shape in zip(axes.flat, shapes):
        pts = sorted((p for p in points if p["shape"] == shape), key=lambda p: p["m"])
        ms = [p["m"] for p in pts]
        for name, label in doc["implementations"].items():
            xy = [(p["m"], p["results"][name]["tflops"]) for p in pts if p["results"].get(name, {}).get("tflops")]
            if xy:
                ax.plot(*zip(*xy), label=label, **STYLE.get(name, {}))
        # Bandwidth roofline as a throughput: 2*M*N*K / (weight bytes / GB/s).
        bw = [(p["m"], p["flops"] / p["roofline"]["bandwidth_bound_us"] / 1e6) for p in pts
              if p["roofline"].get("bandwidth_bound_us")]
        if bw:
            ax.plot(*zip(*bw), color="gray", linestyle="--", label="bandwidth roofline (weights once)")
        peaks = [p["roofline"].get("compute_tflops") for p in pts]
        if doc["device"]["device"] == "gpu" and peaks and peaks[0]:
            ax.axhline(peaks[0], color="black", linestyle=":", label="dense bf16 peak")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ms)
        ax.set_xticklabels([str(m) for m in ms], fontsize=8)
        ax.set_title(f"N x K = {shape}")
        ax.set_xlabel("M (rows of x)")
        ax.set_ylabel("TFLOP/s")
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(shapes):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    ncol = 2 if cols == 1 else 3
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    dev = doc["device"]
    fig.suptitle(f"W4A16 NVFP4 matmul on {dev['device']}: {dev['device_name']} (mlx {dev['versions']['mlx']})",
                 fontsize=10)
    legend_rows = math.ceil(len(labels) / ncol)
    fig.tight_layout(rect=(0, 0.045 * legend_rows / rows, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
