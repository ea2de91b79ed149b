"""A global scale costs no graph node (issue 37): MLX's global_scale (the amax) goes to the
kernel as is and the kernel divides by 2688, as MLX's own nvfp4 kernels do. A divide node per
call cost ~4-5 us of MLX host time per linear at decode, a third of the default path's speed."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlx_fp4 as mx_fp4
from mlx_fp4.bench.decode_host import graph_nodes
from mlx_fp4.nn import FP4SwitchLinear

import common
import reference as ref

K, N, E = 64, 48, 4


@pytest.mark.parametrize("bias", [False, True])
def test_linear_nodes_same_with_and_without_global_scale(bias):
    mx.random.seed(0)
    lin = nn.Linear(K, N, bias=bias)
    x = mx.random.normal((1, K)).astype(mx.bfloat16)
    mx.eval(lin.parameters(), x)
    counts = {}
    for gs in (False, True):
        model = nn.Sequential(nn.Linear(K, N, bias=bias))
        model.layers[0].update(lin.parameters())
        mx_fp4.nn.quantize(model, global_scale=gs, progress=False)
        layer = model.layers[0]
        mx.eval(layer.parameters())
        assert (layer.get("global_scale") is not None) == gs
        g = graph_nodes(layer(x))
        counts[gs] = g["nodes"]
        assert g["by_primitive"] == {"W4A16Matmul": 1}, g
    assert counts[True] == counts[False] == 1


@pytest.mark.parametrize("shape", [(), (1,)])
def test_op_global_scale_no_node_and_value(shape):
    """Both accepted global-scale shapes build one node, and the kernel's multiplier is MLX's:
    the output equals the reference decoded with fp32(amax) / fp32(2688) (reference.multiplier)."""
    g = common.rng("gs_nodes", len(shape))
    w, scales, _ = common.rand_weights(N, K, g)
    x = common.rand_x((3, K), mx.float32, g)
    amax = mx.array(np.full(shape, 517.3, np.float32))
    mx.eval(amax)
    out = mx_fp4.w4a16_matmul(x, w, scales, global_scale=amax)
    assert graph_nodes(out)["by_primitive"] == {"W4A16Matmul": 1}
    common.check_matmul(out, x, w, scales, global_scale=amax)


def test_op_global_scale_shape_2d_refused():
    g = common.rng("gs_nodes_2d")
    w, scales, _ = common.rand_weights(N, K, g)
    x = common.rand_x((1, K), mx.float32, g)
    with pytest.raises(ValueError, match="global_scale"):
        mx_fp4.w4a16_matmul(x, w, scales, global_scale=mx.array([[3.0]]))


def test_multiplier_bit_identical_to_mlx_dequantize():
    """Identity x against the decoded weights: the kernel's in-place division gives exactly the
    weights mx.dequantize(mode="nvfp4", global_scale=...) gives on the same bytes."""
    g = common.rng("gs_nodes_mlx")
    wf = mx.array(g.standard_normal((N, K)).astype(np.float32))
    amax = mx.max(mx.abs(wf))
    wq, sq = mx.quantize(wf, mode="nvfp4", global_scale=amax)
    got = np.array(mx_fp4.w4a16_matmul(mx.eye(K), wq, sq, global_scale=amax).T)
    # fp32(e2m1 * e4m3) is exact; the kernel rounds once, times fp32(amax) / fp32(2688).
    exact = ref.decode_weights(np.array(wq).view(np.uint8), np.array(sq), K).astype(np.float32)
    assert np.array_equal(got, exact * ref.multiplier(amax))
    # MLX rounds e2m1 * (e4m3 * multiplier) instead: at most one ulp apart, never more.
    want = np.array(mx.dequantize(wq, sq, mode="nvfp4", global_scale=amax, dtype=mx.float32))
    assert np.max(np.abs(got - want) / np.spacing(np.abs(want) + np.float32(1e-30))) <= 1


def test_gather_nodes_same_with_and_without_global_scale():
    g = common.rng("gs_nodes_gather")
    wf = mx.array(g.standard_normal((E, N, K)).astype(np.float32))
    x = mx.array(g.standard_normal((2, 1, K)).astype(np.float32)).astype(mx.bfloat16)
    idx = mx.array(np.array([[1, 3], [0, 1]], np.uint32))
    mx.eval(wf, x, idx)
    counts = {}
    for gs in (False, True):
        layer = FP4SwitchLinear.from_switch_linear(_switch(wf), global_scale=gs)
        mx.eval(layer.parameters())
        assert (layer.get("global_scale") is not None) == gs
        counts[gs] = graph_nodes(layer(mx.expand_dims(x, -2), idx))["by_primitive"]
    assert counts[True] == counts[False], counts
    assert counts[True].get("GatherW4A16Matmul") == 1


@pytest.mark.parametrize("per_expert", [False, True])
def test_gather_global_scale_values(per_expert):
    """Scalar and per-expert global scales (MLX amax) against the float64 reference."""
    g = common.rng("gs_gather_values", per_expert)
    w = mx.array(g.integers(0, 256, (E, N, K // 2), dtype=np.uint8))
    s = mx.array(g.integers(0x30, 0x40, (E, N, K // 16), dtype=np.uint8))
    x = mx.array(g.standard_normal((2, 1, K)).astype(np.float32))
    rhs = mx.array(np.array([[3, 0], [1, 1]], np.uint32))
    lhs = mx.array(np.array([[0, 0], [1, 1]], np.uint32))
    amax = np.float32(300.0) if not per_expert else g.uniform(10, 500, E).astype(np.float32)
    out = mx_fp4.gather_w4a16_matmul(x, w, s, lhs_indices=lhs, rhs_indices=rhs, global_scale=mx.array(amax))
    assert graph_nodes(out)["by_primitive"] == {"GatherW4A16Matmul": 1}
    amaxes = np.broadcast_to(np.atleast_1d(amax), (E,))
    for b in range(2):
        for j in range(2):
            e, row = int(np.array(rhs)[b, j]), int(np.array(lhs)[b, j])
            common.check_matmul(out[b, j], x[row], w[e], s[e], global_scale=mx.array(amaxes[e]))


def _switch(wf):
    from mlx_lm.models.switch_layers import SwitchLinear

    sl = SwitchLinear(K, N, E, bias=False)
    sl.weight = wf
    return sl


def _padded(a):
    """True when `a` (unevaluated) is a view of a larger buffer: formats.device_resident's graph."""
    return "Concatenate" in graph_nodes(a)["by_primitive"]


