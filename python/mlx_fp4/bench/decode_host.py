"""Host-cost evidence for the decode benchmark: a matmul-free "floor" model, the node count of one
decode step, and MLX's cost per graph node.

The floor variant is the same mlx-lm model with every ``nn.Linear`` (q/k/v/o, gate/up/down,
lm_head) replaced by :class:`FloorLinear`, one graph node that keeps the output shape and its
dependence on ``x`` but does (almost) no GPU work. Its decode tok/s is an upper bound that no
matmul kernel can beat through mlx-lm + MLX: each real variant has at least one node per linear,
and a kernel node costs the host at least what a view node costs.
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
    whose output has the linear's shape and dtype and depends on ``x``.

    - ``output_dims < input_dims``: ``x[..., :output_dims]`` (a Slice: a view, no GPU kernel);
    - ``output_dims > input_dims``: ``x`` zero-padded to ``output_dims`` (a Pad: one fill+copy
      kernel over the output, e.g. 256 KB for a 128256-token lm_head);
    - equal: ``mx.contiguous(x)`` (a Contiguous: a view of an already contiguous ``x``; a plain
      no-op slice would add no node at all).
    The values are not a product (a floor for timing, not a model)."""

    def __init__(self, input_dims: int, output_dims: int):
        super().__init__()
        self.input_dims, self.output_dims = input_dims, output_dims

    def __call__(self, x: mx.array) -> mx.array:
        if self.output_dims < self.input_dims:
            return x[..., : self.output_dims]
        if self.output_dims > self.input_dims:
            return mx.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, self.output_dims - self.input_dims)])
        return mx.contiguous(x)

    def _extra_repr(self):
        return f"input_dims={self.input_dims}, output_dims={self.output_dims}"


def install_floor(model: nn.Module) -> int:
    """Replace every ``nn.Linear`` of ``model`` (in place, before its weights are evaluated, so they
    are never materialized) with a :class:`FloorLinear`; returns how many were replaced."""
    from ..layers.linear import swap_modules

    count = 0

    def make(_, m):
        nonlocal count
        if type(m) is nn.Linear:  # not subclasses (e.g. mlx-lm SwitchLinear is a separate class)
            count += 1
            out_dims, in_dims = m.weight.shape
            return FloorLinear(in_dims, out_dims)
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


def step_graph(model, prompt) -> dict:
    """Node count of one decode step (the graph ``host_profile`` times: forward of one token with a
    filled KV cache, last position, argmax), and of one decoder layer: nodes(layer 1 output) -
    nodes(layer 0 output), exact since layer 1's graph contains layer 0's."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    y = mx.argmax(model(prompt[None], cache=cache)[:, -1, :], axis=-1)
    mx.eval(y)
    layers = model.layers
    picks = [0, 1] if len(layers) > 1 else [0]
    outs, restore = _capture_layer_outputs(layers, picks)
    try:
        y = mx.argmax(model(y[:, None], cache=cache)[:, -1, :], axis=-1)
    finally:
        restore()
    step = graph_nodes(y)
    first = graph_nodes(_first_array(outs[0]))
    res = {"step": step, "layers": len(layers), "nodes_through_layer0": first["nodes"]}
    if len(picks) > 1:
        per = graph_nodes(_first_array(outs[1]))["nodes"] - first["nodes"]
        res["nodes_per_layer"] = per
        res["nodes_outside_layers"] = step["nodes"] - per * len(layers)
    mx.eval(y)
    return res


def _first_array(y):
    return y[0] if isinstance(y, (tuple, list)) else y


# ---- MLX's cost per node -------------------------------------------------------------------------


def node_cost(n: int = NODE_CHAIN, repeats: int = NODE_REPEATS) -> dict:
    """Host cost per node, model-free: a chain of ``n`` dependent ops on a 1x1x64 bf16 array, built
    (Python + MLX graph construction, clock stops before eval), then ``mx.eval``'d. Two kinds:
    "kernel" (x + 1: one tiny elementwise kernel per node) and "view" (alternating reshapes: no
    kernel). Per-node eval time of the kernel chain is an upper bound on MLX's encode/launch cost
    per node (the GPU's own time for a 64-element add is negligible, but a dependent chain also
    pays launch latency); the view chain is MLX's bookkeeping alone."""
    x = mx.zeros((1, 1, 64), mx.bfloat16)
    mx.eval(x)

    def kernel(y):
        return y + 1

    def view(y):
        return y.reshape(1, 64, 1) if y.shape[-1] == 64 else y.reshape(1, 1, 64)

    out = {"chain_nodes": n, "repeats": repeats}
    for name, op in (("kernel", kernel), ("view", view)):
        build, ev = [], []
        for _ in range(repeats + 1):  # the first chain warms up (kernels loaded), untimed
            t0 = time.perf_counter()
            y = x
            for _ in range(n):
                y = op(y)
            t1 = time.perf_counter()
            mx.eval(y)
            t2 = time.perf_counter()
            build.append(t1 - t0)
            ev.append(t2 - t1)
        out[name] = {"build_us_per_node": statistics.median(build[1:]) / n * 1e6,
                     "eval_us_per_node": statistics.median(ev[1:]) / n * 1e6}
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
    """Markdown: per (layers, variant) the step's nodes, nodes per layer, and the host profile."""
    lines = ["| layers | variant | nodes/step | nodes/layer | build ms | async_eval ms | wait ms | step ms "
             "| build+encode us/node |", "|---" * 9 + "|"]
    for p in points:
        for v in variants:
            e = p["variants"][v]
            g, prof = e.get("graph"), e.get("host_profile")
            if not g or not prof:
                continue
            per_node = (prof["build_ms"] + prof["encode_ms"]) * 1e3 / g["step"]["nodes"]
            lines.append(f"| {p['layers']} | {labels[v]} | {g['step']['nodes']} | {g.get('nodes_per_layer', '-')} "
                         f"| {prof['build_ms']:.2f} | {prof['encode_ms']:.2f} | {prof['wait_ms']:.2f} "
                         f"| {prof['step_ms']:.2f} | {per_node:.2f} |")
    return "\n".join(lines)
