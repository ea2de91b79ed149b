"""Measured routing on Apple GPUs: "never slower than MLX on the same bytes" by measurement.

On first use of a (GPU, shape bucket, x dtype, mode) on an Apple7+ GPU, ``w4a16_matmul`` times our
Metal kernel against MLX's own (``mx.quantized_matmul``, through the op's MLX route) on the same
weight bytes (``gather_w4a16_matmul`` likewise against ``mx.gather_qmm``, per number of experts and
sorted hint), a few warm runs over weight copies larger than the GPU's system-level cache, and
routes that bucket to the faster from then on. Decisions persist in ``metal_tuning.json`` in the
user's cache directory, keyed by GPU, macOS, MLX and package versions: a change of any of them, or
a file that does not parse, starts a new table. ``MLX_FP4_METAL_TUNE=0`` turns it off (the static
table of csrc/metal/w4a16_route.h); ``MLX_FP4_CACHE_DIR`` moves the file;
``mx_fp4.metal_tuning()`` returns the table. Elsewhere (CPU, CUDA, Linux) nothing here runs.
"""

import json
import math
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

import mlx.core as mx

from . import _ext

ENV_TUNE = "MLX_FP4_METAL_TUNE"
ENV_ROUTE = "MLX_FP4_METAL_ROUTE"  # ours / mlx / cpu force a route (csrc/ops.cpp); auto: tuned
ENV_CACHE_DIR = "MLX_FP4_CACHE_DIR"
CACHE_FILE = "metal_tuning.json"
SCHEMA = 1
ROUTES = ("ours", "mlx")
WARM_RUNS = 2
TIMED_RUNS = 5
# The largest Apple system-level cache (M1/M2 Ultra: 2 x 48 MB; an estimate from public die
# analyses). Weight bytes cycled per timed run exceed it, so each run reads cold weights.
SLC_MAX_BYTES = 96 << 20
COLD_BYTES = SLC_MAX_BYTES + (32 << 20)
MAX_COPIES = 64
# Scale codes of the timed weights (any finite ones do: timing does not depend on the values).
SCALE_CODES = {"nvfp4": (0x20, 0x48), "mxfp4": (120, 136)}
BLOCK = {"nvfp4": 16, "mxfp4": 32}


def cache_dir():
    """The user's cache directory for mlx_fp4 (``MLX_FP4_CACHE_DIR`` overrides it)."""
    if os.environ.get(ENV_CACHE_DIR):
        return Path(os.environ[ENV_CACHE_DIR])
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "mlx_fp4"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mlx_fp4"


def package_version():
    from importlib import metadata

    try:
        return metadata.version("mlx-fp4")
    except metadata.PackageNotFoundError:
        return "dev"


def environment():
    """What a decision depends on besides the shape: the GPU and every version in the path."""
    info = mx.device_info() if mx.metal.is_available() else {}
    return {"gpu": str(info.get("device_name", "")), "arch": str(info.get("architecture", "")),
            "macos": platform.mac_ver()[0], "mlx": mx.__version__, "mlx_fp4": package_version(),
            "schema": SCHEMA}


def _dtype_name(dtype):
    return str(dtype).rsplit(".", 1)[-1]


def _entry_key(e):
    op = f":e{e['experts']}{'s' if e['sorted'] else ''}" if e["experts"] else ""
    return f"{e['bucket']}x{e['n']}x{e['k']}:{e['dtype']}:{e['mode']}{op}"


def _valid_entry(e):
    return (isinstance(e, dict) and e.get("route") in ROUTES
            and all(isinstance(e.get(f), int) for f in ("bucket", "n", "k", "experts"))
            and isinstance(e.get("sorted"), bool)
            and e.get("dtype") in ("float32", "float16", "bfloat16") and e.get("mode") in BLOCK
            and all(isinstance(e.get(f), (int, float)) for f in ("ours_s", "mlx_s")))


