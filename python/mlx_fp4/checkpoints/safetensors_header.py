"""The header of a ``.safetensors`` file, checked before ``mx.load`` reads the file.

``mx.load`` checks each tensor's byte range in size_t arithmetic, which wraps: a uint8 tensor of
shape [65536] * 4 declared in 0 bytes loads (any op on it then reads 2^64 bytes of a 0-byte
buffer), dims past int32 become others (2^32 -> 0, 2^31 -> negative), and negative dims come out
as such. Here every dim must be an int in [0, 2^31), the dtype one MLX reads, the byte range the
shape's exact size and inside the file; else a ValueError names the file and the tensor.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Dict, List, Tuple

# The dtypes MLX's safetensors reader knows (mlx/io/safetensors.cpp) -> bytes per element.
ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "C64": 8,
}
HEADER_LENGTH_BYTES = 8  # little-endian u64 before the JSON header
MAX_HEADER_BYTES = 100_000_000  # the limit of the reference (Rust) reader and of MLX's
MAX_DIM = 2**31  # MLX's shapes are int32
METADATA_KEY = "__metadata__"


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        dup = sorted(k for k in set(keys) if keys.count(k) > 1)[0]
        raise ValueError(f"the header names {dup!r} twice")
    return dict(pairs)


def read_header(path: Path) -> Tuple[int, dict]:
    """(header length, header object) of a safetensors file; ValueError(reason) when it is not one."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        prefix = f.read(HEADER_LENGTH_BYTES)
        if len(prefix) < HEADER_LENGTH_BYTES:
            raise ValueError(f"{size} bytes, shorter than the {HEADER_LENGTH_BYTES}-byte header length")
        (length,) = struct.unpack("<Q", prefix)
        if not 0 < length < MAX_HEADER_BYTES or HEADER_LENGTH_BYTES + length > size:
            raise ValueError(f"a {length}-byte header declared in a {size}-byte file")
        raw = f.read(length)
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"the header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"the header is a JSON {type(header).__name__}, not an object")
    return length, header


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _tensor_problem(entry, data_bytes: int):
    """Why a header entry is not a tensor MLX can read safely, or None."""
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
        return "is not an object with dtype, shape and data_offsets"
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in ITEMSIZE:
        return f"has dtype {dtype!r}, not one of {sorted(ITEMSIZE)}"
    if not isinstance(shape, list) or not all(_int(d) and 0 <= d < MAX_DIM for d in shape):
        return f"has shape {shape!r}: expected a list of ints in [0, 2^31)"
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_int(o) for o in offsets):
        return f"has data_offsets {offsets!r}: expected [begin, end] ints"
    begin, end = offsets
    nbytes = ITEMSIZE[dtype]
    for d in shape:
        nbytes *= d
    if not 0 <= begin <= end <= data_bytes or end - begin != nbytes:
        return (f"has data_offsets {offsets!r} for {nbytes} bytes of {dtype} {shape} in a data section of "
                f"{data_bytes} bytes")
    return None


def check_header(path: Path) -> Dict[str, List[int]]:
    """Every tensor of a safetensors file readable as declared: -> name -> shape. ValueError(reason)."""
    length, header = read_header(path)
    data_bytes = os.path.getsize(path) - HEADER_LENGTH_BYTES - length
    shapes = {}
    for name, entry in header.items():
        if name == METADATA_KEY:  # null is no metadata (MLX reads it so; some writers put it)
            if entry is not None and not (isinstance(entry, dict) and all(isinstance(v, str) for v in entry.values())):
                raise ValueError(f"{METADATA_KEY} is {entry!r}, expected an object of strings")
            continue
        problem = _tensor_problem(entry, data_bytes)
        if problem:
            raise ValueError(f"tensor {name!r} {problem}")
        shapes[name] = entry["shape"]
    return shapes
