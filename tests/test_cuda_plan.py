"""The CUDA backend's dispatch table (csrc/cuda/w4a16_plan.h), checked on any machine.

The kernel choice is host arithmetic without CUDA, so CI (no GPU) compiles it into a small driver
(tests/cpp/cuda_plan_main.cpp) and checks the choices docs/cuda.md reports as measured on an H200:
tile configurations, the M crossovers and the conditions of the staged kernel.
"""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    exe = tmp_path_factory.mktemp("cuda_plan") / "cuda_plan"
    subprocess.run([cxx, "-std=c++17", "-O1", "-Wall", "-Werror", "-I", os.path.join(ROOT, "csrc"),
                    os.path.join(ROOT, "tests", "cpp", "cuda_plan_main.cpp"), "-o", str(exe)],
                   check=True, timeout=300)

    def run(*lines):
        out = subprocess.run([str(exe)], input="\n".join(lines) + "\n", capture_output=True, text=True,
                             check=True, timeout=60).stdout.split("\n")
        return [tuple(line.split()) for line in out if line]

    return run


def plan_full(driver, n, k, m, dtype="bf16", vec=1, staged=1, path="-", tc="-", wgmma=0, wg="-", mode="nvfp4"):
    cmd = "plan" if mode == "nvfp4" else f"plan_{mode}"
    (res,) = driver(f"{cmd} {n} {k} {m} {dtype} {vec} {staged} {path} {tc} {wgmma} {wg}")
    kind, mt, rt, kw, st, tile_m, splits, multicast = res
    wg = f"{tile_m}/{splits}" if multicast == "1" else f"{tile_m}/{splits}/{multicast}"
    return kind, f"{mt}/{rt}/{kw}", st == "1", wg


def plan(driver, *args, **kwargs):
    return plan_full(driver, *args, **kwargs)[:3]


# (N, K, M) -> (path, mt/rt/kw): the staged kernel's measured best tiles (kernel_tiles_*_h200.csv).
MEASURED_STAGED = {
    (8192, 8192, 1): ("tc", "1/1/4"),
    (8192, 8192, 8): ("tc", "1/2/4"),
    (8192, 8192, 16): ("tc", "2/2/4"),
    (8192, 8192, 32): ("tc", "4/2/4"),
    (8192, 8192, 64): ("tc", "4/2/2"),
    (14336, 4096, 1): ("tc", "1/1/2"),
    (14336, 4096, 16): ("tc", "2/2/2"),
    (14336, 4096, 32): ("tc", "4/2/2"),
    (4096, 14336, 1): ("tc", "1/1/8"),
    (4096, 14336, 16): ("tc", "2/2/8"),
    (4096, 14336, 32): ("tc", "4/2/8"),
    (4096, 14336, 64): ("tc", "4/2/4"),
    (14336, 4096, 64): ("tc", "4/2/1"),  # one warp per block, still 58 vs 77 us for dequantize + GEMM
}


@pytest.mark.parametrize("shape", sorted(MEASURED_STAGED), ids=lambda s: "{}x{}-M{}".format(*s))
def test_staged_tiles_are_the_measured_ones(driver, shape):
    kind, tiles, staged = plan(driver, *shape)
    assert (kind, tiles) == MEASURED_STAGED[shape] and staged


def test_m_crossovers(driver):
    # Staged kernel up to M = 64, then dequantize + cuBLASLt.
    assert plan(driver, 8192, 8192, 96)[0] == "dequant"
    assert plan(driver, 14336, 4096, 65)[0] == "dequant"
    assert plan(driver, 8192, 8192, 33, "f16")[0] == "tc"
    # Without the staged kernel (K % 128 != 0, unaligned, or disabled): tensor cores up to M = 32.
    assert plan(driver, 8192, 8192, 32, staged=0) == ("tc", "4/2/8", False)
    assert plan(driver, 8192, 8192, 33, staged=0)[0] == "dequant"
    assert plan(driver, 8192, 8192, 1, staged=0) == ("tc", "1/2/8", False)
    assert plan(driver, 8192, 8192, 1, vec=0, staged=1)[2] is False  # staged needs vector loads
    # float32 x: SIMT while M <= 32.
    assert plan(driver, 4096, 4096, 32, "f32")[0] == "simt"
    assert plan(driver, 4096, 4096, 33, "f32")[0] == "dequant"


