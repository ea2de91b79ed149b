"""Loader fuzz worker, run by tests/test_loader_fuzz.py in a subprocess (a crash or a hang there
fails the test and names the case): small valid checkpoints of each dialect, then one seeded
random corruption (loader_fuzz_corrupt) of a copy per case, loaded by load_nvfp4 while every
file opened is recorded (Python's audit hook, plus mx.load's path: its C++ reads are not audited).

Each case must end in one of two ways:
  * a ValueError from the loader ("[load_nvfp4] ...", naming the file, field or tensor);
  * a load in which every array evaluates and is what the files hold, read here without MLX or
    mlx_fp4 (the header parsed with json, the bytes at its offsets): pass-through tensors byte
    for byte, each quantized layer's packed weight and scales byte for byte with the documented
    shapes, its global scale the one fp32 conversion of the file's value, finite, > 0 and with a
    decode multiplier (/ 2688) > 0; no tensor of the files dropped but the activation scales.
Any other exception, a file opened outside the case's folder (or the Python installation, for
imports), or a case past CASE_SECONDS is a failure.

Usage: python loader_fuzz_worker.py WORKDIR FIRST_SEED COUNT PROGRESS_FILE
Prints one JSON line per failure, then one summary line (counts per outcome).
"""

import json
import os
import random
import shutil
import signal
import struct
import sys
from pathlib import Path

import ml_dtypes
import mlx.core as mx
import numpy as np

from mlx_fp4.checkpoints import load_nvfp4

import loader_fuzz_corrupt
from test_checkpoints import _layer_data, write_ct, write_mlx, write_modelopt

CASE_SECONDS = 20
LAYERS = {"model.layers.0.self_attn.q_proj": (16, 32, True), "model.layers.0.mlp.down_proj": (8, 32, False)}
FLOATS = {"model.embed_tokens.weight": ((8, 32), ml_dtypes.bfloat16), "model.norm.weight": ((32,), np.float32),
          "lm_head.weight": ((8, 32), ml_dtypes.bfloat16)}
GLOBAL_SCALE_DENOMINATOR = np.float32(2688)  # 6 * 448 (the format, not the code under test)
DROPPED = {"input_scale", "input_global_scale", "k_scale", "v_scale"}  # activation scales (W4A16)
# name in the safetensors header -> (MLX dtype it loads as, numpy dtype of its bytes)
DTYPES = {"F32": (mx.float32, np.float32), "F16": (mx.float16, np.float16), "BF16": (mx.bfloat16, ml_dtypes.bfloat16),
          "U8": (mx.uint8, np.uint8), "I8": (mx.int8, np.int8), "U16": (mx.uint16, np.uint16),
          "I16": (mx.int16, np.int16), "U32": (mx.uint32, np.uint32), "I32": (mx.int32, np.int32),
          "U64": (mx.uint64, np.uint64), "I64": (mx.int64, np.int64), "BOOL": (mx.bool_, np.bool_),
          "F8_E4M3": (mx.uint8, np.uint8), "F8_E8M0": (mx.uint8, np.uint8), "C64": (mx.complex64, np.complex64)}
def _with_weight_shapes(tensors):
    """compressed-tensors' optional weight_shape [N, K] (int64), so the fuzz reaches its check."""
    for p, (n, k, _) in LAYERS.items():
        tensors[f"{p}.weight_shape"] = np.array([n, k], np.int64)


BASES = {
    "modelopt": lambda f, d: write_modelopt(f, d),
    "modelopt-config": lambda f, d: write_modelopt(f, d, config_style="config"),
    "compressed-tensors": lambda f, d: write_ct(f, d, mutate=_with_weight_shapes),
    "mlx": lambda f, d: write_mlx(f, d),
}


