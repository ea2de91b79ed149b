"""Llama-family GGUF files (llama.cpp's format) as an mlx-lm model and tokenizer.

:func:`load_gguf` reads the file with ``mx.load`` (which turns Q4_0 / Q4_1 / Q8_0 tensors into
MLX affine ``weight`` / ``scales`` / ``biases`` triples with groups of 32, 4 or 8 bits, and the
K-quants, BF16 and F16 into float16), builds mlx-lm's own ``llama`` model from the metadata,
quantizes the layers that came quantized with ``nn.quantize`` (affine, as mx.load gives them)
and loads the tensors under mlx-lm's names. ``dequantize=True`` gives float layers instead
(``mlx_lm.utils.dequantize_model``, then ``dtype``): the start of an FP4 conversion.

The tokenizer (llama.cpp's ``gpt2`` byte-level BPE) is rebuilt from the metadata with the
``tokenizers`` package and wrapped as mlx-lm's ``TokenizerWrapper`` over transformers'
``PreTrainedTokenizerFast``, chat template included.

GGUF's q/k projections are permuted for GPT-J style rotary embeddings (llama.cpp's converter
does it), hence ``rope_traditional=True``: with mlx-lm's default the model still runs but its
perplexity is ~20x worse.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Dict, Tuple, Union

import mlx.core as mx
import mlx.nn as nn

__all__ = ["is_gguf", "load_gguf", "gguf_config", "gguf_tokenizer", "gguf_tensor_types"]

ARCHITECTURES = ("llama",)
GROUP = 32  # every affine tensor mx.load returns from GGUF (Q4_0, Q4_1, Q8_0) has groups of 32

# ggml tensor types by id (ggml.h); mx.load reads 0, 1, 2, 3, 8 and the K-quants / BF16 (as f16).
GGML_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
    17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS",
    24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0",
    35: "TQ2_0", 39: "MXFP4",
}
READABLE = ("F32", "F16", "Q4_0", "Q4_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "BF16")

# GGUF tensor names -> mlx-lm llama names (blk.N.<key> -> model.layers.N.<value>).
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
IGNORED = ("rope_freqs",)  # handled (or refused) through the metadata, not as a parameter

# llama.cpp's pre-tokenizer names (tokenizer.ggml.pre) -> (split digits one by one, regex or None
# for GPT-2's, which ByteLevel applies itself).
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS = {"default": (False, None), "gpt2": (False, None), "smollm": (True, None),
                  "llama-bpe": (False, LLAMA3_REGEX), "llama3": (False, LLAMA3_REGEX)}


def is_gguf(path) -> bool:
    """True for a path that names a ``.gguf`` file (the routing rule of load / convert)."""
    return str(path).lower().endswith(".gguf")


# --------------------------------------------------------------------------- #
# Header (only read to name what mx.load cannot)
# --------------------------------------------------------------------------- #
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def gguf_tensor_types(path) -> Dict[str, str]:
    """``{tensor name: ggml type name}`` from the file's header (GGUF v2/v3)."""
    with open(path, "rb") as f:
        def read(fmt):
            return struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))[0]

        def string():
            return f.read(read("Q")).decode("utf-8", "replace")

        def value(t):
            if t == 8:
                return string()
            if t == 9:
                inner, n = read("I"), read("Q")
                if inner in _SCALARS:  # skip without decoding
                    f.seek(n * struct.calcsize(_SCALARS[inner]), 1)
                else:
                    for _ in range(n):
                        value(inner)
                return None
            return read(_SCALARS[t])

        if f.read(4) != b"GGUF":
            raise ValueError(f"[load_gguf] {str(path)!r} is not a GGUF file (no GGUF magic).")
        version = read("I")
        if version < 2:
            raise ValueError(f"[load_gguf] {str(path)!r}: GGUF version {version} is not supported.")
        n_tensors, n_kv = read("Q"), read("Q")
        for _ in range(n_kv):
            string()
            value(read("I"))
        types = {}
        for _ in range(n_tensors):
            name = string()
            f.seek(8 * read("I"), 1)  # dims
            t = read("I")
            read("Q")  # offset
            types[name] = GGML_TYPES.get(t, f"type {t}")
        return types


