"""python -m mlx_fp4.bench moe: one mixture-of-experts MLP (mlx-lm's SwitchGLU: gate, up, SwiGLU,
down) with Qwen3-30B-A3B shapes (128 experts, top-8, hidden 2048, expert MLP 768) at decode
(1..16 tokens, unsorted routing) and prefill (512 and 2048 tokens, mlx-lm's sorted path), three
ways in one run: mlx_fp4.gather_w4a16_matmul, mx.gather_qmm(mode="nvfp4") on the same bytes,
and dense mx.gather_mm (bf16; float32 on the CPU). Timing: bench/timing.py (median of batched evals; every product routes
to fresh random experts, so no product finds its experts' weights in cache from the last).
"""

import argparse
import math
import os
import sys

import mlx.core as mx
import numpy as np

from ..layers.switch import SORT_MIN_PAIRS, sort_pairs, unsort_pairs
from . import report, timing

QWEN3_30B_A3B = {"experts": 128, "top_k": 8, "hidden": 2048, "moe_intermediate": 768}
DECODE_TOKENS = [1, 2, 4, 8, 16]
PREFILL_TOKENS = [512, 2048]
OURS = "mlx_fp4"
FUSED = "mlx_fp4_fused"
FLOOR = "floor"
IMPLS = {
    OURS: "mlx_fp4.gather_w4a16_matmul (nvfp4)",
    FUSED: "mlx_fp4.nn.FP4SwitchGLU (nvfp4; SwiGLU in the gate's and up projection's epilogues)",
    "mlx_nvfp4": "mx.gather_qmm(mode='nvfp4')",
    "dense": "mx.gather_mm (bf16 weights; float32 on the CPU, where MLX's gather_mm is float32 only)",
    FLOOR: "floor: the experts as one trivial kernel after the routing (no weights read)",
}
OPT_IN = (FUSED, FLOOR)  # not in the default --impls


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m mlx_fp4.bench moe", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "gpu"), default=None)
    p.add_argument("--tokens", nargs="+", type=int, help=f"default: decode {DECODE_TOKENS}, prefill {PREFILL_TOKENS}")
    p.add_argument("--impls", nargs="+", choices=list(IMPLS), default=[k for k in IMPLS if k not in OPT_IN])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--budget", type=float, default=30.0, help="seconds per (point, implementation)")
    p.add_argument("--max-products", type=int, default=8)
    p.add_argument("--out", default="bench-out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--routing", choices=("device", "host"), default="device",
                   help="device: top-k of random logits on the device inside the timed graph (as a model's router "
                        "feeds its experts; the same nodes for every implementation); host: numpy indices copied "
                        "in per product (the bench before 2026-12-01)")
    p.add_argument("--op", choices=("mlp", "matmul"), default="mlp",
                   help="mlp: the whole SwitchGLU; matmul: one gathered matmul (the gate projection) alone")
    p.add_argument("--mode", choices=("nvfp4", "mxfp4"), default="nvfp4",
                   help="FP4 format of ours and of mx.gather_qmm (the mlx_nvfp4 column runs this mode)")
    p.add_argument("--host-floor", action="store_true",
                   help="per point and implementation: the graph's node count for one layer call and that count "
                        "times MLX's measured eval cost per node (bench/decode_host.node_cost), the time any kernel "
                        "would take through this graph")
    for key, v in QWEN3_30B_A3B.items():  # other layer shapes (e.g. a small one for tests)
        p.add_argument("--" + key.replace("_", "-"), type=int, default=v, help=f"default {v} (Qwen3-30B-A3B)")
    return p.parse_args(argv)