class CaseTimeout(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# the audit: every path opened or listed while a load runs

OPENED = []
RECORDING = [False]
_AUDITED = {"open": 0, "os.listdir": 0, "os.scandir": 0, "glob.glob": 0}
_mx_load = mx.load


def _audit(event, args):
    if RECORDING[0] and event in _AUDITED and isinstance(args[0], (str, bytes, os.PathLike)):
        OPENED.append(os.fsdecode(args[0]))


def _recording_load(file, *args, **kwargs):
    if RECORDING[0]:
        OPENED.append(os.fsdecode(file))
    return _mx_load(file, *args, **kwargs)


def _install_audit():
    sys.addaudithook(_audit)
    mx.load = _recording_load  # io.py calls mx.load through the module: its C++ opens are not audited


def _python_roots():
    roots = {sys.prefix, sys.base_prefix, *(p for p in sys.path if p)}
    return sorted({os.path.abspath(r) for r in roots})


def _outside(paths, folder, roots):
    folder = os.path.abspath(folder)
    bad = []
    for p in paths:
        a = os.path.abspath(p)
        if a == folder or a.startswith(folder + os.sep):
            continue
        if any(a == r or a.startswith(r + os.sep) for r in roots):
            continue  # module imports
        bad.append(p)
    return bad


# ---------------------------------------------------------------------------------------------
# the files' content, read without MLX or mlx_fp4


def read_files(folder):
    """name -> (dtype name, shape, bytes) over the files the loader reads (the index's, else all)."""
    index = folder / "model.safetensors.index.json"
    files = sorted(folder.glob("*.safetensors"))
    if index.is_file():
        wm = json.loads(index.read_text()).get("weight_map")
        if isinstance(wm, dict):
            files = [folder / os.path.normpath(v) for v in sorted(set(wm.values()))]
    out = {}
    for f in files:
        raw = f.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        for name, e in json.loads(raw[8:8 + n]).items():
            if name != "__metadata__":
                b, end = e["data_offsets"]
                out[name] = (e["dtype"], list(e["shape"]), raw[8 + n + b:8 + n + end])
    return out


def _bytes(a):
    return np.array(a.reshape(-1).view(mx.uint8)).tobytes() if a.size else b""


def _same(a, src, what):
    dtype, shape, raw = src
    want = DTYPES.get(dtype, (None,))[0]
    if a.dtype != want or list(a.shape) != shape or _bytes(a) != raw:
        return [f"{what}: loaded {a.dtype} {list(a.shape)} but the file holds {dtype} {shape} (or other bytes)"]
    return []


def _value(src):
    dtype, shape, raw = src
    v = np.frombuffer(raw, DTYPES[dtype][1]).reshape(-1)[0]
    return np.float32(v) if np.isrealobj(v) else np.float32(np.nan)  # complex: no scale


def _check_layer(w, files, p):
    if f"{p}.weight_packed" in files:
        dialect, wkey, skey, gkey = "ct", "weight_packed", "weight_scale", "weight_global_scale"
    elif f"{p}.weight_scale" in files or f"{p}.weight_scale_2" in files:
        dialect, wkey, skey, gkey = "modelopt", "weight", "weight_scale", "weight_scale_2"
    else:
        dialect, wkey, skey, gkey = "mlx", "weight", "scales", "global_scale"
    need = [f"{p}.weight", f"{p}.scales"]
    if any(k not in w for k in need) or any(f"{p}.{n}" not in files for n in (wkey, skey)):
        return [f"{p}: a quantized layer without {need} loaded or without {wkey}, {skey} in the files"]
    wt, sc = w[f"{p}.weight"], w[f"{p}.scales"]
    problems = []
    if wt.dtype != mx.uint32 or wt.ndim != 2 or _bytes(wt) != files[f"{p}.{wkey}"][2]:
        problems.append(f"{p}.weight: {wt.dtype} {wt.shape} is not the file's {wkey} bytes as uint32 [N, K/8]")
    k = wt.shape[-1] * 8
    if sc.dtype != mx.uint8 or list(sc.shape) != [wt.shape[0], k // 16] or _bytes(sc) != files[f"{p}.{skey}"][2]:
        problems.append(f"{p}.scales: {sc.dtype} {sc.shape} is not the file's {skey} as uint8 [N, K/16]")
    if f"{p}.global_scale" not in w:
        if dialect != "mlx" or f"{p}.global_scale" in files:
            problems.append(f"{p}: the {gkey} of the files was not loaded")
        return problems
    gs = w[f"{p}.global_scale"]
    if f"{p}.{gkey}" not in files:
        return problems + [f"{p}.global_scale: loaded, but the files have no {gkey}"]
    v = _value(files[f"{p}.{gkey}"])
    with np.errstate(all="ignore"):
        want = {"mlx": v, "modelopt": v * GLOBAL_SCALE_DENOMINATOR, "ct": GLOBAL_SCALE_DENOMINATOR / v}[dialect]
        got = np.float32(gs.item())
        usable = np.isfinite(got) and got > 0 and got / GLOBAL_SCALE_DENOMINATOR > 0
    if gs.dtype != mx.float32 or gs.shape != (1,) or got != want or not usable:
        problems.append(f"{p}.global_scale: loaded {got!r} {gs.dtype} {gs.shape} from the file's {gkey} {v!r}")
    return problems


def check_loaded(w, files):
    """Problems of a successful load against the files' content (empty: faithful)."""
    if w.dialects == {"mxfp4"}:  # the config says mxfp4: passed through as it is
        return [p for k in set(w) | set(files) for p in
                (_same(w[k], files[k], k) if k in w and k in files else [f"{k}: in one of load / files only"])]
    problems = []
    quantized = set(w.quantized)
    consumed = set()
    for p in quantized:
        problems += _check_layer(w, files, p)
        consumed |= {f"{p}.{n}" for n in ("weight", "weight_packed", "weight_scale", "weight_scale_2", "scales",
                                           "global_scale", "weight_global_scale", "weight_shape")}
    for k, a in w.items():
        if k in consumed:
            continue
        problems += _same(a, files[k], k) if k in files else [f"{k}: loaded, but no file holds it"]
    for k in files:
        if k not in w and k not in consumed and k.rpartition(".")[2] not in DROPPED:
            problems.append(f"{k}: in the files, dropped by the load")
    return problems


# ---------------------------------------------------------------------------------------------


def _load(source, folder, roots):
    """-> (outcome, failure or None)."""
    del OPENED[:]
    RECORDING[0] = True
    try:
        w = load_nvfp4(source)
        mx.eval(list(w.values()))
    except ValueError as e:
        msg = str(e)
        outcome = ("error", None if msg.startswith("[load_nvfp4] ") else f"ValueError without [load_nvfp4]: {msg}")
    except CaseTimeout:
        outcome = ("hang", f"over {CASE_SECONDS} s")
    except Exception as e:  # noqa: BLE001 - the point: any other exception is a failure
        outcome = ("raw", f"{type(e).__name__}: {e}")
    else:
        outcome = ("loaded", None)
    finally:
        RECORDING[0] = False
    bad = _outside(OPENED, folder, roots)
    if bad:
        return outcome[0], f"opened outside the folder: {bad}"
    if outcome[0] != "loaded":
        return outcome
    try:
        problems = check_loaded(w, read_files(folder))
    except Exception as e:  # noqa: BLE001 - the files hold what no loader should have accepted
        problems = [f"loaded, but the files cannot be read without MLX: {type(e).__name__}: {e}"]
    return "loaded", ("; ".join(problems[:3]) if problems else None)


def build_bases(workdir):
    data = ({p: _layer_data(p, *spec) for p, spec in LAYERS.items()},
            {k: np.random.default_rng(len(k)).standard_normal(s).astype(np.float32).astype(d)
             for k, (s, d) in FLOATS.items()})
    bases = {}
    for name, write in BASES.items():
        folder = workdir / "bases" / name
        write(folder, data)
        bases[name] = folder
    return bases


def main():
    workdir, first, count, progress = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    bases = build_bases(workdir)
    for folder in bases.values():  # valid folders load (and every lazy import happens before the audit)
        assert check_loaded(load_nvfp4(folder), read_files(folder)) == [], folder
    roots = _python_roots()
    _install_audit()
    # The audit sees the loader's reads (Python's json and header reads, mx.load's path) and flags
    # a path outside: else a clean run would prove nothing.
    mlx = bases["mlx"]
    assert _load(mlx, mlx, roots) == ("loaded", None)
    assert {str(mlx / "config.json"), str(mlx / "model.safetensors")} <= set(OPENED), OPENED
    assert _outside(["/etc/passwd", str(mlx.parent / "x")], mlx, roots) == ["/etc/passwd", str(mlx.parent / "x")]

    def on_alarm(signum, frame):
        raise CaseTimeout()

    signal.signal(signal.SIGALRM, on_alarm)
    counts = {}
    case_dir = workdir / "case"
    with open(progress, "w") as log:
        for seed in range(first, first + count):
            rnd = random.Random(seed)
            base = rnd.choice(sorted(bases))
            shutil.rmtree(case_dir, ignore_errors=True)
            shutil.copytree(bases[base], case_dir)
            desc = f"seed {seed}, {base}: " + loader_fuzz_corrupt.corrupt(case_dir, rnd)
            single = case_dir / "model.safetensors"
            source = single if base == "mlx" and rnd.random() < 0.5 and single.is_file() else case_dir
            log.write(desc + "\n")
            log.flush()
            signal.alarm(CASE_SECONDS)
            outcome, failure = _load(source, case_dir, roots)
            signal.alarm(0)
            counts[outcome] = counts.get(outcome, 0) + 1
            if failure:
                print(json.dumps({"case": desc, "outcome": outcome, "failure": failure}), flush=True)
    print(json.dumps({"summary": counts, "cases": count}), flush=True)


if __name__ == "__main__":
    main()
