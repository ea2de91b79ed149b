"""System facts, per-point metrics, the printed table and the JSON file."""

import ctypes
import json
import math
import os
import platform
import subprocess
import time

import mlx.core as mx
import numpy as np

from . import cpu_facts, timing

# ---- system facts -------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if platform.system() == "Darwin":
        try:
            return subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine()


def llc_bytes():
    """Size of the last-level CPU cache in bytes (Linux sysfs, macOS sysctl), or None."""
    best = None
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in sorted(os.listdir(base)):
            if not entry.startswith("index"):
                continue
            with open(f"{base}/{entry}/level") as f:
                level = int(f.read())
            with open(f"{base}/{entry}/size") as f:
                text = f.read().strip()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            size = int(text.rstrip("KMG")) * mult
            if best is None or level >= best[0]:
                best = (level, size)
    except (OSError, ValueError):
        pass
    if best:
        return best[1]
    if platform.system() == "Darwin":
        for key in ("hw.l3cachesize", "hw.l2cachesize"):
            try:
                out = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, timeout=5).stdout
                if out.strip() and int(out) > 0:
                    return int(out)
            except (OSError, ValueError, subprocess.SubprocessError):
                pass
    return None


def available_memory_bytes(device: str):
    if device == "gpu":
        try:
            info = mx.device_info()
            for key in ("memory_size", "total_memory", "max_recommended_working_set_size"):
                if info.get(key):
                    return int(info[key])
        except Exception:
            pass
        return 8 << 30
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def cpu_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def blas_threads() -> dict:
    """numpy's BLAS thread count: threadpoolctl if installed, else OpenBLAS's own getter, else env."""
    try:
        from threadpoolctl import threadpool_info

        for lib in threadpool_info():
            if lib.get("user_api") == "blas":
                return {"threads": lib["num_threads"], "library": lib.get("internal_api"), "source": "threadpoolctl"}
    except ImportError:
        pass
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line}
        for path in sorted(paths):
            lib = ctypes.CDLL(path)
            for sym in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_", "openblas_get_num_threads"):
                fn = getattr(lib, sym, None)
                if fn is not None:
                    return {"threads": int(fn()), "library": "openblas", "source": f"{sym} in {os.path.basename(path)}"}
    except OSError:
        pass
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if os.environ.get(var, "").isdigit():
            return {"threads": int(os.environ[var]), "library": None, "source": var}
    return {"threads": cpu_threads(), "library": None, "source": "os.sched_getaffinity (assumed)"}


def _gpu_name() -> str:
    try:
        name = mx.device_info().get("device_name")
        if name:
            return str(name)
    except Exception:
        pass
    values = _nvidia_smi(("name",))
    return values[0] if values else "unknown GPU"


# nvidia-smi fields read around each decode process's timed runs: a process that decodes slower
# than its peers can be told apart by its clocks, temperature, power or throttle reasons.
GPU_STATE_FIELDS = ("clocks.sm", "clocks.mem", "temperature.gpu", "power.draw", "clocks_event_reasons.active")


def _nvidia_smi(fields):
    """GPU 0's values of `fields` (strings, units dropped) from nvidia-smi, or None where there is
    none, it fails, or the line does not hold one value per field."""
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = r.stdout.strip().splitlines()
    if r.returncode != 0 or not lines:
        return None
    values = [v.strip() for v in lines[0].split(",")]
    return values if len(values) == len(fields) else None


def gpu_state():
    """GPU 0's GPU_STATE_FIELDS as strings from nvidia-smi, or None where there is none (or it fails)."""
    values = _nvidia_smi(GPU_STATE_FIELDS)
    return dict(zip(GPU_STATE_FIELDS, values)) if values else None


