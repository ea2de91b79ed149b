"""Host-cost evidence for the decode benchmark: a matmul-free "floor" model, the node count of one
decode step, and MLX's cost per graph node.

The floor variant is the same mlx-lm model with every ``nn.Linear`` (q/k/v/o, gate/up/down,
lm_head) replaced by :class:`FloorLinear`, one graph node with one trivial kernel that keeps the
output shape and its dependence on ``x`` but does (almost) no GPU work. Its decode tok/s is an upper
bound that no matmul kernel can beat through mlx-lm + MLX: a real linear is at least one node with
at least one launch (and more inputs to track) plus real GPU time, and everything else in the step
(norms, RoPE, attention, KV cache, sampling) is the same graph. ``floor_view`` (views instead of
kernels where possible) shows what the launches themselves cost.
"""

import os
import re
import statistics
import tempfile
import time
from collections import Counter

import mlx.core as mx
import mlx.nn as nn

NODE_CHAIN = 2000  # nodes in the per-node cost chain: long enough that one eval's fixed cost fades
NODE_REPEATS = 5  # chains timed per kind (median)


class FloorLinear(nn.Module):
    """A parameter-free stand-in for ``nn.Linear(input_dims, output_dims)``: exactly one graph node
    (per decode step) whose output has the linear's shape and dtype and depends on ``x``. The values
    are not a product (a floor for timing, not a model).

    ``kernel=True`` (the "floor" variant): one trivial GPU kernel per linear, as any matmul needs:
    ``mx.take_along_axis(x, idx, axis=-1)`` with a precomputed ``idx[j] = j % input_dims`` of shape
    [1, 1, output_dims] (a GatherAxis: one gather over the output, e.g. 256 KB for a 128256-token
    lm_head; inputs with leading dims other than 1 (prefill) get MLX's broadcast nodes too).

    ``kernel=False`` (the "floor_view" variant): no kernel where a view does: fewer outputs, the
    slice ``x[..., :output_dims]`` (a Slice view); equal, ``mx.contiguous(x)`` (a view of an already
    contiguous x; a no-op slice would add no node at all); more outputs (gate/up, lm_head), the same
    GatherAxis (a one-node view cannot widen the last axis)."""

    def __init__(self, input_dims: int, output_dims: int, kernel: bool = True):
        super().__init__()
        self.input_dims, self.output_dims, self.kernel = input_dims, output_dims, kernel
        # plain attributes, not parameters: the gather indices per input rank, built once
        object.__setattr__(self, "_indices", {})
        self._gather_indices(3)  # mlx-lm's [B, L, D] activations

    def _gather_indices(self, ndim: int) -> mx.array:
        idx = self._indices.get(ndim)
        if idx is None:
            n = self.output_dims
            idx = (mx.arange(n, dtype=mx.uint32) % self.input_dims).reshape((1,) * (ndim - 1) + (n,))
            mx.eval(idx)
            self._indices[ndim] = idx
        return idx

    def __call__(self, x: mx.array) -> mx.array:
        n = self.output_dims
        if self.kernel or n > self.input_dims:
            return mx.take_along_axis(x, self._gather_indices(x.ndim), axis=-1)
        return x[..., :n] if n < self.input_dims else mx.contiguous(x)

    def _extra_repr(self):
        return f"input_dims={self.input_dims}, output_dims={self.output_dims}, kernel={self.kernel}"


def install_floor(model: nn.Module, kernel: bool = True) -> int:
    """Replace every ``nn.Linear`` of ``model`` (in place, before its weights are evaluated, so they
    are never materialized) with a :class:`FloorLinear`; returns how many were replaced."""
    from ..layers.linear import swap_modules

    count = 0

    def make(_, m):
        nonlocal count
        if type(m) is nn.Linear:  # not subclasses (e.g. mlx-lm SwitchLinear is a separate class)
            count += 1
            out_dims, in_dims = m.weight.shape
            return FloorLinear(in_dims, out_dims, kernel)
        return None

    swap_modules(model, make)
    return count