class Experts:
    """The three stacked expert matrices, as nvfp4 (MLX's quantizer, shared by both nvfp4
    implementations) and dense (bf16, or float32 on the CPU)."""

    def __init__(self, cfg, seed, want_dense, mode="nvfp4"):
        e, h, i = cfg["experts"], cfg["hidden"], cfg["moe_intermediate"]
        self.mode, self.cfg = mode, cfg
        key = mx.random.key(seed)
        self.q, self.dense = {}, {}
        self.dense_dtype = mx.bfloat16 if mx.default_device() == mx.gpu else mx.float32
        for j, (name, shape) in enumerate({"gate": (e, i, h), "up": (e, i, h), "down": (e, h, i)}.items()):
            w = (mx.random.normal(shape, key=mx.random.split(key, 3)[j]) * 0.02).astype(mx.bfloat16)
            self.q[name] = mx.quantize(w, mode=mode)[:2]
            if want_dense:
                self.dense[name] = w.astype(self.dense_dtype)
            mx.eval(self.q[name], self.dense.get(name, self.q[name][0]))

    def matrix_bytes(self, name):
        q, s = self.q[name]
        return (q.nbytes + s.nbytes) // q.shape[0]  # one expert


def matmul_fn(impl, experts):
    import mlx_fp4

    def ours(name, x, idx, sort):
        w, s = experts.q[name]
        return mlx_fp4.gather_w4a16_matmul(x, w, s, rhs_indices=idx, sorted_indices=sort, mode=experts.mode)

    def mlx_nvfp4(name, x, idx, sort):
        w, s = experts.q[name]
        return mx.gather_qmm(x, w, s, rhs_indices=idx, transpose=True, mode=experts.mode, sorted_indices=sort)

    def dense(name, x, idx, sort):
        w = experts.dense[name]
        return mx.gather_mm(x.astype(w.dtype), w.swapaxes(-1, -2), rhs_indices=idx, sorted_indices=sort)

    return {OURS: ours, "mlx_nvfp4": mlx_nvfp4, "dense": dense}[impl]


def switch_glu(mm, x, idx):
    """mlx-lm's SwitchGLU.__call__ with `mm` as the expert matmul (same sort rule)."""
    x = mx.expand_dims(x, (-2, -3))
    sort = idx.size >= SORT_MIN_PAIRS
    flat, inv = idx, None
    if sort:
        x, flat, inv = sort_pairs(x, idx)
    up = mm("up", x, flat, sort)
    gate = mm("gate", x, flat, sort)
    y = mm("down", gate * mx.sigmoid(gate) * up, flat, sort)
    if sort:
        y = unsort_pairs(y, inv, idx.shape)
    return y.squeeze(-2)


def fused_glu(experts):
    """The layer of the FUSED implementation: mlx_fp4.nn.FP4SwitchGLU over the same bytes, as a
    (x, indices) callable like switch_glu's."""
    from types import SimpleNamespace

    from ..layers.switch import FP4SwitchGLU, FP4SwitchLinear

    projs = {f"{n}_proj": FP4SwitchLinear.from_arrays(*experts.q[n], mode=experts.mode) for n in ("gate", "up", "down")}
    return FP4SwitchGLU(SimpleNamespace(**projs))


def routing(tokens, cfg, rng, where="host"):
    """Distinct top-k experts per token, uniformly random (a balanced router): from numpy on the
    host (copied in), or as a model's router makes them: top-k of logits on the device, left lazy
    so that the gathered matmuls consume them in the same graph (the logits are evaluated here)."""
    if where == "device":
        logits = mx.array(rng.standard_normal((tokens, cfg["experts"])).astype(np.float32))
        mx.eval(logits)
        return mx.argpartition(-logits, kth=cfg["top_k"] - 1, axis=-1)[:, : cfg["top_k"]].astype(mx.uint32)
    logits = rng.standard_normal((tokens, cfg["experts"]))
    return mx.array(np.argsort(logits, axis=-1)[:, : cfg["top_k"]].astype(np.uint32))


