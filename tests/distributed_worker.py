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
MODEL_TOL in tests/distributed_helpers.py; the MoE checks live in tests/distributed_worker_moe.py.
"""

import json
import os
import sys
import time
import traceback

import mlx.core as mx
import mlx.nn as nn

from distributed_helpers import (
    TOKENS, _both_orders, _check_against_table, _compare_logits, _expect_value_error, _fp4_linear, _pieces,
    _sharded_vs_unsharded, _tiny_llama, _x,
)
from distributed_worker_moe import (
    _check_moe_model, check_moe_errors, check_moe_shard_then_convert, check_switch_shard_inplace,
)
from distributed_worker_mxfp4 import (
    check_mxfp4_k_block_errors, check_mxfp4_layers, check_mxfp4_model, check_mxfp4_shard_then_convert,
)

OUT = sys.argv[1] if len(sys.argv) > 1 else "."
STATE = {"rank": None, "initialized": False, "checks": {}}


def _write():
    if STATE["rank"] is None:
        return
    path = os.path.join(OUT, f"rank{STATE['rank']}.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(STATE, f, indent=1)
    os.replace(tmp, path)


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
        _expect_value_error(msgs, name, fn)

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
    check_mxfp4_layers,
    check_mxfp4_k_block_errors,
    check_mxfp4_model,
    check_mxfp4_shard_then_convert,
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
