"""Property-based tests (hypothesis): random problems against the float64 reference.

Each example draws M (0-300, split over 0-2 batch dims), N (1-300), K (1-600), the x dtype, the
output dtype, the weight layout (uint8 / MLX uint32, garbage padding nibbles), the scale codes
(moderate normals, or every finite E4M3 code incl. subnormals, zero and negatives), a global
scale (none / Python float / fp32 array), an epilogue chain of 0-5 ops with operands of every
broadcast kind and dtype, and x laid out contiguous, strided or transposed. Every device the
`device` fixture yields (cpu; gpu where MLX has one) must agree with tests/reference.py within
the tolerance table of tests/common.py.

Profiles:
  * default (CI): derandomized (a fixed seed), MLX_FP4_HYPOTHESIS_CI_EXAMPLES examples per device
    (default 1000: about 6 s on 2 cores);
  * MLX_FP4_HYPOTHESIS_EXAMPLES=10000: that many examples per device, random seed
    (reproduce a failure with the printed `--hypothesis-seed` / @reproduce_failure blob).
  * MLX_FP4_HYPOTHESIS_REPORT=path.json: write {device: examples run} at the end of the module.
"""

import json
import os
import time

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st

import mlx_fp4 as mx_fp4
import reference as ref
from common import (
    DEFAULT_SCALE_CODES,
    DTYPES,
    SAFETY,
    TOLERANCES,
    assert_close,
    error_bound,
    rand_weights,
    rand_x,
    rng,
)

_BIG = int(os.environ.get("MLX_FP4_HYPOTHESIS_EXAMPLES", "0"))
_CI = int(os.environ.get("MLX_FP4_HYPOTHESIS_CI_EXAMPLES", "1000"))

_SETTINGS = settings(
    max_examples=_BIG or _CI,
    derandomize=not _BIG,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,  # `device` only sets MLX's default device
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
    ],
)

# Every finite E4M3 code: zero, subnormals (0x01-0x07), normals up to 448, and the negatives.
FINITE_SCALE_CODES = np.array([c for c in range(256) if c & 0x7F != 0x7F], dtype=np.uint8)
# Subnormal and tiny normal scales only (2^-9 .. 2^-5).
TINY_SCALE_CODES = np.arange(0x01, 0x10, dtype=np.uint8)

ACTIVATIONS = ["relu", "silu", "gelu", "gelu_approx", "sigmoid", "tanh"]
FP16_MAX = 65504.0

_COUNTS = {}
_T0 = time.perf_counter()


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    path = os.environ.get("MLX_FP4_HYPOTHESIS_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(
                {"examples_per_device": _COUNTS, "wall_s": round(time.perf_counter() - _T0, 1)},
                f,
                indent=1,
            )


# ----------------------------------------------------------------------------------------------
# Strategies


@st.composite
def problems(draw):
    """A problem description (plain Python values; arrays are built from `seed`)."""
    nbatch = draw(st.integers(0, 2))
    batch = tuple(draw(st.lists(st.integers(1, 3), min_size=nbatch, max_size=nbatch)))
    rows_cap = 300 // int(np.prod(batch, dtype=np.int64))
    m = draw(st.one_of(st.integers(0, min(16, rows_cap)), st.integers(0, rows_cap)))
    if batch and draw(st.integers(0, 15)) == 0:
        batch = batch[:-1] + (0,)  # an empty batch dim
    n = draw(st.one_of(st.integers(1, 40), st.integers(1, 300)))
    k = draw(st.one_of(st.integers(1, 64), st.integers(1, 600)))
    p = dict(
        seed=draw(st.integers(0, 2**32 - 1)),
        batch=batch,
        m=m,
        n=n,
        k=k,
        x_dtype=draw(st.sampled_from(DTYPES)),
        out_dtype=draw(st.sampled_from([None] + DTYPES)),
        layout=draw(st.sampled_from(["uint8", "uint32"])),
        garbage=draw(st.booleans()),
        scales=draw(st.sampled_from(["default", "default", "finite", "tiny"])),
        x_scale=draw(st.sampled_from([1.0, 1.0, 2.0**-6, 2.0**-12, 37.0])),
        x_layout=draw(st.sampled_from(["contiguous"] * 4 + ["strided", "transposed"])),
    )
    p["gs"] = draw(
        st.one_of(
            st.none(),
            st.tuples(
                st.sampled_from(["float", "array", "array1"]),
                st.one_of(
                    st.floats(1e-4, 1e3, allow_nan=False, allow_infinity=False),
                    st.floats(-10.0, -1e-3),
                    st.sampled_from([1.0, 1.0 / 2688, 0.0]),
                ),
            ),
        )
    )
    ops = []
    operands = 0
    for _ in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(["add", "mul", "scale", "act", "act", "clamp"]))
        if kind in ("add", "mul"):
            opnd = draw(st.sampled_from(["float", "scalar", "col", "col2", "row", "full"]))
            if opnd != "float":
                if operands == 4:
                    opnd = "float"
                else:
                    operands += 1
            dt = draw(st.sampled_from(["f32", "f16", "bf16"]))
            ops.append((kind, opnd, dt))
        elif kind == "scale":
            ops.append(("scale", draw(st.floats(-4.0, 4.0, allow_nan=False))))
        elif kind == "clamp":
            lo = draw(st.floats(-50.0, 10.0, allow_nan=False))
            hi = lo + draw(st.floats(0.0, 60.0, allow_nan=False))
            ops.append(("clamp", lo, hi))
        else:
            ops.append((draw(st.sampled_from(ACTIVATIONS)),))
    p["ops"] = ops
    return p


