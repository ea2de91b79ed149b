"""mlx_fp4 in an mlx-lm model: convert, check, and time greedy decoding.

Builds a Llama (or Qwen3) from mlx_lm.models with random weights (no download, no tokenizer),
converts its linear layers with ``mx_fp4.nn.quantize``, greedy-decodes a fixed prompt of token
ids, and compares with

* the same model holding the dequantized weights (dense ``nn.Linear``): tokens and logits,
* the same model with MLX's own ``nn.QuantizedLinear(mode="nvfp4")`` (same bytes): tokens/s.

    PYTHONPATH=python python examples/mlx_lm_fp4.py --preset small
    python examples/mlx_lm_fp4.py --arch qwen3 --dtype float16 --global-scale --fuse-swiglu

Runs on MLX's current default device (``--device cpu|gpu`` to choose).
"""

import argparse
import copy
import time

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.generate import generate_step

import mlx_fp4.nn as fnn

PRESETS = {
    # hidden, layers, intermediate, heads, kv heads, vocab
    "tiny": (128, 2, 384, 4, 2, 1024),
    "small": (512, 4, 1408, 8, 4, 8192),
    "medium": (1024, 8, 2816, 16, 8, 32000),
    "1b": (2048, 16, 8192, 32, 8, 32000),
}


