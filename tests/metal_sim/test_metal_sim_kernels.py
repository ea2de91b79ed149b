"""The Metal kernels (csrc/metal/w4a16_matmul.metal) executed on the CPU by metal_sim, launched by
the production host code (csrc/metal/w4a16_dispatch.h), against the float64 reference
(tests/reference.py) within the tolerance table (tests/common.py).

Grid: every kernel x config (GEMV; GEMM BM/BK in {128/64, 64/32} x staged scales on/off) x out
dtype x epilogue chain on ragged shapes (M, N, K not tile multiples, odd K, K < 16, K = 1), every
x dtype, aligned (vector loads) and unaligned (scalar loads) buffers, padded weight rows with
garbage padding nibbles, special values (NaN scales, Inf activations, subnormal scales), and the
automatic kernel choice around its thresholds. Buffers end at a guard page: any read past the end
fails the test, and unwritten outputs read back as NaN.
"""

import numpy as np
import pytest

import simcase as sc
from simcheck import ALL_CONFIGS, DTYPES, EPILOGUES, GEMM_CONFIGS, check

# ---------------------------------------------------------------------------------------------
# Every kernel x config on ragged shapes.

GEMM_SHAPES = [
    # (M, N, K, guard): ragged in every dim, odd K, K % BK != 0, K < 16, K = 1
    (70, 65, 37, "end"),
    (5, 9, 7, "end"),
    (9, 17, 1, "end"),
    (133, 130, 200, "end"),
    (31, 64, 15, "start"),
    # tile multiples with aligned buffers: vector loads, unchecked decode, staged scales
    (64, 64, 64, "aligned"),
    (150, 128, 256, "aligned"),
    (129, 70, 96, "aligned"),
]