def test_overrides(driver):
    assert plan(driver, 4096, 4096, 1, path="simt")[0] == "simt"
    assert plan(driver, 4096, 4096, 512, path="tc")[0] == "tc"
    assert plan(driver, 4096, 4096, 1, "f32", path="tc")[0] == "simt"  # no tensor cores for fp32 x
    assert plan(driver, 4096, 4096, 4096, path="dequant")[0] == "dequant"
    assert plan(driver, 4096, 4096, 1, tc="2,1,3")[1] == "2/1/3"
    assert plan(driver, 4096, 4096, 1, tc="9,9,9")[1] == "1/1/8"  # malformed: ignored (automatic tile)
    # Up to 16 warps per block only for the staged kernel with one x tile (its deep variant);
    # other tiles and the register-prefetch kernel are capped at 8, past 16 the override is malformed.
    assert plan(driver, 14336, 4096, 1, tc="1,1,16")[1] == "1/1/16"
    assert plan(driver, 14336, 4096, 1, tc="1,2,16")[1] == "1/2/16"
    assert plan(driver, 14336, 4096, 16, tc="2,1,16")[1] == "2/1/8"
    assert plan(driver, 14336, 4096, 1, tc="1,1,16", staged=0)[1] == "1/1/8"
    assert plan(driver, 14336, 4096, 1, tc="1,1,32")[1] == "1/1/2"  # malformed: the automatic tile


def test_per_shape_tile_override(driver):
    # "mt,rt,kw@NxK" entries, ';'-separated, force one weight shape's tile; the first that applies wins.
    per_shape = "1,1,16@1024x4096;1,2,4@14336x4096"
    assert plan(driver, 1024, 4096, 1, tc=per_shape)[1] == "1/1/16"
    assert plan(driver, 14336, 4096, 1, tc=per_shape)[1] == "1/2/4"
    assert plan(driver, 4096, 4096, 1, tc=per_shape)[1] == plan(driver, 4096, 4096, 1)[1]  # no entry: automatic
    assert plan(driver, 4096, 1024, 1, tc=per_shape)[1] == plan(driver, 4096, 1024, 1)[1]  # N and K both match
    assert plan(driver, 4096, 4096, 1, tc="1,2,4@1024x4096;2,1,3")[1] == "2/1/3"  # an entry for every shape
    assert plan(driver, 1024, 4096, 1, tc="1,1,4;1,1,16@1024x4096")[1] == "1/1/4"  # the first that applies
    # A malformed entry makes the whole override void (the automatic tile), not a partial one.
    for bad in ("1,1,16@1024", "1,1,16@1024x4096;9,9,9", "1,1,99@1024x4096", "1,1,16@x4096;1,1,4"):
        assert plan(driver, 1024, 4096, 1, tc=bad)[1] == plan(driver, 1024, 4096, 1)[1], bad


def test_load_conditions(driver):
    aligned = "4096 4096 512 1024 2048 4096"  # K, row bytes, scale row bytes, x, w, scales addresses
    assert driver(f"loads {aligned}")[0][:2] == ("1", "1")
    assert driver("loads 4104 2052 257 1024 2048 4096")[0][:2] == ("0", "0")  # K % 8 != 0
    assert driver("loads 4160 2080 260 1024 2048 4096")[0][:2] == ("1", "0")  # K % 128 != 0
    assert driver("loads 4096 2048 256 1032 2048 4096")[0][:2] == ("0", "0")  # x not 16-byte aligned
    # Scales: one copy per row and stage, 16 bytes when K % 256 == 0 (two steps), else 8 bytes.
    assert driver("loads 4096 2048 256 1024 2048 4104")[0][:2] == ("1", "0")  # scales not 16-byte aligned
    assert driver("loads 4224 2112 264 1024 2048 4104")[0][:2] == ("1", "1")  # K % 256 != 0: 8 bytes suffice
    assert driver("loads 4224 2112 264 1024 2048 4100")[0][:2] == ("1", "0")  # ... but not 4
    assert driver("loads 4096 2064 256 1024 2048 4096")[0][:2] == ("1", "1")  # padded rows are fine


