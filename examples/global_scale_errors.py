"""Relative weight error ||W - deq(Q(W))|| / ||W|| of mx_fp4.nn.quantize with global_scale False / True / "auto"
on random 1024x1024 weights (the table in docs/format.md). Run: python examples/global_scale_errors.py"""
import warnings
import mlx.core as mx, mlx.nn as nn, numpy as np
from mlx_fp4 import nn as fnn
warnings.simplefilter("ignore")
rng = np.random.default_rng(0)
n = k = 1024
print("| weights | sigma | False | True | auto picks | auto error |\n|---|---|---|---|---|---|")
for name, gen in [("normal", lambda s: rng.standard_normal((n, k)) * s),
                  ("student-t, 3 dof", lambda s: rng.standard_t(3, (n, k)) * s / np.sqrt(3))]:
    for s in [2e-1, 2e-2, 1e-2, 2e-3, 2e-4]:
        w = mx.array(gen(s).astype(np.float32))
        res = {}
        for gs in (False, True, "auto"):
            m = nn.Sequential(nn.Linear(k, n, bias=False)); m.layers[0].weight = w
            r = fnn.quantize(m, global_scale=gs, progress=False)
            res[gs] = (r.errors["layers.0"], r.converted["layers.0"])
        pick = "global scale" if res["auto"][1].endswith("scale") else "none"
        print(f"| {name} | {s:g} | {res[False][0]:.4f} | {res[True][0]:.4f} | {pick} | {res['auto'][0]:.4f} |")
