"""python -m mlx_fp4.bench sharded: tensor-parallel decode and prefill of an mlx-lm model with
random NVFP4 weights, one rank per process (run it under ``mlx.launch``, any backend; alone it is
the 1-device run).

    mlx.launch -n 2 --backend nccl -m mlx_fp4.bench sharded --preset llama3-8b --out DIR
    python -m mlx_fp4.bench sharded --preset llama3-8b --out DIR            # 1 device
    python -m mlx_fp4.bench sharded --compare DIR/sharded_llama3-8b_1rank.json DIR/..._2rank.json

Both implementations start from the same bytes: the mlx-lm model is built lazily, every linear and
expert layer quantized by ``mlx.nn.quantize(mode="nvfp4")`` (embeddings stay bf16), then

* ``mlx_fp4``: wrapped by ``mlx_fp4.nn.quantize`` (no copy) and sharded by
  ``mlx_fp4.distributed.shard_model`` (our kernels; fp32 partial sums);
* ``mlx_nvfp4``: sharded by the model's own ``model.shard()`` (MLX's nvfp4 sharded layers,
  ``mx.quantized_matmul`` / ``mx.gather_qmm``; partial sums in bf16).

Each is timed twice: as is, and with ``mx.distributed.all_sum`` replaced by the identity (the
"compute" time; results are then wrong, which is irrelevant to timing). Communication time = the
difference. Decode: ``--steps`` tokens after a ``--prompt``-token prefill, mlx-lm's pipelined
loop (``mx.async_eval``), median over ``--repeats``; prefill: ``--prefill`` tokens into a fresh
cache. The slowest rank's time counts. Rank 0 writes ``sharded_<preset>_<n>rank.json``.

Presets: ``llama3-8b`` (latency: the whole model), ``llama3-405b`` and ``deepseek-v3`` (capacity:
as many layers as fit, ``--layers auto``). ``--set key=value`` overrides config entries (e.g.
a small ``vocab_size`` or ``n_routed_experts`` for a CPU run).
"""

import argparse
import contextlib
import importlib
import json
import math
import os
import statistics
import sys
import time

import mlx.core as mx
import mlx.nn as nn

from . import report

IMPLS = {
    "mlx_fp4": "mlx_fp4.nn.quantize (wraps the nvfp4 bytes) + mlx_fp4.distributed.shard_model",
    "mlx_nvfp4": "mlx.nn.quantize(mode='nvfp4') + model.shard() (MLX's nvfp4 sharded layers)",
}
_LLAMA = dict(rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False, vocab_size=128256,
              max_position_embeddings=8192)
PRESETS = {
    "llama3-8b": ("llama", "latency", dict(
        _LLAMA, model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8)),
    "llama3-405b": ("llama", "capacity", dict(
        _LLAMA, model_type="llama", hidden_size=16384, intermediate_size=53248, num_hidden_layers=126,
        num_attention_heads=128, num_key_value_heads=8)),
    "deepseek-v3": ("deepseek_v3", "capacity", dict(
        model_type="deepseek_v3", vocab_size=129280, hidden_size=7168, intermediate_size=18432,
        moe_intermediate_size=2048, num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128,
        n_shared_experts=1, n_routed_experts=256, routed_scaling_factor=2.5, kv_lora_rank=512,
        q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128, topk_method="noaux_tc",
        scoring_func="sigmoid", norm_topk_prob=True, n_group=8, topk_group=4, num_experts_per_tok=8,
        moe_layer_freq=1, first_k_dense_replace=3, max_position_embeddings=4096, rms_norm_eps=1e-6,
        rope_theta=10000.0)),
}
MEMORY_FRACTION = 0.7  # of a rank's memory for the weights under --layers auto (KV cache, temporaries)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m mlx_fp4.bench sharded", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=list(PRESETS), default="llama3-8b")
    p.add_argument("--layers", default=None, help="decoder layers: an int or 'auto' (what fits; capacity presets' "
                   "default), default: the preset's count for latency presets")
    p.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                   help="override config entries (JSON values)")
    p.add_argument("--impls", nargs="+", choices=list(IMPLS), default=list(IMPLS))
    p.add_argument("--prompt", type=int, default=16, help="prefill tokens before the timed decode")
    p.add_argument("--steps", type=int, default=32, help="decode tokens per repeat")
    p.add_argument("--prefill", type=int, default=512, help="tokens of the timed prefill (0: skip)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--comm", choices=("both", "real", "off"), default="both",
                   help="time with the real all_sum, with all_sum as the identity, or both")
    p.add_argument("--device", choices=("cpu", "gpu"), default=None)
    p.add_argument("--backend", default="any", help="mx.distributed.init backend (ring, nccl, mpi, jaccl; any)")
    p.add_argument("--out", default="bench-out")
    p.add_argument("--compare", nargs=2, metavar=("ONE.json", "MANY.json"),
                   help="print the scaling of a many-rank JSON over a 1-rank JSON and exit")
    return p.parse_args(argv)


