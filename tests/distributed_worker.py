"""One rank of the tensor-parallel tests; started by tests/test_distributed.py as

    mlx.launch -n 2 --backend ring -p PORT --python PY tests/distributed_worker.py OUT_DIR

Every rank runs every check in the same order and writes OUT_DIR/rank<r>.json after each
one ({"initialized": ..., "checks": {name: {"ok", "detail", "seconds"}}}), so a hang or a
crash still leaves what ran. Inside a check all collectives come before the assertions, so
a failure on one rank does not leave the other waiting in a collective.

Layer outputs are checked against the float64 reference (tests/reference.py) within the
tolerance table (tests/common.py): a sharded layer does the same math as the unsharded one
with the fp32 sums in another order, which the table's bounds (any summation order) cover.
Model logits (many layers, nonlinear) are compared with the unsharded FP4 model within the
MODEL_TOL below.
"""

import json
import os
import sys
import time
import traceback

import mlx.core as mx
import mlx.nn as nn
import numpy as np

OUT = sys.argv[1] if len(sys.argv) > 1 else "."
STATE = {"rank": None, "initialized": False, "checks": {}}

# Sharded vs unsharded logits, relative to max |logit| of the unsharded model. Both runs
# make the same operations except the order of fp32 sums in the sharded-to-all layers
# (and bf16 models then round the activations to bf16, where a changed last fp32 bit can
# flip one bf16 rounding, which the following layers carry on). Bounds: fp32 models
# 2^7 * u32 (measured 7 u32 on x86-64), bf16 models 8 * u_bf16 (measured 1.6 u_bf16). A real
# fault (bias or global scale applied twice or not at all, a wrong slice) is O(1).
MODEL_TOL = {mx.float32: 2.0**7 * 2.0**-24, mx.bfloat16: 8 * 2.0**-8}


def _write():
    if STATE["rank"] is None:
        return
    path = os.path.join(OUT, f"rank{STATE['rank']}.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(STATE, f, indent=1)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- helpers
def _fp4_linear(k, n, *, bias=True, dtype=mx.float32, seed=0):
    import common
    from mlx_fp4.nn import FP4Linear

    g = common.rng("dist-linear", k, n, bias, seed)
    lin = nn.Linear(k, n, bias=bias)
    lin.weight = mx.array(common.rand_float_weights(n, k, g, scale=1.0 / np.sqrt(k)))
    if bias:
        lin.bias = mx.array(g.standard_normal(n).astype(np.float32)).astype(dtype)
    return FP4Linear.from_linear(lin, global_scale=True)


def _x(m, k, dtype, seed=0):
    import common

    return common.rand_x((m, k), dtype, common.rng("dist-x", m, k, seed))


def _pieces(total, segments, n, r):
    """Rank r's [start, stop) pieces: part r of each of `segments` equal segments."""
    seg = total // segments
    part = seg // n
    return [(s * seg + r * part, s * seg + (r + 1) * part) for s in range(segments)]


def _check_against_table(out, x, layer, *, rows=None, extra_epilogue=()):
    """`out` = layer restricted to `rows` (output rows) vs the float64 reference of the
    unsharded layer's own bytes (sliced here with numpy, independently of the code under
    test), global scale and bias included."""
    import common

    w = np.array(layer.weight)
    s = np.array(layer.scales)
    bias = layer.get("bias")
    if rows is not None:
        w, s = w[rows], s[rows]
        bias = None if bias is None else bias[mx.array(rows)]
    epi = ([] if bias is None else [("add", bias)]) + list(extra_epilogue)
    common.check_matmul(
        out,
        x,
        mx.array(w),
        mx.array(s),
        global_scale=layer.global_scale,
        epilogue=epi or None,
        out_dtype=out.dtype,
    )


def _import_llama():
    """mlx_lm.models.llama without running mlx_lm/__init__.py, which imports transformers
    (3-10 s per rank on a 2-core CI machine) for things these checks never use."""
    if "mlx_lm" not in sys.modules:
        import importlib.util
        import types

        spec = importlib.util.find_spec("mlx_lm")
        if spec is not None and spec.submodule_search_locations:
            pkg = types.ModuleType("mlx_lm")
            pkg.__path__ = list(spec.submodule_search_locations)
            pkg.__spec__ = spec
            sys.modules["mlx_lm"] = pkg
    from mlx_lm.models import llama

    return llama


def _tiny_llama(dtype, intermediate=128, seed=0):
    llama = _import_llama()

    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=intermediate,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=256,
        attention_bias=True,
        mlp_bias=True,
        tie_word_embeddings=False,
    )
    mx.random.seed(seed)
    model = llama.Model(args)
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