def _git(*args):
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        r = subprocess.run(["git", "-C", here, *args], capture_output=True, text=True, timeout=10)
        return r.stdout.strip() if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def load_average():
    """1-minute load average (a busy machine makes CPU numbers noisy), or None."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def _built_commit():
    """The commit the installed extension was built from (_build_info, written by CMake), or None."""
    try:
        from mlx_fp4 import _build_info

        return getattr(_build_info, "GIT_COMMIT", None) or None
    except ImportError:
        return None


def system_info(device: str) -> dict:
    # A development tree is a git checkout; an installed package knows the commit it was built from.
    commit = _git("rev-parse", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    commit = commit or _built_commit()
    fp4_version, fp4_build, fp4_cpu = None, None, None
    try:
        import mlx_fp4

        fp4_version = getattr(mlx_fp4, "__version__", None)
        fp4_build = mlx_fp4.build_info() if hasattr(mlx_fp4, "build_info") else None
        fp4_cpu = mlx_fp4.cpu_info() if hasattr(mlx_fp4, "cpu_info") else None
    except ImportError:
        pass
    backend = "metal" if mx.metal.is_available() else ("cuda" if mx.cuda.is_available() else "cpu-only")
    return {
        "device": device,
        "device_name": _gpu_name() if device == "gpu" else _cpu_model(),
        "mlx_backend": backend,
        "cpu_model": _cpu_model(),
        "cpu": cpu_facts.cpu_id(),
        "numpy_blas": cpu_facts.numpy_blas(),
        "llc_bytes": llc_bytes(),
        "memory_available_bytes": available_memory_bytes(device),
        "threads": {
            "cpus": cpu_threads(),
            "os_cpu_count": os.cpu_count(),
            "numpy_blas": blas_threads(),
            "mlx_fp4": (fp4_cpu or {}).get("threads"),
        },
        "os": platform.platform(),
        "python": platform.python_version(),
        "versions": {"mlx": mx.__version__, "numpy": np.__version__, "mlx_fp4": fp4_version},
        "mlx_fp4_build": fp4_build,
        "mlx_fp4_cpu": fp4_cpu,
        "git": {"commit": commit, "dirty": bool(dirty) if dirty is not None else None},
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "load_average_1m_at_start": load_average(),
    }


# ---- metrics ------------------------------------------------------------------------------------


def result_entry(impl, meas: timing.Measurement, shape, m: int) -> dict:
    """Throughput of one implementation at one point (None where it was not measured)."""
    entry = {"label": impl.label, "weight_bytes": impl.weight_bytes(shape), **meas.as_dict()}
    t = meas.seconds
    ok = meas.status == timing.OK and t is not None and t > 0
    entry["us"] = t * 1e6 if ok else None
    entry["us_min"] = meas.seconds_min * 1e6 if ok else None
    entry["gbps_weights"] = entry["weight_bytes"] / t / 1e9 if ok else None
    entry["tflops"] = shape.flops(m) / t / 1e12 if ok else None
    return entry


def finish_point(point: dict, ours: str, bw_gbps, compute_tflops, compute_source: str) -> None:
    """Add roofline percentages and speedups of `ours` over every baseline to one point."""
    res = point["results"]
    mine = res.get(ours, {})
    t = mine.get("us")
    roof = {
        "bandwidth_gbps": bw_gbps,
        "bandwidth_bound_us": point["weight_bytes"] / (bw_gbps * 1e9) * 1e6 if bw_gbps else None,
        "compute_tflops": compute_tflops,
        "compute_source": compute_source,
    }
    roof["pct_bandwidth"] = 100.0 * roof["bandwidth_bound_us"] / t if t and roof["bandwidth_bound_us"] else None
    roof["pct_compute"] = 100.0 * mine["tflops"] / compute_tflops if t and compute_tflops else None
    point["roofline"] = roof
    point["speedup"] = {
        name: (r["us"] / t if t and r.get("us") else None) for name, r in res.items() if name != ours
    }


# ---- output -------------------------------------------------------------------------------------


def _fmt(v, kind="g") -> str:
    if v is None:
        return "-"
    if kind == "us":
        return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"
    if kind == "pct":
        return f"{v:.0f}%"
    if kind == "x":
        return f"{v:.1f}x" if v < 100 else f"{v:,.0f}x"
    return f"{v:.3g}"


def _cell(point, impl, kind):
    r = point["results"].get(impl)
    if r is None:
        return "n/a"
    if r["status"] != timing.OK:
        return "skip" if r["status"] == timing.SKIPPED_BUDGET else "error"
    return _fmt(r["us"], kind)


BASELINE_COLUMNS = (("mlx_nvfp4", "nvfp4"), ("mlx_dense_bf16", "bf16"), ("numpy_fp32", "numpy"))


def table(points: list, ours: str, impls: list, mode: str = "nvfp4") -> str:
    """The Markdown table; MLX's quantized column is named after the run's mode."""
    cols = ["shape", "M", "ours us", "GB/s", "TFLOP/s", "%BW", "%comp"]
    base = [(n, mode if n == "mlx_nvfp4" else short) for n, short in BASELINE_COLUMNS if n in impls]
    for _, short in base:
        cols += [f"{short} us", f"x{short}"]
    rows = []
    for p in points:
        r = p["results"].get(ours, {})
        ok = r.get("status") == timing.OK
        row = [p["shape"], str(p["m"])]
        row += [_cell(p, ours, "us") if ours in p["results"] else "n/a"]
        row += [_fmt(r.get("gbps_weights")) if ok else "-", _fmt(r.get("tflops")) if ok else "-"]
        row += [_fmt(p["roofline"]["pct_bandwidth"], "pct"), _fmt(p["roofline"]["pct_compute"], "pct")]
        for name, _ in base:
            row += [_cell(p, name, "us"), _fmt(p["speedup"].get(name), "x")]
        rows.append(row)
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
    line = lambda cells: "| " + " | ".join(c.rjust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    out = [line(cols), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in rows]
    return "\n".join(out)


LEGEND = (
    "ours us: median time per product of mlx_fp4.w4a16_matmul; GB/s: packed weight + scale bytes / time; "
    "TFLOP/s: 2*M*N*K / time; %BW: bandwidth-bound time (weight bytes / roofline GB/s) / time; "
    "%comp: our TFLOP/s / compute roofline; <impl> us: that baseline's median time; x<impl>: its time / ours; "
    "skip: not measured (time budget); n/a: not run."
)


def _finite(obj):
    """JSON-safe copy: NaN/inf become None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def write_json(path: str, doc: dict) -> None:
    with open(path, "w") as f:
        json.dump(_finite(doc), f, indent=1)
        f.write("\n")


