"""The Metal kernels with MXFP4 scales (E8M0, one per 32 columns; kMetalFlagMxfp4, the GEMM's
fc_gemm_mxfp4 function constant), executed on the CPU by metal_sim and launched by the production
host code, against the float64 reference (tests/reference.py, ml_dtypes float8_e8m0fnu) within
the tolerance table: the GEMV and every GEMM config on ragged shapes (K % 32 != 0 tails, a strip of
64 holding 1.5 blocks, scale rows that are no whole word), split-K with the tail in the last
partition, every x and out dtype with epilogue chains, the other thread schedule, extreme scale
codes and 0xFF (NaN), every E2M1 code x E8M0 code exactly, and the automatic choice (the same
table as NVFP4)."""

import numpy as np
import pytest

import reference as ref
import simcase as sc
from simcheck import ALL_CONFIGS, DTYPES, GEMM_CONFIGS, check
from test_metal_sim_kernels import SPLIT_CASES as NV_SPLIT_CASES

MXFP4_FLAG, SCALE_WORD_FLAG = 64, 32  # kMetalFlagMxfp4, kMetalFlagScaleWord
BK = {"gemm64": 32, "gemm64s": 32, "gemm128": 64, "gemm128s": 64}
# Chains without a global scale (MXFP4 has none).
MX_EPILOGUES = ["none", "bias_silu", "scale_row_gelu_approx_scalar_sigmoid", "four_operands"]


def mx_check(runner, tmp_path, m, n, k, **kw):
    plan = check(runner, tmp_path, m, n, k, mode="mxfp4", **kw)
    assert int(plan["flags"][0]) & MXFP4_FLAG
    if "_gemm_" in plan["kernel"][0]:
        assert plan["pipeline"][0].endswith("_fc5t"), plan["pipeline"]  # kMetalFcGemmMxfp4
    return plan


@pytest.mark.parametrize("m,n,k,guard", [
    (1, 1, 1, "end"), (1, 70, 37, "end"), (2, 9, 31, "end"), (3, 33, 32, "aligned"), (4, 41, 600, "aligned"),
    (5, 17, 999, "start"), (8, 40, 513, "aligned"), (11, 37, 48, "start"), (16, 70, 256, "aligned"),
], ids=str)
def test_gemv_mxfp4_shapes(sim_runner, tmp_path, m, n, k, guard):
    plan = mx_check(sim_runner, tmp_path, m, n, k, guard=guard, force="gemv")
    assert "_gemv_" in plan["kernel"][0]


GEMM_SHAPES = [
    (70, 65, 37, "end"),        # K % 32 = 5: the tail inside the first block of the last strip
    (9, 17, 1, "end"),          # K = 1
    (133, 130, 200, "end"),     # K % 64 = 8
    (31, 64, 48, "start"),      # K % 32 = 16: a 64-column strip holds 1.5 blocks
    (64, 64, 64, "aligned"),    # tile multiples: vector loads, unchecked decode, staged words
    (150, 128, 256, "aligned"),
    (129, 70, 96, "aligned"),   # 3 scale bytes per row: no 2-byte word for BK = 64
]


