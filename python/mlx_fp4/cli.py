"""``mlx-fp4`` (also ``python -m mlx_fp4``): convert / generate / bench.

* ``convert``: a float, ModelOpt, compressed-tensors or MLX-nvfp4 folder (or Hugging Face repo),
  or a Llama-family ``.gguf`` file (dequantized first, docs/gguf.md) -> an MLX folder with FP4
  layers (options as ``mlx_lm.convert``'s, nvfp4 only);
* ``generate``: mlx-lm's generation loop on our layers; prints the text, tokens/s and peak
  memory as ``mlx_lm.generate`` does;
* ``bench``: ``python -m mlx_fp4.bench`` with the same arguments.

Needs mlx-lm for convert and generate (``pip install "mlx-fp4[lm]"``).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import List, Optional

from . import convert as _convert
from . import formats
from .bench import __main__ as _bench
from .checkpoints import load, save_nvfp4
from .checkpoints.gguf import is_gguf, load_gguf
from .layers import fuse_swiglu

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
    from mlx_lm import utils as lm

    print(f"[INFO] Loading {args.hf_path}")
    if is_gguf(args.hf_path):  # a GGUF file: its layers dequantized (bf16), then quantized as a float source
        model, source, config = load_gguf(args.hf_path, dequantize=True, lazy=True, return_config=True)
    else:
        source = lm._download(args.hf_path)
        model, _, config = load(str(source), return_config=True, lazy=True)
    dtype = args.dtype or config.get("torch_dtype")
    if dtype in DTYPES:
        _cast(model, dtype)
    if args.quantize:
        summary = _convert.quantize(model, args.q_group_size, args.q_bits, mode=args.q_mode,
                                    class_predicate=predicate, global_scale=GLOBAL_SCALES[args.global_scale])
        for path, why in sorted(summary.skipped.items()):
            print(f"[INFO] kept {path}: {why}")
    print(f"[INFO] Saving to {out}")
    files = save_nvfp4(out, model, config=config, tokenizer=source)
    print(f"[INFO] Wrote {len(files)} files; open with `mlx-fp4 generate --model {out}` or mlx_fp4.load.")
    return 0


def cmd_generate(args) -> int:
    import mlx.core as mx
    from mlx_lm import generate
    from mlx_lm.sample_utils import make_sampler

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
    return _bench.main(rest)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mlx-fp4", description="NVFP4 models on MLX with mlx_fp4's kernels.")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("convert", help="a float / ModelOpt / compressed-tensors / MLX folder -> an MLX NVFP4 folder",
                       description="Options as mlx_lm.convert's, NVFP4 only.")
    c.add_argument("--hf-path", "--model", required=True, help="local folder, Hugging Face repo or .gguf file")
    c.add_argument("--mlx-path", default="mlx_model", help="output folder (default: mlx_model)")
    c.add_argument("-q", "--quantize", action="store_true", help="quantize the float linear layers to NVFP4")
    c.add_argument("--q-group-size", type=int, default=None, help="16 (nvfp4); anything else is an error")
    c.add_argument("--q-bits", type=int, default=None, help="4 (nvfp4); anything else is an error")
    c.add_argument("--q-mode", default=formats.MODE, help="nvfp4; anything else is an error")
    c.add_argument("--global-scale", choices=tuple(GLOBAL_SCALES), default="auto",
                   help="per-tensor global scales: auto (where they lower the error; default), true, false "
                        "(false: the folder opens in stock mlx-lm)")
    c.add_argument("--quant-predicate", default="all",
                   help=f"which layers -q quantizes: {', '.join(PREDICATES)} or regex:<pattern> (default all)")
    c.add_argument("--dtype", choices=DTYPES, default=None, help="dtype of the unquantized parameters")
    c.add_argument("--upload-repo", default=None, help="not supported (uploading is off)")
    c.set_defaults(run=cmd_convert)

    g = sub.add_parser("generate", help="generate text with mlx-lm's loop on FP4 layers")
    g.add_argument("--model", required=True, help="local folder or Hugging Face repo (any NVFP4 dialect) or .gguf file")
    g.add_argument("--prompt", "-p", default="Hello", help="prompt text ('\\n' for newlines)")
    g.add_argument("--max-tokens", "-m", type=int, default=100)
    g.add_argument("--temp", type=float, default=0.0, help="sampling temperature (0: greedy)")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--ignore-chat-template", action="store_true")
    g.add_argument("--fuse-swiglu", action="store_true", help="fuse the SwiGLU MLPs (layers.swiglu.SWIGLU_MLPS)")
    g.set_defaults(run=cmd_generate)

    sub.add_parser("bench", help="python -m mlx_fp4.bench (same arguments: mlx-fp4 bench --help)", add_help=False)
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
