"""Reading and writing NVFP4 safetensors: ``load_nvfp4`` (any dialect -> mlx_fp4's layout)
and ``save_nvfp4`` (mlx_fp4's layout -> the MLX layout mlx-lm writes)."""

from __future__ import annotations

import glob
import json
import os
import shutil
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple, Union

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from ..formats import GROUP_SIZE, VALUES_PER_U32, describe, group_size_of
from .dialects import (
    ACTIVATION_SCALES,
    DIALECT_KEYS,
    QUANTIZATION_NAMES,
    classify,
    from_compressed_tensors,
    load_error,
    match_pattern,
    from_mlx,
    from_modelopt,
    quant_info,
)
from .recipe import fp4_mode, quantization_block
from .safetensors_header import check_header

__all__ = ["load_nvfp4", "save_nvfp4", "NVFP4Weights", "checked_shapes", "copy_tokenizer", "read_configs"]

Source = Union[str, os.PathLike, Mapping[str, mx.array]]


class NVFP4Weights(dict):
    """``dict[str, mx.array]`` in mlx_fp4's layout (``global_scale`` entries in MLX's
    convention). Returned by :func:`load_nvfp4`; passing one back to
    :func:`load_nvfp4` or :func:`mlx_fp4.nn.load_weights` uses it as is.

    ``.dialects`` names the formats that were converted, ``.quantized`` lists
    the prefixes of the quantized linears.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.dialects = set()
        self.quantized = []


def _read_json(path: Path) -> Optional[dict]:
    """A config file's object, None when absent; malformed JSON or a non-object is a clear error."""
    if not path.is_file():
        return None
    try:
        with open(path) as f:
            obj = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise load_error(f"{path} is not valid JSON: {e}.") from None
    if not isinstance(obj, dict):
        raise load_error(f"{path} expected a JSON object but holds {type(obj).__name__}.")
    return obj


def _weight_map_files(weight_map, index_path: Path) -> List[str]:
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise load_error(f"{index_path} field 'weight_map' expected an object of tensor name -> file name "
                         f"but got {type(weight_map).__name__}.")
    return sorted(set(weight_map.values()))


def _inside(folder: Path, name: str, index_path: Path) -> Path:
    """A .safetensors file an index names, inside the folder by its name: an absolute path or one
    whose '..' climbs out is an error, so a checkpoint cannot make the loader read elsewhere.
    Symbolic links in the folder are followed (the Hugging Face cache links each file to a blob
    outside the snapshot folder)."""
    rel = os.path.normpath(name)
    if "\0" in rel or os.path.isabs(rel) or rel == os.pardir or rel.startswith(os.pardir + os.sep):
        raise load_error(f"{index_path} names {name!r}, which is outside the checkpoint folder {folder}.")
    if not rel.endswith(".safetensors"):
        raise load_error(f"{index_path} names {name!r}, not a .safetensors file.")
    return folder / rel


def read_configs(folder: Path) -> dict:
    """{'config': config.json, 'hf_quant_config': hf_quant_config.json} of a folder (those present)."""
    cfg = {}
    config = _read_json(folder / "config.json")
    if config is not None:
        cfg["config"] = config
    hf = _read_json(folder / "hf_quant_config.json")
    if hf is not None:
        cfg["hf_quant_config"] = hf
    return cfg


def checked_shapes(path: Path) -> Dict[str, List[int]]:
    """A safetensors file's tensor shapes from its checked header (check_header): what mx.load may
    read. Else a clear error naming the file."""
    try:
        return check_header(path)
    except OSError as e:
        raise load_error(f"cannot read {path}: {e}.") from None
    except ValueError as e:
        raise load_error(f"{path} is not a valid safetensors file: {e}.") from None