class FloorSwitchGLU(nn.Module):
    """A parameter-free stand-in for mlx-lm's ``SwitchGLU`` (an MoE block's experts: gate, up, the
    activation and down for each token's top_k experts), output [..., top_k, output_dims] like the
    experts' and dependent on ``x``: one trivial kernel (a GatherAxis of x, as :class:`FloorLinear`)
    and one view (the reshape to [..., top_k, output_dims]; no single MLX op gives that shape with a
    kernel), so at decode 2 nodes where a real experts block needs at least 1. The router still runs
    (its scores weight this output), so the model keeps every node but the experts'. Its decode tok/s
    bounds what any expert implementation can reach inside that model, to within one view node per
    layer (the ``floor_experts`` variant: FP4Linear elsewhere)."""

    def __init__(self, input_dims: int, output_dims: int, top_k: int):
        super().__init__()
        self.input_dims, self.output_dims, self.top_k = input_dims, output_dims, top_k
        self.gather = FloorLinear(input_dims, top_k * output_dims, kernel=True)

    def __call__(self, x: mx.array, indices: mx.array) -> mx.array:
        return self.gather(x).reshape(*x.shape[:-1], self.top_k, self.output_dims)

    def _extra_repr(self):
        return f"input_dims={self.input_dims}, output_dims={self.output_dims}, top_k={self.top_k}"


def install_expert_floor(model: nn.Module, top_k: int) -> int:
    """Replace every mlx-lm ``SwitchGLU`` of ``model`` (in place, before its weights are evaluated)
    with a :class:`FloorSwitchGLU`; returns how many were replaced."""
    from mlx_lm.models.switch_layers import SwitchGLU

    from ..layers.linear import swap_modules

    count = 0

    def make(_, m):
        nonlocal count
        if isinstance(m, SwitchGLU):
            count += 1
            return FloorSwitchGLU(m.gate_proj.weight.shape[-1], m.down_proj.weight.shape[1], top_k)
        return None

    swap_modules(model, make)
    return count


# ---- node count ----------------------------------------------------------------------------------

_PRIMITIVE = re.compile(r'\[label ="([^"]*)", shape=rectangle\]')
_ARRAY = re.compile(r'^\{ (?:rank=(source|sink); )?"[^"]+"; \}$', re.M)


def graph_nodes(*outputs) -> dict:
    """Primitive nodes (what MLX schedules and encodes) and arrays in the unevaluated graph of
    ``outputs``, through ``mx.export_to_dot`` (MLX's Python API does not expose an array's inputs).
    Already evaluated arrays (weights, the KV cache) are graph sources, not nodes."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "graph.dot")
        mx.export_to_dot(path, *outputs)
        with open(path) as f:
            text = f.read()
    prims = _PRIMITIVE.findall(text)
    kinds = Counter(m for m in _ARRAY.findall(text))
    return {"nodes": len(prims), "arrays": sum(kinds.values()), "source_arrays": kinds["source"],
            "by_primitive": dict(sorted(Counter(prims).items(), key=lambda kv: (-kv[1], kv[0])))}


def _capture_layer_outputs(layers, picks):
    """Swap the class of ``layers[i]`` (i in ``picks``) for a subclass whose __call__ records its
    output: mlx-lm loops over its layers itself, so this is how the per-layer graph is reached
    without forking the model. Returns (outputs dict, restore function)."""
    outs, saved = {}, []
    for i in picks:
        layer = layers[i]
        base = type(layer)

        def call(self, *a, _i=i, _base=base, **k):
            y = _base.__call__(self, *a, **k)
            outs[_i] = y
            return y

        saved.append((layer, base))
        layer.__class__ = type(base.__name__, (base,), {"__call__": call})

    def restore():
        for layer, base in saved:
            layer.__class__ = base

    return outs, restore


def decode_step(model, tokens, cache):
    """The graph of one ``mlx_lm.generate.generate_step`` greedy step (its ``_step``): the model on
    ``tokens`` (1-D) with the KV cache, the last position's log-probabilities, their argmax.
    Returns (next token [1], log-probabilities [vocab]), both unevaluated."""
    logits = model(tokens[None], cache=cache)[:, -1, :]
    logprobs = logits - mx.logsumexp(logits, keepdims=True)
    return mx.argmax(logprobs, axis=-1), logprobs.squeeze(0)


def _filled_cache(model, prompt):
    """A KV cache after the prompt, and the first generated token (evaluated)."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    y, lp = decode_step(model, prompt, cache)
    mx.eval(y, lp)
    return cache, y


