"""MLX 0.32.4's own nvfp4 and mxfp4 Metal kernels in metal_sim: the baseline our kernels are measured
against, and a check of the simulator on code it was not written for.

Nothing of MLX is committed. At test time the mlx-metal 0.32.4 wheel (PyPI, macOS arm64; pinned
by sha256) is downloaded into the cache, its kernel headers are concatenated the way MLX's JIT
does for the fp quantized kernels (utils.h, steel/gemm/gemm.h, quantized_utils.h,
fp_quantized.h), instantiated with MLX's template arguments and built by the same shim and
prep step as our kernels. `launch_*` replay MLX's host code (mlx/backend/metal/quantized.cpp:
kernel choice, grid, threadgroup, buffer slots), transcribed from MLX main at 846d176 (the
newest host source available; the wheel ships only the headers) and checked against the
kernels' signatures in the wheel.

One header is left out: bf16_math.h (bfloat overloads of Metal's math built-ins, which the
shim's math templates cover); the kernels used here call none of them.
"""

import hashlib
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np

import simbuild

WHEEL = "mlx_metal-0.32.4-py3-none-macosx_14_0_arm64.whl"
WHEEL_SHA256 = "8019b2db622599267d66cc168b2f0dbf5af929790a6c3b3913e00eabc42a7947"
KERNELS = "mlx/backend/metal/kernels"
HEADERS = [f"{KERNELS}/utils.h", f"{KERNELS}/steel/gemm/gemm.h", f"{KERNELS}/quantized_utils.h",
           f"{KERNELS}/fp_quantized.h"]
SKIP = {f"{KERNELS}/bf16_math.h"}
# The fp kernels' group size picks the scale format (fp_quantized.h dequantize_scale): 16 reads
# E4M3 (nvfp4), 32 reads E8M0 (mxfp4).
GROUPS = {"nvfp4": 16, "mxfp4": 32}
K_LANES = 16  # fp_qmv_wide: lanes reducing K per output row (MLX's host: 16 for the fp modes)
BITS = 4
TYPES = {"float32": "float", "float16": "float16_t", "bfloat16": "bfloat16_t"}
NUMPY_TYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}
SIMD = 32


class Unavailable(Exception):
    """The wheel could not be fetched (offline)."""


def wheel_dir():
    return simbuild.CACHE / "mlx-metal-0.32.4"