def _load_file(path: Path) -> Tuple[dict, dict]:
    """A safetensors file's arrays and metadata; its header is checked first."""
    shapes = checked_shapes(path)
    try:
        arrays, metadata = mx.load(str(path), return_metadata=True)
    except Exception as e:  # pragma: no cover - the header check above leaves MLX little to refuse
        raise load_error(f"cannot read {path}: {e}") from e
    if {k: list(v.shape) for k, v in arrays.items()} != shapes:  # pragma: no cover - a defence
        raise load_error(f"{path}: MLX read other tensors or shapes than the file's header declares.")
    return arrays, dict(metadata or {})


def _read_source(source) -> Tuple[dict, dict, dict]:
    """-> (weights, configs)."""
    if isinstance(source, Mapping):
        return dict(source), {}
    path = Path(source)
    if path.is_file():
        if path.suffix != ".safetensors":
            raise load_error(f"source expected a .safetensors file or a folder but got {path}.")
        weights, _ = _load_file(path)
        return weights, read_configs(path.parent)
    if path.is_dir():
        index_path = path / "model.safetensors.index.json"
        index = _read_json(index_path)
        if index is not None and "weight_map" in index:
            files = [_inside(path, f, index_path) for f in _weight_map_files(index["weight_map"], index_path)]
        else:
            files = sorted(Path(p) for p in glob.glob(str(path / "*.safetensors")))
        if not files:
            raise load_error(f"no .safetensors files in {path}.")
        weights = {}
        for f in files:
            w, _ = _load_file(f)
            dup = weights.keys() & w.keys()
            if dup:
                raise load_error(f"tensor {sorted(dup)[0]} appears in more than one file ({f.name}).")
            weights.update(w)
        return weights, read_configs(path)
    raise load_error(f"source {str(path)!r} is neither a file, a folder nor a dict.")


def load_nvfp4(source: Source, *, config: Optional[dict] = None) -> NVFP4Weights:
    """Load an NVFP4 checkpoint into the MLX nvfp4 layout (see module doc).

    Args:
        source: a ``.safetensors`` file (its folder's ``config.json`` /
            ``hf_quant_config.json`` are read when present), a folder of them
            (``model.safetensors.index.json`` is honoured), or a dict of arrays
            (e.g. from ``mx.load``). An :class:`NVFP4Weights` is returned unchanged.
        config: the parsed ``config.json`` (or ``{"config": ..., "hf_quant_config":
            ...}``) to use instead of the files next to ``source``.

    No bytes are copied: packed weights are ``view``-ed as uint32 and scales
    are the loaded arrays. Shapes and dtypes are validated, and errors name
    the tensor. A quantized tensor in a module the config excludes
    (ModelOpt ``exclude_modules``, compressed-tensors ``ignore``; fnmatch
    wildcards or ``re:`` regexes) is an error; excluded modules' float tensors
    pass through.
    """
    if isinstance(source, NVFP4Weights):
        return source
    weights, cfgs = _read_source(source)
    if config is not None:
        cfgs = config if ("config" in config or "hf_quant_config" in config) else {"config": config}
    info = quant_info(cfgs)
    if info.get("mode") == "mxfp4":
        # MXFP4 (gpt-oss, mlx-community mxfp4): already the layout mlx-lm reads (its model's
        # sanitize turns the Hugging Face *_blocks / *_scales experts into weight / scales).
        out = NVFP4Weights(weights)
        out.dialects.add("mxfp4")
        return out

    layers = classify(weights)
    out = NVFP4Weights()
    consumed = set()
    done = set()
    passed = set()  # tensors passed through as they are
    for key in weights:
        if key in consumed:
            continue
        p, _, name = key.rpartition(".")
        dialect = layers.get(p)
        if dialect is None or name not in DIALECT_KEYS[dialect]:
            if dialect is not None and name in QUANTIZATION_NAMES:
                raise load_error(f"{key}: a {name!r} tensor in the {dialect} layer {p!r} (tensors of two formats).")
            if name in ACTIVATION_SCALES and (
                dialect is not None or info["method"] in ("modelopt", "compressed-tensors")
            ):
                continue  # W4A4 / FP8-KV calibration scales: unused by W4A16
            out[key] = weights[key]
            passed.add(key)
            continue
        if p in done:
            continue
        done.add(p)
        pat = match_pattern(p, info["ignore"])
        if pat is not None:
            raise load_error(
                f"{key} is NVFP4-quantized but module {p!r} matches the checkpoint's "
                f"exclude/ignore pattern {pat!r}."
            )
        if info["method"] == "compressed-tensors" and dialect != "compressed-tensors":
            raise load_error(f"{key}: a {dialect} tensor in a compressed-tensors checkpoint.")
        if info["method"] == "modelopt" and dialect != "modelopt":
            raise load_error(f"{key}: a {dialect} tensor in a ModelOpt checkpoint.")

        def get(name, *default, _p=p):
            k = f"{_p}.{name}"
            if k in weights:
                consumed.add(k)
                return weights[k]
            if default:
                return default[0]
            raise load_error(f"{k} is missing (needed by the {dialect} layer {_p!r}).")

        if dialect == "modelopt":
            conv = from_modelopt(p, get("weight"), get)
            get("input_scale", None)
        elif dialect == "compressed-tensors":
            conv = from_compressed_tensors(p, get("weight_packed"), get)
            get("input_global_scale", None)
        else:
            conv = from_mlx(p, get("weight"), get)
        out.update(conv)
        out.dialects.add(dialect)
        out.quantized.append(p)
    clash = sorted(passed & {f"{p}.{n}" for p in out.quantized for n in ("weight", "scales", "global_scale")})
    if clash:  # the converted tensor and the file's of the same name: which one loads was the order
        raise load_error(f"{clash[0]} is a tensor of the checkpoint and also what its layer converts to.")
    return out


