"""x and the index arrays reach the primitive as they are on the CPU and on CUDA (no Contiguous
node per call; the backend copies a strided one into rows itself), so a decode step has no more
nodes than MLX's own quantized layers. Strided, transposed, broadcast and sliced inputs, lazy or
evaluated, give the reference's values."""

import mlx.core as mx
import numpy as np
import pytest

import mlx_fp4 as mx_fp4
from mlx_fp4.bench.decode_host import graph_nodes

import common
from test_gather import check_gather, experts

K, N, E = 96, 40, 3


def _no_copy_node(out):
    prims = graph_nodes(out)["by_primitive"]
    assert "Contiguous" not in prims, prims
    return prims


def _strided_views(g, dtype):
    """name -> (x [M, K] view, lazy?) of one row-major base: every layout the CPU glue copies."""
    base = common.rand_x((K, 6), dtype, g)
    wide = common.rand_x((5, 2 * K), dtype, g)
    row = common.rand_x((1, K), dtype, g)
    mx.eval(base, wide, row)
    return {
        "transposed": base.T,                       # column-major view
        "every_other_column": wide[:, ::2],         # inner stride 2
        "broadcast_row": mx.broadcast_to(row, (4, K)),  # stride 0 rows
        "sliced_rows": wide[1:4, K:],               # offset + row stride 2K
        "lazy_product": mx.transpose(base * 2),     # a lazy producer, strided result
    }


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16], ids=common.dname)
def test_strided_x_values_and_no_copy_node(device, dtype):
    if device == mx.gpu and mx.metal.is_available():
        pytest.skip("Metal takes x behind a Contiguous node")
    g = common.rng("x_layout", common.dname(dtype))
    w, scales, _ = common.rand_weights(N, K, g)
    mx.eval(w, scales)
    for name, x in _strided_views(g, dtype).items():
        out = mx_fp4.w4a16_matmul(x, w, scales)
        _no_copy_node(out)
        common.check_matmul(out, x, w, scales)
        # The same values as from contiguous rows of x, bit for bit (one kernel, the same data).
        dense = mx_fp4.w4a16_matmul(mx.contiguous(x), w, scales)
        assert np.array_equal(np.array(out.astype(mx.float32)), np.array(dense.astype(mx.float32))), name


def test_decode_layer_input_has_no_copy_node(device):
    """The decode pattern: x is a lazy normalization output; the graph is norm -> matmul."""
    if device == mx.gpu and mx.metal.is_available():
        pytest.skip("Metal takes x behind a Contiguous node")
    g = common.rng("x_layout_decode")
    w, scales, _ = common.rand_weights(N, K, g)
    h = common.rand_x((1, 1, K), mx.bfloat16, g)
    mx.eval(w, scales, h)
    x = mx.fast.rms_norm(h, mx.ones((K,), mx.bfloat16), 1e-5)
    out = mx_fp4.w4a16_matmul(x, w, scales)
    assert _no_copy_node(out)["W4A16Matmul"] == 1  # the norm's own nodes (per backend) + ours
    common.check_matmul(out, x, w, scales)


def test_gathered_strided_x_and_indices(device):
    if device == mx.gpu and mx.metal.is_available():
        pytest.skip("Metal takes x and the indices behind Contiguous nodes")
    g = common.rng("x_layout_gather")
    w, scales = experts(E, N, K, g)
    x = common.rand_x((K, 4), mx.bfloat16, g)
    idx = mx.array(np.array([[0, 2], [1, 0], [2, 1], [3, 2]], np.int32))  # columns: lhs, rhs
    mx.eval(w, scales, x, idx)
    xs = mx.expand_dims(x.T, -2)            # [4, 1, K], strided
    lhs, rhs = idx[:, 0], idx[:, 1]          # strided index views (stride 2)
    out = mx_fp4.gather_w4a16_matmul(xs, w, scales, lhs_indices=lhs, rhs_indices=rhs)
    _no_copy_node(out)
    check_gather(out, xs, w, scales, lhs, rhs)
