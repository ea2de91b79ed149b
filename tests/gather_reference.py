"""Float64 reference of the gathered (mixture-of-experts) W4A16 matmul, from reference.py only.

out[b] = epilogue(gs[e] / 2688 * (x[lhs[b]] @ W[e].T)), e = rhs[b]: mx.gather_qmm(transpose=True,
mode="nvfp4") semantics, global scale in MLX's convention (the tensor amax). Nothing here
imports mlx_fp4.
"""

import numpy as np

import reference as ref


def stacked_bytes(w):
    """Stacked packed weights [E..., N, words or bytes] as uint8 [E, N, bytes]."""
    a = np.ascontiguousarray(ref.to_numpy(w))
    lead = a.shape[:-2]
    flat = a.reshape(-1, a.shape[-1])
    b = ref.packed_bytes(flat)
    e = int(np.prod(lead)) if lead else 1
    return b.reshape(e, a.shape[-2], b.shape[-1])


def gather_matmul_with_magnitude(x, w, scales, lhs=None, rhs=None, global_scale=None, mode="nvfp4"):
    """(acc, mag): float64 [B..., M, N] accumulators after the multiplier and |gs| sum|x w|."""
    xf = ref.to_numpy(x)
    k = xf.shape[-1]
    wb = stacked_bytes(w)
    s = np.ascontiguousarray(ref.to_numpy(scales)).astype(np.uint8)
    s = s.reshape(-1, s.shape[-2], s.shape[-1])
    experts = [ref.decode_weights(wb[e], s[e], k, mode=mode) for e in range(wb.shape[0])]
    xb = xf.shape[:-2]
    wlead = ref.to_numpy(w).shape[:-2]
    x_flat = xf.reshape(-1, xf.shape[-2], k)
    if lhs is None and rhs is None:
        both = np.broadcast_shapes(xb, wlead)
        lhs_a = np.broadcast_to(np.arange(x_flat.shape[0]).reshape(xb), both)
        rhs_a = np.broadcast_to(np.arange(len(experts)).reshape(wlead), both)
    else:
        lhs_a = np.arange(x_flat.shape[0]).reshape(xb) if lhs is None else np.asarray(ref.to_numpy(lhs))
        rhs_a = np.arange(len(experts)).reshape(wlead) if rhs is None else np.asarray(ref.to_numpy(rhs))
        lhs_a, rhs_a = np.broadcast_arrays(lhs_a, rhs_a)
    mult = None
    if global_scale is not None:
        g = np.asarray(ref.to_numpy(global_scale), dtype=np.float32).reshape(-1)
        mult = (g / np.float32(ref.GLOBAL_SCALE_DENOMINATOR)).astype(np.float64)  # fp32, as the op
    n = experts[0].shape[0] if experts else ref.to_numpy(w).shape[-2]
    acc = np.zeros(lhs_a.shape + (xf.shape[-2], n))
    mag = np.zeros_like(acc)
    with np.errstate(invalid="ignore", over="ignore"):
        for b in np.ndindex(lhs_a.shape):
            xm = x_flat[lhs_a[b]]
            e = int(rhs_a[b])
            wm = experts[e]
            acc[b] = xm @ wm.T
            mag[b] = np.abs(xm) @ np.abs(wm).T
            if mult is not None:
                c = mult[e] if mult.size > 1 else mult[0]
                acc[b] *= c
                mag[b] *= abs(c)
    return acc, mag