_NP_DT = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}


def build(p):
    """Arrays for a drawn problem: (x, w, scales, packed, scale bytes, gs arg, gs f32, epilogue)."""
    g = rng("properties", p["seed"])
    lead = (*p["batch"], p["m"])
    k, n = p["k"], p["n"]
    if p["x_layout"] == "transposed" and len(lead) == 1:
        x = rand_x((k, lead[0]), p["x_dtype"], g, p["x_scale"]).T
    elif p["x_layout"] == "strided":
        x = rand_x((*lead, 2 * k + 1), p["x_dtype"], g, p["x_scale"])[..., 1::2]
    else:
        x = rand_x((*lead, k), p["x_dtype"], g, p["x_scale"])
    codes = {
        "default": DEFAULT_SCALE_CODES,
        "finite": FINITE_SCALE_CODES,
        "tiny": TINY_SCALE_CODES,
    }[p["scales"]]
    w, scales, packed = rand_weights(n, k, g, layout=p["layout"], garbage_padding=p["garbage"],
                                     scale_codes=codes)
    gs_arg = gs32 = None
    if p["gs"] is not None:
        how, v = p["gs"]
        gs32 = np.float32(v)
        gs_arg = {"float": v, "array": mx.array(v, dtype=mx.float32),
                  "array1": mx.array([v], dtype=mx.float32)}[how]
    out_shape = (*lead, n)
    epi = []
    for op in p["ops"]:
        if op[0] in ("add", "mul"):
            name, kind, dt = op
            mag = 4.0 if name == "add" else 1.0
            if kind == "float":
                epi.append((name, float(np.float32(g.standard_normal() * mag))))
                continue
            shape = {"scalar": (), "col": (n,), "col2": (1, n), "row": (*lead, 1),
                     "full": out_shape}[kind]
            epi.append((name, rand_x(shape, _NP_DT[dt], g, mag)))
        elif op[0] in ("scale", "clamp"):
            epi.append(op)
        else:
            epi.append(op[0])
    return x, w, scales, packed, gs_arg, gs32, epi


# Half the spacing of the output dtype's subnormals: the absolute rounding error of a cast that
# lands below the smallest normal (the table's relative out_u * |y| misses it; e.g. fp16 output
# -2.6554e-05 is a tie between two fp16 subnormals 2^-24 apart). Requested for common.py.
SUBNORMAL_HALF_SPACING = {mx.float16: 2.0**-25, mx.bfloat16: 2.0**-134, mx.float32: 2.0**-150}


def check(out, x, packed, scales, k, gs32, epi, out_dtype):
    """common.check_matmul plus the output dtype's subnormal rounding floor."""
    assert out.dtype == out_dtype
    gs32 = None if gs32 is None else ref.multiplier(gs32)  # the op takes MLX's amax
    _, acc, mag = ref.w4a16_matmul_with_magnitude(x, packed, scales, k, gs32)
    y, bound = error_bound(acc, mag, k, TOLERANCES[(x.dtype, out_dtype)], epi, gs32)
    bound = bound + SAFETY * SUBNORMAL_HALF_SPACING[out_dtype]
    assert_close(out, y, bound, what=f"w4a16_matmul x={x.dtype} out={out_dtype}")


# ----------------------------------------------------------------------------------------------


@_SETTINGS
@given(p=problems())
def test_random_problems_match_reference(device, p):
    x, w, scales, packed, gs_arg, gs32, epi = build(p)
    note(f"x {x.shape} {x.dtype}, w {w.shape} {w.dtype}, epilogue {[o if isinstance(o, str) else (o[0],) + tuple(getattr(a, 'shape', a) for a in o[1:]) for o in epi]}")
    out_dtype = p["out_dtype"] or p["x_dtype"]
    if out_dtype == mx.float16:
        # Outputs beyond fp16's range become inf (tested in test_adversarial.py); keep clear of it.
        m = None if gs32 is None else ref.multiplier(gs32)
        y = ref.w4a16_matmul(x, packed, scales, p["k"], m, epi)
        assume(not np.any(np.abs(y) > FP16_MAX / 2))
    out = mx_fp4.w4a16_matmul(
        x, w, scales, global_scale=gs_arg, epilogue=epi or None, out_dtype=p["out_dtype"]
    )
    mx.eval(out)
    assert out.shape == (*p["batch"], p["m"], p["n"])
    check(out, x, packed, scales, p["k"], gs32, epi, out_dtype)
    name = str(device).split(".")[-1]
    _COUNTS[name] = _COUNTS.get(name, 0) + 1
