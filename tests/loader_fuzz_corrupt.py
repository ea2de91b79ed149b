"""Random corruptions of a checkpoint folder for the loader fuzz (tests/test_loader_fuzz.py).

Each ``corrupt(folder, rnd)`` changes a copy of a valid folder in place and returns a line
describing what it did (the fuzz's failure messages quote it). Kinds: truncation and byte flips
of a safetensors file (length prefix, header, data), edits of its header JSON (dtype, shape,
data_offsets, names, metadata, duplicated names), edits of config.json / hf_quant_config.json /
model.safetensors.index.json (fields, values, paths, bytes), deleted or replaced files.
"""

import json
import random
import struct
from pathlib import Path

PREFIX = 8  # the u64 header length
JSON_FILES = ("config.json", "hf_quant_config.json", "model.safetensors.index.json")
DTYPES = ["F32", "F16", "BF16", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "BOOL", "F8_E4M3",
          "F8_E8M0", "C64", "F64", "F8_E5M2", "XX", "", 5, None]
VALUES = [None, 0, -1, 1, 1.5, 1e300, 2**70, -(2**63), True, False, "", "x", "NVFP4", "W4A16_NVFP4", "MIXED_PRECISION",
          "re:(", "re:.*", "*", "lm_head", "model.layers.*", [], {}, [1], ["*"], ["re:.*proj"], {"a": 1},
          "nvfp4", "mxfp4", "affine", "modelopt", "compressed-tensors", "mlx", "nvfp4-pack-quantized", 16, 32, 8]
PATHS = ["../outside.safetensors", "/etc/hostname", "/etc/passwd.safetensors", "missing.safetensors", ".", "",
         "config.json", "sub/../model.safetensors", "a\x00b.safetensors", "./model.safetensors", "..", "/", 5, None]
NAMES = ["", ".", "weight", "x.weight", "model.layers.0.self_attn.q_proj.weight_packed", "\u00e9.weight",
         "model.layers.0.self_attn.q_proj.scales", "model.layers.0.mlp.down_proj.global_scale",
         "model.layers.0.mlp.down_proj.weight_scale_2", "model.layers.0.self_attn.q_proj.weight"]


def _files(folder, pattern):
    return sorted(p for p in folder.glob(pattern) if p.is_file())


def _read_header(path):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:PREFIX])
    return json.loads(raw[PREFIX:PREFIX + n]), raw[PREFIX + n:]


def _write_header(path, header, data, rnd, text=None):
    text = json.dumps(header) if text is None else text
    hb = text.encode("utf-8", "surrogatepass")
    hb += b" " * ((-len(hb)) % 8 if rnd.random() < 0.9 else rnd.randrange(8))
    path.write_bytes(struct.pack("<Q", len(hb)) + hb + data)


def _pick_tensor(header, rnd):
    names = sorted(k for k in header if k != "__metadata__")
    return rnd.choice(names) if names else None


def _shape_edit(entry, rnd):
    shape = list(entry.get("shape", []))
    b, e = entry.get("data_offsets", [0, 0])
    options = [
        [], [0], [-1] + shape[1:], [2**31] + shape[1:], [2**32] + shape[1:], [65536] * 4, shape[::-1],
        [int(_prod(shape))], shape + [1], [1.5] + shape[1:], "abc", None, [True] + shape[1:],
        [2**31, 2**31], [-8, -8], [2**63, 2], [x * 2 for x in shape],
    ]
    new = rnd.choice(options)
    entry["shape"] = new
    if new == [65536] * 4 or new == [2**63, 2] or new == [2**32] + shape[1:]:
        entry["data_offsets"] = [b, b]  # the byte count MLX's size_t product wraps to
    return f"shape {shape} -> {new}"


def _prod(shape):
    out = 1
    for d in shape:
        out *= d
    return out


def _offsets_edit(header, name, rnd):
    entry = header[name]
    b, e = entry.get("data_offsets", [0, 0])
    others = [k for k in header if k not in ("__metadata__", name) and isinstance(header[k], dict)]
    same = [k for k in others if header[k].get("data_offsets", [0, 0])[1] - header[k].get("data_offsets", [0, 0])[0]
            == e - b]
    if same and rnd.random() < 0.3:
        o = rnd.choice(same)
        entry["data_offsets"], header[o]["data_offsets"] = header[o]["data_offsets"], entry["data_offsets"]
        return f"data_offsets of {name!r} and {o!r} swapped"
    new = rnd.choice([[e, b], [b, e + 1], [b - 1, e - 1], [b + 1, e + 1], [2**64 - 1, 2**64 - 1 + e - b],
                      [-8, e - b - 8], [b], [b, e, 0], "x", None, [b, 2**40], [0, e - b], [b * 1.0, e]])
    entry["data_offsets"] = new
    return f"data_offsets [{b}, {e}] -> {new}"