def roofline_lines(doc: dict) -> str:
    """One line per shape: weight size, cache fit, bandwidth roofline; and the GPU compute peak."""
    out = []
    roofs = doc["rooflines"]
    llc = doc["device"].get("llc_bytes")
    seen = set()
    for p in doc["points"]:
        if p["shape"] in seen:
            continue
        seen.add(p["shape"])
        bw = p["roofline"]["bandwidth_gbps"]
        fit = "" if p["weights_fit_llc"] is None else (
            f", {'fit' if p['weights_fit_llc'] else 'do not fit'} in the {llc / 2**20:.0f} MiB last-level cache "
            "(timed cold: copies rotated)")
        out.append(f"{p['shape']}: weights {p['weight_bytes'] / 1e6:.2f} MB (packed + scales){fit}; "
                   f"bandwidth roofline {_fmt(bw)} GB/s -> >= {_fmt(p['roofline']['bandwidth_bound_us'], 'us')} us "
                   "per product")
    if "compute" in roofs:
        out.append(f"compute roofline: {roofs['compute']['method']} = {_fmt(roofs['compute']['tflops'])} TFLOP/s")
    elif doc["device"]["device"] == "cpu":
        out.append("compute roofline: numpy fp32 matmul of the dequantized weight at the same point (%comp)")
    return "\n".join(out)