# The wgmma kernel (sm_90a): automatic for 17 <= M <= 512 where its TMA copies apply (16-bit x,
# NVFP4, rows in 16-byte units), measured on an H200 (kernel harness, benchmarks/notes/wgmma.md): at M = 32 it
# beat the staged kernel on 8192^2 (22.2 vs 32.8 us, harness_staged_epilogue_f3.txt); with the
# 128-row tile's 128-K stages (stop 30, harness_k128_h2) it beat dequantize + cuBLASLt up to M = 512
# on all three shapes (M = 512: 107.6 vs 126.0 us on 8192^2, 115.5 vs 122.5 on 14336 x 4096).
@pytest.mark.parametrize("m", [1, 16, 17, 32, 64, 96, 128, 192, 256, 257, 512, 513, 8192])
@pytest.mark.parametrize("shape", [(8192, 8192), (14336, 4096), (4096, 14336)], ids=lambda s: "{}x{}".format(*s))
def test_wgmma_crossovers(driver, shape, m):
    auto = plan_full(driver, *shape, m, wgmma=1)[0]
    assert (auto == "wgmma") == (17 <= m <= 512)
    assert plan_full(driver, *shape, m, wgmma=0)[0] != "wgmma"  # loads not ok or not built: never
    assert plan_full(driver, *shape, m, wgmma=1, path="wgmma")[0] == "wgmma"
    assert plan_full(driver, *shape, m, wgmma=1, path="dequant")[0] == "dequant"  # opt-out
    assert plan_full(driver, *shape, m, wgmma=1, path="tc")[0] == "tc"


@pytest.mark.parametrize("m", [17, 32, 64, 65, 96, 256, 512])
def test_small_weights_keep_the_staged_kernel(driver, m):
    """1024 x 4096 (Llama-3-8B's k/v), per product through MLX (planab_s34): the staged kernel up to
    M = 64 (4.9 / 8.5 us vs wgmma 11.8 / 8.8), then wgmma (11.0-23.3 vs dequantize + cuBLASLt's
    21.0-29.4); larger weights take wgmma from M = 17."""
    assert plan_full(driver, 1024, 4096, m, wgmma=1)[0] == ("tc" if m <= 64 else "wgmma")
    assert plan_full(driver, 1024, 4096, m, wgmma=1, path="wgmma")[0] == "wgmma"  # forcing still works
    assert plan_full(driver, 1025, 4096, m, wgmma=1)[0] == "wgmma"


def test_wgmma_needs_its_conditions(driver):
    assert plan_full(driver, 8192, 8192, 64, wgmma=0, path="wgmma")[0] == "tc"  # loads not ok: automatic
    assert plan_full(driver, 8192, 8192, 64, wgmma=1, path="wgmma", mode="mxfp4")[0] == "tc"  # E8M0 scales
    assert plan_full(driver, 8192, 8192, 64, wgmma=1, mode="mxfp4")[0] == "tc"
    assert plan_full(driver, 8192, 8192, 64, "f32", wgmma=1, path="wgmma")[0] == "dequant"  # fp32 x
    assert plan_full(driver, 8192, 8192, 64, "f32", wgmma=1)[0] == "dequant"
    assert plan_full(driver, 8192, 8192, 64, "f16", wgmma=1)[0] == "wgmma"