def header_edit(folder, rnd):
    path = rnd.choice(_files(folder, "*.safetensors"))
    header, data = _read_header(path)
    name = _pick_tensor(header, rnd)
    what = rnd.randrange(9)
    if name is None or what == 0:
        header["__metadata__"] = rnd.choice([{"format": 5}, [], "x", {"a": None}, {"format": "pt"}, None])
        desc = f"__metadata__ -> {header['__metadata__']!r}"
    elif what == 1:
        old = header[name].get("dtype")
        header[name]["dtype"] = rnd.choice(DTYPES)
        desc = f"dtype of {name!r} {old} -> {header[name]['dtype']!r}"
    elif what == 2:
        desc = f"{name!r}: " + _shape_edit(header[name], rnd)
    elif what == 3:
        desc = _offsets_edit(header, name, rnd)
    elif what == 4:
        field = rnd.choice(["dtype", "shape", "data_offsets"])
        header[name].pop(field, None)
        header[name]["extra"] = 1
        desc = f"{name!r} lost {field}"
    elif what == 5:
        new = rnd.choice(NAMES + [k for k in header if k != name])
        header[new] = header.pop(name)
        desc = f"tensor {name!r} renamed {new!r}"
    elif what == 6:
        del header[name]
        desc = f"tensor {name!r} removed from the header"
    elif what == 7:
        text = json.dumps(header)
        dup = json.dumps({name: header[name]})[1:-1]
        _write_header(path, header, data, rnd, text=text[:-1] + ", " + dup + "}")
        return f"{path.name}: tensor {name!r} named twice"
    else:
        _write_header(path, header, data, rnd, text=rnd.choice(["[]", '"x"', "null", "{", "{}" * 2, "\udcff"]))
        return f"{path.name}: header replaced by a non-object"
    _write_header(path, header, data, rnd)
    return f"{path.name}: {desc}"


def truncate(folder, rnd):
    path = rnd.choice(_files(folder, "*.safetensors") + _files(folder, "*.json"))
    size = path.stat().st_size
    cut = rnd.choice([0, 1, PREFIX - 1, PREFIX, PREFIX + 1, rnd.randrange(size), size - 1])
    path.write_bytes(path.read_bytes()[: max(0, min(cut, size - 1))])
    return f"{path.name} truncated to {max(0, min(cut, size - 1))} of {size} bytes"


def flip_bytes(folder, rnd, region=None):
    path = rnd.choice(_files(folder, "*.safetensors"))
    raw = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", raw[:PREFIX])
    region = region or rnd.choice(["prefix", "header", "data"])
    lo, hi = {"prefix": (0, PREFIX), "header": (PREFIX, PREFIX + n), "data": (PREFIX + n, len(raw))}[region]
    if hi <= lo:
        return f"{path.name}: no {region} bytes to flip"
    where = sorted(rnd.randrange(lo, hi) for _ in range(rnd.randint(1, 4)))
    for i in where:
        raw[i] = raw[i] ^ (1 << rnd.randrange(8)) if rnd.random() < 0.5 else rnd.randrange(256)
    path.write_bytes(bytes(raw))
    return f"{path.name}: {region} bytes at {where} changed"


SPECIAL_FLOATS = [float("nan"), float("inf"), -float("inf"), -1.0, 0.0, -0.0, 1e-45, 1e-40, 1e-38, 3e38, 1e36,
                  1e35, 2.0**-126, 65504.0, 1.0]


