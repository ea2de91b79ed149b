"""What a CPU number depends on, for the JSON: the processor (vendor, family/model, SIMD
extensions), numpy's BLAS (library, version, the kernel core it picked at run time) and where a
process runs (its CPUs, their clock, its context switches).
CPU ratios are only comparable on one machine; these say which machine."""

import ctypes
import os
import platform

import numpy as np

# SIMD extensions that decide which hot loops and BLAS kernels run (x86 /proc/cpuinfo flag names,
# AArch64 "Features" names).
_SIMD_FLAGS = ("sse2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16",
               "amx_tile", "asimd", "fphp", "asimdhp", "asimddp", "bf16", "i8mm", "sve", "sve2")


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _cpuinfo_blocks():
    """/proc/cpuinfo as one {field: value} per processor (Linux), or None where it cannot be read."""
    text = _read("/proc/cpuinfo")
    if text is None:
        return None
    blocks = []
    for chunk in text.split("\n\n"):
        fields = {}
        for line in chunk.splitlines():
            name, sep, value = line.partition(":")
            if sep:
                fields[name.strip()] = value.strip()
        if fields:
            blocks.append(fields)
    return blocks


def cpu_id() -> dict:
    """Vendor, family / model / stepping and SIMD flags from /proc/cpuinfo (Linux); else platform."""
    info = {"machine": platform.machine()}
    keys = {"vendor_id": "vendor", "cpu family": "family", "model": "model", "stepping": "stepping",
            "model name": "model_name", "cpu implementer": "implementer", "cpu part": "part"}
    blocks = _cpuinfo_blocks()
    if blocks is None:
        info["model_name"] = platform.processor() or None
        return info
    for name, value in (blocks[0] if blocks else {}).items():  # the first processor is enough
        if name in keys:
            info[keys[name]] = value
        elif name in ("flags", "Features"):
            have = set(value.split())
            info["simd"] = [f for f in _SIMD_FLAGS if f in have]
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


# /proc/self/stat: the field after the command name's ")" holding the CPU the process last ran on
# (field 39 of proc(5), the 37th after the name).
_STAT_PROCESSOR_FIELD = 36


def _cpu_mhz(cpu):
    """CPU `cpu`'s current clock in MHz: cpufreq where the kernel exposes it, else /proc/cpuinfo."""
    khz = _read(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq")
    if khz and khz.strip().isdigit():
        return round(int(khz) / 1000)
    for fields in _cpuinfo_blocks() or []:
        if fields.get("processor") == str(cpu) and "cpu MHz" in fields:
            return round(float(fields["cpu MHz"]))
    return None


def host_state():
    """Where this process runs on the host (Linux; None fields elsewhere): the CPUs it may use, the
    CPU its main thread last ran on and that CPU's clock, the main thread's voluntary and
    involuntary context switches so far (the thread that builds and encodes each step's graph).
    Read around each decode process's timed runs, like report.gpu_state: a host-bound step is slowed by a
    busy or slow core, which these tell apart."""
    st = {"affinity": None, "cpu": None, "cpu_mhz": None, "voluntary_switches": None, "involuntary_switches": None}
    try:
        cpus = sorted(os.sched_getaffinity(0))
        st["affinity"] = f"{cpus[0]}-{cpus[-1]}" if cpus == list(range(cpus[0], cpus[-1] + 1)) else ",".join(map(str, cpus))
    except (AttributeError, OSError):
        pass
    stat = _read("/proc/self/stat")
    if stat and ")" in stat:
        rest = stat.rsplit(")", 1)[1].split()
        if len(rest) > _STAT_PROCESSOR_FIELD and rest[_STAT_PROCESSOR_FIELD].isdigit():
            st["cpu"] = int(rest[_STAT_PROCESSOR_FIELD])
            st["cpu_mhz"] = _cpu_mhz(st["cpu"])
    for line in (_read("/proc/self/status") or "").splitlines():
        key, _, value = line.partition(":")
        if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches") and value.strip().isdigit():
            st["voluntary_switches" if key.startswith("vol") else "involuntary_switches"] = int(value)
    return st
