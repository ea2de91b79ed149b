// The gathered W4A16 matmul on Apple GPUs (mixture-of-experts):
// out[p] = epilogue(mult[e] * (x[lhs[p]] @ dequant(w[e], scales[e])^T)), e = rhs[p]; NVFP4 or
// MXFP4 scales (kMetalFlagMxfp4, set by the dense plan from the problem's mode).
// One threadgroup per (weight-row tile, pair): the dense GEMV's block loop (w4a16_gemv.metal,
// same decode and reduction order) on the pair's expert and x matrix, one row of x at a time;
// for sorted prefill a threadgroup per kMetalGatherRun pairs, one pass of that many rows when
// they are a run of one expert (tiling_metal.h).
// Out-of-range indices: the pair's outputs are NaN and nothing is read through them.
// Registers only, no threadgroup memory or barrier. The file must stay ASCII.
#include "gather_kernel_abi.h"
#include "w4a16_device.h"
#include "w4a16_gemv.metal"

// One pair on this simdgroup's R weight rows: every row of its x matrix, one at a time.
template <typename XT, typename OutT, int R>
inline void gather_pair(
    device const XT* x, device const uchar* w, device const uchar* scales, device OutT* out,
    constant GatherMetalParams& g, device const float* gscale, device const uchar* op0,
    device const uchar* op1, device const uchar* op2, device const uchar* op3, device const uint* lhs,
    device const uint* rhs, int pair, int n0, int lane) {
  constant W4A16MetalParams& p = g.mm;
  const uint l = lhs[pair];
  const uint e = rhs[pair];
  if (l >= uint(g.x_batches) || e >= uint(g.experts)) {
    for (int i = lane; i < p.m * R; i += kMetalSimdWidth) {
      const int col = n0 + i % R;
      if (col < p.n) {
        out[(long(pair) * p.m + i / R) * p.n + col] = OutT(fp4_math::bits_to_float(0x7FC00000u));  // NaN
      }
    }
    return;
  }
  GemvRows<R> rows;
  for (int r = 0; r < R; ++r) {
    const long wrow = min(n0 + r, p.n - 1);  // rows past N clamped: read, never stored
    rows.w[r] = w + long(e) * g.w_expert_bytes + wrow * p.w_row_bytes;
    rows.s[r] = scales + long(e) * g.scale_expert_bytes + wrow * p.scale_row_bytes;
  }
  device const XT* xm = x + long(l) * p.m * p.k;
  device const float* mult = gscale + (g.multiplier_per_expert != 0 ? e : 0u);
  for (int mi = 0; mi < p.m; ++mi) {
    GemvAcc<1, R> acc;
    for (int r = 0; r < R; ++r) {
      acc.v[0][r] = 0.0f;
    }
    // one row of x per pass (MT = 1); the scale format as in the dense GEMV (uniform branch)
    if ((p.flags & kMetalFlagMxfp4) != 0) {
      gemv_accumulate<XT, 1, R, true>(acc, xm, rows, p, mi, 1, lane);
    } else {
      gemv_accumulate<XT, 1, R, false>(acc, xm, rows, p, mi, 1, lane);
    }
    for (int r = 0; r < R; ++r) {
      const float v = simd_sum(acc.v[0][r]);
      if (lane == 0 && n0 + r < p.n) {
        const int row = pair * p.m + mi;  // the output row: epilogue operands are indexed by it
        out[long(row) * p.n + n0 + r] = OutT(finish_value(v, row, n0 + r, p, mult, op0, op1, op2, op3));
      }
    }
  }
}

// RUN pairs per threadgroup row (tg.y): RUN == 1 one pair; RUN > 1 (kMetalGatherRun) a run of
// one expert with consecutive x matrices of one row each is one GEMV pass of RUN rows, anything
// else falls back to the pairs one by one (the checks read only indices, uniformly).
template <typename XT, typename OutT, int RUN>
[[max_total_threads_per_threadgroup(kMetalGemvThreads)]] [[kernel]] void gather_w4a16_gemv(
    device const XT* x [[buffer(kMetalBufX)]],
    device const uchar* w [[buffer(kMetalBufW)]],
    device const uchar* scales [[buffer(kMetalBufScales)]],
    device OutT* out [[buffer(kMetalBufOut)]],
    constant GatherMetalParams& g [[buffer(kMetalBufParams)]],
    device const float* gscale [[buffer(kMetalBufGlobalScale)]],
    device const uchar* op0 [[buffer(kMetalBufOperand0)]],
    device const uchar* op1 [[buffer(kMetalBufOperand1)]],
    device const uchar* op2 [[buffer(kMetalBufOperand2)]],
    device const uchar* op3 [[buffer(kMetalBufOperand3)]],
    device const uint* lhs [[buffer(kMetalGatherBufLhs)]],
    device const uint* rhs [[buffer(kMetalGatherBufRhs)]],
    uint2 tg [[threadgroup_position_in_grid]],
    uint sgid [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]) {
  constexpr int R = metal_gemv_rows(RUN);
  constant W4A16MetalParams& p = g.mm;
  const int first = int(tg.y) * RUN;
  const int count = min(RUN, g.pairs - first);
  const int n0 = (int(tg.x) * kMetalGemvSimdgroups + int(sgid)) * R;
  if (n0 >= p.n) {
    return;  // the whole simdgroup leaves; no barrier follows
  }
  const uint l0 = lhs[first];
  const uint e0 = rhs[first];
  bool run = RUN > 1 && count == RUN && p.m == 1 && l0 < uint(g.x_batches) && e0 < uint(g.experts);
  for (int i = 1; run && i < RUN; ++i) {
    run = rhs[first + i] == e0 && lhs[first + i] == l0 + uint(i);
  }
  if (!run) {
    for (int i = 0; i < count; ++i) {
      gather_pair<XT, OutT, R>(x, w, scales, out, g, gscale, op0, op1, op2, op3, lhs, rhs, first + i, n0, int(lane));
    }
    return;
  }
  GemvRows<R> rows;
  for (int r = 0; r < R; ++r) {
    const long wrow = min(n0 + r, p.n - 1);
    rows.w[r] = w + long(e0) * g.w_expert_bytes + wrow * p.w_row_bytes;
    rows.s[r] = scales + long(e0) * g.scale_expert_bytes + wrow * p.scale_row_bytes;
  }
  GemvAcc<RUN, R> acc;
  for (int mi = 0; mi < RUN; ++mi) {
    for (int r = 0; r < R; ++r) {
      acc.v[mi][r] = 0.0f;
    }
  }
  // The run's x matrices are consecutive rows from x matrix l0 (p.m == 1).
  device const XT* xr = x + long(l0) * p.k;
  if ((p.flags & kMetalFlagMxfp4) != 0) {
    gemv_accumulate<XT, RUN, R, true>(acc, xr, rows, p, 0, RUN, int(lane));
  } else {
    gemv_accumulate<XT, RUN, R, false>(acc, xr, rows, p, 0, RUN, int(lane));
  }
  device const float* mult = gscale + (g.multiplier_per_expert != 0 ? e0 : 0u);
  for (int mi = 0; mi < RUN; ++mi) {
    for (int r = 0; r < R; ++r) {
      const float v = simd_sum(acc.v[mi][r]);
      if (lane == 0 && n0 + r < p.n) {
        const int row = first + mi;  // one row per pair: the pair's output row
        out[long(row) * p.n + n0 + r] = OutT(finish_value(v, row, n0 + r, p, mult, op0, op1, op2, op3));
      }
    }
  }
}