def _collect(weights) -> Dict[str, mx.array]:
    if isinstance(weights, nn.Module):
        return dict(tree_flatten(weights.parameters()))  # global scales are parameters
    if isinstance(weights, Mapping):
        return dict(weights)
    raise ValueError(
        f"[save_nvfp4] weights expected an nn.Module or a dict of arrays but got "
        f"{type(weights).__name__}."
    )


def _check_layout(arrays: Dict[str, mx.array]) -> None:
    """Every quantized linear in mlx_fp4's layout, before anything is written."""
    for key, v in arrays.items():
        if not isinstance(v, mx.array):
            raise ValueError(f"[save_nvfp4] {key} expected an mx.array but got {type(v).__name__}.")
        p, _, name = key.rpartition(".")
        w = arrays.get(f"{p}.weight")
        if w is None or w.ndim != 2 or f"{p}.scales" not in arrays:
            continue
        if name == "scales" and arrays.get(f"{p}.biases") is None:
            if w.dtype != mx.uint32:
                raise ValueError(f"[save_nvfp4] {p}.weight expected uint32 [N, K/8] but got {describe(w)}.")
            if fp4_mode(w, v) is None:
                n, k = w.shape[0], w.shape[1] * VALUES_PER_U32
                raise ValueError(
                    f"[save_nvfp4] {key} expected uint8 [{n}, {k // GROUP_SIZE}] (nvfp4) or "
                    f"[{n}, {k // group_size_of('mxfp4')}] (mxfp4) but got {describe(v)}."
                )
        if name == "global_scale" and v.size != 1:
            raise ValueError(f"[save_nvfp4] {key} expected a scalar but got {describe(v)}.")


# What mlx_lm.convert leaves next to the weights for the tokenizer (tokenizer.save_pretrained).
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "tokenizer.model", "spiece.model", "tiktoken.model", "*.tiktoken", "vocab.json", "vocab.txt",
    "merges.txt", "chat_template.json", "chat_template.jinja", "generation_config.json",
)