def _read(path) -> Tuple[Dict[str, mx.array], dict]:
    try:
        return mx.load(str(path), return_metadata=True)
    except Exception as e:  # mx.load: "[load_gguf] gguf_tensor_to_f16 failed" and the like
        if not Path(path).is_file():
            raise
        try:
            types = gguf_tensor_types(path)
        except Exception:
            raise ValueError(f"[load_gguf] mx.load cannot read {str(path)!r}: {e}") from e
        bad = {n: t for n, t in types.items() if t not in READABLE}
        if bad:
            name, t = next(iter(bad.items()))
            raise ValueError(
                f"[load_gguf] {str(path)!r}: tensor {name!r} has GGML type {t}, which mx.load cannot "
                f"read ({len(bad)} tensor(s) of type(s) {', '.join(sorted(set(bad.values())))}); readable: "
                f"{', '.join(READABLE)}. Re-quantize the file (llama-quantize) to Q4_0, Q4_1, Q8_0, a K-quant "
                "or F16."
            ) from e
        raise ValueError(f"[load_gguf] mx.load cannot read {str(path)!r}: {e}") from e


# --------------------------------------------------------------------------- #
# Config and weights
# --------------------------------------------------------------------------- #
def _meta(md: dict, key: str, default=None, kind=int):
    v = md.get(key, default)
    if v is None:
        raise ValueError(f"[load_gguf] metadata {key!r} is missing.")
    if isinstance(v, mx.array):
        v = v.item()
    return kind(v)


def _architecture(md: dict) -> str:
    arch = md.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"[load_gguf] general.architecture {arch!r} is not supported; supported: "
            f"{', '.join(ARCHITECTURES)} (Llama-family files: Llama, SmolLM, TinyLlama, Mistral-as-llama...)."
        )
    return arch


