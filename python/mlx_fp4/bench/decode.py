"""End-to-end decode benchmark: an mlx-lm model with real layer shapes and random weights (or, for
the ``smollm2`` preset, a real checkpoint's).

    python -m mlx_fp4.bench decode --preset llama3-8b --layers 8 16 32

Variants (bench/decode_build.py), all quantizing the same layers of one dense bf16 model: dense bf16
(``nn.Linear``), MLX's nvfp4 ``nn.QuantizedLinear`` (``nn.quantize(mode="nvfp4")``), MLX's affine 4-bit
(``affine4``: group 64, mlx-lm's default), what a user of this package gets (``fp4``:
``mlx_fp4.nn.quantize`` of the dense model, its defaults, global_scale="auto"), ``mlx_fp4.nn.FP4Linear``
wrapping MLX's nvfp4 layers (``fp4_same_bytes``: equal bytes, no global scale), ``fp4`` with
``mlx_fp4.nn.fuse_swiglu`` (``fp4_fused``), and with a fused QKV projection too
(``fp4_qkv``, bench/decode_qkv.py). Two matmul-free floors (``floor``: one trivial kernel per linear,
``floor_view``: one view where it can; bench/decode_host.py) bound what any matmul kernel can reach
through mlx-lm + MLX. Each (variant, layers) runs in
its own process (one model in memory, no order effects inside a process), ``--processes`` times in
rotating order; each process greedy-decodes ``--repeats`` times with ``mlx_lm.generate.generate_step``
after one untimed warm-up. With ``--interleave`` every variant of a point shares one process and the
variants' timed generations alternate (bench/decode_interleave.py), so host drift falls on all alike
and each round gives a paired ratio. Reported per point: median and spread (min, max) over all repeats of
prefill tok/s (prompt tokens / time to the first token) and decode tok/s (tokens after the first /
their time), its ratio to MLX nvfp4 and to MLX affine 4-bit, the weight bytes one decode step reads and
their fraction of the copy bandwidth, and a host-side profile of single decode steps (graph building,
encoding, waiting for the GPU), the step's graph node count (total, per layer; every variant, also in
the summary table, bench/decode_summary.py) and MLX's model-free cost per node.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import mlx.core as mx

from .decode_build import (  # noqa: F401 (re-exported: the bench's variants live in decode_build)
    EXPERT_FLOOR, FLOORS, LABELS, OURS, REFERENCES, VARIANTS, build_model, eval_one_by_one, step_weight_bytes)
from .decode_host import host_costs, host_profile, host_table, node_cost, step_graph
from .decode_presets import MOE_MODULES, PRESETS
from .decode_summary import summary_table
from .plot import pyplot
# Identical models in two processes decoded 1.24-1.41x apart on the H200 (docs/moe.md, stop 27).
SPREAD_NOTE = ("\none process per variant: a ratio between two variants carries the spread between processes "
               "(identical models have come out up to 1.4x apart); use --processes 3 or more for ratios\n")
PROFILE_STEPS = 16  # single decode steps timed piece by piece (host profile)
VARIANT_SEPARATOR = "+"  # an interleaved worker's --worker "v1+v2+v3,layers"


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m mlx_fp4.bench decode", description=__doc__.split("\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="llama3-8b")
    p.add_argument("--layers", nargs="+", type=int, default=None,
                   help="decoder layers (several: one point each); default 8 16 32, a checkpoint preset's own depth")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=None,
                   help="default: all (floor only for presets without expert layers)")
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens (random ids)")
    p.add_argument("--tokens", type=int, default=128, help="tokens generated per repeat")
    p.add_argument("--repeats", type=int, default=3, help="timed generations per process (after one warm-up)")
    p.add_argument("--processes", type=int, default=1, help="processes per (variant, layers), in rotating order")
    p.add_argument("--interleave", action="store_true",
                   help="all variants of a point in one process, their timed generations in turn "
                        "(bench/decode_interleave.py); ratios are then also paired per round")
    p.add_argument("--device", choices=("cpu", "gpu"), default=None, help="default: gpu when MLX has one")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench-out")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # internal: "variant,layers" in this process
    return p.parse_args(argv)


def _device(args) -> str:
    if args.device:
        return args.device
    return "gpu" if (mx.metal.is_available() or mx.cuda.is_available()) else "cpu"


# ---- one process: build, decode, time ------------------------------------------------------------


def time_generation(model, prompt, tokens: int):
    from mlx_lm.generate import generate_step

    out = []
    t0 = time.perf_counter()
    t_first = None
    for tok, _ in generate_step(prompt, model, max_tokens=tokens):
        out.append(int(tok))
        if t_first is None:
            t_first = time.perf_counter()
    t_end = time.perf_counter()
    prefill = prompt.size / (t_first - t0)
    decode = (len(out) - 1) / (t_end - t_first) if len(out) > 1 else float("nan")
    return out, prefill, decode


def prefill_forward_seconds(model, prompt):
    """(graph build, eval) seconds of the prefill forward alone, as generate_step runs it: the prompt but
    its last token into a fresh KV cache, only the cache evaluated. That is the time to first token
    less the first decode step and generate_step's own work. None for a 1-token prompt (no forward
    before the first step)."""
    from mlx_lm.models.cache import make_prompt_cache

    if prompt.size < 2:
        return None
    cache = make_prompt_cache(model)
    x = prompt[None, :-1]
    mx.eval(x)
    t0 = time.perf_counter()
    model(x, cache=cache)
    t1 = time.perf_counter()
    mx.eval([c.state for c in cache])
    return t1 - t0, time.perf_counter() - t1


def top2_trace(model, prompt, tokens: int):
    """Greedy tokens with each step's two best token ids and their log-probability gap (untimed):
    tells a divergence between two variants at a near-tie from a real difference."""
    from mlx_lm.generate import generate_step

    trace = []
    for tok, lp in generate_step(prompt, model, max_tokens=tokens):
        top = mx.argsort(-lp.astype(mx.float32))[:2]
        vals = lp.astype(mx.float32)[top]
        ids = top.tolist()
        trace.append({"token": int(tok), "top2": ids, "gap": float((vals[0] - vals[1]).item())})
    return trace


def prepare_variant(args, variant: str, layers: int) -> dict:
    """Build one variant's model and prompt and run its untimed warm-up generation (the top-2 trace)."""
    t0 = time.perf_counter()
    model, notes = build_model(args.preset, layers, variant, args.seed)
    setup_s = time.perf_counter() - t0
    vocab = getattr(getattr(model, "args", None), "vocab_size", None) or PRESETS[args.preset]["vocab_size"]
    prompt = mx.random.randint(0, vocab, (args.prompt,), key=mx.random.key(args.seed + 1))
    t0 = time.perf_counter()
    trace = top2_trace(model, prompt, args.tokens)  # also the warm-up: kernels loaded, JIT done
    return {"variant": variant, "layers": layers, "model": model, "prompt": prompt, "notes": notes,
            "setup_s": setup_s, "warmup_s": time.perf_counter() - t0, "top2": trace, "runs": []}