def one_matmul(mm, x, idx):
    """The gate projection of switch_glu alone (same sort rule and layout)."""
    x = mx.expand_dims(x, (-2, -3))
    sort = idx.size >= SORT_MIN_PAIRS
    flat = idx
    if sort:
        x, flat, _ = sort_pairs(x, idx)
    return mm("gate", x, flat, sort)


def floor_layer(cfg, op="mlp"):
    """The FLOOR implementation: the routing's indices still computed and consumed (an mx.depends of
    x on them, no kernel), then the layer's output shape from x by one trivial GatherAxis kernel and
    a view (bench/decode_host.FloorSwitchGLU, the decode bench's expert floor). Its time bounds what
    any expert implementation can reach through this bench's graph: gather_qmm / floor is the most
    any one can gain over gather_qmm here."""
    from .decode_host import FloorSwitchGLU

    out_dims = cfg["hidden"] if op == "mlp" else cfg["moe_intermediate"]
    experts = FloorSwitchGLU(cfg["hidden"], out_dims, cfg["top_k"])
    return lambda x, idx: experts(mx.depends([x], [idx])[0], idx)


def layer_fn(impl, experts, op="mlp"):
    """(x, indices) -> one layer call of `impl`: the MLP, or its gate projection alone."""
    if impl == FLOOR:
        return floor_layer(experts.cfg, op)
    if impl == FUSED:
        if op != "mlp":
            raise ValueError(f"--impls {FUSED} needs --op mlp (it fuses the whole MLP)")
        return fused_glu(experts)
    mm = matmul_fn(impl, experts)
    layer = switch_glu if op == "mlp" else one_matmul
    return lambda x, idx: layer(mm, x, idx)


def runner(layer, x, cfg, rng, where="host"):
    def run(count):
        outs = [layer(x, routing(x.shape[0], cfg, rng, where)) for _ in range(count)]
        import time

        t0 = time.perf_counter()
        mx.eval(outs)
        mx.synchronize()
        return time.perf_counter() - t0

    return run


def active_bytes(idx_sets, experts, names=("gate", "up", "down")):
    """Expected weight bytes one layer call reads: its distinct experts times its matrices."""
    per_expert = sum(experts.matrix_bytes(n) for n in names)
    return np.mean([len(np.unique(np.array(i))) for i in idx_sets]) * per_expert


