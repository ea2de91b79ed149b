"""metal_sim tests of the Metal host side: the dispatch table and launch arithmetic of
csrc/metal/w4a16_dispatch.h (driven through the runner), the parameter-block layout seen by C++
and by the MSL compilation, the kernel specializations and the embedded source, and that
eval_gpu (csrc/metal/w4a16_matmul.cpp) compiles against MLX's own Metal headers.
"""

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import simbuild
import simcase as sc
from simcheck import require_toolchain

# The dispatch table (docs/metal.md) and the launch arithmetic, driven through the runner.


@pytest.mark.parametrize(
    "m,expected",
    [(1, "gemv_mt1"), (2, "gemv_mt2"), (3, "gemv_mt4"), (4, "gemv_mt4"), (5, "gemv_mt8"),
     (8, "gemv_mt8"), (9, "gemv_mt16"), (16, "gemv_mt16"), (17, "gemm_bm64_bk32_s0"),
     (255, "gemm_bm64_bk32_s0"),
     (256, "gemm_bm128_bk64_s1"), (5000, "gemm_bm128_bk64_s1")])
def test_dispatch_table(sim_runner, m, expected):
    plan = sc.run_plan(sim_runner, m, 300, 200)
    assert f"_w4a16_{expected}_" in plan["kernel"][0]
    if expected.startswith("gemv"):
        mt = int(expected[len("gemv_mt"):])
        cols = 4 * (4 if mt <= 4 else 2)  # 4 simdgroups x weight rows per simdgroup
        tiles_m, tiles_n = -(-m // mt), -(-300 // cols)
        assert plan["tiles"] == [str(tiles_m), str(tiles_n)]
        assert plan["grid"] == [str(tiles_m * tiles_n)] and plan["threads"] == ["128"]
        # K = 200: 100-byte weight rows are not 8-byte words, so the unaligned pipeline
        assert plan["pipeline"] == [plan["kernel"][0] + "_fc0f"]
    else:
        bm = 128 if "bm128" in expected else 64
        tiles_m, tiles_n = -(-m // bm), -(-300 // 64)
        lgm, lgn = (tiles_m - 1).bit_length(), (tiles_n - 1).bit_length()
        assert plan["tiles"] == [str(tiles_m), str(tiles_n)]
        assert plan["log2_grid"] == [str(lgm), str(lgn)]
        assert plan["grid"] == [str(1 << (lgm + lgn))]
        assert plan["threads"] == [str(bm // 32 * 2 * 32)]


def test_gemv_pipeline_is_specialized_on_alignment(sim_runner):
    assert sc.run_plan(sim_runner, 3, 64, 256)["pipeline"][0].endswith("_fc0t")
    assert sc.run_plan(sim_runner, 3, 64, 250)["pipeline"][0].endswith("_fc0f")


def test_bindings_follow_primitive_inputs(sim_runner):
    # x, w, scales, out (-1), params (-2), then global scale and operands (none here: x).
    plan = sc.run_plan(sim_runner, 10, 10, 10)
    assert plan["bindings"] == ["0", "1", "2", "-1", "-2", "0", "0", "0", "0", "0", "0"]


def test_forced_gemv_rejects_large_m(sim_runner):
    with pytest.raises(sc.SimFailure, match="GEMV handles M <= 16"):
        sc.run_plan(sim_runner, 17, 10, 10, force="gemv")


@pytest.mark.parametrize("lgm,lgn", [(0, 0), (2, 2), (3, 1), (1, 4), (0, 3), (5, 0)])
def test_morton_is_a_bijection(sim_runner, lgm, lgn):
    out = subprocess.run([str(sim_runner), "morton", str(lgm), str(lgn)], capture_output=True,
                         text=True, check=True).stdout.split("\n")
    tiles = [tuple(map(int, line.split())) for line in out if line]
    assert sorted(tiles) == [(a, b) for a in range(1 << lgm) for b in range(1 << lgn)]
    if lgm and lgn:
        assert tiles[1] == (0, 1) and tiles[2] == (1, 0)  # even bits -> n, odd bits -> m


def test_params_abi_matches_between_cpp_and_msl(sim_runner):
    out = subprocess.run([str(sim_runner), "abi"], capture_output=True, text=True,
                         check=True).stdout.split("\n")
    cpp = out[0].split()[1:]
    msl = out[1].split()[1:]
    assert cpp == msl


def test_every_specialization_is_compiled(sim_runner):
    names = subprocess.run([str(sim_runner), "list"], capture_output=True, text=True,
                           check=True).stdout.split()
    # 5 GEMV (MT = 1, 2, 4, 8, 16) + 4 GEMM configs, x 3 x dtypes x 3 out dtypes, and the
    # split-K reduction per out dtype.
    assert len(names) == 9 * 9 + 3 and len(set(names)) == 84


def test_embedded_source_is_ascii_and_self_contained(embedded_msl):
    embedded_msl.encode("ascii")  # MLX hands the source to Metal as an ASCII string
    # Every quoted include is inlined; only system headers (<metal_stdlib>, and the C++ branch
    # of portable.h) remain.
    includes = [ln for ln in embedded_msl.splitlines() if ln.lstrip().startswith("#include")]
    assert "#include <metal_stdlib>" in includes
    assert not [ln for ln in includes if '"' in ln]


def test_eval_gpu_compiles_against_the_mlx_metal_headers(tmp_path):
    """eval_gpu uses MLX's Metal API exactly as the wheel declares it (mlx/backend/metal/
    device.h); Apple's metal-cpp is replaced by a declarations-only stub (host_stub/)."""
    require_toolchain()
    spec = importlib.util.find_spec("mlx")
    include = Path(list(spec.submodule_search_locations)[0]) / "include"
    if not (include / "mlx" / "backend" / "metal" / "device.h").exists():
        # Linux wheels ship no Metal headers: those of the mlx-metal wheel (mlx_kernels.py)
        import mlx_kernels

        try:
            include = mlx_kernels.fetch_headers()
        except mlx_kernels.Unavailable as e:
            if os.environ.get("CI"):
                pytest.fail(str(e))
            pytest.skip(str(e))
    header = tmp_path / "mlx_fp4_metal_source.h"
    subprocess.run([shutil.which("cmake"), f"-DMLX_FP4_EMBED_OUT={header}",
                    f"-DMLX_FP4_SOURCE_DIR={simbuild.ROOT}", "-P",
                    str(simbuild.ROOT / "cmake" / "metal.cmake")], check=True)
    cxx = os.environ.get("METAL_SIM_CXX") or "clang++-19"
    r = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", "-Wno-c++20-extensions",
                        f"-I{simbuild.SIM / 'host_stub'}", f"-I{include}",
                        f"-I{simbuild.CSRC}", f"-I{tmp_path}",
                        str(simbuild.CSRC / "metal" / "w4a16_matmul.cpp")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_address_spaces_are_consistent():
    """Every pointer in the MSL carries the right address space (a syntax-only compile with
    device/constant/threadgroup as clang address spaces; execution builds erase them)."""
    require_toolchain()
    ok, err = simbuild.check_address_spaces()
    assert ok, err


def test_address_space_check_catches_a_missing_qualifier(embedded_msl):
    old = "    device const uchar* wrow = w + long(row_ok ? n : 0) * p.w_row_bytes;\n"
    assert embedded_msl.count(old) == 1
    bad = embedded_msl.replace(old, "    const uchar* wrow = w + long(row_ok ? n : 0) * p.w_row_bytes;\n")
    ok, err = simbuild.check_address_spaces(bad, only=["mlx_fp4_w4a16_gemm_bm64_bk32_s0_xf32_of32"])
    assert not ok and "address_space(1)" in err, err