class Tuner:
    """Decisions for one environment, persisted at `path`. `timer(m, n, k, dtype, mode, route,
    experts, sorted)` returns seconds per call of that route (experts > 0: the gathered op over m
    rows in all); `apply(entry)` hands a decision to the op."""

    def __init__(self, path, env, timer, apply):
        self.path, self.env, self.timer, self.apply = Path(path), env, timer, apply
        self.decisions = {}
        self._lock = threading.Lock()
        self.state = self._load()
        for e in self.decisions.values():
            self.apply(e)

    def _load(self):
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return "new"
        except OSError:
            return self._restart("rebuilt: unreadable")
        try:
            doc = json.loads(text)
            entries = doc["decisions"]
            if not (isinstance(doc, dict) and isinstance(entries, list)
                    and all(_valid_entry(e) for e in entries)):
                raise ValueError("bad schema")
        except (ValueError, TypeError, KeyError):
            return self._restart("rebuilt: corrupt")
        if doc.get("environment") != self.env:
            return self._restart("re-tuned: environment changed")
        self.decisions = {_entry_key(e): e for e in entries}
        return "loaded"

    def _restart(self, why):
        self.decisions = {}
        self._write()
        return why

    def _write(self):
        doc = {"environment": self.env, "decisions": sorted(self.decisions.values(), key=_entry_key)}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        tmp.replace(self.path)  # atomic: a reader never sees half a file

    def route(self, m, n, k, dtype, mode, experts=0, sorted=False):
        """The measured route of the bucket of (m, n, k, dtype, mode[, experts, sorted]), timing
        both on first use."""
        bucket = _ext._metal_shape_bucket(m)
        e = {"bucket": bucket, "n": n, "k": k, "dtype": _dtype_name(dtype), "mode": mode,
             "experts": experts, "sorted": bool(sorted)}
        key = _entry_key(e)
        with self._lock:
            if key not in self.decisions:
                ours = float(self.timer(bucket, n, k, dtype, mode, "ours", experts, sorted))
                theirs = float(self.timer(bucket, n, k, dtype, mode, "mlx", experts, sorted))
                # ours only where it is not slower: ties keep ours (no extra rounding, no cast)
                e.update(route="ours" if ours <= theirs else "mlx", ours_s=ours, mlx_s=theirs)
                self.decisions[key] = e
                self._write()
                self.apply(e)
            return self.decisions[key]["route"]

    def table(self):
        return sorted(self.decisions.values(), key=_entry_key)


def apply_to_op(e):
    dtype = getattr(mx, e["dtype"])
    _ext._metal_route_set(e["bucket"], e["n"], e["k"], dtype, e["mode"], e["route"],
                          experts=e["experts"], sorted=e["sorted"])