def timed_run(state: dict, tokens: int, round_index: int) -> None:
    """One timed generation (and the prefill forward alone) of a prepared variant, appended to its runs."""
    model, prompt = state["model"], state["prompt"]
    started = time.time()  # wall clock: lines a run up with GPU samples taken outside the process
    toks, prefill, decode = time_generation(model, prompt, tokens)
    seconds = time.time() - started
    fwd = prefill_forward_seconds(model, prompt)
    forward = (prompt.size - 1) / sum(fwd) if fwd else float("nan")
    state["tokens"] = toks
    state["runs"].append({"prefill_tok_s": prefill, "decode_tok_s": decode, "started_unix_s": started,
                          "seconds": seconds, "prefill_forward_tok_s": forward, "round": round_index})


def process_states(on_gpu: bool) -> dict:
    """The GPU's and the host's state now (report.gpu_state, cpu_facts.host_state)."""
    from . import cpu_facts, report

    return {"gpu": report.gpu_state() if on_gpu else None, "host": cpu_facts.host_state()}


def finish_variant(args, state: dict, before: dict, after: dict) -> dict:
    """A variant's result: its runs, the host profile of single steps, its graph and MLX's node cost."""
    model, prompt = state["model"], state["prompt"]
    prof = host_profile(model, prompt, min(PROFILE_STEPS, args.tokens))
    graph = step_graph(model, prompt)
    cost = node_cost()
    return {"variant": state["variant"], "layers": state["layers"], "pid": os.getpid(), "notes": state["notes"],
            "setup_s": state["setup_s"], "warmup_s": state["warmup_s"],
            "weight_bytes_per_step": step_weight_bytes(model), "tokens": state["tokens"], "top2": state["top2"],
            "runs": state["runs"], "host_profile": prof,
            "graph": graph, "node_cost": cost, "host_per_node": host_costs(prof, graph, cost),
            "peak_memory_bytes": mx.get_peak_memory(),
            "gpu_state": {"before_runs": before["gpu"], "after_runs": after["gpu"]},
            "host_state": {"before_runs": before["host"], "after_runs": after["host"]},
            "env": {k: v for k, v in os.environ.items() if k.startswith("MLX_")}}