def copy_tokenizer(source, folder: Path) -> List[Path]:
    """The tokenizer into ``folder``: ``source`` a folder (its tokenizer files are copied) or
    a tokenizer (``save_pretrained``, as mlx_lm.convert does). Returns the files written."""
    folder = Path(folder)
    before = {f: f.stat().st_mtime_ns for f in folder.iterdir()}
    if isinstance(source, (str, os.PathLike)):
        src = Path(source)
        if not src.is_dir():
            raise ValueError(f"[save_nvfp4] tokenizer expected a folder or a tokenizer but got {str(src)!r}.")
        for pattern in TOKENIZER_FILES:
            for f in sorted(src.glob(pattern)):
                if f.is_file() and f.resolve() != (folder / f.name).resolve():
                    shutil.copy2(f, folder / f.name)
    elif hasattr(source, "save_pretrained"):
        source.save_pretrained(str(folder))
    else:
        raise ValueError(
            f"[save_nvfp4] tokenizer expected a folder or a tokenizer but got {type(source).__name__}."
        )
    return sorted(f for f in folder.iterdir() if before.get(f) != f.stat().st_mtime_ns)


def _saved_config(config: dict, weights) -> dict:
    """config.json for the MLX layout: ``quantization`` as the saved layers are quantized (nvfp4,
    mxfp4, per-layer entries for others; none when no layer is), mirrored in
    ``quantization_config`` as mlx-lm writes it (a ModelOpt / compressed-tensors one is replaced)."""
    cfg = dict(config)
    cfg.pop("quantization_config", None)
    block = quantization_block(weights, cfg.pop("quantization", None))
    if block is not None:
        cfg["quantization"] = block
        cfg["quantization_config"] = block
    return cfg


def save_nvfp4(
    path: Union[str, os.PathLike],
    weights,
    *,
    config: Optional[dict] = None,
    tokenizer=None,
    metadata: Optional[Dict[str, str]] = None,
) -> List[Path]:
    """Save NVFP4 weights in the MLX layout, with mlx-lm's own saving code.

    Args:
        path: a ``*.safetensors`` file, or a folder, written by ``mlx_lm.utils.save_model``:
            ``model.safetensors`` (or ``model-0000i-of-0000n.safetensors`` shards) and
            ``model.safetensors.index.json``; with ``config``, ``config.json``
            (``mlx_lm.utils.save_config``) with ``"quantization": {"group_size": 16,
            "bits": 4, "mode": "nvfp4"}``; with ``tokenizer`` (a folder to copy the tokenizer
            files from, or a tokenizer) its files. Such a folder opens in ``mlx_lm.load`` and
            ``mlx_lm.generate`` when no layer has a global scale (stock MLX layers cannot hold
            one: then it raises), and always in ``mlx_fp4.load``.
        weights: the dict :func:`load_nvfp4` returned, or a model (its parameters, global
            scales included).
        metadata: extra safetensors metadata (single-file saves only).

    ``<p>.global_scale`` is MLX's convention (the amax) in memory and on disk, so
    :func:`load_nvfp4` returns the same arrays bit for bit. Scales are written as U8
    (``mx.save_safetensors`` has no F8_E4M3). Returns every file written.
    """
    arrays = _collect(weights)
    _check_layout(arrays)
    path = Path(path)
    if path.suffix == ".safetensors":
        path.parent.mkdir(parents=True, exist_ok=True)
        mx.save_safetensors(str(path), arrays, metadata={"format": "mlx", **(metadata or {})})
        return [path]
    from mlx_lm.utils import save_config, save_model

    if metadata:
        raise ValueError("[save_nvfp4] metadata is for single-file saves (mlx-lm writes the folder's).")
    path.mkdir(parents=True, exist_ok=True)
    save_model(path, weights if isinstance(weights, nn.Module) else _Arrays(arrays))
    index = path / "model.safetensors.index.json"
    files = [path / f for f in sorted(set(_read_json(index)["weight_map"].values()))] + [index]
    if config is not None:
        save_config(_saved_config(config, weights if isinstance(weights, nn.Module) else arrays),
                    path / "config.json")
        files.append(path / "config.json")
    if tokenizer is not None:
        files += copy_tokenizer(tokenizer, path)
    return files


class _Arrays(nn.Module):
    """A plain dict of arrays as the module mlx_lm.utils.save_model takes."""

    def __init__(self, arrays: Dict[str, mx.array]):
        super().__init__()
        for key, value in tree_unflatten(list(arrays.items())).items():
            self[key] = value
