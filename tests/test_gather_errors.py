"""gather_w4a16_matmul user errors: a ValueError when the op is called (before anything runs),
naming the argument with what was expected and what came."""

import mlx.core as mx
import pytest

import mlx_fp4 as mx_fp4
from common import rand_weights, rng

E, N, K = 4, 16, 40


@pytest.fixture
def good():
    g = rng("gather-errors")
    parts = [rand_weights(N, K, g) for _ in range(E)]
    return dict(
        x=mx.ones((3, 1, 1, K)),
        w=mx.stack([p[0] for p in parts]),
        scales=mx.stack([p[1] for p in parts]),
        rhs_indices=mx.array([[0, 1], [3, 3], [2, 0]]),
    )


def call(good, **over):
    args = {**good, **over}
    x, w, s = args.pop("x"), args.pop("w"), args.pop("scales")
    return mx_fp4.gather_w4a16_matmul(x, w, s, **args)


CASES = [
    (dict(x=mx.ones((3, 1, 1, K), mx.int32)), r"x must be float16, bfloat16 or float32 but got int32"),
    (dict(x=mx.ones((K,))), r"x must have at least 2 dimensions"),
    (dict(x=mx.ones((3, 1, 1, K + 2))), r"w \(uint8\) must have last dimension ceil\(K/2\) = 21"),
    (dict(w=mx.zeros((E, N, 20), mx.float32)), r"w must be uint8 or uint32 .* but got dtype float32"),
    (dict(w=mx.zeros((E, N, 3), mx.uint32)), r"w \(uint32\) must have last dimension ceil\(K/8\) = 5"),
    (dict(scales=mx.zeros((E, N, 2), mx.uint8)), r"scales must have shape w.shape\[:-1\] \+ \(ceil\(K/16\),\) = \(4, 16, 3\)"),
    (dict(scales=mx.zeros((E, N, 3), mx.int8)), r"scales must be uint8 \(E4M3 bits\) but got dtype int8"),
    (dict(rhs_indices=mx.array([[0.0, 1.0]])), r"rhs_indices must be an integer array but got dtype float32"),
    (dict(rhs_indices=mx.array([[0, 4]])), r"rhs_indices must be in \[0, 4\) .* but got 4 at flat position 1"),
    (dict(rhs_indices=mx.array([[0, -1]])), r"rhs_indices must be in \[0, 4\) .* but got -1"),
    (dict(lhs_indices=mx.array([3])), r"lhs_indices must be in \[0, 3\) \(the matrices in x"),
    (dict(rhs_indices=mx.array([[0, 1, 2]]), lhs_indices=mx.array([0, 1])), r"must broadcast together"),
    (dict(rhs_indices=mx.zeros((2, 2), mx.int32)), r"lhs_indices of shape \(3, 1\) and rhs_indices of shape \(2, 2\)"),
    (dict(global_scale=mx.ones((3,))), r"global_scale must be a scalar or have one value per expert, shape .*\(4,\)"),
    (dict(global_scale=mx.ones((E,), mx.float16)), r"global_scale must be a Python float or a float32 array"),
    (dict(epilogue=[("add", mx.ones((5,)))]), r"epilogue\[0\] operand must broadcast to the output shape \(3, 2, 1, 16\)"),
    (dict(epilogue=["nope"]), r"unknown op 'nope'"),
    (dict(out_dtype=mx.int32), r"out_dtype must be float16, bfloat16 or float32"),
]


@pytest.mark.parametrize("over,pattern", CASES, ids=[p for _, p in CASES])
def test_errors(good, over, pattern):
    with pytest.raises(ValueError, match=pattern) as info:
        call(good, **over)
    assert "[gather_w4a16_matmul]" in str(info.value) or "epilogue" in str(info.value)


def test_good_calls(good):
    mx.eval(call(good))
    mx.eval(call(good, global_scale=mx.ones((E,))))
    mx.eval(call(good, global_scale=2.0, w=good["w"].reshape(2, 2, N, -1), scales=good["scales"].reshape(2, 2, N, -1),
                 rhs_indices=mx.array([[0, 3]], mx.uint16)))