# (N, K, M) -> tile_m/splits: the best of the H200 sweep (kernel us of the plan's pick; the
# runner-up in brackets; benchmarks/results/cuda/wgmma/harness_k128_h2.txt, best of 2 runs: tiles
# up to 96 rows with stages of 256, the 128-row tile with stages of 128; M = 256..512 from
# harness_huge_tile_h7.txt, one run, with the 256-row tile).
# Rule: most blocks within 132 SMs, splits of 1 or 2, 32-row tiles up to M = 64; past one wave the
# fewest waves x K units per block x unit cost (a 96-row unit costs 1.16 64-row ones, a 128-row 1.24);
# then the unsplit 256-row tile (2.40) from M = 256 where it costs less.
WGMMA_TILES = {
    (8192, 8192, 32): "32/2",     # 22.1 (64/2 28.1)
    (8192, 8192, 64): "64/2",     # 26.9 (32/1 32.3)
    (8192, 8192, 96): "96/2",     # 31.5 (128/2 38.2)
    (8192, 8192, 128): "128/2",   # 36.1 (64/1 39.8)
    (8192, 8192, 192): "96/1",    # 46.4, one wave (128/1 54.0)
    (8192, 8192, 256): "128/1",   # 54.9 (256/2 62.3; 256/1 90.0: 64 blocks)
    (8192, 8192, 384): "96/1",    # 89.7 (128/2 100.2; 256/1 105.3: padded to 512)
    (8192, 8192, 512): "256/1",   # 97.9 (128/1 110.8)
    (14336, 4096, 32): "32/1",    # 20.3 (64/1 23.4)
    (14336, 4096, 64): "64/1",    # 24.3 (96/1 27.6)
    (14336, 4096, 96): "96/1",    # 27.9, one wave (128/1 31.3)
    (14336, 4096, 128): "128/1",  # 31.7 (128/2 44.0)
    (14336, 4096, 192): "96/1",   # 50.9: 2 waves x 1.16 (64/1 63.5: 3 waves)
    (14336, 4096, 256): "256/1",  # 53.9: 1 wave x 2.40 (128/1 59.5: 2 waves x 1.24)
    (14336, 4096, 384): "128/1",  # 88.0: 3 waves x 1.24 (256/1 121.5: 2 waves x 2.40)
    (14336, 4096, 512): "256/1",  # 104.2: 2 waves x 2.40 (128/1 115.3: 4 waves x 1.24)
    (4096, 14336, 32): "32/2",    # 30.4 (64/2 35.4)
    (4096, 14336, 64): "32/2",    # 31.2 (64/2 37.3)
    (4096, 14336, 96): "64/2",    # 38.4 (96/2 43.4)
    (4096, 14336, 128): "64/2",   # 39.0 (128/2 51.0)
    (4096, 14336, 192): "96/2",   # 46.3 (128/2 61.9)
    (4096, 14336, 256): "128/2",  # 54.9 (64/1 64.9)
    (4096, 14336, 384): "96/1",   # 78.0 (256/2 105.2)
    (4096, 14336, 512): "128/1",  # 94.9 (128/2 106.9; 256/2 100.0, 256/1 64 blocks)
    (6144, 4096, 384): "96/1",    # 49.4 (256/1 51.7; 96/2 55.0): no split past one wave (harness_plan_s33.txt)
    (6144, 4096, 512): "256/1",   # 52.4 (128/1 58.9; 128/2 63.7)
    (8192, 1024, 64): "32/1",     # 4 units of K, no split: two 32-row tiles fill 128 SMs (8192^2: 36.3 vs 64/1 45.2)
}


@pytest.mark.parametrize("shape", sorted(WGMMA_TILES), ids=lambda s: "{}x{}-M{}".format(*s))
def test_wgmma_tiles(driver, shape):
    assert plan_full(driver, *shape, wgmma=1)[3] == WGMMA_TILES[shape]


def test_wgmma_forced_beyond_its_range(driver):
    # Past M = 512 (dequantize + cuBLASLt unless forced) the same cost rule: 8192^2 M = 1024 is 256
    # blocks of 256 rows x 2.40 (2 waves; 210.5 us) against 512 of 128 x 1.24 (4; 227.4), and at
    # 14336 x 4096 896 of 128 (7 waves: 199.2) against 448 of 256 (4: 220.8).
    assert plan_full(driver, 8192, 8192, 1024, wgmma=1, path="wgmma")[3] == "256/1"
    assert plan_full(driver, 14336, 4096, 1024, wgmma=1, path="wgmma")[3] == "128/1"
    assert plan_full(driver, 8192, 8192, 1, wgmma=1, path="wgmma")[3] == "32/2"


