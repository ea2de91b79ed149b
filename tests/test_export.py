"""mx.export_function / mx.import_function of code using mx_fp4, inside mx_fp4.export_mode():
the imported function reproduces the outputs (float64 reference, the tolerance table) and runs
on MLX-native ops only (no mx_fp4 primitive in the file)."""

import mlx.core as mx
import numpy as np
import pytest

import common
import mlx_fp4 as mx_fp4
from mlx_fp4 import nn as fnn

pytest.importorskip("mlx_lm")
from lm_fixtures import tiny_llama  # noqa: E402


def _roundtrip(tmp_path, fn, *args):
    path = str(tmp_path / "f.mlxfn")
    with mx_fp4.export_mode():
        assert mx_fp4.exporting()
        mx.export_function(path, fn, *args)
    assert not mx_fp4.exporting()
    assert b"W4A16" not in open(path, "rb").read()  # only MLX's own primitives were written
    return mx.import_function(path)


@pytest.mark.parametrize("k", [64, 40], ids=["quantized_matmul", "reference_ops"])
def test_exported_matmul_matches_reference(tmp_path, k):
    g = common.rng("export", k)
    w, scales, packed = common.rand_weights(24, k, g)
    x = common.rand_x((3, k), mx.bfloat16, g)
    b = common.rand_x((24,), mx.float32, g)
    gs = mx.array(0.8, mx.float32)
    epi = [("add", b), "silu", ("clamp", -1.0, 2.0)]

    def f(x):
        return mx_fp4.w4a16_matmul(x, w, scales, global_scale=gs, epilogue=epi)

    imported = _roundtrip(tmp_path, f, x)
    (out,) = imported(x)
    common.check_matmul(out, x, packed, scales, global_scale=gs, epilogue=epi)
    x2 = common.rand_x((3, k), mx.bfloat16, g)  # new values through the imported graph
    common.check_matmul(imported(x2)[0], x2, packed, scales, global_scale=gs, epilogue=epi)


def test_export_without_the_switch_fails():
    w, scales, _ = common.rand_weights(8, 32, common.rng("noexport"))
    with pytest.raises(Exception, match="serialize"):
        mx.export_function("/dev/null", lambda x: mx_fp4.w4a16_matmul(x, w, scales), mx.ones((1, 32)))


def test_exported_model_matches(tmp_path):
    model = tiny_llama(seed=4)
    fnn.quantize(model, global_scale=True, progress=False)
    fnn.fuse_swiglu(model)
    tokens = mx.array([[1, 7, 42, 99, 5]])
    want = model(tokens)
    imported = _roundtrip(tmp_path, lambda t: model(t), tokens)
    got = imported(tokens)[0]
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("global_scale", [False, True])
def test_exported_switch_layer_matches(tmp_path, global_scale):
    layer = fnn.FP4SwitchLinear(32, 16, 4, bias=True, global_scale=global_scale)
    mx.eval(layer.parameters())  # constants, not the graph that made them, go in the file
    x = mx.random.normal((5, 1, 32))
    idx = mx.array([[0], [3], [1], [2], [3]])
    want = layer(x, idx)
    imported = _roundtrip(tmp_path, lambda x, i: layer(x, i), x, idx)
    np.testing.assert_allclose(np.array(imported(x, idx)[0]), np.array(want), rtol=1e-5, atol=1e-5)