def run_worker(args) -> dict:
    variant, layers = args.worker.split(",")
    on_gpu = _device(args) == "gpu"
    mx.set_default_device(mx.gpu if on_gpu else mx.cpu)
    state = prepare_variant(args, variant, int(layers))
    before = process_states(on_gpu)
    for r in range(args.repeats):
        timed_run(state, args.tokens, r)
    return finish_variant(args, state, before, process_states(on_gpu))


# ---- parent: processes, statistics, report --------------------------------------------------------


def _spawn(args, variants, layers: int) -> list:
    """Results of one worker process: one variant (decode's worker) or, with --interleave, all of
    ``variants`` in turn (decode_interleave's worker); an error entry per variant if it failed."""
    module = "mlx_fp4.bench.decode_interleave" if args.interleave else "mlx_fp4.bench"
    cmd = [sys.executable, "-m", module] + ([] if args.interleave else ["decode"])
    cmd += ["--worker", f"{VARIANT_SEPARATOR.join(variants)},{layers}", "--preset", args.preset,
            "--prompt", str(args.prompt), "--tokens", str(args.tokens), "--repeats", str(args.repeats), "--seed", str(args.seed)]
    if args.device:
        cmd += ["--device", args.device]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or len(lines) < len(variants):
        tail = (proc.stderr or proc.stdout)[-2000:]
        return [{"variant": v, "layers": layers, "error": f"exit {proc.returncode}: {tail}"} for v in variants]
    return [json.loads(ln) for ln in lines[-len(variants):]]


def _stats(values):
    v = [x for x in values if x == x]
    if not v:
        return None
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}


def first_difference(tokens, ref_trace) -> dict:
    """Where greedy tokens first differ from the reference, and whether the reference was at a
    near-tie there (our token is its second choice; its top-2 log-probability gap)."""
    step = next((i for i, (a, b) in enumerate(zip(tokens, (t["token"] for t in ref_trace))) if a != b), None)
    if step is None:
        return {"step": None}
    r = ref_trace[step]
    return {"step": step, "ours": tokens[step], "reference": r["token"],
            "ours_is_reference_second_choice": tokens[step] == r["top2"][1], "reference_top2_gap": r["gap"],
            "reference_median_top2_gap": statistics.median(t["gap"] for t in ref_trace)}


def paired_ratios(results, variant: str, ref: str, layers: int):
    """decode tok/s of ``variant`` over ``ref`` per round of each interleaved process (the runs timed
    back to back in one process); None when the two did not run interleaved."""
    ratios = []
    for pid in {r["pid"] for r in results if r.get("interleaved") and r["layers"] == layers}:
        by = {r["variant"]: r for r in results if r.get("pid") == pid and r["layers"] == layers and "error" not in r}
        if variant in by and ref in by:
            ref_runs = {run["round"]: run["decode_tok_s"] for run in by[ref]["runs"]}
            ratios += [run["decode_tok_s"] / ref_runs[run["round"]] for run in by[variant]["runs"]
                       if ref_runs.get(run["round"])]
    return _stats(ratios)