def build(arch, preset, dtype, seed, logit_scale=8.0):
    hidden, layers, inter, heads, kv, vocab = PRESETS[preset]
    common = dict(
        hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter,
        num_attention_heads=heads, num_key_value_heads=kv, rms_norm_eps=1e-5,
        vocab_size=vocab, tie_word_embeddings=False, max_position_embeddings=4096,
    )
    if arch == "llama":
        from mlx_lm.models import llama as mod

        args = mod.ModelArgs(model_type="llama", **common)
    else:
        from mlx_lm.models import qwen3 as mod

        args = mod.ModelArgs(model_type="qwen3", head_dim=hidden // heads, rope_theta=1e6, **common)
    mx.random.seed(seed)
    model = mod.Model(args)
    # Random weights give nearly flat next-token distributions, where greedy decoding is
    # decided by near-ties; a sharper output layer makes the token comparison meaningful.
    model.lm_head.weight = model.lm_head.weight * logit_scale
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


def to_mlx_nvfp4(model):
    """A copy whose FP4Linear layers are MLX nn.QuantizedLinear(mode="nvfp4") sharing the
    same weight/scales/bias arrays (global scales dropped: MLX's layer has none)."""
    from mlx.utils import tree_unflatten

    twin = copy.deepcopy(model)
    swaps = []
    for path, m in twin.named_modules():
        if isinstance(m, fnn.FP4Linear):
            q = nn.QuantizedLinear(16, 8, bias=False, mode="nvfp4")
            q.weight, q.scales = m.weight, m.scales
            if "bias" in m:
                q.bias = m.bias
            swaps.append((path, q))
    twin.update_modules(tree_unflatten(swaps))
    return twin


def decode(model, prompt, steps):
    """Greedy tokens, per-step log-probs, prefill seconds, decode tokens/s."""
    toks, logps = [], []
    t0 = time.perf_counter()
    t1 = None
    for tok, lp in generate_step(mx.array(prompt), model, max_tokens=steps):
        mx.eval(tok, lp)
        if t1 is None:
            t1 = time.perf_counter()
        toks.append(int(tok))
        logps.append(lp)
    t2 = time.perf_counter()
    tps = (len(toks) - 1) / (t2 - t1) if len(toks) > 1 else float("nan")
    return toks, np.stack([np.array(l.astype(mx.float32)) for l in logps]), t1 - t0, tps


def timed(model, prompt, steps, repeats):
    decode(model, prompt, min(steps, 4))  # warm-up (kernel compilation, caches)
    runs = [decode(model, prompt, steps) for _ in range(repeats)]
    best = max(runs, key=lambda r: r[3])
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=["llama", "qwen3"], default="llama")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="small")
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--global-scale", action="store_true", help="per-tensor global scales")
    ap.add_argument("--fuse-swiglu", action="store_true", help="fused SwiGLU MLP epilogue")
    ap.add_argument("--device", choices=["cpu", "gpu"], default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--logit-scale", type=float, default=8.0,
                    help="multiplies the random lm_head (sharper logits, fewer near-ties)")
    a = ap.parse_args()
    if a.device:
        mx.set_default_device(mx.cpu if a.device == "cpu" else mx.gpu)
    dtype = getattr(mx, a.dtype)
    rng = np.random.default_rng(a.seed)
    vocab = PRESETS[a.preset][5]
    prompt = [int(t) for t in rng.integers(1, vocab, a.prompt_len)]

    print(f"device {mx.default_device()}  arch {a.arch}  preset {a.preset} {PRESETS[a.preset]}  "
          f"dtype {a.dtype}  prompt {a.prompt_len} tokens  decode {a.steps} tokens")
    base = build(a.arch, a.preset, dtype, a.seed, a.logit_scale)

    # mx_fp4: quantize the float model (RNE quantizer, optional global scales)
    fp4 = base
    fnn.quantize(fp4, global_scale=a.global_scale)
    # MLX's own nvfp4 layers holding the very same bytes
    mlx_q = to_mlx_nvfp4(fp4)
    if a.fuse_swiglu:
        fnn.fuse_swiglu(fp4)

    # the same model with the dequantized weights (dense matmuls)
    dense = copy.deepcopy(fp4)
    fnn.dequantize(dense, dtype=mx.float32)
    dense.set_dtype(dtype)
    mx.eval(dense.parameters())

    t_fp4, l_fp4, pre_fp4, tps_fp4 = timed(fp4, prompt, a.steps, a.repeats)
    t_den, l_den, pre_den, tps_den = timed(dense, prompt, a.steps, a.repeats)
    same = t_fp4 == t_den
    first = next((i for i, (x, y) in enumerate(zip(t_fp4, t_den)) if x != y), None)
    upto = len(t_fp4) if first is None else first + 1
    # compare where it matters: the reference's 8 most likely tokens at each step
    top = np.argsort(-l_den[:upto], axis=-1)[:, :8]
    diff = np.abs(np.take_along_axis(l_fp4[:upto], top, -1) - np.take_along_axis(l_den[:upto], top, -1)).max()
    print(f"mx_fp4 tokens     : {t_fp4}")
    print(f"dequantized tokens: {t_den}")
    note = ""
    if not same:
        gap = abs(l_den[first][t_fp4[first]] - l_den[first][t_den[first]])
        note = (f" (first difference at step {first}, where the dequantized model's two "
                f"candidates are {gap:.3g} apart in log-prob)")
    print(f"tokens identical: {same}{note}; max |logprob diff| (top-8 tokens) up to there: {diff:.3g}")

    mx_fp4_label = "mx_fp4 FP4Linear" + (" + fused SwiGLU" if a.fuse_swiglu else "")
    rows = [(mx_fp4_label, pre_fp4, tps_fp4)]
    if not a.global_scale:  # MLX's quantized_matmul has no global scale
        t_mlx, _, pre_mlx, tps_mlx = timed(mlx_q, prompt, a.steps, a.repeats)
        rows.append(("MLX nvfp4 QuantizedLinear", pre_mlx, tps_mlx))
        print(f"MLX nvfp4 tokens  : {t_mlx} ({'same' if t_mlx == t_fp4 else 'different'} tokens)")
    else:
        print("MLX nvfp4 QuantizedLinear: skipped (mx.quantized_matmul ignores global scales)")
    rows.append((f"dense {a.dtype} (dequantized)", pre_den, tps_den))
    print(f"\n{'model':40s} {'prefill s':>10s} {'decode tok/s':>13s}")
    for name, pre, tps in rows:
        print(f"{name:40s} {pre:10.3f} {tps:13.1f}")


if __name__ == "__main__":
    main()
