"""MoE checks of the tensor-parallel worker (tests/distributed_worker.py runs them on every rank):
sharded FP4SwitchLinear layers and a tiny Qwen3-MoE model against the unsharded ones."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from distributed_helpers import _import_llama, _compare_logits, _sharded_vs_unsharded, _both_orders


MOE_CONFIG = dict(
    model_type="qwen3_moe", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=256, max_position_embeddings=128,
    tie_word_embeddings=False, intermediate_size=128, moe_intermediate_size=32, num_experts=8,
    num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
    head_dim=16, rope_theta=10000.0,
)


def _tiny_qwen3_moe(dtype, seed=0, **overrides):
    _import_llama()  # installs the light mlx_lm package stub
    from mlx_lm.models import qwen3_moe

    mx.random.seed(seed)
    model = qwen3_moe.Model(qwen3_moe.ModelArgs.from_dict(dict(MOE_CONFIG, **overrides)))
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


def _switch_layer(k, n, e, *, bias, seed):
    from mlx_fp4.nn import FP4SwitchLinear

    mx.random.seed(seed)  # the same experts on every rank
    layer = FP4SwitchLinear(k, n, e, bias=bias, global_scale=True)
    if bias:
        layer.bias = mx.random.normal((e, n))
    mx.eval(layer.parameters())
    return layer


def _check_gather_ref(out, x, w, s, idx, gs, epilogue=None, mode="nvfp4"):
    import gather_reference as gref
    from common import TOLERANCES, assert_close, error_bound

    acc, mag = gref.gather_matmul_with_magnitude(x, w, s, rhs=idx, global_scale=gs, mode=mode)
    y, bound = error_bound(acc, mag, x.shape[-1], TOLERANCES[(x.dtype, out.dtype)], epilogue, gs)
    assert_close(out, y, bound, what="sharded FP4SwitchLinear")


def check_switch_shard_inplace(group):
    """FP4SwitchLinear split in place the way mlx-lm's MoE shard() splits switch_mlp: rows
    (gate/up, bias rows with them) and K (down, partials all_sum-ed), per-expert global scales
    whole; outputs vs the float64 gather reference of the unsharded bytes (sliced with numpy)."""
    import common
    from mlx_fp4 import distributed as D

    n_ranks, r = group.size(), group.rank()
    e, k, n, t, top = 4, 64, 48, 5, 2
    g = common.rng("dist-switch", e, k, n)
    idx = mx.array(np.stack([g.choice(e, size=top, replace=False) for _ in range(t)]).astype(np.int32))
    x = common.rand_x((t, 1, 1, k), mx.float32, g)

    rows_layer = _switch_layer(k, n, e, bias=True, seed=3)
    ref = _switch_layer(k, n, e, bias=True, seed=3)
    D.shard_inplace(rows_layer, "all-to-sharded", group=group)
    y_rows = rows_layer(x, idx)

    k_layer = _switch_layer(k, n, e, bias=False, seed=4)
    ref_k = _switch_layer(k, n, e, bias=False, seed=4)
    D.shard_inplace(k_layer, "sharded-to-all", group=group)
    kk = k // n_ranks
    y_k = mx.distributed.all_sum(k_layer(x[..., r * kk : (r + 1) * kk], idx), group=group)
    mx.eval(y_rows, y_k)

    nn_ = n // n_ranks
    rows = slice(r * nn_, (r + 1) * nn_)
    assert type(rows_layer).__name__ == "FP4SwitchLinear"
    assert tuple(rows_layer.weight.shape) == (e, nn_, k // 8)
    assert tuple(rows_layer.bias.shape) == (e, nn_)
    assert rows_layer.global_scale.shape == (e,), "per-expert global scales stay whole"
    assert mx.array_equal(rows_layer.global_scale, ref.global_scale).item()
    w_np, s_np = np.array(ref.weight)[:, rows], np.array(ref.scales)[:, rows]
    bias_rows = mx.expand_dims(mx.array(np.array(ref.bias)[:, rows])[idx], -2)
    _check_gather_ref(y_rows, x, mx.array(w_np), mx.array(s_np), idx, ref.global_scale, [("add", bias_rows)])

    assert tuple(k_layer.weight.shape) == (e, n, kk // 8)
    assert tuple(k_layer.scales.shape) == (e, n, kk // 16)
    assert mx.array_equal(k_layer.global_scale, ref_k.global_scale).item()
    _check_gather_ref(y_k, x, ref_k.weight, ref_k.scales, idx, ref_k.global_scale)

    # K off the 16-element blocks (48 / 2 = 24): the same ValueError on every rank, layer untouched
    bad = _switch_layer(48, 16, e, bias=False, seed=5)
    try:
        D.shard_inplace(bad, "sharded-to-all", group=group)
        msg = "no error"
    except ValueError as err:
        msg = str(err)
    assert "16-element" in msg and "block" in msg, msg
    assert tuple(bad.weight.shape) == (e, 16, 6), "a failed shard_inplace must not modify"

    # mxfp4 experts (32-element blocks, no global scale): K=128 -> 64 per rank; K=96 -> 48 raises
    from mlx_fp4.nn import FP4SwitchLinear

    mx.random.seed(6)
    mx_layer = FP4SwitchLinear(128, 24, e, bias=False, mode="mxfp4")
    mx_ref = FP4SwitchLinear.from_arrays(mx_layer.weight, mx_layer.scales, mode="mxfp4")
    xm = common.rand_x((t, 1, 1, 128), mx.float32, g)
    D.shard_inplace(mx_layer, "sharded-to-all", group=group)
    y_mx = mx.distributed.all_sum(mx_layer(xm[..., r * 64 : (r + 1) * 64], idx), group=group)
    mx.eval(y_mx)
    assert tuple(mx_layer.scales.shape) == (e, 24, 64 // 32)
    _check_gather_ref(y_mx, xm, mx_ref.weight, mx_ref.scales, idx, None, mode="mxfp4")
    errors = {}
    for name, fn in (
        ("mxfp4_k", lambda: D.shard_inplace(FP4SwitchLinear(96, 8, e, bias=False, mode="mxfp4"), "sharded-to-all", group=group)),
    ):
        try:
            fn()
            errors[name] = "no error"
        except ValueError as err:
            errors[name] = str(err)
    assert "32-element MXFP4 block" in errors["mxfp4_k"], errors
    return {"rows": "ok", "k": "ok", "mxfp4_k": "ok", "k_error": msg, **errors}


def _moe_shard_types(model, n_ranks):
    from mlx_fp4 import distributed as D
    from mlx_fp4.nn import FP4SwitchLinear

    layer = model.model.layers[0]
    glu = layer.mlp.switch_mlp
    for name, shape in (("gate_proj", (8, 32 // n_ranks, 64 // 8)), ("up_proj", (8, 32 // n_ranks, 64 // 8)),
                        ("down_proj", (8, 64, 32 // n_ranks // 8))):
        sl = getattr(glu, name)
        assert type(sl) is FP4SwitchLinear, (name, type(sl))
        assert tuple(sl.weight.shape) == shape, (name, sl.weight.shape)
        assert sl.global_scale is not None and sl.global_scale.shape == (8,), name
    assert type(layer.self_attn.q_proj) is D.FP4AllToShardedLinear
    assert type(layer.self_attn.o_proj) is D.FP4ShardedToAllLinear
    assert layer.mlp.sharding_group is not None


def _check_moe_model(group, dtype, fuse):
    from mlx_fp4 import nn as fnn

    model = _tiny_qwen3_moe(dtype)
    ref, out = _sharded_vs_unsharded(group, model, fnn.fuse_switch_glu if fuse else None)
    _moe_shard_types(model, group.size())
    return _compare_logits(ref, out, dtype, f"qwen3-moe {dtype} fused_switch_glu={fuse}")


def check_moe_shard_then_convert(group):
    """Plain model.shard() of the float MoE model (experts split in place), then
    mlx_fp4.distributed.quantize(global_scale=True): the bytes and per-expert global scales of
    quantize-then-shard_model, and the same logits."""
    from mlx_fp4.nn import FP4SwitchLinear

    a, b, ref, out = _both_orders(group, _tiny_qwen3_moe)
    mods_a = dict(a.named_modules())
    n_checked = 0
    for path, m in b.named_modules():
        if isinstance(m, FP4SwitchLinear):
            ma = mods_a[path]
            for key in ("weight", "scales", "global_scale"):
                assert mx.array_equal(ma[key], m[key]).item(), f"{path}.{key} differs"
            n_checked += 1
    assert n_checked == 2 * 3, n_checked
    return f"{n_checked} sharded expert layers bit-identical; " + _compare_logits(
        ref, out, mx.float32, "moe shard-then-convert"
    )


def check_moe_errors(group):
    """What cannot be split exactly raises on every rank, naming the layer: experts with K off
    the 16-element blocks (moe_intermediate 48 -> 24 per rank) through shard_model, and an MLX
    nvfp4 model with per-expert global scales that plain model.shard() split along the experts
    (refused by mlx_fp4.distributed.quantize)."""
    from mlx_fp4 import distributed as D
    from mlx_fp4 import nn as fnn

    msgs = {}
    model = _tiny_qwen3_moe(mx.float32, moe_intermediate_size=48)
    fnn.quantize(model, global_scale=True, progress=False)
    try:
        D.shard_model(model, group)
    except ValueError as e:
        msgs["shard_model"] = str(e)
    from mlx_fp4.nn import FP4SwitchLinear

    m2 = _tiny_qwen3_moe(mx.float32)
    for layer in m2.model.layers:  # mlx-lm's nvfp4 experts with per-expert global scales
        glu = layer.mlp.switch_mlp
        for name in ("gate_proj", "up_proj", "down_proj"):
            fp4 = FP4SwitchLinear.from_switch_linear(getattr(glu, name), global_scale=True)
            setattr(glu, name, _as_mlx_switch(fp4))
    nn.quantize(m2, group_size=16, bits=4, mode="nvfp4", class_predicate=lambda p, m: isinstance(m, nn.Linear))
    m2.shard(group)  # MLX's shard_inplace splits global_scale [8] into [4]
    gs_shape = tuple(m2.model.layers[0].mlp.switch_mlp.gate_proj.global_scale.shape)
    try:
        D.quantize(m2, progress=False, group=group)
    except ValueError as e:
        msgs["quantize"] = str(e)
    assert "shard_model" in msgs and "quantize" in msgs, msgs
    assert "16-element" in msgs["shard_model"] and "switch_mlp" in msgs["shard_model"], msgs
    assert "per-expert global scales" in msgs["quantize"], msgs
    msgs["stock_shard_global_scale_shape"] = list(gs_shape)
    return msgs


def _as_mlx_switch(sl):
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear

    q = QuantizedSwitchLinear(sl.input_dims, sl.output_dims, sl.num_experts, bias=False,
                              group_size=16, bits=4, mode="nvfp4")
    q.weight, q.scales, q.global_scale = sl.weight, sl.scales, sl.global_scale
    q.freeze()
    return q
