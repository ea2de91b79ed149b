"""``mlx-fp4`` (also ``python -m mlx_fp4``): convert / generate / bench.

* ``convert``: a float, ModelOpt, compressed-tensors or MLX-nvfp4 folder (or Hugging Face repo),
  or a Llama-family ``.gguf`` file (dequantized first, docs/gguf.md) -> an MLX folder with FP4
  layers (options as ``mlx_lm.convert``'s, FP4 modes only);
* ``generate``: mlx-lm's generation loop on our layers; prints the text, tokens/s and peak
  memory as ``mlx_lm.generate`` does;
* ``bench``: ``python -m mlx_fp4.bench`` with the same arguments.

Needs mlx-lm for convert and generate (from a clone: ``pip install ".[cpu,lm]"`` on Linux,
``pip install ".[lm]"`` on macOS).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path
from typing import List, Optional

from mlx.utils import tree_flatten

from . import convert as _convert
from . import formats
from ._build_info import GPU_BACKEND
from ._version import __version__
from .bench import __main__ as _bench
from .checkpoints import load, save_nvfp4
from .checkpoints.gguf import is_gguf, load_gguf
from .checkpoints.source import resolve
from .layers import fuse_swiglu
from .recipes import quantize_like_mlx_lm

PREDICATES = ("all", "skip-lm-head")
DTYPES = ("float16", "bfloat16", "float32")
GLOBAL_SCALES = {"auto": "auto", "true": True, "false": False}


class CLIError(Exception):
    """A bad option: printed as ``mlx-fp4 <command>: error: ...``, exit status 2."""


def _predicate(spec: str):
    """--quant-predicate: a name in PREDICATES or ``regex:<pattern>`` (layers whose path matches)."""
    if spec == "all":
        return None
    if spec == "skip-lm-head":
        return lambda path, m: _convert._skip_reason(path, m) is None and not path.endswith("lm_head")
    if spec.startswith("regex:"):
        pattern = re.compile(spec[len("regex:"):])
        return lambda path, m: _convert._skip_reason(path, m) is None and pattern.search(path) is not None
    raise CLIError(f"--quant-predicate expected one of {', '.join(PREDICATES)} or regex:<pattern> but got {spec!r}")


def _cast(model, dtype_name: str) -> None:
    """Floating parameters (not the packed weights or scales) to ``dtype_name``."""
    import mlx.core as mx
    from mlx.utils import tree_map

    dtype = getattr(mx, dtype_name)
    model.update(tree_map(lambda a: a.astype(dtype) if mx.issubdtype(a.dtype, mx.floating) else a,
                          model.parameters()))


def _checked(value, ok: bool, option: str, expected: str):
    """A generate option's value, or a CLIError naming it with the expected range."""
    if not ok:
        raise CLIError(f"{option} expected {expected} but got {value!r}")
    return value


def check_generate_args(args) -> None:
    """Values mlx-lm would loop on forever (--max-tokens < 0) or fail inside on (0, an empty prompt)."""
    _checked(args.max_tokens, args.max_tokens >= 1, "--max-tokens", "a positive integer")
    _checked(args.prompt, bool(args.prompt.strip()), "--prompt", "non-empty text")
    _checked(args.temp, math.isfinite(args.temp) and args.temp >= 0, "--temp", "a number >= 0 (0: greedy)")
    _checked(args.top_p, 0 < args.top_p <= 1, "--top-p", "a number in (0, 1]")


def cmd_convert(args) -> int:
    if args.upload_repo:
        raise CLIError("--upload-repo: uploading is off; upload the folder with `hf upload` instead")
    try:
        formats.check_config(args.q_group_size, args.q_bits, args.q_mode, "mlx-fp4 convert")
    except ValueError as e:
        raise CLIError(str(e)) from e
    out = Path(args.mlx_path)
    if out.exists() and any(out.iterdir()):
        raise CLIError(f"--mlx-path {str(out)!r} exists and is not empty; remove it or choose another")
    predicate = _predicate(args.quant_predicate)
    where = "mlx-fp4 convert: --hf-path"
    print(f"[INFO] Loading {args.hf_path}")
    if is_gguf(args.hf_path):  # a GGUF file: its layers dequantized (bf16), then quantized as a float source
        resolve(args.hf_path, where, download=False)
        model, source, config = load_gguf(args.hf_path, dequantize=True, lazy=True, return_config=True)
    else:
        source = resolve(args.hf_path, where)
        model, _, config = load(str(source), return_config=True, lazy=True)
    dtype = args.dtype or config.get("torch_dtype")
    if dtype in DTYPES:
        _cast(model, dtype)
    if args.quantize:
        summary = quantize_like_mlx_lm(model, args.q_group_size, args.q_bits, mode=args.q_mode,
                                       global_scale=GLOBAL_SCALES[args.global_scale], user_predicate=predicate)
        for path, why in sorted(summary.skipped.items()):
            print(f"[INFO] kept {path}: {why}")
    elif not any(k.endswith(".scales") for k, _ in tree_flatten(model.parameters())):
        print("[INFO] No layer is quantized: writing the weights as they are (pass -q to quantize to FP4).")
    print(f"[INFO] Saving to {out}")
    files = save_nvfp4(out, model, config=config, tokenizer=source)
    print(f"[INFO] Wrote {len(files)} files; open with `mlx-fp4 generate --model {out}` or mlx_fp4.load.")
    return 0