def summarize(results, variants, bandwidth_gbps):
    points = []
    for layers in sorted({r["layers"] for r in results}):
        row = {"layers": layers, "variants": {}}
        for v in variants:
            rs = [r for r in results if r["variant"] == v and r["layers"] == layers and "error" not in r]
            errs = [r["error"] for r in results if r["variant"] == v and r["layers"] == layers and "error" in r]
            if not rs:
                row["variants"][v] = {"error": errs[0] if errs else "not run"}
                continue
            runs = [run for r in rs for run in r["runs"]]
            dec = _stats([run["decode_tok_s"] for run in runs])
            wbytes = rs[0]["weight_bytes_per_step"]
            entry = {
                "decode_tok_s": dec,
                "prefill_tok_s": _stats([run["prefill_tok_s"] for run in runs]),
                "prefill_forward_tok_s": _stats([run["prefill_forward_tok_s"] for run in runs]),
                "per_process_decode_median": [statistics.median([x["decode_tok_s"] for x in r["runs"]]) for r in rs],
                "per_process_gpu_state": [r.get("gpu_state") for r in rs],
                "per_process_host_state": [r.get("host_state") for r in rs],
                "weight_bytes_per_step": wbytes,
                "weight_gbps": wbytes * dec["median"] / 1e9 if dec else None,
                "host_profile": rs[0]["host_profile"],
                "graph": rs[0].get("graph"),
                "host_per_node": rs[0].get("host_per_node"),
                "node_cost": rs[0].get("node_cost"),
                "notes": rs[0].get("notes"),
                "tokens": rs[0]["tokens"],
                "same_tokens_in_all_processes": all(r["tokens"] == rs[0]["tokens"] for r in rs),
            }
            g = entry["graph"] or {}
            entry["nodes_per_step"] = (g.get("step") or {}).get("nodes")
            entry["nodes_per_layer"] = g.get("nodes_per_layer")
            for ref in REFERENCES:  # paired: per-round ratios of an interleaved process
                paired = paired_ratios(results, v, ref, layers) if v != ref else None
                if paired:
                    entry[f"paired_vs_{ref}"] = paired
            if bandwidth_gbps and entry["weight_gbps"]:
                entry["bandwidth_fraction"] = entry["weight_gbps"] / bandwidth_gbps
            row["variants"][v] = entry
        for v, e in row["variants"].items():  # ratios of the medians to each reference run
            for ref in REFERENCES:
                r = row["variants"].get(ref, {}).get("decode_tok_s")
                if r and e.get("decode_tok_s") and v != ref:
                    e[f"decode_x_{ref}"] = e["decode_tok_s"]["median"] / r["median"]
        ref = [r for r in results if r["variant"] == "mlx_nvfp4" and r["layers"] == layers and "top2" in r]
        for v in OURS:
            e = row["variants"].get(v, {})
            if ref and e.get("tokens"):
                e["vs_mlx_nvfp4"] = first_difference(e["tokens"], ref[0]["top2"])
                e["first_token_difference_vs_mlx_nvfp4"] = e["vs_mlx_nvfp4"]["step"]
        points.append(row)
    return points


def _spread(d) -> str:
    """'median (min-max)' of a _stats entry, in whole tok/s."""
    return f"{d['median']:.0f} ({d['min']:.0f}-{d['max']:.0f})"