def time_route(m, n, k, dtype, mode, route, experts=0, sorted=False):
    """Seconds per call of one route on the device: random weights (copies totalling COLD_BYTES,
    cycled so every call reads cold ones), WARM_RUNS untimed passes, the median of TIMED_RUNS.
    experts > 0: the gathered op, m pairs of one row each, random top-1 routing (sorted when the
    hint is), weights [experts, N, K]."""
    block = BLOCK[mode]
    lo, hi = SCALE_CODES[mode]
    lead = (experts,) if experts else ()
    copy_bytes = max(experts, 1) * (n * k // 2 + n * k // block)
    copies = max(2, min(MAX_COPIES, math.ceil(COLD_BYTES / copy_bytes)))
    ws = [mx.random.randint(0, 256, (*lead, n, k // 2)).astype(mx.uint8) for _ in range(copies)]
    ss = [mx.random.randint(lo, hi, (*lead, n, k // block)).astype(mx.uint8) for _ in range(copies)]
    if experts:
        x = mx.random.normal((m, 1, k)).astype(dtype)
        rhs = mx.random.randint(0, experts, (m,)).astype(mx.uint32)
        rhs = mx.sort(rhs) if sorted else rhs

        def call(w, s):
            return _ext.gather_w4a16_matmul(x, w, s, rhs_indices=rhs, sorted_indices=sorted, mode=mode)
    else:
        x = mx.random.normal((m, k)).astype(dtype)

        def call(w, s):
            return _ext.w4a16_matmul(x, w, s, mode=mode)
    mx.eval(ws, ss, x)
    key = dict(experts=experts, sorted=sorted)
    before = _ext._metal_route_get(m, n, k, dtype, mode, **key)
    _ext._metal_route_set(m, n, k, dtype, mode, route, **key)
    try:
        def one_pass():
            mx.eval([call(w, s) for w, s in zip(ws, ss)])

        for _ in range(WARM_RUNS):
            one_pass()
        times = []
        for _ in range(TIMED_RUNS):
            t0 = time.perf_counter()
            one_pass()
            times.append((time.perf_counter() - t0) / copies)
    finally:
        _ext._metal_route_set(m, n, k, dtype, mode, before, **key)
    return statistics.median(times)


_tuner = None
_tuner_lock = threading.Lock()
_ACTIVE = None


def active():
    """Whether measured routing runs in this process: an Apple7+ GPU and MLX_FP4_METAL_TUNE != 0."""
    global _ACTIVE
    if os.environ.get(ENV_TUNE, "1") == "0":
        return False
    if _ACTIVE is None:
        arch = str(mx.device_info().get("architecture", "")) if mx.metal.is_available() else ""
        _ACTIVE = arch.startswith("applegpu_g") and \
            _ext._metal_static_route(arch, 1, 1, 1, mx.bfloat16) != "cpu"
    return _ACTIVE


def tuner():
    global _tuner
    with _tuner_lock:
        if _tuner is None:
            _tuner = Tuner(cache_dir() / CACHE_FILE, environment(), time_route, apply_to_op)
        return _tuner


def _on_gpu(stream):
    """Whether the op's stream argument (None, a Stream, a Device or mx.gpu / mx.cpu) is the GPU."""
    if stream is None:
        stream = mx.default_device()
    if isinstance(stream, mx.Stream):
        stream = stream.device
    return (stream.type if isinstance(stream, mx.Device) else stream) == mx.gpu


def before_matmul(x, w, mode="nvfp4", stream=None):
    """Called by ops.w4a16_matmul before the op is built: on first use of the bucket, measure."""
    if os.environ.get(ENV_ROUTE, "auto") != "auto":
        return  # a forced route wins over any measurement (and both timings would run it)
    if not active() or not _on_gpu(stream) or mode not in BLOCK or x.ndim < 1:
        return
    k = x.shape[-1]
    if k == 0 or k % BLOCK[mode] != 0 or w.ndim != 2:
        return  # MLX's kernel needs K a multiple of the block: nothing to compare with
    m = x.size // k
    if m == 0:
        return
    _route(m, w.shape[0], k, x.dtype, mode)


def _route(m, n, k, dtype, mode, experts=0, sorted=False):
    try:
        tuner().route(m, n, k, dtype, mode, experts, sorted)
    except (RuntimeError, ValueError) as err:  # inside mx.compile's trace eval raises: static route
        print(f"[mlx_fp4] Metal tuning skipped ({err}); static route", file=sys.stderr)


def before_gather(x, w, lhs_indices=None, rhs_indices=None, sorted_indices=False, mode="nvfp4",
                  stream=None):
    """Called by ops.gather_w4a16_matmul: the gathered op's bucket (all pairs' rows of x), N, K,
    experts and hint as gather_ops.cpp keys them (pairs: the indices' broadcast shape, the hint
    only with rhs and no lhs, as mx.gather_qmm), measured on first use against mx.gather_qmm."""
    import numpy as np

    if os.environ.get(ENV_ROUTE, "auto") != "auto":
        return
    if not active() or not _on_gpu(stream) or mode not in BLOCK or x.ndim < 2 or w.ndim < 3:
        return
    k = x.shape[-1]
    if k == 0 or k % BLOCK[mode] != 0:
        return
    xb, wb = tuple(x.shape[:-2]), tuple(w.shape[:-2])
    lb = tuple(lhs_indices.shape) if lhs_indices is not None else xb
    rb = tuple(rhs_indices.shape) if rhs_indices is not None else wb
    try:
        pairs = math.prod(np.broadcast_shapes(lb, rb))
    except ValueError:
        return  # the op raises its own error
    rows = pairs * x.shape[-2]
    if rows == 0:
        return
    hint = bool(sorted_indices and rhs_indices is not None and lhs_indices is None)
    _route(rows, w.shape[-2], k, x.dtype, mode, math.prod(wb), hint)


def metal_tuning():
    """The measured route table of this GPU (a list of dicts: bucket, n, k, dtype, mode, route,
    ours_s, mlx_s; seconds per call), with the environment and the cache file."""
    on = active()
    t = tuner() if on else None
    return {"enabled": on, "path": str(cache_dir() / CACHE_FILE),
            "environment": t.env if t else None, "state": t.state if t else None,
            "decisions": t.table() if t else []}