@pytest.mark.parametrize("how", ["from_linear", "attribute", "update", "load_weights"])
def test_linear_global_scale_stored_outside_small_pool(how, tmp_path):
    """A 4-byte global scale lands in MLX CUDA's managed small-allocation pool, which kernels
    read across the bus (~14 us more per product on an H100); layers store it as a view of a
    16-byte buffer however it is assigned, with the same shape, dtype and value."""
    mx.random.seed(1)
    layer = mx_fp4.nn.FP4Linear.from_linear(nn.Linear(K, N), global_scale=True)
    padded_at_creation = _padded(layer.global_scale)
    value = np.array(layer.global_scale)
    if how == "from_linear":
        assert padded_at_creation
    elif how == "attribute":
        layer.global_scale = 517.25
        value = np.array([517.25], np.float32)
    elif how == "update":
        layer.update({"global_scale": mx.array([3.5])})
        value = np.array([3.5], np.float32)
    elif how == "load_weights":
        mx.eval(layer.parameters())
        path = str(tmp_path / "w.safetensors")
        layer.save_weights(path)
        layer.load_weights(path)
    gs = layer.global_scale
    assert how == "from_linear" or _padded(gs), graph_nodes(gs)
    assert gs.shape == (1,) and gs.dtype == mx.float32
    np.testing.assert_array_equal(np.array(gs), value)


@pytest.mark.parametrize("experts", [1, 2, 4])
def test_switch_global_scale_stored_outside_small_pool(experts):
    layer = FP4SwitchLinear(K, N, experts, global_scale=True)
    gs = mx.arange(1, experts + 1).astype(mx.float32)
    layer.global_scale = gs
    # [1] and [2] (<= 8 bytes) are padded; [4] (16 bytes) is not in the small pool and stays as is.
    assert _padded(layer.global_scale) == (experts * 4 <= 8)
    np.testing.assert_array_equal(np.array(layer.global_scale), np.array(gs))