def fetch_headers():
    """Directory holding the wheel's mlx/include (kernel and host headers), downloading the
    wheel once."""
    d = wheel_dir()
    inc = d / "include"
    if (inc / "mlx" / "backend" / "metal" / "device.h").exists():
        return inc
    d.mkdir(parents=True, exist_ok=True)
    whl = d / WHEEL
    if not whl.exists():
        r = subprocess.run([sys.executable, "-m", "pip", "download", "mlx-metal==0.32.4",
                            "--no-deps", "--only-binary=:all:", "--platform", "macosx_14_0_arm64",
                            "-d", str(d), "-q"], capture_output=True, text=True, timeout=600)
        if r.returncode != 0 or not whl.exists():
            raise Unavailable(f"pip download mlx-metal==0.32.4 failed: {r.stderr[-500:]}")
    digest = hashlib.sha256(whl.read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise RuntimeError(f"{whl}: sha256 {digest}, expected {WHEEL_SHA256}")
    tmp = d / f"include.{os.getpid()}.tmp"
    with zipfile.ZipFile(whl) as z:
        for name in z.namelist():
            # MLX's C++ and kernel headers (the host API too: test_metal_sim_host.py compiles
            # eval_gpu against mlx/backend/metal/device.h); not Apple's metal-cpp
            if name.startswith("mlx/include/mlx/") and name.endswith(".h"):
                rel = name[len("mlx/include/"):]
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                (tmp / rel).write_bytes(z.read(name))
    tmp.replace(inc)
    return inc


def amalgamate(inc):
    """The headers as one MSL text, quoted includes inlined once each, `#line` per file."""
    seen, out = set(), []

    def emit(rel):
        if rel in seen or rel in SKIP:
            return
        seen.add(rel)
        out.append(f'#line 1 "{rel}"')
        for i, line in enumerate((inc / rel).read_text().split("\n"), 1):
            m = re.match(r'\s*#include\s+"([^"]+)"', line)
            if m:
                emit(m.group(1))
                out.append(f'#line {i + 1} "{rel}"')
            elif re.match(r"\s*#pragma\s+once", line):
                out.append("")
            else:
                out.append(line)

    for h in HEADERS:
        emit(h)
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# Instantiations (host names are ours; template arguments as MLX's quantized.cpp passes them).


def name(kind, dtype, *extra, mode="nvfp4"):
    tag = [] if mode == "nvfp4" else [mode]
    return "_".join(["mlx", kind, dtype, *map(str, extra), *tag])


def instantiation(host, fn, args):
    a = ", ".join(map(str, args))
    return f'template [[host_name("{host}")]] [[kernel]] decltype({fn}<{a}>) {fn}<{a}>;'


def all_instantiations():
    lines = []
    for mode, group in GROUPS.items():
        # mxfp4 has no global scale (MLX's host passes none)
        scales = (False, True) if mode == "nvfp4" else (False,)
        for dt, t in TYPES.items():
            for gs in scales:
                for fast in (True, False):
                    kind = "qmv_fast" if fast else "qmv"
                    # <T, group_size, bits, batched, partial_rows, has_global_scale, results>
                    args = [t, group, BITS, "false", "false", str(gs).lower(), 4]
                    lines.append(instantiation(name(kind, dt, int(gs), mode=mode), f"fp_{kind}", args))
            for nv in range(1, 6):
                lines.append(instantiation(name("qmv_wide", dt, nv, mode=mode), "fp_qmv_wide",
                                           [t, group, BITS, nv, K_LANES, "false"]))
            for aligned in (True, False):
                for gs in scales:
                    lines.append(instantiation(name("qmm_t", dt, int(aligned), int(gs), mode=mode),
                                               "fp_qmm_t", [t, group, BITS, str(aligned).lower(),
                                                            "false", str(gs).lower()]))
                lines.append(instantiation(name("qmm_t_splitk", dt, int(aligned), mode=mode),
                                           "fp_qmm_t_splitk", [t, group, BITS, str(aligned).lower()]))
            # mx.gather_qmm's decode kernels (GatherQMM::eval_gpu -> gather_qmv; no global scale
            # there: its host passes none): <T, group_size, bits, has_global_scale>
            for fast in (True, False):
                kind = "gather_qmv_fast" if fast else "gather_qmv"
                lines.append(instantiation(name(kind, dt, mode=mode), f"fp_{kind}", [t, group, BITS, "false"]))
            # mx.quantize (QuantizedMatmul's quantize_impl): <T, group_size, bits, has_global_scale>
            for gs in scales:
                lines.append(instantiation(name("quantize", dt, int(gs), mode=mode), "fp_quantize",
                                           [t, group, BITS, str(gs).lower()]))
    return lines


def build_runner(count=False, only=None):
    """The runner with MLX's kernels (count: the cost-model build, only the named ones)."""
    inc = fetch_headers()
    lines = all_instantiations()
    if only is not None:
        lines = [ln for ln in lines if re.search(r'host_name\("(' + "|".join(only) + r')"', ln)]
    return simbuild.build_source_runner("mlx-count" if count else "mlx", amalgamate(inc), lines,
                                        count=count)


# ---------------------------------------------------------------------------------------------
# Host side: MLX's dispatch for one [M, K] x [N, K]^T problem (not batched, transpose=True), and
# (launch_gather) mx.gather_qmm's decode.


def get_qmv_batch_limit(k, n, gpu):
    """MLX's vector/matrix crossover on M (quantized.cpp get_qmv_batch_limit). gpu:
    (architecture generation, size letter), e.g. (16, 's') for an M4 Max."""
    gen, size = gpu
    def pick(a, b, c):
        return a if (k <= 2048 and n <= 2048) else b if (k <= 4096 and n <= 4096) else c
    if gen >= 17 and size != "d":
        return pick(33, 25, 13)
    if gen >= 15 and size != "d":
        return pick(13, 15, 13)
    if size == "d":
        return pick(32, 18, 12)
    return pick(14, 10, 6) if gen >= 13 else pick(18, 12, 10)


def mlx_plan(m, n, k, gpu=(16, "s"), has_global_scale=False, mode="nvfp4"):
    """(kernel kind, parameters) MLX's QuantizedMatmul::eval_gpu runs (no NAX: M1-M4); the same
    table for both fp modes (only k_align reads the group size)."""
    if m >= get_qmv_batch_limit(k, n, gpu):
        bm = bn = 32
        tgs = -(-n // bn) * -(-m // bm)
        split = max(1, 512 // tgs)
        k_align = max(GROUPS[mode], 32)
        split = min(split, k // k_align)
        while split > 1 and k % (split * k_align) != 0:
            split -= 1
        if split > 1 and not has_global_scale:
            return "qmm_t_splitk", {"split_k": split}
        return "qmm_t", {}
    if m >= 2 and not has_global_scale:
        return "qmv_wide", {}
    fast = n % 8 == 0 and k % 512 == 0
    return ("qmv_fast" if fast else "qmv"), {}


def _write(path, a):
    np.ascontiguousarray(a).tofile(path)
    return path


def _spec(d, kernel, grid, threads, buffers, outputs, guard):
    lines = [f"kernel {kernel}", "grid " + " ".join(map(str, grid)),
             "threads " + " ".join(map(str, threads)), f"guard {guard}"]
    for slot, path in buffers.items():
        lines.append(f"buffer {slot} {path}")
    for slot, (nbytes, path) in outputs.items():
        lines.append(f"output {slot} {nbytes} {path}")
    spec = Path(d) / "exec.txt"
    spec.write_text("\n".join(lines) + "\n")
    return spec


def run_exec(runner, spec, env=None, timeout=600):
    r = subprocess.run([str(runner), "exec", str(spec)], capture_output=True, text=True,
                       env=env, timeout=timeout)
    if r.returncode != 0:
        raise AssertionError(f"metal_sim runner exited with {r.returncode}:\n{r.stderr}")


def launch(runner, d, x, w_bytes, scales, *, kind, dtype, global_scale=None, split_k=None,
           guard="end", slack=0, env=None, mode="nvfp4"):
    """Runs MLX's `kind` kernel on x [M, K] (numpy, dtype), w_bytes uint8 [N, K/2], scales
    uint8 [N, K/16] (mode="mxfp4": [N, K/32]); returns the output [M, N] as float64 (as MLX
    returns it, in dtype).
    slack: zero bytes appended to the weight and scale buffers (MLX's qmm_t reads past the
    last row when K % 32 != 0; see test_mlx_kernels.py)."""
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    m, k = x.shape
    n = w_bytes.shape[0]
    if slack:
        w_bytes = np.concatenate([w_bytes.reshape(-1), np.zeros(slack, np.uint8)])
        scales = np.concatenate([scales.reshape(-1), np.zeros(slack, np.uint8)])
    np_dt = x.dtype
    i32 = lambda v: np.asarray([v], np.int32)  # noqa: E731
    zeros = _write(d / "zeros.bin", np.zeros(16, np.int64))  # unused batch-stride slots
    wp = _write(d / "w.bin", w_bytes)
    sp = _write(d / "s.bin", scales)
    xp = _write(d / "x.bin", x)
    gp = _write(d / "gs.bin", np.asarray([global_scale or 1.0], np.float32))
    out_path = d / "y.bin"
    gs = int(global_scale is not None)
    if kind in ("qmv_fast", "qmv"):
        kernel = name(kind, dtype, gs, mode=mode)
        bufs = {0: wp, 1: sp, 2: gp, 3: xp, 5: _write(d / "k.bin", i32(k)),
                6: _write(d / "n.bin", i32(n))}
        bufs.update({s: zeros for s in range(7, 14)})
        grid, threads = (m, -(-n // 8), 1), (32, 2, 1)
        outs = {4: (m * n * np_dt.itemsize, out_path)}
    elif kind == "qmv_wide":
        tiles = (m + 4) // 5
        nv = -(-m // tiles)
        kernel = name(kind, dtype, nv, mode=mode)
        bufs = {0: wp, 1: sp, 2: xp, 4: _write(d / "k.bin", i32(k)),
                5: _write(d / "n.bin", i32(n)), 6: _write(d / "m.bin", i32(m))}
        bufs.update({s: zeros for s in range(7, 14)})
        rows_per_tg = (SIMD // K_LANES) * 2
        grid, threads = (-(-m // nv), -(-n // rows_per_tg), 1), (32, 2, 1)
        outs = {3: (m * n * np_dt.itemsize, out_path)}
    elif kind == "qmm_t":
        kernel = name(kind, dtype, int(n % 32 == 0), gs, mode=mode)
        bufs = {0: wp, 1: sp, 2: gp, 3: xp, 5: _write(d / "k.bin", i32(k)),
                6: _write(d / "n.bin", i32(n)), 7: _write(d / "m.bin", i32(m))}
        bufs.update({s: zeros for s in range(8, 15)})
        grid, threads = (-(-n // 32), -(-m // 32), 1), (32, 2, 2)
        outs = {4: (m * n * np_dt.itemsize, out_path)}
    elif kind == "qmm_t_splitk":
        kernel = name(kind, dtype, int(n % 32 == 0), mode=mode)
        bufs = {0: wp, 1: sp, 2: xp, 4: _write(d / "k.bin", i32(k)),
                5: _write(d / "n.bin", i32(n)), 6: _write(d / "m.bin", i32(m)),
                7: _write(d / "kp.bin", i32(k // split_k)),
                8: _write(d / "ps.bin", i32(m * n))}
        grid, threads = (-(-n // 32), -(-m // 32), split_k), (32, 2, 2)
        outs = {3: (split_k * m * n * 4, out_path)}
    else:
        raise ValueError(kind)
    run_exec(runner, _spec(d, kernel, grid, threads, bufs, outs, guard), env=env)
    if kind == "qmm_t_splitk":
        parts = np.fromfile(out_path, np.float32).reshape(split_k, m, n)
        acc = parts[0].copy()
        for p in parts[1:]:  # MLX sums the fp32 partials (strided reduce), then casts
            acc += p
        return acc.astype(np_dt).astype(np.float64)
    return np.fromfile(out_path, np_dt).reshape(m, n).astype(np.float64)


QMV_FAST_K = 512  # quantized.cpp qmv_fast_k_alignment(4): the fast kernel's K multiple


def launch_gather(runner, d, x, w_bytes, scales, lhs, rhs, *, dtype, env=None, mode="nvfp4"):
    """Runs mx.gather_qmm's decode kernel (GatherQMM::eval_gpu -> gather_qmv: one row of x per
    pair, unsorted, transpose=True) as MLX's host code launches it: x [B, 1, K] (numpy, dtype),
    w_bytes uint8 [E, N, K/2], scales uint8 [E, N, K/group], lhs / rhs uint32 [P] (x matrix and
    expert of each pair). Returns (kind, out [P, 1, N] float64)."""
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    b, m, k = x.shape
    e, n, row = w_bytes.shape
    pairs = len(rhs)
    assert m == 1, "gather_qmv runs M < the vector limit; this replay covers one row per pair"
    fast = n % 8 == 0 and k % QMV_FAST_K == 0
    kind = "gather_qmv_fast" if fast else "gather_qmv"
    i32 = lambda *v: np.asarray(v, np.int32)  # noqa: E731
    i64 = lambda *v: np.asarray(v, np.int64)  # noqa: E731
    words = row // 4  # w as MLX's uint32 [E, N, K/8]; strides in elements of each array
    blocks = scales.shape[-1]
    bufs = {0: _write(d / "w.bin", w_bytes), 1: _write(d / "s.bin", scales),
            2: _write(d / "gs.bin", np.ones(1, np.float32)), 3: _write(d / "x.bin", x),
            4: _write(d / "lhs.bin", np.asarray(lhs, np.uint32)), 5: _write(d / "rhs.bin", np.asarray(rhs, np.uint32)),
            7: _write(d / "k.bin", i32(k)), 8: _write(d / "n.bin", i32(n)),
            # add_strides_and_shapes: x [B, 1, K], w [E, N, K/8], scales [E, N, blocks]
            9: _write(d / "xnd.bin", i32(1)), 10: _write(d / "xsh.bin", i32(b, m, k)),
            11: _write(d / "xst.bin", i64(m * k, k, 1)), 12: _write(d / "wnd.bin", i32(1)),
            13: _write(d / "wsh.bin", i32(e, n, words)), 14: _write(d / "wst.bin", i64(n * words, words, 1)),
            15: _write(d / "sst.bin", i64(n * blocks, blocks, 1)),
            # add_gather_strides_and_shapes: the indices' collapsed shape [P] and strides
            16: _write(d / "bnd.bin", i32(1)), 17: _write(d / "bsh.bin", i32(pairs)),
            18: _write(d / "lst.bin", i64(1)), 19: _write(d / "rst.bin", i64(1))}
    out_path = d / "y.bin"
    outs = {6: (pairs * m * n * x.dtype.itemsize, out_path)}
    grid, threads = (m, -(-n // 8), pairs), (32, 2, 1)
    run_exec(runner, _spec(d, name(kind, dtype, mode=mode), grid, threads, bufs, outs, "end"), env=env)
    return kind, np.fromfile(out_path, x.dtype).reshape(pairs, m, n).astype(np.float64)


def launch_quantize(runner, d, w, *, dtype, global_scale=None, env=None, mode="nvfp4"):
    """Runs mx.quantize's Metal kernel (fp_quantize) on w [N, K] (numpy, dtype) as MLX's host code
    launches it (quantize_impl, get_quantize_kernel_dims: one thread per weight, simdgroups of
    32 consecutive weights, so each holds two NVFP4 blocks or one MXFP4 block). Threadgroups of
    one simdgroup here: MLX's are larger, but the kernel shares nothing beyond its simdgroup.
    Returns (packed uint8 [N, K/2], scales uint8 [N, K/group])."""
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    n, k = w.shape
    if (n * k) % SIMD or k % GROUPS[mode]:
        raise ValueError(f"N*K a multiple of {SIMD} and K of {GROUPS[mode]} (got {n}x{k})")
    gs = int(global_scale is not None)
    bufs = {0: _write(d / "w.bin", w), 3: _write(d / "gs.bin", np.asarray([global_scale or 1.0], np.float32))}
    outs = {1: (n * k // 2, d / "q.bin"), 2: (n * k // GROUPS[mode], d / "s.bin")}
    grid, threads = (n * k // SIMD, 1, 1), (SIMD, 1, 1)
    run_exec(runner, _spec(d, name("quantize", dtype, gs, mode=mode), grid, threads, bufs, outs, "end"), env=env)
    return (np.fromfile(d / "q.bin", np.uint8).reshape(n, k // 2),
            np.fromfile(d / "s.bin", np.uint8).reshape(n, k // GROUPS[mode]))
