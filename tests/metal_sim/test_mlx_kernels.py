"""MLX 0.32.4's own nvfp4 and mxfp4 Metal kernels (qmv_fast, qmv, qmv_wide, qmm_t, qmm_t_splitk),
compiled from the mlx-metal wheel's headers by metal_sim (mlx_kernels.py) and launched as MLX's
host code launches them, against `mx.quantized_matmul` on the CPU and the float64 reference; for
mxfp4 also against our kernels (the dispatch's choice) on the same bytes.

MLX's CPU kernel for bf16/fp16 inputs rounds in the input precision while it accumulates (measured
2-51x outside the tolerance table on K <= 512), and its Metal kernels accumulate in fp32. So the
CPU comparison runs mx.quantized_matmul on the same bytes with x widened exactly to fp32, then
rounds once to the dtype; the Metal result must lie within the table's bound of it (twice the
bound: both sides round). The float64 reference check is the table itself.
"""

import mlx.core as mx
import numpy as np
import pytest

import common
import mlx_kernels as mk
import reference as ref
import simcase as sc

NP = mk.NUMPY_TYPES
DTYPES = list(NP)


def problem(m, n, k, dtype, key, scale_codes=None, mode="nvfp4"):
    g = common.rng("mlx_kernels", m, n, k, dtype, key, *(() if mode == "nvfp4" else (mode,)))
    codes = g.integers(0, 16, size=(n, k), dtype=np.uint8)
    packed = ref.pack_nibbles(codes)
    default = common.DEFAULT_SCALE_CODES if mode == "nvfp4" else common.DEFAULT_E8M0_CODES
    scales = g.choice(scale_codes if scale_codes is not None else default,
                      size=(n, k // mk.GROUPS[mode])).astype(np.uint8)
    x = g.standard_normal((m, k)).astype(NP[dtype])
    return x, packed, scales


def mlx_cpu_fp32(x, packed, scales, dtype, mode="nvfp4"):
    """mx.quantized_matmul on the CPU in fp32 (x widened exactly), rounded once to dtype."""
    y = mx.quantized_matmul(mx.array(x.astype(np.float32)), mx.array(packed.view(np.uint32)),
                            mx.array(scales), transpose=True, group_size=mk.GROUPS[mode], bits=4,
                            mode=mode, stream=mx.cpu)
    return np.array(y.astype(getattr(mx, dtype)).astype(mx.float32)).astype(np.float64)


def check(runner, tmp_path, kind, m, n, k, dtype, *, global_scale=None, split_k=None, slack=0,
          key=0, mode="nvfp4"):
    x, packed, scales = problem(m, n, k, dtype, key, mode=mode)
    out = mk.launch(runner, tmp_path / "case", x, packed, scales, kind=kind, dtype=dtype,
                    global_scale=global_scale, split_k=split_k, slack=slack, mode=mode)
    mdt = getattr(mx, dtype)
    gs = None if global_scale is None else np.float32(global_scale / 2688.0)
    _, acc, mag = ref.w4a16_matmul_with_magnitude(x.astype(np.float64), packed, scales, k, gs,
                                                  mode=mode)
    y, bound = common.error_bound(acc, mag, k, common.TOLERANCES[(mdt, mdt)], None, gs)
    what = f"MLX {kind} {mode} {dtype} m={m} n={n} k={k}"
    common.assert_close(out, y, bound, what=what + " vs float64 reference")
    cpu = mlx_cpu_fp32(x, packed, scales, dtype, mode) * (1.0 if gs is None else float(gs))
    common.assert_close(out, cpu, 2 * bound, what=what + " vs mx.quantized_matmul (CPU)")
    return x, packed, scales, out, bound


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


# ---------------------------------------------------------------------------------------------
# mxfp4 (group 32, E8M0): MLX's kernels, and ours on the same bytes.

SIM_DTYPE = {"bfloat16": sc.BF16, "float16": sc.F16, "float32": sc.F32}


def ours_on(sim_runner, tmp_path, x, packed, scales, dtype):
    m, k = x.shape
    out, plan = sc.run_case(sim_runner, tmp_path / "ours", m=m, n=packed.shape[0], k=k,
                            x=x.astype(np.float32), w_packed=packed, scales=scales,
                            x_dtype=SIM_DTYPE[dtype], out_dtype=SIM_DTYPE[dtype], mode=1)
    return out, plan


MX_CASES = [  # (kind, m, n, k): MLX's choice on the M4 Max-class plan, ragged where it allows
    ("qmv_fast", 1, 64, 512), ("qmv", 1, 37, 96), ("qmv_wide", 5, 40, 64),
    ("qmv_wide", 12, 64, 512), ("qmm_t", 33, 65, 96), ("qmm_t", 100, 96, 64),
    ("qmm_t_splitk", 16, 64, 512),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind,m,n,k", MX_CASES, ids=str)
def test_mlx_mxfp4_kernels_and_ours_on_the_same_bytes(mlx_runner, sim_runner, tmp_path, kind, m,
                                                      n, k, dtype):
    plan_kind, params = mk.mlx_plan(m, n, k, mode="mxfp4")
    if kind != "qmm_t":  # qmm_t is forced where MLX would split or take the vector path
        assert plan_kind == kind
    x, packed, scales, theirs, bound = check(mlx_runner, tmp_path, kind, m, n, k, dtype,
                                             split_k=params.get("split_k"), mode="mxfp4")
    ours, plan = ours_on(sim_runner, tmp_path, x, packed, scales, dtype)
    common.assert_close(ours, theirs, 2 * bound,
                        what=f"ours ({plan['kernel'][0]}) vs MLX {kind} mxfp4 {dtype}")


def test_mlx_mxfp4_qmm_t_half_overflows_where_ours_does_not(mlx_runner, sim_runner, tmp_path):
    """Finding: MLX's qmm_t decodes E8M0 scales into the activation dtype; with float16 inputs a
    scale of 2^17 (code 144) is Inf and the output is Inf/NaN, where the exact result is small.
    Ours keeps the scale in fp32 (B elements times the block scale in the MMA)."""
    m, n, k = 40, 64, 64
    x, packed, scales = problem(m, n, k, "float16", "overflow", scale_codes=[144], mode="mxfp4")
    x = (x.astype(np.float32) * np.float32(2.0**-20)).astype(np.float16)
    theirs = mk.launch(mlx_runner, tmp_path / "mlx", x, packed, scales, kind="qmm_t",
                       dtype="float16", mode="mxfp4")
    assert not np.isfinite(theirs).all()
    _, acc, mag = ref.w4a16_matmul_with_magnitude(x.astype(np.float64), packed, scales, k,
                                                  mode="mxfp4")
    y, bound = common.error_bound(acc, mag, k, common.TOLERANCES[(mx.float16, mx.float16)])
    ours, _ = ours_on(sim_runner, tmp_path, x, packed, scales, "float16")
    common.assert_close(ours, y, bound, what="ours, mxfp4 scale 2^17, float16")


@pytest.mark.parametrize("mode", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("n,k,fast", [(64, 512, True), (36, 96, False)])
def test_gather_qmv(mlx_runner, tmp_path, n, k, fast, dtype, mode):
    """mx.gather_qmm's decode kernel (gather_qmv, launched as GatherQMM::eval_gpu does: one row of
    x per pair, unsorted top-k routing, a repeated expert) against the float64 reference: the
    baseline gather_cost.py counts our decode against."""
    import gather_reference as gref

    g = common.rng("mlx_gather_qmv", n, k, dtype, mode)
    e, tokens, top = 6, 3, 2
    w_bytes = np.stack([ref.pack_nibbles(g.integers(0, 16, size=(n, k), dtype=np.uint8)) for _ in range(e)])
    codes = common.DEFAULT_SCALE_CODES if mode == "nvfp4" else common.DEFAULT_E8M0_CODES
    scales = g.choice(codes, size=(e, n, k // mk.GROUPS[mode])).astype(np.uint8)
    x = g.standard_normal((tokens, 1, k)).astype(NP[dtype])
    rhs = np.concatenate([g.choice(e, top, replace=False) for _ in range(tokens)]).astype(np.uint32)
    rhs[2] = rhs[0]  # an expert repeated across tokens
    lhs = (np.arange(tokens * top) // top).astype(np.uint32)
    kind, out = mk.launch_gather(mlx_runner, tmp_path / "case", x, w_bytes, scales, lhs, rhs, dtype=dtype, mode=mode)
    assert kind == ("gather_qmv_fast" if fast else "gather_qmv")
    acc, mag = gref.gather_matmul_with_magnitude(x.astype(np.float64), w_bytes, scales, lhs, rhs, mode=mode)
    mdt = getattr(mx, dtype)
    y, bound = common.error_bound(acc, mag, k, common.TOLERANCES[(mdt, mdt)], None, None)
    common.assert_close(out, y, bound, what=f"MLX {kind} {mode} {dtype} n={n} k={k}")