def config_for(args) -> tuple:
    arch, kind, cfg = PRESETS[args.preset]
    cfg = dict(cfg)
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"[bench sharded] --set expected KEY=VALUE but got {item!r}")
        try:
            cfg[key] = json.loads(value)
        except json.JSONDecodeError:
            cfg[key] = value
    return arch, kind, cfg


def build(arch: str, cfg: dict, seed: int = 0) -> nn.Module:
    """The model, lazily (nothing evaluated), with mlx's nvfp4 layers over random weights."""
    mod = importlib.import_module(f"mlx_lm.models.{arch}")
    mx.random.seed(seed)
    model = mod.Model(mod.ModelArgs.from_dict(cfg))
    model.set_dtype(mx.bfloat16)
    nn.quantize(model, group_size=16, bits=4, mode="nvfp4",
                class_predicate=lambda p, m: hasattr(m, "to_quantized") and not isinstance(m, nn.Embedding))
    return model


def layer_bytes(model) -> int:
    """Bytes of the decoder layers' parameters (lazy arrays know their size)."""
    from mlx.utils import tree_flatten

    return sum(a.nbytes for _, a in tree_flatten(model.model.layers[-1].parameters()) if isinstance(a, mx.array))


def auto_layers(arch, cfg, n_ranks, device) -> int:
    """Decoder layers whose weights fit MEMORY_FRACTION of one rank's memory (the ranks of one host
    share it on the CPU), at least 1, at most the preset's count."""
    one = build(arch, dict(cfg, num_hidden_layers=1, first_k_dense_replace=0))
    per_rank = layer_bytes(one) / n_ranks
    mem = report.available_memory_bytes(device) / (n_ranks if device == "cpu" else 1)
    return max(1, min(cfg["num_hidden_layers"], int(mem * MEMORY_FRACTION // per_rank)))


def prepare(impl: str, model, group) -> None:
    from .. import distributed as D
    from .. import nn as fnn

    if impl == "mlx_fp4":
        fnn.quantize(model, progress=False)
        if group.size() > 1:
            D.shard_model(model, group)
    elif group.size() > 1:
        model.shard(group)
    for layer in model.model.layers:  # one layer's full float weights at a time
        mx.eval(layer.parameters())
    mx.eval(model.parameters())


@contextlib.contextmanager
def no_comm(active: bool, calls: list = None):
    """``mx.distributed.all_sum`` as the identity inside (the compute-only timing); with ``calls``,
    the real one that appends (dtype, bytes) of every call instead."""
    if not active and calls is None:
        yield
        return
    real = mx.distributed.all_sum

    def counted(x, *a, **k):
        calls.append((str(x.dtype), x.nbytes))
        return real(x, *a, **k)

    mx.distributed.all_sum = counted if calls is not None else (lambda x, *a, **k: x)
    try:
        yield
    finally:
        mx.distributed.all_sum = real


def traffic(model, tokens: int) -> dict:
    """all_sum calls and bytes per rank of one forward over ``tokens`` new tokens."""
    from mlx_lm.models.cache import make_prompt_cache

    calls = []
    with no_comm(False, calls):
        mx.eval(model(mx.zeros((1, tokens), mx.int32), cache=make_prompt_cache(model)))
    return {"tokens": tokens, "all_sum_calls": len(calls), "bytes": sum(b for _, b in calls),
            "dtypes": sorted({d for d, _ in calls})}


def _barrier(group):
    if group.size() > 1:
        mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group))


def _slowest(seconds: float, group) -> float:
    from ..distributed import group_max

    return group_max(mx.array(seconds), group).item()


def time_decode(model, prompt, steps):
    """Seconds for ``steps`` pipelined decode steps after a prefill of ``prompt``."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)

    def step(tok):
        return mx.argmax(model(tok[None], cache=cache)[:, -1], axis=-1)

    y = step(prompt)
    mx.eval(y)
    t0 = time.perf_counter()
    for _ in range(steps):
        nxt = step(y)
        mx.async_eval(nxt)
        y = nxt
    mx.eval(y)
    return time.perf_counter() - t0


def time_prefill(model, tokens):
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    t0 = time.perf_counter()
    mx.eval(model(tokens[None], cache=cache))
    return time.perf_counter() - t0


def measure(model, group, args, vocab, comm_off: bool) -> dict:
    prompt = mx.random.randint(0, vocab, (args.prompt,), key=mx.random.key(1))
    long = mx.random.randint(0, vocab, (args.prefill,), key=mx.random.key(2)) if args.prefill else None
    out = {}
    phases = [("decode", lambda: time_decode(model, prompt, args.steps), args.steps)]
    if long is not None:
        phases.append(("prefill", lambda: time_prefill(model, long), args.prefill))
    for phase, run, tokens in phases:
        with no_comm(comm_off):
            run()  # warm-up (compiles kernels, sizes the allocator)
        times = []
        for _ in range(args.repeats):
            _barrier(group)
            with no_comm(comm_off):
                dt = run()
            times.append(_slowest(dt, group))
        med = statistics.median(times)
        out[phase] = {"tokens": tokens, "seconds": med, "tokens_per_s": tokens / med, "all_seconds": times}
    return out


def _ms_per_token(entry, phase):
    return 1e3 * entry[phase]["seconds"] / entry[phase]["tokens"]


def summarize(res: dict) -> list:
    """Lines of the per-run table: ms per token real / compute-only, communication share."""
    lines = ["| impl | phase | tokens/s | ms/token | ms/token without all_sum | all_sum share |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for impl, r in res.items():
        for phase in r.get("real") or r.get("off") or {}:
            real, off = r.get("real", {}).get(phase), r.get("off", {}).get(phase)
            ms = _ms_per_token(r["real"], phase) if real else math.nan
            ms_off = _ms_per_token(r["off"], phase) if off else math.nan
            share = (ms - ms_off) / ms if real and off else math.nan
            tps = real["tokens_per_s"] if real else off["tokens_per_s"]
            lines.append(f"| {impl} | {phase} | {tps:.4g} | {ms:.4g} | {ms_off:.4g} | {share:.0%} |")
    return lines


def compare(one_path: str, many_path: str) -> str:
    one, many = (json.load(open(p)) for p in (one_path, many_path))
    if one["layers"] != many["layers"] or one["preset"] != many["preset"]:
        print(f"WARNING: different runs ({one['preset']} x {one['layers']} vs {many['preset']} x {many['layers']} "
              "layers): scaling of ms per token per layer", file=sys.stderr)
    lines = [f"{many['preset']}: {many['ranks']} ranks ({many['backend']}) over 1, {many['layers']} layers",
             "", "| impl | phase | 1 rank ms/token/layer | n ranks | speedup | vs mlx_nvfp4 on n ranks "
             "| weight GB/s per rank (decode: every weight read once per token) |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for impl in many["results"]:
        for phase in many["results"][impl].get("real", {}):
            a = _ms_per_token(one["results"][impl]["real"], phase) / one["layers"]
            b = _ms_per_token(many["results"][impl]["real"], phase) / many["layers"]
            base = many["results"].get("mlx_nvfp4", {}).get("real", {}).get(phase)
            vs = (_ms_per_token(many["results"]["mlx_nvfp4"]["real"], phase) / many["layers"]) / b if base else math.nan
            gbps = many["weight_bytes_per_rank"][impl] / (b * many["layers"]) / 1e6 if phase == "decode" else math.nan
            lines.append(f"| {impl} | {phase} | {a:.4g} | {b:.4g} | {a / b:.2f}x | {vs:.2f}x | {gbps:.4g} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.compare:
        print(compare(*args.compare))
        return 0
    device = args.device or ("gpu" if (mx.metal.is_available() or mx.cuda.is_available()) else "cpu")
    mx.set_default_device(mx.gpu if device == "gpu" else mx.cpu)
    group = mx.distributed.init(backend=args.backend)  # a singleton group without a launcher
    n, rank = group.size(), group.rank()
    arch, kind, cfg = config_for(args)
    layers = args.layers or ("auto" if kind == "capacity" else str(cfg["num_hidden_layers"]))
    cfg["num_hidden_layers"] = auto_layers(arch, cfg, n, device) if layers == "auto" else int(layers)
    if arch == "deepseek_v3":
        cfg["first_k_dense_replace"] = min(cfg["first_k_dense_replace"], cfg["num_hidden_layers"] - 1)
    results, weights = {}, {}
    for impl in args.impls:
        model = build(arch, cfg)
        prepare(impl, model, group)
        weights[impl] = layer_bytes(model) * cfg["num_hidden_layers"]
        modes = {"both": (False, True), "real": (False,), "off": (True,)}[args.comm if n > 1 else "real"]
        results[impl] = {("off" if off else "real"): measure(model, group, args, cfg["vocab_size"], off) for off in modes}
        results[impl]["traffic"] = [traffic(model, t) for t in (1, args.prefill) if t]
        del model
    if rank != 0:
        return 0
    doc = {
        "schema": 1,
        "command": "python -m mlx_fp4.bench sharded " + " ".join(sys.argv[1:] if argv is None else argv),
        "preset": args.preset, "kind": kind, "arch": arch, "config": cfg, "layers": cfg["num_hidden_layers"],
        "ranks": n, "backend": args.backend if n > 1 else None,
        "device": report.system_info(device),
        "env": {k: os.environ[k] for k in ("MLX_USE_CUDA_GRAPHS", "NCCL_NVLS_ENABLE", "MLX_FP4_CUDA_PATH") if k in os.environ},
        "implementations": {k: IMPLS[k] for k in args.impls},
        "weight_bytes_per_rank": weights,
        "timing": f"median of {args.repeats} repeats after one warm-up, slowest rank; decode: {args.steps} "
                  f"pipelined steps after a {args.prompt}-token prompt; prefill: {args.prefill} tokens, fresh cache",
        "results": results,
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"sharded_{args.preset}_{n}rank.json")
    report.write_json(path, doc)
    print(f"{args.preset} ({kind}), {cfg['num_hidden_layers']} layers, {n} rank(s), {device} "
          f"({doc['device']['device_name']})")
    print("\n".join(summarize(results)))
    for impl, r in results.items():
        print(f"{impl} all_sum per forward: " + "; ".join(
            f"{t['tokens']} tokens: {t['all_sum_calls']} calls, {t['bytes'] / 2**20:.3g} MiB {'/'.join(t['dtypes'])}"
            for t in r["traffic"]))
    print(f"wrote {path}")
    return 0

