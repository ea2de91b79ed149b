"""The Metal GEMV with MXFP4 scales (E8M0, one per 32 columns; kMetalFlagMxfp4), executed on the
CPU by metal_sim and launched by the production host code, against the float64 reference
(tests/reference.py, ml_dtypes float8_e8m0fnu) within the tolerance table: ragged K (tails inside
a 32-column block), every tile height, both alignments, the extreme scale codes (0xFE: 2^127 with
the bit-built offset applied first, no overflow; 0xFF: NaN), and the automatic choice (MXFP4
always takes the GEMV; M > 16 is left to the op's MLX route)."""

import numpy as np
import pytest

import common
import reference as ref
import simcase as sc

MXFP4 = 1  # fp4::kModeMxfp4


def run(runner, tmp_path, m, n, k, *, x_dtype=sc.BF16, out_dtype=sc.F32, force="auto", guard="end",
        scale_codes=(121, 131), seed=0, mutate=None):
    g = np.random.default_rng([m, n, k, seed])
    x = g.standard_normal((m, k)).astype(np.float32)
    x = x.astype(sc.NP_DTYPE[x_dtype]).astype(np.float32)
    codes = g.integers(0, 16, size=(n, k), dtype=np.uint8)
    packed = ref.pack_nibbles(codes)
    scales = g.integers(*scale_codes, size=(n, -(-k // ref.MX_BLOCK)), dtype=np.uint8)
    if mutate is not None:
        mutate(x, packed, scales)
    out, plan = sc.run_case(runner, tmp_path / "case", m=m, n=n, k=k, x=x, w_packed=packed, scales=scales,
                            x_dtype=x_dtype, out_dtype=out_dtype, force=force, guard=guard, mode=MXFP4)
    _, acc, mag = ref.w4a16_matmul_with_magnitude(x, packed, scales, k, mode="mxfp4")
    tol = common.TOLERANCES[(sc_mx(x_dtype), sc_mx(out_dtype))]
    y, bound = common.error_bound(acc, mag, k, tol)
    common.assert_close(out, y, bound, what=f"{plan.get('kernel')} mxfp4 m={m} n={n} k={k}")
    return plan


def sc_mx(dtype):
    import mlx.core as mx

    return {sc.BF16: mx.bfloat16, sc.F16: mx.float16, sc.F32: mx.float32}[dtype]


@pytest.mark.parametrize("m,n,k,guard", [
    (1, 1, 1, "end"), (1, 70, 37, "end"), (2, 9, 31, "end"), (3, 33, 32, "aligned"), (4, 41, 600, "aligned"),
    (5, 17, 999, "start"), (8, 40, 513, "aligned"), (11, 37, 48, "start"), (16, 70, 256, "aligned"),
], ids=str)
def test_gemv_mxfp4_shapes(sim_runner, tmp_path, m, n, k, guard):
    plan = run(sim_runner, tmp_path, m, n, k, guard=guard)
    assert "_gemv_" in plan["kernel"][0]
    assert int(plan["flags"][0]) & 64  # kMetalFlagMxfp4


@pytest.mark.parametrize("x_dtype,out_dtype", [(sc.F16, sc.BF16), (sc.F32, sc.F16), (sc.BF16, sc.BF16)])
def test_gemv_mxfp4_dtypes(sim_runner, tmp_path, x_dtype, out_dtype):
    run(sim_runner, tmp_path, 3, 29, 200, x_dtype=x_dtype, out_dtype=out_dtype)


def test_gemv_mxfp4_extreme_and_nan_scales(sim_runner, tmp_path):
    """2^127 scales on tiny activations stay finite (the 2^14 offset is applied to the partial
    sum, not to the scale); a 0xFF scale poisons exactly its row."""
    def mutate(x, packed, scales):
        scales[:] = 0xFE
        scales[3, 1] = 0xFF
        x *= np.float32(2.0**-110)

    run(sim_runner, tmp_path, 2, 9, 96, x_dtype=sc.F32, mutate=mutate)