def test_wgmma_tile_override(driver):
    assert plan_full(driver, 8192, 8192, 64, wgmma=1, path="wgmma", wg="128,4")[3] == "128/4"
    assert plan_full(driver, 8192, 8192, 64, wgmma=1, path="wgmma", wg="80,4")[3] == "64/2"  # malformed: ignored
    # Multicast of x over weight tiles: forced only (slower than none at every point of the sweep).
    assert plan_full(driver, 8192, 8192, 64, wgmma=1, path="wgmma", wg="64,1,4")[3] == "64/1/4"
    assert plan_full(driver, 8192, 8192, 64, wgmma=1, path="wgmma", wg="64,2,4")[3] == "64/2/4"
    assert plan_full(driver, 8192, 8192, 64, wgmma=1, path="wgmma", wg="64,4,4")[3] == "64/2"  # cluster of 16 > 8
    assert plan_full(driver, 8192, 8192, 64, wgmma=1, path="wgmma", wg="64,1,3")[3] == "64/2"  # not 1, 2, 4


@pytest.mark.parametrize("shape", sorted(WGMMA_TILES), ids=lambda s: "{}x{}-M{}".format(*s))
def test_wgmma_plan_never_multicasts(driver, shape):
    assert plan_full(driver, *shape, wgmma=1)[3].count("/") == 1  # tile_m/splits: multicast 1


def test_wgmma_load_conditions(driver):
    # K, row bytes, scale row bytes, x, w, scales addresses -> third field: wgmma_loads_ok
    assert driver("loads 4096 2048 256 1032 2048 4096")[0][2] == "1"  # any x (permuted into our buffer)
    assert driver("loads 4088 2048 256 1024 2048 4096")[0][2] == "1"  # K tail, padded rows
    assert driver("loads 4088 2044 256 1024 2048 4096")[0][2] == "0"  # rows not in 16-byte units
    assert driver("loads 4224 2112 264 1024 2048 4096")[0][2] == "0"  # scale rows not in 16-byte units
    assert driver("loads 4096 2048 256 1024 2056 4096")[0][2] == "0"  # weights not 16-byte aligned
    assert driver("loads 4096 2048 256 1024 2048 4104")[0][2] == "0"  # scales not 16-byte aligned


@pytest.mark.parametrize("shape", sorted(MEASURED_STAGED) + [(4096, 4096, 33), (4096, 4096, 512), (2880, 2880, 8)],
                         ids=lambda s: "{}x{}-M{}".format(*s))
@pytest.mark.parametrize("staged", [1, 0])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_mxfp4_takes_the_tensor_core_kernels_like_nvfp4(driver, shape, staged, dtype):
    """Both tensor-core kernels take E8M0 scales: 16-bit x plans the same path and tiles for MXFP4 as
    for NVFP4 (tensor cores up to M = 32, the staged kernel up to 64, then dequantize + cuBLASLt)."""
    nv = plan(driver, *shape, dtype, staged=staged)
    assert plan(driver, *shape, dtype, staged=staged, mode="mxfp4") == nv
    assert plan(driver, *shape, dtype, staged=staged, path="tc", mode="mxfp4")[0] == "tc"


@pytest.mark.parametrize("m", [1, 8, 32, 33, 512])
def test_mxfp4_float32_x_stays_off_the_tensor_cores(driver, m):
    want = "simt" if m <= 32 else "dequant"
    assert plan(driver, 4096, 4096, m, "f32", mode="mxfp4")[0] == want
    assert plan(driver, 4096, 4096, m, "f32", path="tc", mode="mxfp4")[0] == want


@pytest.mark.parametrize("m", [1, 64, 256])
def test_mxfp4_never_takes_wgmma(driver, m):
    """The wgmma kernel reads E4M3 scales only: forced, MXFP4 keeps the automatic choice."""
    assert plan_full(driver, 8192, 8192, m, wgmma=1, path="wgmma", mode="mxfp4")[0] == plan(driver, 8192, 8192, m, mode="mxfp4")[0]