@pytest.mark.parametrize("force", GEMM_CONFIGS)
@pytest.mark.parametrize("m,n,k,guard", GEMM_SHAPES, ids=lambda v: str(v))
def test_gemm_shapes(sim_runner, tmp_path, force, m, n, k, guard):
    plan = check(sim_runner, tmp_path, m, n, k, force=force, guard=guard)
    bm = {"gemm64": "64", "gemm64s": "64", "gemm128": "128", "gemm128s": "128"}[force]
    assert f"_bm{bm}_" in plan["kernel"][0]
    if guard == "aligned":
        flags = int(plan["flags"][0])
        assert flags & (2 | 8 | 16) == 2 | 8 | 16  # x vec2, w vec8, out vec2
        scale_word = -(-k // 16) % (int(bm) // 32) == 0  # BK / 16 scale bytes per row word
        assert bool(flags & 32) == scale_word


GEMV_SHAPES = [
    (1, 1, 1, "end"),
    (1, 70, 37, "end"),
    (2, 9, 7, "end"),
    (3, 33, 16, "aligned"),
    (4, 41, 600, "aligned"),
    (4, 17, 999, "start"),
    (1, 100, 1024, "aligned"),
    (5, 19, 15, "end"),
    (8, 40, 513, "aligned"),
    (11, 37, 64, "start"),
    (16, 70, 256, "aligned"),
    (13, 66, 1000, "end"),
]


@pytest.mark.parametrize("m,n,k,guard", GEMV_SHAPES, ids=lambda v: str(v))
def test_gemv_shapes(sim_runner, tmp_path, m, n, k, guard):
    plan = check(sim_runner, tmp_path, m, n, k, force="gemv", guard=guard)
    assert "_gemv_" in plan["kernel"][0]
    aligned = guard != "end" and k % 16 == 0  # "start" and "aligned" are 16-byte aligned
    assert plan["pipeline"][0].endswith("_fc0t" if aligned else "_fc0f")


# Every GEMV tile height MT on one problem (M rows split over ceil(M / MT) threadgroup rows).
@pytest.mark.parametrize("force", ["gemv1", "gemv2", "gemv4", "gemv8", "gemv16"])
@pytest.mark.parametrize("guard", ["end", "aligned"])
def test_gemv_tile_heights(sim_runner, tmp_path, force, guard):
    plan = check(sim_runner, tmp_path, 7, 45, 160, force=force, guard=guard, epilogue="bias_silu")
    assert f"_gemv_mt{force[4:]}_" in plan["kernel"][0]


# Split-K (forced partition counts): every GEMM config, uneven partitions, the K tail in the last
# partition, the epilogue applied once by the reduction.
SPLIT_CASES = [
    ("gemm64k3", 70, 65, 300, "end", "gate_gelu_clamp_gs"),
    ("gemm64sk2", 40, 130, 256, "aligned", "four_operands"),
    ("gemm128k2", 150, 130, 200, "end", "bias_silu"),
    ("gemm128sk4", 129, 128, 1024, "aligned", "relu_float_tanh_gs"),
    ("gemm64k16", 9, 70, 513, "start", "none"),
]


@pytest.mark.parametrize("force,m,n,k,guard,epilogue", SPLIT_CASES, ids=lambda v: str(v))
def test_split_k(sim_runner, tmp_path, force, m, n, k, guard, epilogue):
    plan = check(sim_runner, tmp_path, m, n, k, force=force, guard=guard, epilogue=epilogue,
                 out_dtype=sc.BF16)
    strips = -(-k // (64 if "128" in force else 32))
    want = int(force.rsplit("k", 1)[1])
    per = -(-strips // want)
    assert plan["split"] == [str(-(-strips // per)), str(per)]


@pytest.mark.parametrize("m,n,split", [(17, 4096, 4), (24, 4096, 4), (32, 4096, 4), (64, 4096, 2),
                                       (128, 4096, 1), (17, 14336, 2), (256, 4096, 1)])
def test_split_k_chosen_for_small_grids(sim_runner, m, n, split):
    # ceil(N / 64) tiles x split <= 512 threadgroups, split x M <= 128, K = 4096: 128 strips
    plan = sc.run_plan(sim_runner, m, n, 4096)
    assert plan["split"][0] == str(split)
    bm = 64 if m < 256 else 128
    tiles = 1 << ((-(-m // bm) - 1).bit_length() + (-(-n // 64) - 1).bit_length())
    assert plan["grid"] == [str(tiles * split)]


# Every config x out dtype x epilogue chain, on a ragged shape.
@pytest.mark.parametrize("epilogue", EPILOGUES)
@pytest.mark.parametrize("out_dtype", DTYPES, ids=lambda d: sc.DTYPE_NAME[d])
@pytest.mark.parametrize("force", ALL_CONFIGS)
def test_out_dtype_epilogue(sim_runner, tmp_path, force, out_dtype, epilogue):
    m, n, k = (3, 37, 45) if force == "gemv" else (70, 67, 45)
    check(sim_runner, tmp_path, m, n, k, force=force, out_dtype=out_dtype, epilogue=epilogue,
          x_dtype=sc.F16 if out_dtype == sc.BF16 else sc.BF16)


# Every x dtype (the kernels are specialized on it), aligned and unaligned.
@pytest.mark.parametrize("guard", ["end", "aligned"])
@pytest.mark.parametrize("x_dtype", DTYPES, ids=lambda d: sc.DTYPE_NAME[d])
@pytest.mark.parametrize("force", ALL_CONFIGS)
def test_x_dtypes(sim_runner, tmp_path, force, x_dtype, guard):
    m = 4 if force == "gemv" else 77
    n, k = (66, 96) if guard == "aligned" else (66, 43)
    check(sim_runner, tmp_path, m, n, k, force=force, x_dtype=x_dtype, out_dtype=x_dtype,
          guard=guard, epilogue="bias_silu")


# The other thread schedule (highest runnable thread first): races show differently.
@pytest.mark.parametrize("force", ALL_CONFIGS)
def test_reverse_schedule(sim_runner, tmp_path, force):
    m = 3 if force == "gemv" else 140
    check(sim_runner, tmp_path, m, 130, 200, force=force, epilogue="four_operands",
          schedule="reverse")
    check(sim_runner, tmp_path, m, 128, 256, force=force, guard="aligned", schedule="reverse")


# Weight rows longer than ceil(K/2) (MLX's uint32 layout) with garbage padding nibbles.
@pytest.mark.parametrize("force", ALL_CONFIGS)
@pytest.mark.parametrize("k", [13, 37, 64])
def test_padded_rows_garbage(sim_runner, tmp_path, force, k):
    m = 2 if force == "gemv" else 40
    row_bytes = 4 * (-(-k // 8)) + 8  # wider than the uint32 layout too
    check(sim_runner, tmp_path, m, 70, k, force=force, row_bytes=row_bytes,
          garbage_padding=True, guard="aligned" if k == 64 else "end")


# ---------------------------------------------------------------------------------------------
# Special values: NaN scale bytes (0x7F), Inf activations, subnormal E4M3 scales, all codes.


def plant_specials(x, packed, scales):
    n, blocks = scales.shape
    scales[0, 0] = 0x7F  # NaN: row 0 of the output is NaN where block 0 contributes
    scales[min(1, n - 1), :] = np.arange(blocks) % 8  # E4M3 subnormals and zero
    scales[min(2, n - 1), -1] = 0xFF  # -NaN in the K-tail block
    x[-1, 0] = np.inf


@pytest.mark.parametrize("force", ALL_CONFIGS)
@pytest.mark.parametrize("k", [35, 64])
def test_special_values(sim_runner, tmp_path, force, k):
    m = 3 if force == "gemv" else 66
    check(sim_runner, tmp_path, m, 67, k, force=force, mutate=plant_specials,
          guard="aligned" if k == 64 else "end")


# ---------------------------------------------------------------------------------------------
# The automatic kernel choice around its thresholds (docs/metal.md), end to end.


@pytest.mark.parametrize("m", [1, 4, 5, 16, 17, 255, 256, 300])
def test_auto_dispatch_runs(sim_runner, tmp_path, m):
    check(sim_runner, tmp_path, m, 70, 40, force="auto", epilogue="bias_silu")


# The GEMM skips the fragment rows of a simdgroup past M (ARows::live): M ending inside every
# fragment row of the 64- and 128-row tiles, a simdgroup with no row (M = 9 on BM = 64), the
# K tail (the checked strip) and split-K.
@pytest.mark.parametrize("force", GEMM_CONFIGS + ["gemm64k3"])
@pytest.mark.parametrize("m", [1, 9, 17, 24, 33, 57, 65, 100])
def test_gemm_rows_past_m(sim_runner, tmp_path, force, m):
    check(sim_runner, tmp_path, m, 70, 100, force=force, guard="aligned")


# ---------------------------------------------------------------------------------------------
# Exactness of the bit-built decode: all 16 E2M1 codes x all 256 E4M3 scale bytes.


@pytest.mark.parametrize("force", ["gemv16"] + GEMM_CONFIGS)
@pytest.mark.parametrize("guard", ["end", "aligned"])
def test_all_code_scale_pairs_exact(sim_runner, tmp_path, force, guard):
    """x = the 16 x 16 identity, weight row n = codes 0..15 with scale byte n: out[m, n] is the
    decoded weight e2m1(m) * e4m3(n) itself, which must equal ml_dtypes' decode exactly (NaN for
    the NaN scale bytes 0x7F and 0xFF)."""
    import reference as ref

    k, n = 16, 256
    x = np.eye(k)
    codes = np.tile(np.arange(16, dtype=np.uint8), (n, 1))
    packed = ref.pack_nibbles(codes)
    scales = np.arange(n, dtype=np.uint8).reshape(n, 1)
    out, plan = sc.run_case(sim_runner, tmp_path / "case", m=k, n=n, k=k, x=x, w_packed=packed,
                            scales=scales, x_dtype=sc.F32, out_dtype=sc.F32, force=force,
                            guard=guard)
    want = ref.decode_weights(packed, scales, k).T  # [k, n]: code m of row n
    assert np.array_equal(out, want, equal_nan=True), plan["kernel"]