def gguf_config(md: dict, weights: Dict[str, mx.array]) -> dict:
    """mlx-lm's ``llama`` config (``config.json`` keys) from GGUF metadata."""
    a = _architecture(md)
    if "rope_freqs.weight" in weights or md.get(f"{a}.rope.scaling.type") not in (None, "none"):
        raise ValueError(f"[load_gguf] rope scaling ({md.get(f'{a}.rope.scaling.type', 'rope_freqs')}) is not "
                         "supported.")
    heads = _meta(md, f"{a}.attention.head_count")
    hidden = _meta(md, f"{a}.embedding_length")
    tokens = md.get("tokenizer.ggml.tokens")
    vocab = md.get(f"{a}.vocab_size", len(tokens) if tokens else weights["token_embd.weight"].shape[0])
    config = {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": _meta(md, f"{a}.block_count"),
        "intermediate_size": _meta(md, f"{a}.feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": _meta(md, f"{a}.attention.head_count_kv", heads),
        "head_dim": _meta(md, f"{a}.attention.key_length", hidden // heads),
        "rms_norm_eps": _meta(md, f"{a}.attention.layer_norm_rms_epsilon", kind=float),
        "rope_theta": _meta(md, f"{a}.rope.freq_base", 10000.0, kind=float),
        "rope_traditional": True,  # GGUF's q/k row order (see the module docstring)
        "max_position_embeddings": _meta(md, f"{a}.context_length", 4096),
        "vocab_size": _meta({"v": vocab}, "v"),
        "tie_word_embeddings": "output.weight" not in weights,
        "attention_bias": "blk.0.attn_q.bias" in weights,
        "mlp_bias": "blk.0.ffn_up.bias" in weights,
    }
    for key, name in (("bos_token_id", "bos"), ("eos_token_id", "eos")):
        if f"tokenizer.ggml.{name}_token_id" in md:
            config[key] = _meta(md, f"tokenizer.ggml.{name}_token_id")
    return config


def mlx_name(name: str) -> str:
    """A GGUF tensor name (``blk.3.attn_q.scales``) -> mlx-lm's (``model.layers.3.self_attn.q_proj.scales``)."""
    parts = name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in BLOCK_NAMES:
        return f"model.layers.{parts[1]}.{BLOCK_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in TOP_NAMES:
        return f"{TOP_NAMES[parts[0]]}.{parts[1]}"
    raise ValueError(f"[load_gguf] tensor {name!r} has no counterpart in mlx-lm's llama model.")


def _affine_bits(weights: Dict[str, mx.array], prefix: str) -> int:
    w, s = weights[f"{prefix}.weight"], weights[f"{prefix}.scales"]
    return w.shape[-1] * 32 // (s.shape[-1] * GROUP)


def load_gguf(path: Union[str, Path], *, dequantize: bool = False, dtype=mx.bfloat16, lazy: bool = False,
              return_config: bool = False):
    """``(model, tokenizer)`` (``+ config`` with ``return_config``) from a Llama-family GGUF file.

    The model is mlx-lm's ``llama.Model``. Tensors that came quantized (Q4_0 / Q4_1: affine 4 bits,
    Q8_0: 8 bits, groups of 32) are ``nn.QuantizedLinear`` / ``nn.QuantizedEmbedding`` on the same
    bytes, the rest float as stored; ``config["quantization"]`` records the recipe as mlx-lm
    writes it. ``dequantize=True``: every layer float (``mlx_lm.utils.dequantize_model``) and every
    floating parameter cast to ``dtype`` (bf16 default; ``None`` keeps them), the source to convert
    to NVFP4 / MXFP4 from. Raises ValueError for another architecture, a tensor type mx.load
    cannot read, rope scaling, or a tokenizer other than byte-level BPE.
    """
    from mlx_lm.models import llama
    from mlx_lm.utils import dequantize_model

    raw, md = _read(path)
    config = gguf_config(md, raw)
    weights = {mlx_name(k): v for k, v in raw.items() if k.split(".")[0] not in IGNORED}
    quantized = {k[: -len(".scales")]: _affine_bits(weights, k[: -len(".scales")])
                 for k in weights if k.endswith(".scales")}
    if quantized:
        counts = {b: list(quantized.values()).count(b) for b in set(quantized.values())}
        bits = max(counts, key=counts.get)
        q = {"group_size": GROUP, "bits": bits, "mode": "affine"}
        q.update({p: {"group_size": GROUP, "bits": b, "mode": "affine"} for p, b in quantized.items() if b != bits})
        config["quantization"] = q

    model = llama.Model(llama.ModelArgs.from_dict(config))

    def predicate(p, m):
        if p in quantized and hasattr(m, "to_quantized"):
            return {"group_size": GROUP, "bits": quantized[p], "mode": "affine"}
        return False

    nn.quantize(model, class_predicate=predicate)
    model.load_weights(list(weights.items()), strict=True)
    if dequantize:
        model = dequantize_model(model)
        config.pop("quantization", None)
        if dtype is not None:
            from mlx.utils import tree_map

            model.update(tree_map(lambda a: a.astype(dtype) if mx.issubdtype(a.dtype, mx.floating) else a,
                                  model.parameters()))
            config["torch_dtype"] = str(dtype).split(".")[-1]
    model.eval()
    if not lazy:
        mx.eval(model.parameters())
    tokenizer = gguf_tokenizer(md)
    return (model, tokenizer, config) if return_config else (model, tokenizer)


# --------------------------------------------------------------------------- #
# Tokenizer
# --------------------------------------------------------------------------- #
def _token(md: dict, name: str, tokens: list):
    i = md.get(f"tokenizer.ggml.{name}_token_id")
    return None if i is None else tokens[int(i.item() if isinstance(i, mx.array) else i)]


def gguf_tokenizer(md: dict):
    """mlx-lm's ``TokenizerWrapper`` over a ``PreTrainedTokenizerFast`` rebuilt from the metadata
    (``tokenizer.ggml.model == "gpt2"``: byte-level BPE; tokens of type control / user-defined
    are special tokens, never split)."""
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, TokenizerWrapper
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    kind = md.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"[load_gguf] tokenizer.ggml.model {kind!r} is not supported (only 'gpt2', byte-level "
                         "BPE; 'llama' is SentencePiece).")
    tokens = list(md["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in md.get("tokenizer.ggml.merges", [])]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                               ignore_merges=False, fuse_unk=False))
    pre = md.get("tokenizer.ggml.pre", "default")
    digits, regex = PRE_TOKENIZERS.get(pre, (False, None))
    steps = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
    if regex is not None:
        steps.append(pre_tokenizers.Split(Regex(regex), behavior="isolated"))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=regex is None))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    types = md.get("tokenizer.ggml.token_type")
    types = types.tolist() if isinstance(types, mx.array) else list(types or [])
    special = [tokens[i] for i, t in enumerate(types) if t in (3, 4)]  # CONTROL, USER_DEFINED
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])

    bos, eos = _token(md, "bos", tokens), _token(md, "eos", tokens)
    add_bos = md.get("tokenizer.ggml.add_bos_token", False)
    if bool(add_bos.item() if isinstance(add_bos, mx.array) else add_bos) and bos is not None:
        bos_id = tokens.index(bos)
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                           special_tokens=[(bos, bos_id)])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bos, eos_token=eos, unk_token=_token(md, "unknown", tokens),
        pad_token=_token(md, "padding", tokens), chat_template=md.get("tokenizer.chat_template"),
        clean_up_tokenization_spaces=False,
    )
    return TokenizerWrapper(hf, detokenizer_class=BPEStreamingDetokenizer,
                            eos_token_ids=[tokens.index(eos)] if eos is not None else None)