def test_mxfp4_staged_load_conditions(driver):
    """MXFP4 scale rows hold K / 32 bytes: the staged kernel copies 8 per row and stage of two steps
    (K % 256 == 0), else 4."""
    assert driver("loads_mxfp4 4096 2048 128 1024 2048 4096")[0][:2] == ("1", "1")
    assert driver("loads_mxfp4 4096 2048 128 1024 2048 4100")[0][:2] == ("1", "0")  # not 8-byte aligned
    assert driver("loads_mxfp4 4224 2112 132 1024 2048 4100")[0][:2] == ("1", "1")  # K % 256 != 0: 4 bytes
    assert driver("loads_mxfp4 4224 2112 132 1024 2048 4098")[0][:2] == ("1", "0")  # ... but not 2
    assert driver("loads_mxfp4 2880 1440 90 1024 2048 4096")[0][:2] == ("1", "0")  # gpt-oss K: K % 128 != 0


def test_gather_wgmma_rows_rule(driver):
    """The grouped wgmma kernel (prefill of the gathered op) runs from 32 rows per expert on
    average, where it was measured faster than the grouped staged kernel (docs/moe.md): the Qwen3
    MoE MLP's 512- and 2048-token prefill (4096 and 16384 rows, 128 experts) take it, 256 tokens
    stays on the staged kernel. Its grid y holds every tile of 64 rows."""
    assert driver("gather_wgmma 16384 128") == [("1", str(16384 // 64 + 128))]
    assert driver("gather_wgmma 4096 128") == [("1", str(4096 // 64 + 128))]
    assert driver("gather_wgmma 4095 128")[0][0] == "0"
    assert driver("gather_wgmma 2048 128")[0][0] == "0"
    assert driver("gather_wgmma 300 3") == [("1", "8")]  # ceil(300 / 64) + 3
    assert driver("gather_wgmma 0 0")[0][0] == "0"
    assert driver(f"gather_wgmma {64 * 70000} 1")[0][0] == "0"  # tiles past grid y's 65535


def test_gather_decode_rules(driver):
    """The gathered op's decode without a plan (docs/moe.md): up to 128 rows of x in all (16
    tokens of top-8, where the batched pair kernel beat the plan and the grouped staged kernel),
    and the decode GEMV's shape 0 at every K: four rows per warp, four warps per block, every
    lane busy in its first step from K = 2048 (of the shapes the harness timed at 1-16 tokens,
    none beat it at K = 2048)."""
    assert driver("gather_decode 2048") == [("0", "2048", "16", "128")]
    assert driver("gather_decode 768") == [("0", "2048", "16", "128")]


def test_batched_pair_tiles_split_over_the_whole_grid(driver):
    """The gathered op's batched pair kernel (decode, one product per pair on grid z) takes one
    product's tile but splits K over warps from the grid of all products (batched_tc_config): one
    product alone (Qwen3-30B-A3B's gate, 768 x 2048) keeps 4 warps per block, 16 tokens of top-8
    (128 products) one warp of the whole K. MLX_FP4_CUDA_GATHER_TC overrides it ("product": one
    product's split; "1,rt,kw": a tile; anything else: the rule)."""
    assert driver("batched 768 2048 1 1") == [("1", "1", "4")]
    assert driver("batched 768 2048 1 128") == [("1", "1", "1")]
    assert driver("batched 768 2048 1 128 product") == [("1", "1", "4")]
    assert driver("batched 768 2048 1 128 1,2,8") == [("1", "2", "8")]
    assert driver("batched 768 2048 1 128 1,1,16") == [("1", "1", "8")]  # no deep batched kernel
    assert driver("batched 768 2048 1 128 4,2,1") == [("1", "1", "1")]  # not one x tile: the rule
    assert driver("batched 2048 768 1 8") == [("1", "1", "1")]  # K = 768: 6 steps, one warp already
