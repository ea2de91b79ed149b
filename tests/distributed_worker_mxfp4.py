"""The MXFP4 checks of the tensor-parallel worker (tests/distributed_worker.py runs them on every
rank): the sharded linear layers with E8M0 scales per 32 K elements and no global scale, K split
on 32-element blocks only, and a tiny mlx-lm Llama converted with mode="mxfp4" and sharded by
its own plan. Layer outputs against the float64 reference within the tolerance table (the
reference decodes the unsharded layer's bytes, sliced here with numpy)."""

import mlx.core as mx
import mlx.nn as nn

from distributed_helpers import (
    _both_orders, _check_against_table, _compare_logits, _expect_value_error, _fp4_linear, _pieces,
    _sharded_vs_unsharded, _tiny_llama, _x,
)

MODE = "mxfp4"


def check_mxfp4_layers(group):
    from mlx_fp4 import distributed as D

    n_ranks, r = group.size(), group.rank()
    # all-to-sharded: rows of W (and bias), bias fused; the column slices gathered
    layer = _fp4_linear(64, 96, mode=MODE, seed=1)
    x = _x(5, 64, mx.bfloat16)
    col = D.shard_linear(layer, "all-to-sharded", group=group)
    y = col(x)
    full = mx.distributed.all_gather(y.T, group=group).T
    # sharded-to-all: K = 128 -> 64 per rank (two 32-element blocks), all_sum, bias once
    layer_k = _fp4_linear(128, 40, mode=MODE, seed=2)
    xk = _x(5, 128, mx.float32)
    row = D.shard_linear(layer_k, "sharded-to-all", segments=2, group=group)
    cols = [i for a, b in _pieces(128, 2, n_ranks, r) for i in range(a, b)]
    yk = row(xk[:, mx.array(cols)])
    # MLX's own mxfp4 QuantizedLinear, sharded from its bytes
    q = nn.QuantizedLinear(128, 24, bias=False, group_size=32, bits=4, mode=MODE)
    from_mlx = D.FP4ShardedToAllLinear.from_quantized_linear(q, group=group)
    yq = from_mlx(xk[:, r * 64 : (r + 1) * 64])
    # in place (no bias: an in-place layer adds its bias on every rank)
    inplace = _fp4_linear(128, 32, bias=False, mode=MODE, seed=3)
    ref_inplace = _fp4_linear(128, 32, bias=False, mode=MODE, seed=3)
    D.shard_inplace(inplace, "sharded-to-all", group=group)
    yi = mx.distributed.all_sum(inplace(xk[:, r * 64 : (r + 1) * 64]), group=group)
    mx.eval(y, full, yk, yq, yi)

    assert type(col) is D.FP4AllToShardedLinear and col.mode == MODE and col.group_size == 32
    assert "global_scale" not in col
    rows = list(range(r * 96 // n_ranks, (r + 1) * 96 // n_ranks))
    _check_against_table(y, x, layer, rows=rows)
    _check_against_table(full, x, layer)
    assert type(row) is D.FP4ShardedToAllLinear and row.mode == MODE
    assert tuple(row.scales.shape) == (40, 128 // n_ranks // 32)
    _check_against_table(yk, xk, layer_k)
    _check_against_table(yq, xk, q)
    assert tuple(inplace.scales.shape) == (32, 128 // n_ranks // 32)
    _check_against_table(yi, xk, ref_inplace)
    return "all-to-sharded, sharded-to-all (segments 2), from MLX mxfp4, in place: ok"


def check_mxfp4_k_block_errors(group):
    """K slices that are whole NVFP4 blocks but not whole MXFP4 blocks raise the same ValueError
    on every rank; a global scale with mxfp4 too."""
    from mlx_fp4 import distributed as D

    msgs = {}

    def expect(name, fn):
        _expect_value_error(msgs, name, fn)

    layer96 = _fp4_linear(96, 32, mode=MODE)  # 48 per rank: 16-aligned, not 32-aligned
    expect("shard_linear", lambda: D.shard_linear(layer96, "sharded-to-all", group=group))
    expect("shard_inplace", lambda: D.shard_inplace(layer96, "sharded-to-all", group=group))
    expect("constructor", lambda: D.FP4ShardedToAllLinear(96, 32, mode=MODE, group=group))
    expect("global_scale", lambda: D.FP4AllToShardedLinear(64, 32, mode=MODE, group=group, global_scale=3.0))
    assert tuple(layer96.scales.shape) == (32, 3), "a failed shard_inplace must not modify"
    ok = D.FP4AllToShardedLinear(96, 32, mode=MODE, group=group)  # rows split: any K of 32s
    mx.eval(ok(_x(2, 96, mx.float32)))
    for name in ("shard_linear", "shard_inplace", "constructor"):
        assert "32-element" in msgs[name] and "MXFP4" in msgs[name], f"{name}: unclear {msgs[name]!r}"
    return msgs


def check_mxfp4_model(group):
    """A tiny Llama converted with mode="mxfp4" (every linear), sharded with shard_model: the
    model's plan splits o_proj (K = 64) and down_proj (K = 128) on 32-element blocks; the same
    logits as unsharded."""
    from mlx_fp4 import distributed as D

    model = _tiny_llama(mx.float32)
    ref, out = _sharded_vs_unsharded(group, model, None, mode=MODE)
    layer = model.model.layers[0]
    assert type(layer.self_attn.q_proj) is D.FP4AllToShardedLinear
    assert type(layer.mlp.down_proj) is D.FP4ShardedToAllLinear
    assert layer.mlp.down_proj.mode == MODE and layer.self_attn.o_proj.mode == MODE
    return _compare_logits(ref, out, mx.float32, "llama mxfp4")


def check_mxfp4_shard_then_convert(group):
    """Plain model.shard() of the float model, then mlx_fp4.distributed.quantize(mode="mxfp4"):
    the bytes of convert-then-shard_model (blocks never straddle a 32-aligned split) and the same
    logits."""
    from mlx_fp4 import distributed as D

    a, b, ref, out = _both_orders(group, _tiny_llama, mode=MODE)
    mods_a = dict(a.named_modules())
    n_checked = 0
    for path, m in b.named_modules():
        if isinstance(m, (D.FP4AllToShardedLinear, D.FP4ShardedToAllLinear)):
            ma = mods_a[path]
            assert type(ma) is type(m) and m.mode == MODE, path
            for key in ("weight", "scales", "bias"):
                assert mx.array_equal(ma[key], m[key]).item(), f"{path}.{key} differs"
            n_checked += 1
    assert n_checked == 2 * 7, n_checked
    return f"{n_checked} sharded mxfp4 layers bit-identical; " + _compare_logits(ref, out, mx.float32, "mxfp4 shard-then-convert")
