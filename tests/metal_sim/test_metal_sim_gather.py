"""The gathered (MoE) Metal kernel in metal_sim: the production host code (gather_dispatch.h, via
src/gather_plan.cpp) plans each launch, the embedded MSL runs on the CPU with guarded buffers, and
the output is held to the float64 reference (tests/gather_reference.py) with the one tolerance
table: unsorted / sorted / repeated experts, lhs indices, M > 1, ragged K, global scales (scalar
and per expert), the chain, out-of-range indices (NaN rows, no read); MXFP4 experts (E8M0 per 32,
K % 32 != 0 tails, a NaN scale)."""

import subprocess

import ml_dtypes
import numpy as np
import pytest

import gather_reference as gref
import simbuild
from common import TOLERANCES, assert_close, error_bound, rng
from simcase import BF16, CODES, F16, F32, NP_DTYPE
from simcheck import require_toolchain

import mlx.core as mx

MX_DTYPE = {F32: mx.float32, F16: mx.float16, BF16: mx.bfloat16}
PARAMS_SLOT, OUT_SLOT = 4, 3
BIND_OUTPUT, BIND_PARAMS = -1, -2


@pytest.fixture(scope="module")
def gather_sim(embedded_msl):
    require_toolchain()
    plan = simbuild.host_tool("gather_plan")
    lines = subprocess.run([str(plan), "instantiations"], check=True, capture_output=True, text=True).stdout
    runner = simbuild.build_source_runner("gather", embedded_msl, lines.splitlines(), groups=2)
    return plan, runner


GATHER_KERNELS = {"pairs": 1, "runs": 2, "gemm": 3}  # fp4::GatherMetalKernel, as MLX_FP4_METAL_GATHER names them