def main(argv) -> int:
    args = parse_args(argv)
    device = args.device or ("gpu" if (mx.metal.is_available() or mx.cuda.is_available()) else "cpu")
    mx.set_default_device(mx.gpu if device == "gpu" else mx.cpu)
    cfg = {key: getattr(args, key) for key in QWEN3_30B_A3B}
    tokens = sorted(set(args.tokens)) if args.tokens else DECODE_TOKENS + PREFILL_TOKENS
    experts = Experts(cfg, args.seed, "dense" in args.impls, args.mode)
    labels = {k: v.replace("nvfp4", args.mode) for k, v in IMPLS.items()}
    tcfg = timing.TimingConfig(repeats=args.repeats, budget_s=args.budget if args.budget > 0 else math.inf,
                               max_products=args.max_products)
    info = report.system_info(device)
    what = "MoE MLP" if args.op == "mlp" else "one gathered matmul (gate) of the MoE MLP"
    print(f"mlx_fp4 MoE bench: {device} ({info['device_name']}), {args.mode}, {what}, {args.routing} routing "
          f"(E={cfg['experts']}, top-{cfg['top_k']}, hidden {cfg['hidden']}, expert MLP {cfg['moe_intermediate']})")
    extrap = timing.Extrapolator()
    points = []
    cost = None
    if args.host_floor:
        from .decode_host import graph_nodes, node_cost

        cost = node_cost()["kernel"]
    for t in tokens:
        rng = np.random.default_rng(args.seed + t)
        x = (mx.random.normal((t, cfg["hidden"]), key=mx.random.key(t)) * 0.5).astype(mx.bfloat16)
        mx.eval(x)
        sort = "sorted" if t * cfg["top_k"] >= SORT_MIN_PAIRS else "unsorted"
        point = {"tokens": t, "phase": f"{'decode' if t <= max(DECODE_TOKENS) else 'prefill'}, {sort}",
                 "active_weight_bytes": active_bytes([routing(t, cfg, rng) for _ in range(8)], experts,
                                                     ("gate", "up", "down") if args.op == "mlp" else ("gate",)),
                 "results": {}}
        for impl in args.impls:
            layer = layer_fn(impl, experts, args.op)
            meas = timing.measure(runner(layer, x, cfg, rng, args.routing), tcfg, extrap.predict(impl, t))
            extrap.record(impl, t, meas.seconds)
            res = point["results"][impl] = {"label": labels[impl], **meas.as_dict(),
                                            "ms": meas.seconds * 1e3 if meas.seconds else None}
            if cost:
                res["nodes"] = graph_nodes(layer(x, routing(t, cfg, rng, args.routing)))["nodes"]
                res["host_floor_ms"] = res["nodes"] * cost["eval_us_per_node_min"] / 1e3
        mine = point["results"].get(OURS, {}).get("ms")
        point["speedup"] = {k: (r["ms"] / mine if mine and r.get("ms") else None)
                            for k, r in point["results"].items() if k != OURS}
        point["ours_active_gbps"] = point["active_weight_bytes"] / (mine * 1e-3) / 1e9 if mine else None
        floor, qmm = (point["results"].get(k, {}).get("ms") for k in (FLOOR, "mlx_nvfp4"))
        point["floor_x_mlx_nvfp4"] = qmm / floor if floor and qmm else None
        points.append(point)
        print(row(point, args.impls, args.host_floor), flush=True)
    doc = {"schema": 1, "command": "python -m mlx_fp4.bench moe " + " ".join(argv), "device": info,
           "layer": cfg, "mode": args.mode, "routing": args.routing, "op": args.op, "timing": tcfg.describe(),
           "node_cost_kernel": cost,
           "implementations": {k: labels[k] for k in args.impls},
           "points": points}
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"moe_{device}" + ("" if args.mode == "nvfp4" else f"_{args.mode}")
                        + ("" if args.op == "mlp" else f"_{args.op}"))
    report.write_json(base + ".json", doc)
    with open(base + ".md", "w") as f:
        f.write(f"`{doc['command']}` on {info['device_name']} ({device}), mlx {info['versions']['mlx']}\n\n")
        f.write(header(args.impls, args.host_floor) + "\n"
                + "\n".join(row(p, args.impls, args.host_floor) for p in points) + "\n")
    print(f"wrote {base}.json, {base}.md")
    return 0


def header(impls, floor=False):
    cols = ["tokens", "phase"] + [f"{k} ms" for k in impls] + [f"x vs {k}" for k in impls if k != OURS]
    cols.append("ours GB/s (active experts)")
    if FLOOR in impls and "mlx_nvfp4" in impls:
        cols.append("bound: mlx_nvfp4 / floor")
    if floor:
        cols += [f"{k} nodes, host floor ms" for k in impls]
    return "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols)


def row(p, impls, floor=False):
    def f(v, spec=".3g"):
        return "-" if v is None else format(v, spec)

    res = p["results"]
    cells = [str(p["tokens"]), p["phase"]] + [f(res[k]["ms"]) if res[k]["ms"] else res[k]["status"] for k in impls]
    cells += [f(p["speedup"].get(k), ".2f") for k in impls if k != OURS]
    cells.append(f(p["ours_active_gbps"]))
    if FLOOR in impls and "mlx_nvfp4" in impls:
        cells.append(f(p["floor_x_mlx_nvfp4"], ".2f"))
    if floor:
        cells += [f"{res[k]['nodes']}, {f(res[k]['host_floor_ms'])}" for k in impls]
    return "| " + " | ".join(cells) + " |"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