def table(points, variants) -> str:
    head = "| layers | " + " | ".join(LABELS[v] for v in variants) + " |"
    lines = [head, "|---" * (len(variants) + 1) + "|"]
    for p in points:
        base = p["variants"].get("mlx_nvfp4", {}).get("decode_tok_s")
        cells = []
        for v in variants:
            e = p["variants"][v]
            d = e.get("decode_tok_s")
            if not d:
                cells.append("error")
                continue
            c = _spread(d)
            if base and v != "mlx_nvfp4":
                c += f", {d['median'] / base['median']:.2f}x"
            if e.get("paired_vs_mlx_nvfp4"):
                pr = e["paired_vs_mlx_nvfp4"]
                c += f", paired {pr['median']:.2f}x ({pr['min']:.2f}-{pr['max']:.2f})"
            if e.get("bandwidth_fraction"):
                c += f", {100 * e['bandwidth_fraction']:.0f}% bw"
            cells.append(c)
        lines.append(f"| {p['layers']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def prefill_table(points, variants) -> str:
    """Prefill tok/s per variant: mlx-lm's number (prompt / time to first token, which holds the first
    decode step) and the forward alone (prefill_forward_seconds), each against MLX nvfp4 and dense."""
    refs = (("MLX nvfp4", "mlx_nvfp4"), ("dense", "dense"))
    lines = ["| layers | variant | prefill tok/s (time to first token) | prefill forward tok/s |", "|---|---|---|---|"]
    for p in points:
        vs = p["variants"]

        def cell(v, key):
            d = vs[v].get(key)
            if not d:
                return "-"
            c = _spread(d)
            for name, ref in refs:
                r = vs.get(ref, {}).get(key)
                if r and ref != v:
                    c += f", {d['median'] / r['median']:.2f}x {name}"
            return c

        for v in variants:
            lines.append(f"| {p['layers']} | {LABELS[v]} | {cell(v, 'prefill_tok_s')} | "
                         f"{cell(v, 'prefill_forward_tok_s')} |")
    return "\n".join(lines)


def _host_cell(hs) -> str:
    """' [cpu N at MHz, S inv.]' from a process's host_state before / after its runs, or ''."""
    before, after = (hs or {}).get("before_runs") or {}, (hs or {}).get("after_runs") or {}
    if after.get("cpu") is None:
        return ""
    mhz = f" at {after['cpu_mhz']}" if after.get("cpu_mhz") else ""
    inv = ""
    if after.get("involuntary_switches") is not None and before.get("involuntary_switches") is not None:
        inv = f", {after['involuntary_switches'] - before['involuntary_switches']} inv."
    return f" [cpu {after['cpu']}{mhz}{inv}]"


def process_table(points, variants) -> str:
    """One line per (layers, variant): each process's median decode tok/s, in run order, with the
    SM clock nvidia-smi read after its timed runs where there was one, and the host CPU the process
    last ran on (its clock) and the involuntary context switches during its timed runs."""
    lines = ["| layers | variant | per process: decode tok/s (SM MHz after the runs; cpu N at MHz, "
             "involuntary switches during the runs) |", "|---|---|---|"]
    for p in points:
        for v in variants:
            e = p["variants"][v]
            meds = e.get("per_process_decode_median")
            if not meds:
                continue
            states = e.get("per_process_gpu_state") or [None] * len(meds)
            hosts = e.get("per_process_host_state") or [None] * len(meds)
            cells = []
            for med, st, hs in zip(meds, states, hosts):
                clock = ((st or {}).get("after_runs") or {}).get("clocks.sm")
                cells.append(f"{med:.0f}" + (f" ({clock})" if clock else "") + _host_cell(hs))
            lines.append(f"| {p['layers']} | {LABELS[v]} | " + ", ".join(cells) + " |")
    return "\n".join(lines)


def plot(doc, path) -> None:
    plt = pyplot()  # None without matplotlib (the hint is printed)
    if plt is None:
        return

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for v in doc["config"]["variants"]:
        xs, ys, lo, hi = [], [], [], []
        for p in doc["points"]:
            d = p["variants"][v].get("decode_tok_s")
            if d:
                xs.append(p["layers"])
                ys.append(d["median"])
                lo.append(d["median"] - d["min"])
                hi.append(d["max"] - d["median"])
        if xs:
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=LABELS[v])
    ax.set_xlabel("decoder layers")
    ax.set_ylabel("decode tok/s (median, min-max)")
    ax.set_title(f"{doc['config']['preset']} decode, {doc['device']['device_name']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(run_worker(args)), flush=True)
        return 0
    if args.repeats < 1 or args.processes < 1 or args.tokens < 2 or args.prompt < 1:
        raise SystemExit("[bench decode] --repeats/--processes expected >= 1, --tokens >= 2, --prompt >= 1")
    moe = PRESETS[args.preset]["module"] in MOE_MODULES
    fixed = PRESETS[args.preset].get("num_hidden_layers") if "gguf" in PRESETS[args.preset] else None
    if args.layers is None:
        args.layers = [fixed] if fixed is not None else [8, 16, 32]
    if fixed is not None and args.layers != [fixed]:
        raise SystemExit(f"[bench decode] --layers expected {fixed} for the {args.preset} preset (a real checkpoint: "
                         f"all its layers) but got {' '.join(map(str, args.layers))}")
    if args.variants is None:  # the floors that fit the preset
        excluded = FLOORS if moe else (EXPERT_FLOOR,)
        args.variants = [v for v in VARIANTS if v not in excluded]
    if set(FLOORS) & set(args.variants) and moe:
        raise SystemExit(f"[bench decode] --variants {'/'.join(FLOORS)} expected a dense preset but got {args.preset} "
                         "(expert layers would stay dense)")
    if EXPERT_FLOOR in args.variants and not moe:
        raise SystemExit(f"[bench decode] --variants {EXPERT_FLOOR} expected a preset with expert layers "
                         f"({', '.join(MOE_MODULES)}) but got {args.preset}")
    try:
        import mlx_lm  # noqa: F401
    except ImportError:
        print("[bench decode] needs mlx-lm (pip install mlx-lm).", file=sys.stderr)
        return 2
    from . import report

    device = _device(args)
    info = report.system_info(device)
    bandwidth = None
    if device == "gpu":
        from . import baselines, timing

        mx.set_default_device(mx.gpu)
        bandwidth = baselines.gpu_copy_roofline(1 << 30, timing.TimingConfig(repeats=5))
        mx.clear_cache()
    results = []
    for rnd in range(args.processes):
        for layers in args.layers:
            order = args.variants[rnd % len(args.variants):] + args.variants[:rnd % len(args.variants)]
            groups = [order] if args.interleave else [[v] for v in order]  # one worker process each
            for r in (r for group in groups for r in _spawn(args, group, layers)):
                results.append(r)
                msg = r.get("error") or "decode " + ", ".join(f"{x['decode_tok_s']:.0f}" for x in r["runs"]) + " tok/s"
                print(f"[bench decode] {args.preset} layers={layers} {r['variant']}: {msg}", flush=True)
    bw = bandwidth["gbps"] if bandwidth else None
    points = summarize(results, args.variants, bw)
    doc = {
        "schema": 1,
        "command": "python -m mlx_fp4.bench decode " + " ".join(sys.argv[2:] if argv is None else argv),
        "device": info,
        "config": {"preset": args.preset, "model": PRESETS[args.preset], "layers": args.layers,
                   "variants": args.variants, "prompt_tokens": args.prompt, "tokens": args.tokens,
                   "repeats": args.repeats, "processes": args.processes, "seed": args.seed,
                   "interleave": args.interleave},
        "variants": {v: LABELS[v] for v in args.variants},
        "method": "mlx_lm.generate.generate_step, greedy, random weights (a gguf preset: its checkpoint "
        "dequantized to bf16) and random prompt ids; every quantized variant quantizes the same layers (every "
        "nn.Linear and SwitchLinear; embeddings stay bf16): fp4 = mlx_fp4.nn.quantize of the dense model "
        "(defaults), fp4_same_bytes = FP4Linear wrapping MLX nvfp4's layers, affine4 = MLX affine group 64; "
        "decode_x_<ref> = median decode tok/s over the reference's; prefill tok/s = prompt / "
        "time to first token (mlx-lm's prompt tok/s; it holds the first decode step); prefill forward tok/s = "
        "(prompt - 1) / time of the forward alone into a fresh KV cache, cache evaluated; decode tok/s = "
        "(tokens - 1) / time from the first to the last token; one untimed warm-up generation per process; "
        "each (variant, layers) in its own process; with --interleave all variants of a point in one process, "
        "timed in turn (round r starts at variant r mod n), paired = per-round ratio in one process",
        "method_host": "host_profile: single synchronous steps of generate_step's graph (model on one token with "
        "the filled KV cache, logsumexp, argmax) in mlx-lm's generation stream; build_ms = Python + MLX graph "
        "construction until the outputs exist (nothing evaluated); encode_ms = mx.async_eval of the outputs, "
        "started with the GPU idle (MLX's own host cost: graph walk, allocation, encode, launch); wait_ms = the "
        "following mx.eval (GPU work left); medians. graph: primitive nodes of that step's unevaluated graph "
        "(mx.export_to_dot; evaluated weights and KV cache are sources, not nodes), per layer = nodes(layer 1 "
        "output) - nodes(layer 0 output). node_cost: a chain of 2000 dependent ops on a 64-element bf16 "
        "array, built then evaluated: 'kernel' x + 1 (one tiny kernel each), 'view' alternating reshapes. "
        "floor: every nn.Linear replaced by one trivial kernel (GatherAxis: output feature j = x's feature "
        "j % input_dims), floor_view: by one view (Slice / Contiguous; the same GatherAxis where the output is "
        "wider); no weights",
        "bandwidth": bandwidth,
        "points": points,
        "raw": results,
    }
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"decode_{args.preset}_{device}")
    report.write_json(base + ".json", doc)
    text = table(points, args.variants)
    host = host_table(points, args.variants, LABELS)
    summary = summary_table(points, args.variants)
    with open(base + ".md", "w") as f:
        f.write(f"`{doc['command']}` on {info['device_name']}, mlx {info['versions']['mlx']}\n\n"
                f"summary: decode tok/s, x each reference (of the medians; paired: per-round ratios, interleaved), "
                f"graph nodes of one decode step\n\n{summary}\n\n"
                f"decode tok/s: median (min-max), x MLX nvfp4 (of the medians; paired: per-round ratios, interleaved), "
                f"% of copy bandwidth over the weight bytes\n\n{text}\n"
                f"{SPREAD_NOTE if args.processes < 2 and not args.interleave else ''}"
                f"\n{process_table(points, args.variants)}\n"
                f"\n{prefill_table(points, args.variants)}\n"
                f"\nhost profile of single synchronous decode steps (medians; nodes: mx.export_to_dot of the "
                f"step's graph)\n\n{host}\n")
    print(summary)
    print(host)
    if not args.no_plot:
        plot(doc, base + ".png")
    return 0 if all("error" not in r for r in results) else 1