def scalar_value(folder, rnd):
    """A one-element float tensor (a per-tensor scale) set to a special value, its header unchanged."""
    path = rnd.choice(_files(folder, "*.safetensors"))
    header, data = _read_header(path)
    scalars = sorted(k for k, e in header.items() if k != "__metadata__" and e["dtype"] in ("F32", "F16", "BF16")
                     and _prod(e["shape"]) == 1)
    if not scalars:
        return f"{path.name}: no scalar"
    name = rnd.choice(scalars)
    b, _ = header[name]["data_offsets"]
    v = rnd.choice(SPECIAL_FLOATS)
    fmt = {"F32": "<f", "F16": "<e"}.get(header[name]["dtype"])
    raw = struct.pack(fmt, v) if fmt else struct.pack("<f", v)[2:]  # bf16: the high half of fp32
    data = data[:b] + raw + data[b + len(raw):]
    raw_all = path.read_bytes()
    (n,) = struct.unpack("<Q", raw_all[:PREFIX])
    path.write_bytes(raw_all[:PREFIX + n] + data)
    return f"{path.name}: {name} = {v!r}"


def _walk(obj, rnd, depth=0):
    """A random (container, key) inside a JSON value, or None."""
    keys = list(obj.keys()) if isinstance(obj, dict) else list(range(len(obj))) if isinstance(obj, list) else []
    if not keys:
        return None
    k = rnd.choice(keys)
    child = obj[k]
    if isinstance(child, (dict, list)) and child and rnd.random() < 0.6 and depth < 6:
        deeper = _walk(child, rnd, depth + 1)
        if deeper:
            return deeper
    return obj, k


def json_edit(folder, rnd):
    present = [folder / f for f in JSON_FILES if (folder / f).is_file()]
    if not present:
        return "no JSON file to edit"
    path = rnd.choice(present)
    obj = json.loads(path.read_text())
    spot = _walk(obj, rnd)
    if spot is None:
        obj = rnd.choice(VALUES)
        desc = f"whole object -> {obj!r}"
    else:
        parent, key = spot
        in_map = path.name.endswith("index.json") and isinstance(parent, dict) and parent is obj.get("weight_map")
        choice = rnd.randrange(4)
        if choice == 0 and isinstance(parent, dict):
            del parent[key]
            desc = f"{key!r} deleted"
        elif choice == 1 and isinstance(parent, dict):
            parent[rnd.choice(NAMES + ["quantization", "weight_map", "quant_method"])] = parent.pop(key)
            desc = f"{key!r} renamed"
        else:
            parent[key] = rnd.choice(PATHS if in_map else VALUES)
            desc = f"{key!r} -> {parent[key]!r}"
    path.write_text(json.dumps(obj))
    return f"{path.name}: {desc}"


def json_bytes(folder, rnd):
    present = [folder / f for f in JSON_FILES if (folder / f).is_file()]
    if not present:
        return "no JSON file to damage"
    path = rnd.choice(present)
    raw = bytearray(path.read_bytes())
    i = rnd.randrange(len(raw))
    raw[i] = rnd.choice([0x00, 0x22, 0x7B, 0x7D, 0xFF, 0xC3, rnd.randrange(256)])
    path.write_bytes(bytes(raw))
    return f"{path.name}: byte {i} -> {raw[i]:#04x}"


def remove_file(folder, rnd):
    files = sorted(p for p in folder.iterdir() if p.is_file())
    if not files:
        return "no file to remove"
    path = rnd.choice(files)
    how = rnd.choice(["deleted", "emptied", "made a folder"])
    path.unlink()
    if how == "emptied":
        path.write_bytes(b"")
    elif how == "made a folder":
        path.mkdir()
    return f"{path.name} {how}"


# kind -> (weight, function); data flips are weighted up: the only kind that can load with new values.
KINDS = {
    "header": (5, header_edit),
    "truncate": (2, truncate),
    "bytes": (2, flip_bytes),
    "data": (2, lambda f, r: flip_bytes(f, r, "data")),
    "scalar": (2, scalar_value),
    "json": (4, json_edit),
    "json-bytes": (1, json_bytes),
    "file": (1, remove_file),
}


def corrupt(folder: Path, rnd: random.Random) -> str:
    """One or two random corruptions of ``folder``; returns their description."""
    names = sorted(KINDS)
    weights = [KINDS[k][0] for k in names]
    steps = []
    for _ in range(2 if rnd.random() < 0.15 else 1):
        kind = rnd.choices(names, weights)[0]
        try:
            steps.append(f"{kind}: {KINDS[kind][1](folder, rnd)}")
        except (ValueError, UnicodeDecodeError, struct.error, IndexError, KeyError, TypeError, AttributeError, OSError):
            steps.append(f"{kind}: skipped (an earlier step left nothing it can edit)")
    return "; ".join(steps)
