"""Draw variance: equally good NVFP4 quantizations (global scale = amax * f, f near 1) of SmolLM2."""
import sys
import mlx.core as mx, mlx.nn as nn
from mlx_fp4.bench import quality as Q
from mlx_fp4.convert import quantize

def gs_factor(f):
    def q(model):
        def pred(path, m):
            if isinstance(m, nn.Linear):
                return {"global_scale": mx.max(mx.abs(m.weight.astype(mx.float32))).item() * f}
            return False
        return quantize(model, class_predicate=pred, progress=False)
    return q

names = []
for f in (0.71, 0.83, 1.19, 1.41):
    n = f"ours_gs_x{f}"
    Q.VARIANTS[n] = (f"ours nvfp4, global_scale = amax x {f}", gs_factor(f))
    names.append(n)
sys.exit(Q.main(["--max-tokens", "1025", "--no-plot", "--out", "/tmp/q2", "--variants", "bf16", *names]))
