"""Shared helpers of the tensor-parallel worker (tests/distributed_worker.py and its MoE
checks): FP4 layers and tiny models, the float64-reference check, logits comparison and the two
convert/shard orders."""

import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np

# Sharded vs unsharded logits, relative to max |logit| of the unsharded model. Both runs
# make the same operations except the order of fp32 sums in the sharded-to-all layers
# (and bf16 models then round the activations to bf16, where a changed last fp32 bit can
# flip one bf16 rounding, which the following layers carry on). Bounds: fp32 models
# 2^7 * u32 (measured 7 u32 on x86-64), bf16 models 8 * u_bf16 (measured 1.6 u_bf16). A real
# fault (bias or global scale applied twice or not at all, a wrong slice) is O(1).
MODEL_TOL = {mx.float32: 2.0**7 * 2.0**-24, mx.bfloat16: 8 * 2.0**-8}


# --------------------------------------------------------------------------- helpers
def _fp4_linear(k, n, *, bias=True, dtype=mx.float32, seed=0, mode="nvfp4"):
    """An FP4Linear of a random float layer: nvfp4 with a global scale, or mxfp4 (none)."""
    import common
    from mlx_fp4.nn import FP4Linear

    g = common.rng("dist-linear", k, n, bias, seed, *(() if mode == "nvfp4" else (mode,)))
    lin = nn.Linear(k, n, bias=bias)
    lin.weight = mx.array(common.rand_float_weights(n, k, g, scale=1.0 / np.sqrt(k)))
    if bias:
        lin.bias = mx.array(g.standard_normal(n).astype(np.float32)).astype(dtype)
    return FP4Linear.from_linear(lin, mode=mode, global_scale=mode == "nvfp4")


def _expect_value_error(msgs, name, fn):
    """Runs fn, which must raise ValueError; its message goes to msgs[name]."""
    try:
        fn()
    except ValueError as e:
        msgs[name] = str(e)
        return
    raise AssertionError(f"{name}: no ValueError")


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
        global_scale=layer.get("global_scale"),
        epilogue=epi or None,
        out_dtype=out.dtype,
        mode=layer.mode,
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


def _sharded_vs_unsharded(group, model, fuse, mode="nvfp4"):
    """Convert (nvfp4: with global scales; mxfp4 has none) and fuse, logits, shard_model, logits
    again."""
    from mlx_fp4 import distributed as D
    from mlx_fp4 import nn as fnn

    fnn.quantize(model, mode=mode, global_scale=mode == "nvfp4", progress=False)
    if fuse is not None:
        fuse(model)
    tokens = mx.array(TOKENS)
    ref = model(tokens)
    mx.eval(ref)
    D.shard_model(model, group)
    out = model(tokens)
    mx.eval(out)
    return ref, out


def _both_orders(group, build, mode="nvfp4"):
    """(a, b, ref, out): ``a`` converted (nvfp4: with global scales) then shard_model-ed, ``b``
    sharded by plain model.shard() (float) then mlx_fp4.distributed.quantize-d; ref = a's unsharded
    logits, out = b's. Asserts that a and b give the same logits."""
    from mlx_fp4 import distributed as D
    from mlx_fp4 import nn as fnn

    gs = mode == "nvfp4"
    tokens = mx.array(TOKENS)
    a = build(mx.float32)
    fnn.quantize(a, mode=mode, global_scale=gs, progress=False)
    ref = a(tokens)
    D.shard_model(a, group)
    b = build(mx.float32)
    b.shard(group)  # plain mlx-lm / MLX sharding of the float model
    D.quantize(b, mode=mode, global_scale=gs, progress=False, group=group)  # collective (max of the amaxes)
    out, out_a = b(tokens), a(tokens)
    mx.eval(ref, out, out_a)
    assert mx.array_equal(out, out_a).item(), "same bytes must give the same logits"
    return a, b, ref, out
