"""What a CPU number depends on, for the JSON: the processor (vendor, family/model, SIMD
extensions) and numpy's BLAS (library, version, the kernel core it picked at run time).
CPU ratios are only comparable on one machine; these say which machine."""

import ctypes
import os
import platform

import numpy as np

# SIMD extensions that decide which hot loops and BLAS kernels run (x86 /proc/cpuinfo flag names,
# AArch64 "Features" names).
_SIMD_FLAGS = ("sse2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16",
               "amx_tile", "asimd", "fphp", "asimdhp", "asimddp", "bf16", "i8mm", "sve", "sve2")


def cpu_id() -> dict:
    """Vendor, family / model / stepping and SIMD flags from /proc/cpuinfo (Linux); else platform."""
    info = {"machine": platform.machine()}
    keys = {"vendor_id": "vendor", "cpu family": "family", "model": "model", "stepping": "stepping",
            "model name": "model_name", "cpu implementer": "implementer", "cpu part": "part"}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor is enough
                name, _, value = line.partition(":")
                name, value = name.strip(), value.strip()
                if name in keys:
                    info[keys[name]] = value
                elif name in ("flags", "Features"):
                    have = set(value.split())
                    info["simd"] = [f for f in _SIMD_FLAGS if f in have]
    except OSError:
        info["model_name"] = platform.processor() or None
    return info


def _openblas_core():
    """The kernel core OpenBLAS picked at run time (e.g. Haswell, SkylakeX, Zen), or None."""
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line})
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for sym in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename64_",
                    "openblas_get_corename"):
            fn = getattr(lib, sym, None)
            if fn is not None:
                fn.restype = ctypes.c_char_p
                return fn().decode()
    return None


def numpy_blas() -> dict:
    """numpy's BLAS: name and version from numpy's build config, the run-time core, env overrides."""
    out = {"name": None, "version": None, "core": _openblas_core()}
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        out["name"], out["version"] = blas.get("name"), blas.get("version")
    except (TypeError, KeyError, ValueError):
        pass
    env = {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS") if k in os.environ}
    if env:
        out["env"] = env
    return out