TOKENS = [[1, 5, 17, 42, 99, 3, 250, 7, 64, 128, 11, 200]]


def _compare_logits(ref, out, dtype, what):
    ref64 = np.array(ref.astype(mx.float32)).astype(np.float64)
    out64 = np.array(out.astype(mx.float32)).astype(np.float64)
    scale = np.abs(ref64).max()
    err = np.abs(ref64 - out64).max() / scale
    tol = MODEL_TOL[dtype]
    assert np.isfinite(out64).all(), f"{what}: non-finite logits"
    assert err <= tol, f"{what}: max |diff| / max |logit| = {err:.3g} > {tol:.3g}"
    return f"{what}: max|diff|/max|logit| = {err:.3g} (tol {tol:.3g}, max|logit| {scale:.3g})"


# --------------------------------------------------------------------------- checks
def check_all_to_sharded_layer(group):
    from mlx_fp4 import distributed as D

    n_ranks, r = group.size(), group.rank()
    details = []
    for dtype in (mx.float32, mx.bfloat16):
        for segments in (1, 3):
            k, n = 64, 96
            layer = _fp4_linear(k, n, dtype=dtype, seed=segments)
            x = _x(5, k, dtype)
            sl = D.shard_linear(layer, "all-to-sharded", segments=segments, group=group)
            y = sl(x)
            # the fused SwiGLU hook: more epilogue ops after the fused bias, on the local slice
            t = _x(5, n // n_ranks, dtype, seed=7)
            fused = sl.fp4_matmul(x, epilogue=["silu", ("mul", t)])
            full = None
            if segments == 1:  # gather the column slices into the full output
                full = mx.distributed.all_gather(y.T, group=group).T
            mx.eval(y, full, fused)
            assert type(sl) is D.FP4AllToShardedLinear, type(sl)
            assert sl.output_dims == n and sl.input_dims == k
            rows = [i for a, b in _pieces(n, segments, n_ranks, r) for i in range(a, b)]
            _check_against_table(y, x, layer, rows=rows)
            _check_against_table(fused, x, layer, rows=rows, extra_epilogue=["silu", ("mul", t)])
            if full is not None:
                _check_against_table(full, x, layer)
            details.append(f"{dtype} segments={segments}: ok")
    return "; ".join(details)


def check_sharded_to_all_layer(group):
    from mlx_fp4 import distributed as D

    n_ranks, r = group.size(), group.rank()
    details = []
    cases = [
        (mx.float32, 1, mx.float32),
        (mx.bfloat16, 1, mx.float32),
        (mx.bfloat16, 2, mx.float32),
        (mx.float32, 1, None),  # reduce in the output dtype
    ]
    for dtype, segments, reduce_dtype in cases:
        k, n = 128, 40
        layer = _fp4_linear(k, n, dtype=dtype, seed=10 + segments)
        x = _x(5, k, dtype)
        sl = D.shard_linear(layer, "sharded-to-all", segments=segments, group=group)
        sl.reduce_dtype = reduce_dtype
        cols = [i for a, b in _pieces(k, segments, n_ranks, r) for i in range(a, b)]
        y = sl(x[:, mx.array(cols)])
        both = mx.distributed.all_gather(y[None], group=group)
        mx.eval(y, both)
        assert type(sl) is D.FP4ShardedToAllLinear, type(sl)
        assert sl.input_dims == k and sl.output_dims == n
        assert tuple(sl.weight.shape) == (n, k // n_ranks // 8)
        assert tuple(sl.scales.shape) == (n, k // n_ranks // 16)
        assert tuple(sl.bias.shape) == (n,), "the bias of sharded-to-all is not split"
        assert sl.global_scale is not None and sl.global_scale.item() == layer.global_scale.item()
        assert sl["global_scale"].shape == (1,), "the global scale is copied whole, never split"
        # bias once and global scale once: both are inside the reference
        _check_against_table(y, x, layer)
        assert mx.array_equal(both[0], both[-1]).item(), "ranks disagree after all_sum"
        details.append(f"{dtype} segments={segments} reduce={reduce_dtype}: ok")
    return "; ".join(details)


def check_kernel_is_ours(group):
    """Sharded layers (and a sharded mlx-lm model) call mlx_fp4.w4a16_matmul, never
    mx.quantized_matmul; MLX's own shard_linear would have (the trap this module avoids)."""
    from mlx_fp4 import distributed as D
    from mlx_fp4 import nn as fnn
    from mlx_fp4 import ops
    import mlx.nn.layers.distributed as mlx_dist

    calls = {"ours": 0, "mlx": 0}
    orig_ours, orig_mlx = ops.w4a16_matmul, mx.quantized_matmul

    def ours(*a, **kw):
        calls["ours"] += 1
        return orig_ours(*a, **kw)

    def mlx_qmm(*a, **kw):
        calls["mlx"] += 1
        return orig_mlx(*a, **kw)

    ops.w4a16_matmul, mx.quantized_matmul = ours, mlx_qmm  # layers call ops.w4a16_matmul
    try:
        layer = _fp4_linear(64, 32)
        x = _x(3, 64, mx.float32)
        a = D.shard_linear(layer, "all-to-sharded", group=group)(x)
        b = D.shard_linear(layer, "sharded-to-all", group=group)(x[:, :32])
        model = _tiny_llama(mx.float32)
        fnn.quantize(model, progress=False)
        D.shard_model(model, group)
        logits = model(mx.array(TOKENS))
        mx.eval(a, b, logits)
        layer_calls = calls["ours"]
        try:  # MLX's own shard_linear cannot carry the global_scale parameter: it refuses
            mlx_dist.shard_linear(layer, "all-to-sharded", group=group)
            trap = "no error"
        except ValueError as e:
            trap = f"ValueError ({e})"
    finally:
        ops.w4a16_matmul, mx.quantized_matmul = orig_ours, orig_mlx
    # 2 layers + per model layer 7 projections + lm_head
    assert calls["mlx"] == 0, f"mx.quantized_matmul called {calls['mlx']} times"
    assert layer_calls >= 2 + 2 * 7 + 1, f"w4a16_matmul called only {layer_calls} times"
    assert trap != "no error", "MLX's shard_linear silently dropped the global scale"
    return (
        f"w4a16_matmul calls {layer_calls}, quantized_matmul calls 0; "
        f"MLX's own shard_linear(FP4Linear with a global scale): {trap}"
    )


def check_shard_inplace(group):
    from mlx_fp4 import distributed as D

    n_ranks, r = group.size(), group.rank()
    # all-to-sharded in place: the layer keeps its type and computes its rows (bias fused)
    layer = _fp4_linear(64, 96)
    ref = _fp4_linear(64, 96)
    x = _x(4, 64, mx.float32)
    D.shard_inplace(layer, "all-to-sharded", group=group)
    y1 = layer(x)
    # sharded-to-all in place (no bias: an in-place layer adds its bias on every rank)
    layer2 = _fp4_linear(128, 32, bias=False)
    ref2 = _fp4_linear(128, 32, bias=False)
    xk = _x(4, 128, mx.float32)
    D.shard_inplace(layer2, "sharded-to-all", group=group)
    part = layer2(xk[:, r * 64 : (r + 1) * 64].astype(mx.float32))
    y2 = mx.distributed.all_sum(part, group=group)
    mx.eval(y1, y2)
    assert type(layer).__name__ == "FP4Linear"
    assert tuple(layer.weight.shape) == (96 // n_ranks, 64 // 8)
    assert layer.global_scale.item() == ref.global_scale.item()
    rows = list(range(r * 96 // n_ranks, (r + 1) * 96 // n_ranks))
    _check_against_table(y1, x, ref, rows=rows)
    assert tuple(layer2.weight.shape) == (32, 128 // n_ranks // 8)
    assert tuple(layer2.scales.shape) == (32, 128 // n_ranks // 16)
    _check_against_table(y2, xk, ref2)
    return "all-to-sharded and sharded-to-all in place: ok"


def check_k_block_errors(group):
    """K splits off 16-element boundaries raise the same ValueError on every rank, before
    any communication. Returns the messages (the test compares them across ranks)."""
    from mlx_fp4 import distributed as D
    from mlx_fp4 import nn as fnn

    msgs = {}

    def expect(name, fn):
        try:
            fn()
        except ValueError as e:
            msgs[name] = str(e)
            return
        raise AssertionError(f"{name}: no ValueError")

    layer48 = _fp4_linear(48, 32)  # 48 / 2 = 24 elements per rank
    layer96 = _fp4_linear(96, 32)  # segments=2: 48 per segment, 24 per rank
    expect("shard_linear", lambda: D.shard_linear(layer48, "sharded-to-all", group=group))
    expect(
        "shard_linear_segments",
        lambda: D.shard_linear(layer96, "sharded-to-all", segments=2, group=group),
    )
    expect("shard_inplace", lambda: D.shard_inplace(layer48, "sharded-to-all", group=group))
    expect("constructor", lambda: D.FP4ShardedToAllLinear(48, 32, group=group))
    assert tuple(layer48.weight.shape) == (32, 6), "a failed shard_inplace must not modify"
    model = _tiny_llama(mx.float32, intermediate=80)  # down_proj K = 80 -> 40 per rank
    fnn.quantize(model, progress=False)
    expect("shard_model", lambda: D.shard_model(model, group))
    # a split that is fine: K=96, no segments -> 48 per rank
    ok = D.shard_linear(layer96, "sharded-to-all", group=group)
    y = ok(_x(2, 48, mx.float32))
    mx.eval(y)  # a collective: every rank reaches it
    for name, m in msgs.items():
        assert "16-element" in m and "block" in m, f"{name}: unclear message {m!r}"
    assert msgs["shard_model"].startswith("model.layers.0.mlp.down_proj: "), msgs["shard_model"]
    return msgs


def _sharded_vs_unsharded(group, model, fuse):
    """Convert with global scales (and fuse), logits, shard_model, logits again."""
    from mlx_fp4 import distributed as D
    from mlx_fp4 import nn as fnn

    fnn.quantize(model, global_scale=True, progress=False)
    if fuse is not None:
        fuse(model)
    tokens = mx.array(TOKENS)
    ref = model(tokens)
    mx.eval(ref)
    D.shard_model(model, group)
    out = model(tokens)
    mx.eval(out)
    return ref, out


def _check_model(group, dtype, fuse):
    from mlx_fp4 import distributed as D
    from mlx_fp4 import nn as fnn

    model = _tiny_llama(dtype)
    ref, out = _sharded_vs_unsharded(group, model, fnn.fuse_swiglu if fuse else None)
    layer = model.model.layers[0]
    n = group.size()
    for name in ("q_proj", "k_proj", "v_proj"):
        assert type(getattr(layer.self_attn, name)) is D.FP4AllToShardedLinear, name
    assert type(layer.self_attn.o_proj) is D.FP4ShardedToAllLinear
    assert type(layer.mlp.gate_proj) is D.FP4AllToShardedLinear
    assert type(layer.mlp.up_proj) is D.FP4AllToShardedLinear
    assert type(layer.mlp.down_proj) is D.FP4ShardedToAllLinear
    assert layer.self_attn.n_heads == 4 // n and layer.self_attn.n_kv_heads == 2 // n
    assert layer.self_attn.o_proj.global_scale is not None
    return _compare_logits(ref, out, dtype, f"llama {dtype} fused_swiglu={fuse}")


def _both_orders(group, build):
    """(a, b, ref, out): ``a`` converted with global scales then shard_model-ed, ``b`` sharded by
    plain model.shard() (float) then mlx_fp4.distributed.quantize-d; ref = a's unsharded logits,
    out = b's. Asserts that a and b give the same logits."""
    from mlx_fp4 import distributed as D
    from mlx_fp4 import nn as fnn

    tokens = mx.array(TOKENS)
    a = build(mx.float32)
    fnn.quantize(a, global_scale=True, progress=False)
    ref = a(tokens)
    D.shard_model(a, group)
    b = build(mx.float32)
    b.shard(group)  # plain mlx-lm / MLX sharding of the float model
    D.quantize(b, global_scale=True, progress=False, group=group)  # collective (max of the amaxes)
    out, out_a = b(tokens), a(tokens)
    mx.eval(ref, out, out_a)
    assert mx.array_equal(out, out_a).item(), "same bytes must give the same logits"
    return a, b, ref, out


def check_shard_then_convert(group):
    """model.shard() (MLX's float sharded layers) first, mlx_fp4.distributed.quantize after:
    the same bytes and global scales as quantize first, shard after, and the same logits."""
    from mlx_fp4 import distributed as D

    a, b, ref, out = _both_orders(group, _tiny_llama)
    mods_a = dict(a.named_modules())
    n_checked = 0
    for path, m in b.named_modules():
        if isinstance(m, (D.FP4AllToShardedLinear, D.FP4ShardedToAllLinear)):
            ma = mods_a[path]
            assert type(ma) is type(m), path
            for key in ("weight", "scales", "bias"):
                assert mx.array_equal(ma[key], m[key]).item(), f"{path}.{key} differs"
            assert ma.global_scale.item() == m.global_scale.item(), f"{path}.global_scale"
            n_checked += 1
    assert n_checked == 2 * 7, n_checked
    return f"{n_checked} sharded layers bit-identical; " + _compare_logits(
        ref, out, mx.float32, "shard-then-convert"
    )


def check_mlx_nvfp4_sharded_then_wrapped(group):
    """An MLX nvfp4 model (mlx.nn.quantize(mode="nvfp4")) sharded by plain model.shard() has
    MLX's QuantizedAllToSharded/ShardedToAll layers (mx.quantized_matmul); D.quantize wraps
    them in FP4 sharded layers without copying bytes; logits match the unsharded model."""
    from mlx_fp4 import distributed as D
    from mlx_fp4 import nn as fnn
    import mlx.nn.layers.distributed as mlx_dist

    tokens = mx.array(TOKENS)
    a = _tiny_llama(mx.float32)
    nn.quantize(a, group_size=16, bits=4, mode="nvfp4", class_predicate=lambda p, m: isinstance(m, nn.Linear) and "lm_head" not in p)
    fnn.quantize(a, global_scale=False, progress=False)  # wraps the nvfp4 layers, quantizes lm_head
    ref = a(tokens)

    b = _tiny_llama(mx.float32)
    nn.quantize(b, group_size=16, bits=4, mode="nvfp4", class_predicate=lambda p, m: isinstance(m, nn.Linear) and "lm_head" not in p)
    b.shard(group)
    q = b.model.layers[0].self_attn.q_proj
    was_mlx = type(q) is mlx_dist.QuantizedAllToShardedLinear
    w_before = q.weight
    D.quantize(b, progress=False)
    out = b(tokens)
    mx.eval(ref, out)
    q2 = b.model.layers[0].self_attn.q_proj
    assert was_mlx, "plain model.shard() should give MLX's quantized sharded layer"
    assert type(q2) is D.FP4AllToShardedLinear, type(q2)
    assert q2.weight is w_before, "wrapping must not copy the bytes"
    assert type(b.model.layers[1].mlp.down_proj) is D.FP4ShardedToAllLinear
    return _compare_logits(ref, out, mx.float32, "mlx-nvfp4 shard-then-wrap")


# --------------------------------------------------------------------------- MoE
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
    from mlx_fp4.nn import FP4Linear, FP4SwitchLinear

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
        ("mxfp4_linear", lambda: D.shard_linear(FP4Linear(64, 32, mode="mxfp4"), "all-to-sharded", group=group)),
    ):
        try:
            fn()
            errors[name] = "no error"
        except ValueError as err:
            errors[name] = str(err)
    assert "32-element MXFP4 block" in errors["mxfp4_k"], errors
    assert "mode='nvfp4' only" in errors["mxfp4_linear"], errors
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


CHECKS = [
    check_all_to_sharded_layer,
    check_sharded_to_all_layer,
    check_kernel_is_ours,
    check_shard_inplace,
    check_k_block_errors,
    ("model_fp32", lambda g: _check_model(g, mx.float32, fuse=False)),
    ("model_bf16", lambda g: _check_model(g, mx.bfloat16, fuse=True)),
    check_shard_then_convert,
    check_mlx_nvfp4_sharded_then_wrapped,
    check_switch_shard_inplace,
    ("moe_model_fp32", lambda g: _check_moe_model(g, mx.float32, fuse=False)),
    ("moe_model_bf16", lambda g: _check_moe_model(g, mx.bfloat16, fuse=True)),
    check_moe_shard_then_convert,
    check_moe_errors,
]


def main():
    backend = os.environ.get("MLX_FP4_DIST_BACKEND", "ring")
    if os.environ.get("MLX_FP4_DIST_DEVICE", "cpu") == "cpu":
        mx.set_default_device(mx.cpu)
    t0 = time.perf_counter()
    try:
        group = mx.distributed.init(strict=True, backend=backend)
    except Exception as e:  # the test skips when no rank could start the backend
        STATE["rank"] = os.environ.get("MLX_RANK", "unknown")
        STATE["init_error"] = f"{type(e).__name__}: {e}"
        _write()
        return 1
    STATE.update(rank=group.rank(), size=group.size(), initialized=True, backend=backend)
    STATE["init_seconds"] = time.perf_counter() - t0
    _write()
    import mlx_fp4  # noqa: F401  (imported after init so an import error is reported too)

    only = os.environ.get("MLX_FP4_DIST_CHECKS")
    for fn in CHECKS:  # a check function, or (name, function) for a variant
        name, fn = fn if isinstance(fn, tuple) else (fn.__name__[len("check_") :], fn)
        if only and name not in only.split(","):
            continue
        t = time.perf_counter()
        try:
            detail = fn(group)
            res = {"ok": True, "detail": detail}
        except Exception:
            res = {"ok": False, "detail": traceback.format_exc()}
        res["seconds"] = round(time.perf_counter() - t, 3)
        STATE["checks"][name] = res
        _write()
    STATE["done"] = True
    STATE["total_seconds"] = round(time.perf_counter() - t0, 3)
    _write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