def run_gather(sim, d, *, x, w_bytes, scales, lhs, rhs, x_dtype, out_dtype, gs=None, epilogue=(), mode=0,
               sorted_hint=False, launch=None, force=None):
    """x [B, M, K] numpy (representable in x_dtype), w_bytes uint8 [E, N, row], scales uint8
    [E, N, blocks], lhs/rhs uint32 [P]; gs: None, a scalar or [E] fp32 global scales (MLX amax); epilogue:
    (name, operand array shaped for [P, M, N] or float, p1); sorted_hint: the op's sorted_indices
    (gather_metal_kernel); launch: a dict that receives the plan's launch lines; force: a kernel of
    GATHER_KERNELS instead of the plan's. Returns out [P, M, N] float64."""
    plan, runner = sim
    d.mkdir(parents=True, exist_ok=True)
    b, m, k = x.shape
    e, n, row = w_bytes.shape
    pairs = len(lhs)
    files = [d / "x.bin", d / "w.bin", d / "s.bin", d / "lhs.bin", d / "rhs.bin"]
    np.ascontiguousarray(x.astype(NP_DTYPE[x_dtype])).tofile(files[0])
    np.ascontiguousarray(w_bytes).tofile(files[1])
    np.ascontiguousarray(scales).tofile(files[2])
    np.asarray(lhs, np.uint32).tofile(files[3])
    np.asarray(rhs, np.uint32).tofile(files[4])
    spec = [f"pairs {pairs}", f"x_batches {b}", f"experts {e}", f"m {m}", f"n {n}", f"k {k}",
            f"w_row_bytes {row}", f"scale_row_bytes {scales.shape[2]}", f"x_dtype {x_dtype}",
            f"out_dtype {out_dtype}", f"has_gs {int(gs is not None)}",
            f"per_expert {int(gs is not None and np.ndim(gs) == 1)}", f"mode {mode}", f"sorted {int(sorted_hint)}",
            f"force {GATHER_KERNELS[force] if force else 0}"]
    if gs is not None:
        files.append(d / "gs.bin")
        np.asarray(gs, np.float32).reshape(-1).tofile(files[-1])
    nops = 0
    for name, arg, p1 in epilogue:
        if isinstance(arg, np.ndarray):
            kind = 1 if arg.ndim == 1 else 3  # [N] col or the full [P, M, N]
            dt = {np.dtype(np.float32): F32, np.dtype(np.float16): F16, np.dtype(ml_dtypes.bfloat16): BF16}[arg.dtype]
            files.append(d / f"op{nops}.bin")
            np.ascontiguousarray(arg).tofile(files[-1])
            spec += [f"op {CODES[name]} {nops} 0 0", f"operand {kind} {dt}"]
            nops += 1
        else:
            spec.append(f"op {CODES[name]} -1 {0.0 if arg is None else float(arg)} {p1 or 0.0}")
    (d / "spec.txt").write_text("\n".join(spec) + "\n")
    r = subprocess.run([str(plan), "plan", str(d / "spec.txt"), str(d)], check=True, capture_output=True, text=True)
    launch = {} if launch is None else launch
    launch.update(dict(line.split(" ", 1) for line in r.stdout.strip().splitlines()))
    binding = [int(v) for v in launch["binding"].split()]
    out_bytes = pairs * m * n * np.dtype(NP_DTYPE[out_dtype]).itemsize
    ex = [f"kernel {launch['kernel']}", f"grid {launch['grid']} 1", f"threads {launch['threads']} 1 1", "guard end"]
    ex += [f"fc {c.split(':')[0]} bool {c.split(':')[1]}" for c in launch["constants"].split()]
    for slot, src in enumerate(binding):
        if src == BIND_OUTPUT:
            ex.append(f"output {slot} {out_bytes} {d / 'out.bin'}")
        elif src == BIND_PARAMS:
            ex.append(f"buffer {slot} {d / 'params.bin'}")
        else:
            ex.append(f"buffer {slot} {files[src]}")
    (d / "exec.txt").write_text("\n".join(ex) + "\n")
    r = subprocess.run([str(runner), "exec", str(d / "exec.txt")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"metal_sim runner exited with {r.returncode}:\n{r.stderr}"
    return np.fromfile(d / "out.bin", NP_DTYPE[out_dtype]).astype(np.float64).reshape(pairs, m, n)


def experts(g, e, n, k, mode="nvfp4"):
    from common import rand_weights

    parts = [rand_weights(n, k, g, mode=mode) for _ in range(e)]
    return np.stack([p[2] for p in parts]), np.stack([np.array(p[1]) for p in parts])


CASES = [  # (x dtype, out dtype, E, N, K, M, pairs, sorted, lhs given, global scale)
    (BF16, BF16, 6, 40, 64, 1, 10, False, False, None),
    (F16, F32, 4, 33, 17, 1, 7, True, False, "scalar"),
    (F32, BF16, 5, 24, 96, 3, 6, False, True, "per_expert"),
    (BF16, F16, 3, 16, 40, 2, 5, True, True, None),
]


@pytest.mark.parametrize("xd,od,e,n,k,m,pairs,sort,with_lhs,gs", CASES, ids=[str(i) for i in range(len(CASES))])
def test_gather_kernel_matches_reference(gather_sim, tmp_path, xd, od, e, n, k, m, pairs, sort, with_lhs, gs):
    g = rng("metal-gather", xd, od, e, n, k, m, pairs)
    w_bytes, scales = experts(g, e, n, k)
    batches = 4 if with_lhs else pairs
    x = g.standard_normal((batches, m, k)).astype(np.float32)
    x = np.array(mx.array(x).astype(MX_DTYPE[xd]).astype(mx.float32))  # representable in xd
    rhs = g.integers(0, e, size=pairs).astype(np.uint32)
    if sort:
        rhs = np.sort(rhs)
    rhs[:2] = rhs[0]  # a repeated expert
    lhs = g.integers(0, batches, size=pairs).astype(np.uint32) if with_lhs else np.arange(pairs, dtype=np.uint32)
    amax = None if gs is None else (np.float32(300.0) if gs == "scalar" else g.uniform(10, 500, e).astype(np.float32))
    gate = g.standard_normal((pairs, m, n)).astype(np.float16)
    bias = g.standard_normal(n).astype(np.float32)
    chain = [("add", bias, None), ("silu", None, None), ("mul", gate, None), ("clamp", -4.0, 4.0)]
    out = run_gather(gather_sim, tmp_path, x=x, w_bytes=w_bytes, scales=scales, lhs=lhs, rhs=rhs, x_dtype=xd,
                     out_dtype=od, gs=amax, epilogue=chain)
    acc, mag = gref.gather_matmul_with_magnitude(x, w_bytes, scales, lhs, rhs,
                                                 None if amax is None else mx.array(amax))
    ref_chain = [("add", bias), "silu", ("mul", gate.astype(np.float64)), ("clamp", -4.0, 4.0)]
    y, bound = error_bound(acc, mag, k, TOLERANCES[(MX_DTYPE[xd], MX_DTYPE[od])], ref_chain, amax)
    assert_close(out, y, bound, what=f"metal gather case x={xd} out={od}")


def test_out_of_range_pairs_are_nan_and_not_read(gather_sim, tmp_path):
    g = rng("metal-gather-oob")
    w_bytes, scales = experts(g, 3, 16, 32)
    x = g.standard_normal((4, 1, 32)).astype(np.float32)
    lhs = np.array([0, 1, 9, 3], np.uint32)  # pair 2: lhs past x
    rhs = np.array([2, 7, 0, 1], np.uint32)  # pair 1: rhs past w
    out = run_gather(gather_sim, tmp_path, x=x, w_bytes=w_bytes, scales=scales, lhs=lhs, rhs=rhs, x_dtype=F32,
                     out_dtype=F32)
    assert np.isnan(out[1]).all() and np.isnan(out[2]).all()
    acc, mag = gref.gather_matmul_with_magnitude(x, w_bytes, scales, lhs[[0, 3]], rhs[[0, 3]])
    y, bound = error_bound(acc, mag, 32, TOLERANCES[(mx.float32, mx.float32)])
    assert_close(out[[0, 3]], y, bound, what="in-range pairs")


@pytest.mark.parametrize("mode", ["nvfp4", "mxfp4"])
def test_sorted_prefill_runs(gather_sim, tmp_path, mode):
    """mlx-lm's sorted prefill (x [P, 1, K], rhs sorted, lhs the default) from 64 pairs: threadgroups
    of 8 pairs, one GEMV pass per run of one expert with consecutive x matrices in them (8 rows,
    or fewer where experts change, where lhs are not consecutive, in the last partial group);
    out-of-range pairs alone (NaN rows). 24 experts: fewer pairs per expert than the GEMM takes."""
    g = rng("metal-gather-runs", mode)
    e, n, k, pairs = 24, 40, 96, 75
    w_bytes, scales = experts(g, e, n, k, mode=mode)
    x = g.standard_normal((pairs, 1, k)).astype(np.float32)
    x = np.array(mx.array(x).astype(mx.bfloat16).astype(mx.float32))
    rhs = np.sort(g.integers(0, e, size=pairs)).astype(np.uint32)
    rhs[:16] = 0  # runs 0 and 1 uniform
    rhs[-3:] = 99  # out of range, in the last (partial) run
    lhs = np.arange(pairs, dtype=np.uint32)
    lhs[[9, 10]] = lhs[[10, 9]]  # run 1: one expert, x matrices not consecutive
    nvfp4 = mode == "nvfp4"
    amax = g.uniform(10, 500, e).astype(np.float32) if nvfp4 else None
    gate = g.standard_normal((pairs, 1, n)).astype(np.float16)
    chain = [("silu", None, None), ("mul", gate, None)]
    launch = {}
    out = run_gather(gather_sim, tmp_path, x=x, w_bytes=w_bytes, scales=scales, lhs=lhs, rhs=rhs, x_dtype=BF16,
                     out_dtype=F32, gs=amax, epilogue=chain, mode=0 if nvfp4 else 1, sorted_hint=True, launch=launch)
    assert launch["kernel"].endswith("_run8") and launch["grid"].split()[1] == str((pairs + 7) // 8)
    assert np.isnan(out[-3:]).all()
    ok = slice(0, pairs - 3)
    acc, mag = gref.gather_matmul_with_magnitude(x, w_bytes, scales, lhs[ok], rhs[ok],
                                                 None if amax is None else mx.array(amax), mode=mode)
    y, bound = error_bound(acc, mag, k, TOLERANCES[(mx.bfloat16, mx.float32)],
                           ["silu", ("mul", gate[ok].astype(np.float64))], amax)
    assert_close(out[ok], y, bound, what=f"metal gather sorted runs {mode}")


@pytest.mark.parametrize("mode,xd,od,hint_lies", [("nvfp4", BF16, F32, False), ("nvfp4", F16, BF16, True),
                                                  ("mxfp4", BF16, F16, False)])
def test_sorted_prefill_gemm(gather_sim, tmp_path, mode, xd, od, hint_lies):
    """From kMetalGatherGemmMinRows pairs per expert (sorted hint, one row per pair): the gathered
    GEMM, tiles of 64 consecutive pairs, one strip pass per expert among them. Tiles span several
    experts, the last one is partial, N = 72 ends inside the second weight tile, K = 100 ends
    inside a strip and a scale block; x rows through a permuted lhs; a bad lhs and out-of-range
    experts give NaN rows; per-expert global scale (NVFP4), a bias and a full gate in the chain.
    hint_lies: rhs not sorted although the hint says so (a run per change: slower, still exact)."""
    g = rng("metal-gather-gemm", mode, xd, od, hint_lies)
    e, n, k, pairs = 3, 72, 100, 150
    w_bytes, scales = experts(g, e, n, k, mode=mode)
    x = g.standard_normal((pairs, 1, k)).astype(np.float32)
    x = np.array(mx.array(x).astype(MX_DTYPE[xd]).astype(mx.float32))
    rhs = g.integers(0, e, size=pairs).astype(np.uint32)
    rhs = rhs if hint_lies else np.sort(rhs)
    rhs[-2:] = 7  # out of range, in the last (partial) tile
    lhs = g.permutation(pairs).astype(np.uint32)
    lhs[70] = 999  # past x
    nvfp4 = mode == "nvfp4"
    amax = g.uniform(10, 500, e).astype(np.float32) if nvfp4 else None
    gate = g.standard_normal((pairs, 1, n)).astype(np.float16)
    bias = g.standard_normal(n).astype(np.float32)
    chain = [("add", bias, None), ("silu", None, None), ("mul", gate, None)]
    launch = {}
    out = run_gather(gather_sim, tmp_path, x=x, w_bytes=w_bytes, scales=scales, lhs=lhs, rhs=rhs, x_dtype=xd,
                     out_dtype=od, gs=amax, epilogue=chain, mode=0 if nvfp4 else 1, sorted_hint=True, launch=launch)
    assert launch["kernel"].startswith("mlx_fp4_gather_gemm") and launch["grid"] == f"2 {(pairs + 63) // 64}"
    bad = np.zeros(pairs, bool)
    bad[[70, pairs - 2, pairs - 1]] = True
    assert np.isnan(out[bad]).all()
    ok = ~bad
    acc, mag = gref.gather_matmul_with_magnitude(x, w_bytes, scales, lhs[ok], rhs[ok],
                                                 None if amax is None else mx.array(amax), mode=mode)
    ref_chain = [("add", bias), "silu", ("mul", gate[ok].astype(np.float64))]
    y, bound = error_bound(acc, mag, k, TOLERANCES[(MX_DTYPE[xd], MX_DTYPE[od])], ref_chain, amax)
    assert_close(out[ok], y, bound, what=f"metal gathered GEMM {mode} x={xd} out={od}")


def test_sorted_prefill_gemm_without_the_run_mask_fails(gather_sim, embedded_msl, tmp_path):
    """The GEMM test above has teeth: with the rows of every run added into every row (the run mask
    removed), a tile spanning two experts no longer matches the reference."""
    plan, _ = gather_sim
    old = "        if (local[fi] >= i && local[fi] < j) {\n"
    assert embedded_msl.count(old) == 1, "the kernel source changed; update the snippet in this test"
    lines = [ln for ln in subprocess.run([str(plan), "instantiations"], check=True, capture_output=True,
                                         text=True).stdout.splitlines() if "gather_gemm" in ln and "_xbf16_of32" in ln]
    mutant = simbuild.build_source_runner("gather-mutant", embedded_msl.replace(old, "        {  // planted\n"), lines)
    g = rng("metal-gather-gemm-mutant")
    e, n, k, pairs = 2, 64, 64, 128
    w_bytes, scales = experts(g, e, n, k)
    x = g.standard_normal((pairs, 1, k)).astype(np.float32)
    x = np.array(mx.array(x).astype(mx.bfloat16).astype(mx.float32))
    rhs = np.repeat(np.arange(e, dtype=np.uint32), pairs // e)
    rhs[:32] = 0
    rhs[32:96] = 1  # the first tile holds both experts
    lhs = np.arange(pairs, dtype=np.uint32)
    acc, mag = gref.gather_matmul_with_magnitude(x, w_bytes, scales, lhs, rhs)
    y, bound = error_bound(acc, mag, k, TOLERANCES[(mx.bfloat16, mx.float32)])
    for sim, good in ((gather_sim, True), ((plan, mutant), False)):
        launch = {}
        out = run_gather(sim, tmp_path / str(good), x=x, w_bytes=w_bytes, scales=scales, lhs=lhs, rhs=rhs,
                         x_dtype=BF16, out_dtype=F32, sorted_hint=True, launch=launch)
        assert launch["kernel"].startswith("mlx_fp4_gather_gemm")
        if good:
            assert_close(out, y, bound, what="the kernel")
        else:
            with pytest.raises(AssertionError):
                assert_close(out, y, bound, what="mutant")


def test_sorted_hint_below_the_run_threshold_keeps_one_pair_per_threadgroup(gather_sim, tmp_path):
    g = rng("metal-gather-few")
    w_bytes, scales = experts(g, 2, 16, 32)
    x = g.standard_normal((8, 1, 32)).astype(np.float32)
    launch = {}
    run_gather(gather_sim, tmp_path, x=x, w_bytes=w_bytes, scales=scales, lhs=np.arange(8, dtype=np.uint32),
               rhs=np.zeros(8, np.uint32), x_dtype=F32, out_dtype=F32, sorted_hint=True, launch=launch)
    assert not launch["kernel"].endswith("_run8") and launch["grid"].split()[1] == "8"


MX_CASES = [  # (x dtype, out dtype, E, N, K, M, pairs, sorted, lhs given)
    (BF16, BF16, 6, 40, 64, 1, 10, False, False),
    (F16, F32, 4, 33, 17, 1, 7, True, False),
    (F32, BF16, 5, 24, 100, 3, 6, False, True),
    (BF16, F16, 3, 16, 200, 2, 5, True, True),
]


@pytest.mark.parametrize("xd,od,e,n,k,m,pairs,sort,with_lhs", MX_CASES, ids=[str(i) for i in range(len(MX_CASES))])
def test_gather_kernel_mxfp4_matches_reference(gather_sim, tmp_path, xd, od, e, n, k, m, pairs, sort, with_lhs):
    """MXFP4 experts (no global scale): the dense GEMV's E8M0 block loop per pair; a NaN scale
    (0xFF) in expert 0's row 2 poisons that column of expert 0's pairs only."""
    g = rng("metal-gather-mxfp4", xd, od, e, n, k, m, pairs)
    w_bytes, scales = experts(g, e, n, k, mode="mxfp4")
    scales[0, 2, -1] = 0xFF
    batches = 4 if with_lhs else pairs
    x = g.standard_normal((batches, m, k)).astype(np.float32)
    x = np.array(mx.array(x).astype(MX_DTYPE[xd]).astype(mx.float32))
    rhs = g.integers(0, e, size=pairs).astype(np.uint32)
    if sort:
        rhs = np.sort(rhs)
    rhs[:2] = 0  # expert 0 (the NaN scale), repeated
    lhs = g.integers(0, batches, size=pairs).astype(np.uint32) if with_lhs else np.arange(pairs, dtype=np.uint32)
    bias = g.standard_normal(n).astype(np.float32)
    chain = [("add", bias, None), ("silu", None, None)]
    out = run_gather(gather_sim, tmp_path, x=x, w_bytes=w_bytes, scales=scales, lhs=lhs, rhs=rhs, x_dtype=xd,
                     out_dtype=od, epilogue=chain, mode=1)
    acc, mag = gref.gather_matmul_with_magnitude(x, w_bytes, scales, lhs, rhs, mode="mxfp4")
    y, bound = error_bound(acc, mag, k, TOLERANCES[(MX_DTYPE[xd], MX_DTYPE[od])], [("add", bias), "silu"])
    assert np.isnan(y[:2, :, 2]).all()
    assert_close(out, y, bound, what=f"metal gather mxfp4 case x={xd} out={od}")


def test_sorted_runs_cost_less_than_one_pass_per_pair(tmp_path):
    """The counted cost (gather_cost.py, as costmodel.py counts the dense kernels) of a sorted
    prefill: the committed benchmarks/results/metal/gather_cost.json is what the kernels give today,
    and the runs execute fewer instructions and load fewer device bytes than one pass per pair. At
    decode our pair GEMV reads the bytes mx.gather_qmm's gather_qmv reads (within 2%) in fewer
    instructions."""
    import json
    import os
    from pathlib import Path

    import gather_cost
    import mlx_kernels

    require_toolchain()
    try:
        doc = gather_cost.compute(tmp_path)
    except mlx_kernels.Unavailable as e:  # MLX's kernels come from the mlx-metal wheel (PyPI)
        if os.environ.get("CI"):
            pytest.fail(str(e))
        pytest.skip(str(e))
    committed = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "metal" /
                            "gather_cost.json").read_text())
    assert doc == committed, "rerun python tests/metal_sim/gather_cost.py after a kernel change"
    runs, per_pair, plan = doc["runs"], doc["per_pair"], doc["plan"]
    assert runs["kernel"].endswith("_run8") and not per_pair["kernel"].endswith("_run8")
    assert runs["instructions_per_pair_weight"] < 0.6 * per_pair["instructions_per_pair_weight"]
    assert runs["device_bytes_per_pair_weight"] < 0.8 * per_pair["device_bytes_per_pair_weight"]
    # The plan takes the GEMM here (32 pairs per expert); the rule's threshold is the sweep's
    # first density where the GEMM counts fewer instructions and bytes than the runs.
    assert plan["kernel"].startswith("mlx_fp4_gather_gemm")
    assert plan["cost_per_pair_weight"] < runs["cost_per_pair_weight"]
    # the first density from which the GEMM costs fewer lane-cycles and bytes than the runs
    cheaper = [c["gemm"]["cost_per_pair_weight"] < c["runs"]["cost_per_pair_weight"]
               and c["gemm"]["device_bytes_per_pair_weight"] < c["runs"]["device_bytes_per_pair_weight"]
               for c in doc["crossover"]]
    first = next(c["pairs_per_expert"] for i, c in enumerate(doc["crossover"]) if all(cheaper[i:]))
    tiling = (Path(__file__).resolve().parents[2] / "csrc" / "shared" / "tiling_metal.h").read_text()
    assert f"kMetalGatherGemmMinRows = {first};" in tiling
    for point in doc["decode"]["points"]:
        ours, mlx = point["ours"], point["mlx"]
        assert ours["instructions_per_pair_weight"] < mlx["instructions_per_pair_weight"], point
        assert abs(ours["device_bytes_per_pair_weight"] / mlx["device_bytes_per_pair_weight"] - 1) < 0.02, point
