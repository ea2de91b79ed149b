"""MLX 0.32.4's own nvfp4 Metal kernels (qmv_fast, qmv, qmv_wide, qmm_t, qmm_t_splitk), compiled
from the mlx-metal wheel's headers by metal_sim (mlx_kernels.py) and launched as MLX's host code
launches them, against `mx.quantized_matmul(mode="nvfp4")` on the CPU and the float64 reference.

MLX's CPU kernel for bf16/fp16 inputs rounds in the input precision while it accumulates (measured
2-51x outside the tolerance table on K <= 512), and its Metal kernels accumulate in fp32. So the
CPU comparison runs mx.quantized_matmul on the same bytes with x widened exactly to fp32, then
rounds once to the dtype; the Metal result must lie within the table's bound of it (twice the
bound: both sides round). The float64 reference check is the table itself.
"""

import ml_dtypes
import mlx.core as mx
import numpy as np
import pytest

import common
import mlx_kernels as mk
import reference as ref

NP = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}
DTYPES = list(NP)


def problem(m, n, k, dtype, key, scale_codes=None):
    g = common.rng("mlx_kernels", m, n, k, dtype, key)
    codes = g.integers(0, 16, size=(n, k), dtype=np.uint8)
    packed = ref.pack_nibbles(codes)
    scales = g.choice(scale_codes if scale_codes is not None else common.DEFAULT_SCALE_CODES,
                      size=(n, k // 16)).astype(np.uint8)
    x = g.standard_normal((m, k)).astype(NP[dtype])
    return x, packed, scales


def mlx_cpu_fp32(x, packed, scales, dtype):
    """mx.quantized_matmul on the CPU in fp32 (x widened exactly), rounded once to dtype."""
    y = mx.quantized_matmul(mx.array(x.astype(np.float32)), mx.array(packed.view(np.uint32)),
                            mx.array(scales), transpose=True, group_size=16, bits=4, mode="nvfp4",
                            stream=mx.cpu)
    return np.array(y.astype(getattr(mx, dtype)).astype(mx.float32)).astype(np.float64)


def check(runner, tmp_path, kind, m, n, k, dtype, *, global_scale=None, split_k=None, slack=0,
          key=0):
    x, packed, scales = problem(m, n, k, dtype, key)
    out = mk.launch(runner, tmp_path / "case", x, packed, scales, kind=kind, dtype=dtype,
                    global_scale=global_scale, split_k=split_k, slack=slack)
    mdt = getattr(mx, dtype)
    gs = None if global_scale is None else np.float32(global_scale / 2688.0)
    _, acc, mag = ref.w4a16_matmul_with_magnitude(x.astype(np.float64), packed, scales, k, gs)
    y, bound = common.error_bound(acc, mag, k, common.TOLERANCES[(mdt, mdt)], None, gs)
    what = f"MLX {kind} {dtype} m={m} n={n} k={k}"
    common.assert_close(out, y, bound, what=what + " vs float64 reference")
    cpu = mlx_cpu_fp32(x, packed, scales, dtype) * (1.0 if gs is None else float(gs))
    common.assert_close(out, cpu, 2 * bound, what=what + " vs mx.quantized_matmul (CPU)")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", [(1, 64, 512), (1, 136, 1024)])
@pytest.mark.parametrize("gs", [None, 37.5])
def test_qmv_fast(mlx_runner, tmp_path, m, n, k, dtype, gs):
    assert mk.mlx_plan(m, n, k, has_global_scale=gs is not None)[0] == "qmv_fast"
    check(mlx_runner, tmp_path, "qmv_fast", m, n, k, dtype, global_scale=gs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", [(1, 37, 48), (1, 70, 112), (1, 9, 16)])
def test_qmv_ragged(mlx_runner, tmp_path, m, n, k, dtype):
    assert mk.mlx_plan(m, n, k)[0] == "qmv"
    check(mlx_runner, tmp_path, "qmv", m, n, k, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", [(2, 37, 48), (5, 40, 64), (7, 33, 144), (12, 64, 512)])
def test_qmv_wide(mlx_runner, tmp_path, m, n, k, dtype):
    assert mk.mlx_plan(m, n, k)[0] == "qmv_wide"
    check(mlx_runner, tmp_path, "qmv_wide", m, n, k, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", [(64, 64, 512), (33, 65, 96), (100, 96, 64)])
def test_qmm_t(mlx_runner, tmp_path, m, n, k, dtype):
    check(mlx_runner, tmp_path, "qmm_t", m, n, k, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_qmm_t_k_tail(mlx_runner, tmp_path, dtype):
    # K % 32 == 16: the weight loader's last K tile reads one 16-column group past each row.
    check(mlx_runner, tmp_path, "qmm_t", 40, 70, 48, dtype, slack=64)


def test_qmm_t_k_tail_reads_past_the_rows(mlx_runner, tmp_path):
    """Finding: for K % 32 == 16, MLX's qmm_t reads weights and scales past the end of the last
    row (the buffer's guard page faults). On a GPU that reads the next row or allocator slack;
    a NaN scale byte (0x7F) there would make the zero-padded tail NaN."""
    x, packed, scales = problem(40, 70, 48, "bfloat16", 0)
    with pytest.raises(AssertionError, match="out-of-bounds device access"):
        mk.launch(mlx_runner, tmp_path / "case", x, packed, scales, kind="qmm_t",
                  dtype="bfloat16")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", [(16, 64, 512), (33, 70, 256)])
def test_qmm_t_splitk(mlx_runner, tmp_path, m, n, k, dtype):
    kind, params = mk.mlx_plan(m, n, k, gpu=(16, "s"))
    assert kind == "qmm_t_splitk"
    check(mlx_runner, tmp_path, kind, m, n, k, dtype, split_k=params["split_k"])


def test_plan_matches_mlx_host_code():
    """MLX's choice on an M4 Max-class GPU (gen 16, 's') for the cost-model grid."""
    plan = lambda m, n, k: mk.mlx_plan(m, n, k, gpu=(16, "s"))  # noqa: E731
    assert plan(1, 4096, 4096)[0] == "qmv_fast"
    assert plan(8, 4096, 4096)[0] == "qmv_wide"
    assert plan(14, 4096, 4096)[0] == "qmv_wide"  # vector limit 15 at 4096^2
    assert plan(16, 4096, 4096) == ("qmm_t_splitk", {"split_k": 4})
    assert plan(64, 4096, 4096) == ("qmm_t_splitk", {"split_k": 2})
    assert plan(256, 4096, 4096)[0] == "qmm_t"
    assert plan(13, 14336, 4096) == ("qmm_t", {})  # 448 tiles: no split
    assert plan(4, 4096, 14336)[0] == "qmv_wide"
