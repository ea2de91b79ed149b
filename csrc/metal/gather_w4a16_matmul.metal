// The gathered W4A16 matmul on Apple GPUs (mixture-of-experts):
// out[p] = epilogue(mult[e] * (x[lhs[p]] @ dequant(w[e], scales[e])^T)), e = rhs[p]; NVFP4 or
// MXFP4 scales (kMetalFlagMxfp4, set by the dense plan from the problem's mode).
// One threadgroup per (weight-row tile, pair): the dense GEMV's block loop (w4a16_gemv.metal,
// same decode and reduction order) on the pair's expert and x matrix, one row of x at a time;
// for sorted prefill a threadgroup per kMetalGatherRun pairs, one pass per run of one expert in
// them (tiling_metal.h).
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

// Pairs pair0 .. pair0 + rows - 1 of expert e with consecutive one-row x matrices from l (rows <=
// RUN): one GEMV pass of `rows` rows of x over the expert's weight rows.
template <typename XT, typename OutT, int RUN, int R>
inline void gather_run(
    device const XT* x, device const uchar* w, device const uchar* scales, device OutT* out,
    constant GatherMetalParams& g, device const float* gscale, device const uchar* op0,
    device const uchar* op1, device const uchar* op2, device const uchar* op3, int pair0, int rows, uint l,
    uint e, int n0, int lane) {
  constant W4A16MetalParams& p = g.mm;
  GemvRows<R> wrows;
  for (int r = 0; r < R; ++r) {
    const long wrow = min(n0 + r, p.n - 1);  // rows past N clamped: read, never stored
    wrows.w[r] = w + long(e) * g.w_expert_bytes + wrow * p.w_row_bytes;
    wrows.s[r] = scales + long(e) * g.scale_expert_bytes + wrow * p.scale_row_bytes;
  }
  GemvAcc<RUN, R> acc;
  for (int mi = 0; mi < RUN; ++mi) {
    for (int r = 0; r < R; ++r) {
      acc.v[mi][r] = 0.0f;
    }
  }
  device const XT* xr = x + long(l) * p.k;  // p.m == 1: x matrix l + i is row i from here
  if ((p.flags & kMetalFlagMxfp4) != 0) {
    gemv_accumulate<XT, RUN, R, true>(acc, xr, wrows, p, 0, rows, lane);
  } else {
    gemv_accumulate<XT, RUN, R, false>(acc, xr, wrows, p, 0, rows, lane);
  }
  device const float* mult = gscale + (g.multiplier_per_expert != 0 ? e : 0u);
  for (int mi = 0; mi < RUN; ++mi) {
    for (int r = 0; r < R; ++r) {
      const float v = simd_sum(acc.v[mi][r]);
      if (lane == 0 && mi < rows && n0 + r < p.n) {
        const int row = pair0 + mi;  // one row per pair: the pair's output row
        out[long(row) * p.n + n0 + r] = OutT(finish_value(v, row, n0 + r, p, mult, op0, op1, op2, op3));
      }
    }
  }
}

// RUN pairs per threadgroup row (tg.y): RUN == 1 one pair; RUN > 1 (kMetalGatherRun, one row
// per pair) split into runs of one in-range expert with consecutive x matrices, each one GEMV
// pass (gather_run); out-of-range pairs alone (NaN rows). The splits read only indices and are
// the same for every lane (uniform branches).
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
  for (int i = 0; i < count;) {
    const uint l = lhs[first + i];
    const uint e = rhs[first + i];
    if (RUN == 1 || p.m != 1 || l >= uint(g.x_batches) || e >= uint(g.experts)) {
      gather_pair<XT, OutT, R>(x, w, scales, out, g, gscale, op0, op1, op2, op3, lhs, rhs, first + i, n0, int(lane));
      ++i;
      continue;
    }
    int j = i + 1;
    while (j < count && rhs[first + j] == e && lhs[first + j] == l + uint(j - i)) {
      ++j;
    }
    gather_run<XT, OutT, RUN, R>(x, w, scales, out, g, gscale, op0, op1, op2, op3, first + i, j - i, l, e, n0,
                                 int(lane));
    i = j;
  }
}