def cmd_generate(args) -> int:
    import mlx.core as mx
    from mlx_lm import generate
    from mlx_lm.sample_utils import make_sampler

    check_generate_args(args)
    if args.seed is not None:
        mx.random.seed(args.seed)
    model, tokenizer = load(args.model)
    if args.fuse_swiglu:
        fuse_swiglu(model)
    prompt = args.prompt.replace("\\n", "\n")
    if not args.ignore_chat_template and getattr(tokenizer, "chat_template", None):
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    generate(model, tokenizer, prompt, max_tokens=args.max_tokens, verbose=True,
             sampler=make_sampler(args.temp, top_p=args.top_p))
    return 0


def cmd_bench(rest: List[str]) -> int:
    return _bench.main(rest, prog="mlx-fp4 bench")


def version_text() -> str:
    import mlx.core as mx

    return f"mlx-fp4 {__version__} (mlx {mx.__version__}, GPU backend: {GPU_BACKEND})"


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help with '(default: ...)' where there is a default to show (not for required options or flags)."""

    def _get_help_string(self, action):
        if action.required or action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def parser() -> argparse.ArgumentParser:
    fmt = _DefaultsFormatter
    p = argparse.ArgumentParser(prog="mlx-fp4", description="FP4 (NVFP4 / MXFP4) models on MLX with mlx_fp4's "
                                "kernels: convert a checkpoint, generate text, benchmark.")
    p.add_argument("--version", action="version", version=version_text())
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("convert", help="a float / ModelOpt / compressed-tensors / MLX folder or .gguf -> an MLX "
                       "FP4 folder", formatter_class=fmt,
                       description="Convert a model to an MLX folder with FP4 layers (options as mlx_lm.convert's; "
                       "FP4 modes only). With -q the float linear layers are quantized; the model's own mlx-lm "
                       "quant_predicate (e.g. an 8-bit MoE router) is honoured as mlx_lm.convert honours it.")
    c.add_argument("--hf-path", "--model", required=True, help="local folder, Hugging Face repo or .gguf file")
    c.add_argument("--mlx-path", default="mlx_model", help="output folder")
    c.add_argument("-q", "--quantize", action="store_true", help="quantize the float linear layers to FP4")
    c.add_argument("--q-group-size", type=int, default=None, help="the mode's (16 nvfp4, 32 mxfp4); others are an error")
    c.add_argument("--q-bits", type=int, default=None, help="4; others are an error")
    c.add_argument("--q-mode", default=formats.MODE, help=f"one of {', '.join(formats.MODES)}")
    c.add_argument("--global-scale", choices=tuple(GLOBAL_SCALES), default="auto",
                   help="per-tensor global scales (nvfp4): auto (where they lower the error), true, false "
                        "(false: the folder opens in stock mlx-lm)")
    c.add_argument("--quant-predicate", default="all",
                   help=f"which layers -q quantizes: {', '.join(PREDICATES)} or regex:<pattern>")
    c.add_argument("--dtype", choices=DTYPES, default=None, help="dtype of the unquantized parameters "
                   "(default: the config's torch_dtype)")
    c.add_argument("--upload-repo", default=None, help="not supported (uploading is off)")
    c.set_defaults(run=cmd_convert)

    g = sub.add_parser("generate", help="generate text with mlx-lm's loop on FP4 layers", formatter_class=fmt,
                       description="Load a model with FP4 layers (any folder convert reads, or a .gguf file) "
                       "and generate with mlx-lm's loop, printing the text, tokens/s and peak memory as "
                       "mlx_lm.generate does.")
    g.add_argument("--model", required=True, help="local folder or Hugging Face repo (any NVFP4 dialect) or .gguf file")
    g.add_argument("--prompt", "-p", default="Hello", help="prompt text ('\\n' for newlines)")
    g.add_argument("--max-tokens", "-m", type=int, default=100, help="tokens to generate at most (>= 1)")
    g.add_argument("--temp", type=float, default=0.0, help="sampling temperature (>= 0; 0: greedy)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold in (0, 1] (1: off)")
    g.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    g.add_argument("--ignore-chat-template", action="store_true", help="send the prompt as is, without the "
                   "tokenizer's chat template")
    g.add_argument("--fuse-swiglu", action="store_true", help="fuse the SwiGLU MLPs (layers.swiglu.SWIGLU_MLPS)")
    g.set_defaults(run=cmd_generate)

    sub.add_parser("bench", help="benchmarks (mlx-fp4 bench --help; also python -m mlx_fp4.bench)", add_help=False)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:
        return cmd_bench(argv[1:])
    p = parser()
    args = p.parse_args(argv)
    try:
        return args.run(args)
    except CLIError as e:
        print(f"mlx-fp4 {args.command}: error: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError) as e:  # a missing model, a checkpoint the loaders refuse
        print(f"mlx-fp4 {args.command}: error: {e}", file=sys.stderr)
        return 1
