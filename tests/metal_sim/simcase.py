"""Runs one W4A16 problem through the metal_sim runner and returns the output as float64.

The problem is described the way W4A16Matmul::problem() describes it to eval_gpu (dims, dtype
codes, epilogue op codes and operand kinds); the runner then takes the production host path
(csrc/metal/w4a16_dispatch.h) to pick the kernel, grid and bindings.
"""

import os
import shutil
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np

# fp4::OperandDtype, OperandKind and EpilogueCode (csrc/shared/epilogue.h).
F32, F16, BF16 = 0, 1, 2
NP_DTYPE = {F32: np.float32, F16: np.float16, BF16: ml_dtypes.bfloat16}
DTYPE_NAME = {F32: "f32", F16: "f16", BF16: "bf16"}
SCALAR, COL, ROW, FULL = 0, 1, 2, 3
CODES = {"add": 0, "mul": 1, "scale": 2, "relu": 3, "silu": 4, "gelu": 5, "gelu_approx": 6,
         "sigmoid": 7, "tanh": 8, "clamp": 9}


class SimFailure(AssertionError):
    """The runner stopped: a metal_sim check fired (stderr says which)."""

    def __init__(self, returncode, stderr):
        super().__init__(f"metal_sim runner exited with {returncode}:\n{stderr}")
        self.returncode = returncode
        self.stderr = stderr


def symbolize(runner, stderr):
    """Append file:line of the faulting pc (printed as a module offset) when a symbolizer exists."""
    sym = shutil.which("llvm-symbolizer-19") or shutil.which("llvm-symbolizer")
    if sym is None or "module offset" not in stderr:
        return stderr
    import re

    m = re.search(r"module offset (0x[0-9a-f]+)", stderr)
    r = subprocess.run([sym, f"--obj={runner}", m.group(1)], capture_output=True, text=True)
    return stderr + "  at " + " / ".join(r.stdout.split()) + "\n"


def run_case(runner, case_dir, *, m, n, k, x, w_packed, scales, x_dtype, out_dtype,
             global_scale=None, epilogue=(), force="auto", guard="end", workers=2, timeout=300,
             schedule="forward", mode=0):
    """x: float array [m, k] already representable in x_dtype; w_packed uint8 [n, row_bytes];
    scales uint8 [n, ceil(k/16)] (mode 1, MXFP4: E8M0 [n, ceil(k/32)]); epilogue: list of (name, operand array or float or None,
    p1) with operand kinds inferred from the shape. Returns (out float64 [m, n], plan dict)."""
    d = Path(case_dir)
    d.mkdir(parents=True, exist_ok=True)
    spec = [f"m {m}", f"n {n}", f"k {k}", f"w_row_bytes {w_packed.shape[1]}",
            f"scale_row_bytes {scales.shape[1]}", f"x_dtype {x_dtype}", f"out_dtype {out_dtype}",
            f"has_gs {0 if global_scale is None else 1}", f"force {force}", f"guard {guard}",
            f"workers {workers}", f"mode {mode}"]
    np.ascontiguousarray(np.asarray(x).astype(NP_DTYPE[x_dtype])).tofile(d / "x.bin")
    np.ascontiguousarray(w_packed, dtype=np.uint8).tofile(d / "w.bin")
    np.ascontiguousarray(scales, dtype=np.uint8).tofile(d / "scales.bin")
    if global_scale is not None:
        np.asarray([global_scale], dtype=np.float32).tofile(d / "gs.bin")
    nops = 0
    for op in epilogue:
        name, arg, p1 = op
        code = CODES[name]
        if isinstance(arg, np.ndarray):
            kind = {0: SCALAR}.get(arg.ndim)
            if arg.ndim == 1:
                kind = COL
            elif arg.ndim == 2:
                kind = ROW if arg.shape[1] == 1 and n != 1 else FULL
            dt = {np.dtype(np.float32): F32, np.dtype(np.float16): F16,
                  np.dtype(ml_dtypes.bfloat16): BF16}[arg.dtype]
            np.ascontiguousarray(arg).tofile(d / f"operand{nops}.bin")
            spec.append(f"op {code} {nops} 0 0")
            spec.append(f"operand {kind} {dt}")
            nops += 1
        else:
            p0 = 0.0 if arg is None else float(arg)
            spec.append(f"op {code} -1 {p0!r} {float(p1 or 0.0)!r}")
    (d / "spec.txt").write_text("\n".join(spec) + "\n")
    env = dict(os.environ, MSIM_SCHEDULE=schedule)
    r = subprocess.run([str(runner), "run", str(d)], capture_output=True, text=True,
                       timeout=timeout, env=env)
    if r.returncode != 0:
        raise SimFailure(r.returncode, symbolize(runner, r.stderr))
    out = np.fromfile(d / "out.bin", dtype=NP_DTYPE[out_dtype]).astype(np.float64)
    plan = {}
    plan_path = d / "plan.txt"
    if plan_path.exists():
        for line in plan_path.read_text().splitlines():
            key, *vals = line.split()
            plan[key] = vals
    return out.reshape(m, n), plan


def run_plan(runner, m, n, k, x_dtype=BF16, out_dtype=BF16, force="auto"):
    r = subprocess.run([str(runner), "plan", str(m), str(n), str(k), str(x_dtype), str(out_dtype),
                        force], capture_output=True, text=True)
    if r.returncode != 0:
        raise SimFailure(r.returncode, r.stderr)
    plan = {}
    for line in r.stdout.splitlines():
        key, *vals = line.split()
        plan[key] = vals
    return plan