def host_profile(model, prompt, steps: int) -> dict:
    """Single synchronous decode steps (the graph of :func:`decode_step`, in mlx-lm's generation
    stream), each timed in three parts: ``build`` (Python + MLX graph construction: the model
    forward until its outputs exist, nothing evaluated), ``encode`` (``mx.async_eval``: MLX walks
    the graph, allocates, encodes and launches every node; the GPU is idle when it starts, since the
    previous step was waited for, so this is MLX's own host cost) and ``wait`` (the following
    ``mx.eval``: the GPU work still running after the last launch). Host-bound when ``wait`` is
    small against build + encode. Medians over ``steps``."""
    from mlx_lm.generate import generation_stream

    with mx.stream(generation_stream):
        cache, y = _filled_cache(model, prompt)
        build, encode, wait = [], [], []
        for _ in range(steps):
            t0 = time.perf_counter()
            y, lp = decode_step(model, y, cache)
            t1 = time.perf_counter()
            mx.async_eval(y, lp)
            t2 = time.perf_counter()
            mx.eval(y, lp)
            t3 = time.perf_counter()
            build.append(t1 - t0)
            encode.append(t2 - t1)
            wait.append(t3 - t2)
    med = lambda v: statistics.median(v) * 1e3  # noqa: E731
    return {"steps": steps, "build_ms": med(build), "encode_ms": med(encode), "wait_ms": med(wait),
            "step_ms": med([a + b + c for a, b, c in zip(build, encode, wait)])}


def step_graph(model, prompt) -> dict:
    """Node count of one decode step (the graph of :func:`decode_step` with a filled KV cache), and
    of one decoder layer: nodes(layer 1 output) - nodes(layer 0 output), exact since layer 1's graph
    contains layer 0's."""
    cache, y = _filled_cache(model, prompt)
    layers = model.layers
    picks = [0, 1] if len(layers) > 1 else [0]
    outs, restore = _capture_layer_outputs(layers, picks)
    try:
        y, lp = decode_step(model, y, cache)
    finally:
        restore()
    step = graph_nodes(y, lp)
    first = graph_nodes(_first_array(outs[0]))
    res = {"step": step, "layers": len(layers), "nodes_through_layer0": first["nodes"]}
    if len(picks) > 1:
        per = graph_nodes(_first_array(outs[1]))["nodes"] - first["nodes"]
        res["nodes_per_layer"] = per
        res["nodes_outside_layers"] = step["nodes"] - per * len(layers)
    mx.eval(y, lp)
    return res


def _first_array(y):
    return y[0] if isinstance(y, (tuple, list)) else y


# ---- MLX's cost per node -------------------------------------------------------------------------


