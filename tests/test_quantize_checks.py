"""quantize's bad input (issue 38): an empty w and a given global scale that is not finite and > 0.

A given global_scale of 0, -1, NaN or inf came out as the bytes of no global scale, so
dequantize(..., global_scale=gs) gave a zero layer, flipped signs or NaN without a word. Now a
value known at the call is a ValueError naming global_scale; one known only when the graph runs
(lazy, traced) gives NaN scale codes (0x7F), so the weights decode to NaN. An all-zero w keeps
global_scale=True (amax 0, all scales 0). An empty w raised from inside MLX ("[take] ..." or
"[max] ..."); mx.quantize raises there too ("[argmin] ..."), so it is an error naming w.
"""

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlx_fp4 as mx_fp4
from mlx_fp4.nn import FP4Linear

from common import rand_float_weights, rng

N, K = 8, 32
E4M3_NAN = 0x7F
BAD_SCALES = [0.0, -1.0, math.nan, math.inf, -math.inf, 1e-45]  # 1e-45 / 2688 is 0 in fp32
BAD_IDS = ["zero", "negative", "nan", "inf", "-inf", "underflow"]
# ... and for quantizing: 2688 / 1e-36 (mx.quantize's encode scale) overflows fp32.
QUANTIZE_BAD = BAD_SCALES + [1e-36]
QUANTIZE_IDS = BAD_IDS + ["encode-overflow"]


def _w():
    return mx.array(rand_float_weights(N, K, rng("quantize-checks")).astype(np.float32))


EMPTY = [((0, K), "N >= 1 rows"), ((3, 0, K), "N >= 1 rows"), ((0, 4, K), "at least one matrix"),
         ((N, 0), "K >= 1 columns"), ((0, 0), "K >= 1 columns"), ((2, N, 0), "K >= 1 columns")]


@pytest.mark.parametrize("gs", [False, True], ids=["plain", "global_scale"])
@pytest.mark.parametrize("shape,what", EMPTY, ids=[str(s) for s, _ in EMPTY])
def test_empty_w_is_a_clear_error(shape, what, gs):
    w = mx.zeros(shape)
    with pytest.raises(ValueError, match=r"^\[quantize\] w must have .*" + what + r".* but got shape \(" +
                       ", ".join(map(str, shape))):
        mx_fp4.quantize(w, global_scale=gs)
    with pytest.raises(ValueError):  # MLX's own quantizer refuses it as well: no result to match
        mx.eval(mx.quantize(w, mode="nvfp4"))


@pytest.mark.parametrize("as_array", [False, True], ids=["float", "array"])
@pytest.mark.parametrize("bad", QUANTIZE_BAD, ids=QUANTIZE_IDS)
def test_known_bad_global_scale_raises(bad, as_array):
    gs = mx.array(bad, mx.float32) if as_array else bad
    with pytest.raises(ValueError, match=r"^\[quantize\] global_scale must be finite and > 0.* but got"):
        mx_fp4.quantize(_w(), global_scale=gs)


@pytest.mark.parametrize("bad", QUANTIZE_BAD, ids=QUANTIZE_IDS)
def test_from_linear_bad_global_scale_raises(bad):
    lin = nn.Linear(K, N)
    with pytest.raises(ValueError, match=r"global_scale must be finite and > 0"):
        FP4Linear.from_linear(lin, global_scale=bad)


def _lazy(v):
    return mx.array(v, mx.float32) * mx.array(1.0)  # a graph node: its value is known at eval only


@pytest.mark.parametrize("compiled", [False, True], ids=["lazy", "compiled"])
@pytest.mark.parametrize("bad", QUANTIZE_BAD, ids=QUANTIZE_IDS)
def test_lazy_bad_global_scale_gives_nan_scales(device, bad, compiled):
    w = _w()

    def q(w, gs):
        return mx_fp4.quantize(w, global_scale=gs)

    packed, scales = (mx.compile(q) if compiled else q)(w, _lazy(bad))
    assert (np.array(scales) == E4M3_NAN).all()
    d = np.array(mx_fp4.dequantize(packed, scales, global_scale=mx.array(bad, mx.float32), dtype=mx.float32))
    assert np.isnan(d).all()


def test_lazy_good_global_scale_is_unchanged(device):
    """The NaN rule touches no valid scale: lazy and known give the same bytes (the known path is
    checked against the reference in test_quantize.py)."""
    w = _w()
    _, _, amax = mx_fp4.quantize(w, global_scale=True)
    mx.eval(amax)
    known = mx_fp4.quantize(w, global_scale=amax)
    lazy = mx_fp4.quantize(w, global_scale=amax * mx.array(1.0))
    for a, b, what in zip(known, lazy, ("packed", "scales")):
        np.testing.assert_array_equal(np.array(a), np.array(b), err_msg=what)


def test_all_zero_w_keeps_global_scale_true():
    packed, scales, gs = mx_fp4.quantize(mx.zeros((N, K)), global_scale=True)
    assert gs.item() == 0.0 and not np.array(packed).any() and not np.array(scales).any()


def test_distributed_all_zero_layer_with_global_scale():
    """mlx_fp4.distributed.quantize gives a sharded layer the amax of the whole tensor as its
    given global scale: 0 for an all-zero layer, which quantize now refuses. It quantizes that
    layer without one (zero bytes either way) and keeps global_scale 0 (a single-process group)."""
    import mlx.nn.layers.distributed as mlx_dist

    from mlx_fp4 import distributed as D

    group = mx.distributed.init()
    model = nn.Sequential(nn.Linear(K, N), nn.Linear(K, N))
    model.layers[0].weight = mx.zeros((N, K))
    model.layers = [mlx_dist.AllToShardedLinear.from_linear(m, group=group) for m in model.layers]
    D.quantize(model, global_scale=True, progress=False, group=group)
    zero, other = model.layers
    assert isinstance(zero, D.FP4AllToShardedLinear) and zero.global_scale.item() == 0.0
    assert not np.array(zero.weight).any() and not np.array(zero.scales).any()
    x = mx.ones((1, K))
    np.testing.assert_array_equal(np.array(zero(x)), np.broadcast_to(np.array(zero.bias), (1, N)))
    assert other.global_scale.item() > 0


@pytest.mark.parametrize("bad", BAD_SCALES, ids=BAD_IDS)
def test_layer_global_scale_setter_refuses_known_bad_value(bad):
    """Setting a known non-finite or non-positive number on a layer would give NaN, sign-flipped
    or zero outputs silently: the setter refuses it, naming global_scale."""
    layer = FP4Linear.from_linear(nn.Linear(K, N), global_scale=True)
    with pytest.raises(ValueError, match=r"global_scale must be finite and > 0"):
        layer.global_scale = float(bad)