@pytest.mark.parametrize("force", GEMM_CONFIGS)
@pytest.mark.parametrize("m,n,k,guard", GEMM_SHAPES, ids=str)
def test_gemm_mxfp4_shapes(sim_runner, tmp_path, force, m, n, k, guard):
    plan = mx_check(sim_runner, tmp_path, m, n, k, force=force, guard=guard)
    assert f"_bk{BK[force]}_" in plan["kernel"][0]
    if guard == "aligned":
        # the strip's BK / 32 scale bytes of a row form one aligned word
        assert bool(int(plan["flags"][0]) & SCALE_WORD_FLAG) == (-(-k // 32) % (BK[force] // 32) == 0)


# The NVFP4 split-K cases (uneven partitions, the K tail in the last one), their global-scale
# chains swapped for chains without one.
NO_GS = {"gate_gelu_clamp_gs": "scale_row_gelu_approx_scalar_sigmoid", "relu_float_tanh_gs": "bias_silu"}
SPLIT_CASES = [(f, m, n, k, g, NO_GS.get(e, e)) for f, m, n, k, g, e in NV_SPLIT_CASES]


@pytest.mark.parametrize("force,m,n,k,guard,epilogue", SPLIT_CASES, ids=str)
def test_split_k_mxfp4(sim_runner, tmp_path, force, m, n, k, guard, epilogue):
    plan = mx_check(sim_runner, tmp_path, m, n, k, force=force, guard=guard, epilogue=epilogue,
                    out_dtype=sc.BF16)
    assert int(plan["split"][0]) > 1


@pytest.mark.parametrize("epilogue", MX_EPILOGUES)
@pytest.mark.parametrize("force", ALL_CONFIGS)
def test_dtypes_and_chains_mxfp4(sim_runner, tmp_path, force, epilogue):
    """Every x dtype and out dtype over the chains (x, out) rotate with the chain index."""
    i = MX_EPILOGUES.index(epilogue)
    x_dtype, out_dtype = DTYPES[i % 3], DTYPES[(i + 1) % 3]
    m = 3 if force == "gemv" else 70
    mx_check(sim_runner, tmp_path, m, 67, 77, force=force, x_dtype=x_dtype, out_dtype=out_dtype,
             epilogue=epilogue, guard="aligned" if i % 2 else "end")


@pytest.mark.parametrize("force", GEMM_CONFIGS)
def test_reverse_schedule_mxfp4(sim_runner, tmp_path, force):
    mx_check(sim_runner, tmp_path, 140, 130, 200, force=force, schedule="reverse",
             epilogue="four_operands")
    mx_check(sim_runner, tmp_path, 140, 128, 256, force=force, guard="aligned", schedule="reverse")


@pytest.mark.parametrize("m", [1, 8, 9, 16, 17, 255, 256, 300])
def test_auto_dispatch_same_table(sim_runner, tmp_path, m):
    plan = mx_check(sim_runner, tmp_path, m, 70, 72, force="auto", epilogue="bias_silu")
    nv = sc.run_plan(sim_runner, m, 70, 72, sc.BF16, sc.F32)
    assert plan["kernel"] == nv["kernel"]


def extreme_scales(low):
    """Mutates a problem: every block at the edge of fp32 (codes 2..4 with x * 2^100, or
    250..252 with x * 2^-100; decoded weights stay fp32 normals), a NaN (0xFF) scale in row 3's
    K-tail block and in row 5's first block."""
    def mutate(x, packed, scales):
        g = np.random.default_rng(int(low))
        scales[:] = g.integers(2, 5, size=scales.shape) if low else g.integers(250, 253, size=scales.shape)
        scales[3, -1] = 0xFF
        scales[5, 0] = 0xFF
        x *= 2.0**100 if low else 2.0**-100

    return mutate


@pytest.mark.parametrize("low", [True, False], ids=["low", "high"])
@pytest.mark.parametrize("force", ALL_CONFIGS)
def test_extreme_and_nan_scales_mxfp4(sim_runner, tmp_path, force, low):
    m = 3 if force == "gemv" else 66
    mx_check(sim_runner, tmp_path, m, 40, 100, force=force, x_dtype=sc.F32, mutate=extreme_scales(low))


def test_gemv_mxfp4_top_code_on_tiny_activations(sim_runner, tmp_path):
    """The GEMV scales its partial sums, so 2^127 (0xFE) on tiny activations stays finite (the
    GEMMs' weights are fp32: codes <= 252, see test_every_code_scale_pair_exact)."""
    def mutate(x, packed, scales):
        scales[:] = 0xFE
        scales[3, 1] = 0xFF
        x *= np.float32(2.0**-110)

    mx_check(sim_runner, tmp_path, 2, 9, 96, x_dtype=sc.F32, force="gemv", mutate=mutate)


@pytest.mark.parametrize("force", ["gemv16"] + GEMM_CONFIGS)
@pytest.mark.parametrize("guard", ["end", "aligned"])
def test_every_code_scale_pair_exact(sim_runner, tmp_path, force, guard):
    """x = the 32 x 32 identity, weight row n = codes 0..15 twice with E8M0 byte c(n): out[m, n]
    is the decoded weight e2m1(m % 16) * 2^(c - 127) itself, equal to ml_dtypes' decode rounded
    to fp32. Codes 0..252 (every decoded weight an fp32; 0 and 1 give fp32 subnormals, which a
    GPU flushes) and 255 (NaN)."""
    k = 32
    codes_used = np.concatenate([np.arange(253), [255]]).astype(np.uint8)
    n = len(codes_used)
    x = np.eye(k)[:16] if force == "gemv16" else np.eye(k)  # the GEMV takes M <= 16 rows
    packed = ref.pack_nibbles(np.tile(np.arange(k, dtype=np.uint8) % 16, (n, 1)))
    scales = codes_used.reshape(n, 1)
    out, plan = sc.run_case(sim_runner, tmp_path / "case", m=len(x), n=n, k=k, x=x, w_packed=packed,
                            scales=scales, x_dtype=sc.F32, out_dtype=sc.F32, force=force,
                            guard=guard, mode=1)
    want = ref.decode_weights(packed, scales, k, mode="mxfp4").T[: len(x)].astype(np.float32)
    assert np.array_equal(out, want.astype(np.float64), equal_nan=True), plan["kernel"]


@pytest.mark.parametrize("force", ALL_CONFIGS)
def test_padded_rows_garbage_mxfp4(sim_runner, tmp_path, force):
    m = 2 if force == "gemv" else 40
    for k in (45, 64):
        row_bytes = 4 * (-(-k // 8)) + 8
        mx_check(sim_runner, tmp_path / str(k), m, 70, k, force=force, row_bytes=row_bytes,
                 garbage_padding=True, guard="aligned" if k == 64 else "end")