def node_cost(n: int = NODE_CHAIN, repeats: int = NODE_REPEATS) -> dict:
    """Host cost per node, model-free: a chain of ``n`` dependent ops on a 1x1x64 bf16 array, built
    (Python + MLX graph construction, clock stops before eval), then ``mx.eval``'d. Two kinds:
    "kernel" (``y + one``, ``one`` an evaluated array of y's shape, so no broadcast node: one tiny
    elementwise kernel per node) and "view" (alternating reshapes: no kernel). The kernel chain's
    eval time per node bounds MLX's encode/launch cost per node from above (the GPU's own time for a
    64-element add is negligible, but a dependent chain also pays launch latency); the view chain is
    MLX's bookkeeping alone. Divided by the chain's node count as ``graph_nodes`` counts it."""
    x = mx.zeros((1, 1, 64), mx.bfloat16)
    one = mx.ones(x.shape, x.dtype)
    mx.eval(x, one)

    def kernel(y):
        return y + one

    def view(y):
        return y.reshape(1, 64, 1) if y.shape[-1] == 64 else y.reshape(1, 1, 64)

    out = {"chain_ops": n, "repeats": repeats}
    for name, op in (("kernel", kernel), ("view", view)):
        build, ev = [], []
        nodes = None
        for _ in range(repeats + 1):  # the first chain warms up (kernels loaded), untimed
            t0 = time.perf_counter()
            y = x
            for _ in range(n):
                y = op(y)
            t1 = time.perf_counter()
            if nodes is None:
                nodes = graph_nodes(y)["nodes"]
            t1b = time.perf_counter()
            mx.eval(y)
            t2 = time.perf_counter()
            build.append(t1 - t0)
            ev.append(t2 - t1b)
        us = lambda v, f: f(v[1:]) / nodes * 1e6  # noqa: E731
        # medians, and minima (the least disturbed chain: on a shared host, the better estimate)
        out[name] = {"nodes": nodes, "build_us_per_node": us(build, statistics.median),
                     "eval_us_per_node": us(ev, statistics.median), "build_us_per_node_min": us(build, min),
                     "eval_us_per_node_min": us(ev, min)}
    return out


def host_costs(profile: dict, graph: dict, cost: dict) -> dict:
    """The step's measured host time per node, and what nodes x the chain's per-node cost predicts."""
    nodes = graph["step"]["nodes"]
    k = cost["kernel"]
    return {
        "build_us_per_node": profile["build_ms"] * 1e3 / nodes,
        "encode_us_per_node": profile["encode_ms"] * 1e3 / nodes,
        "predicted_build_ms": nodes * k["build_us_per_node"] / 1e3,
        "predicted_eval_ms": nodes * k["eval_us_per_node"] / 1e3,
    }


def host_table(points, variants, labels) -> str:
    """Markdown: per (layers, variant) the step's nodes, nodes per layer, the host profile, the host
    time per node and per layer (build + encode over the step's nodes, times nodes per layer) and the
    model-free per-node cost of the chains (:func:`node_cost`), measured in that variant's process."""
    lines = ["| layers | variant | nodes/step | nodes/layer | build ms | async_eval ms | wait ms | step ms "
             "| build+encode us/node | host ms/layer | chain us/node: kernel build+eval, view build+eval |",
             "|---" * 11 + "|"]
    for p in points:
        for v in variants:
            e = p["variants"][v]
            g, prof = e.get("graph"), e.get("host_profile")
            if not g or not prof:
                continue
            per_node = (prof["build_ms"] + prof["encode_ms"]) * 1e3 / g["step"]["nodes"]
            per_layer = f"{per_node * g['nodes_per_layer'] / 1e3:.3f}" if "nodes_per_layer" in g else "-"
            c = e.get("node_cost") or {}
            chain = " / ".join(f"{c[k]['build_us_per_node']:.2f}+{c[k]['eval_us_per_node']:.2f}"
                               for k in ("kernel", "view") if k in c)
            lines.append(f"| {p['layers']} | {labels[v]} | {g['step']['nodes']} | {g.get('nodes_per_layer', '-')} "
                         f"| {prof['build_ms']:.2f} | {prof['encode_ms']:.2f} | {prof['wait_ms']:.2f} "
                         f"| {prof['step_ms']:.2f} | {per_node:.2f} | {per_layer} | {chain or '-'} |")
    return "\n".join(lines)
