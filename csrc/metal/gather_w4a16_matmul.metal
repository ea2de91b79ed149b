// The gathered W4A16 matmul on Apple GPUs (mixture-of-experts):
// out[p] = epilogue(mult[e] * (x[lhs[p]] @ dequant(w[e], scales[e])^T)), e = rhs[p]; NVFP4 or
// MXFP4 scales (kMetalFlagMxfp4, set by the dense plan from the problem's mode).
// One threadgroup per (weight-row tile, pair): the dense GEMV's block loop (w4a16_gemv.metal,
// same decode and reduction order) on the pair's expert and x matrix, one row of x at a time;
// for sorted prefill a threadgroup per kMetalGatherRun pairs, one pass per run of one expert in
// them (tiling_metal.h).
// Sorted prefill with enough rows per expert (gather_metal_kernel): gather_w4a16_gemm, the dense
// fused GEMM's tile (w4a16_matmul.metal) over BM consecutive pairs, once per expert among them.
// Out-of-range indices: the pair's outputs are NaN and nothing is read through them.
// The GEMV kernel: registers only, no threadgroup memory or barrier. The file must stay ASCII.
#include "gather_kernel_abi.h"
#include "w4a16_device.h"
#include "w4a16_gemv.metal"
#include "w4a16_matmul.metal"

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
  device const float* mult = gscale + (g.global_scale_per_expert != 0 ? e : 0u);
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
  device const float* mult = gscale + (g.global_scale_per_expert != 0 ? e : 0u);
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

// ---------------------------------------------------------------------------------------------
// Sorted prefill: one threadgroup per (64 weight rows, BM consecutive pairs of one row each). Each
// run of one in-range expert among the pairs is one pass of the dense GEMM's strips over that
// expert's weights into fresh accumulators, which are then added into the rows of the run (each
// lane's fragment rows are whole rows: rows of other runs keep their own sums). Rows take x row
// lhs[pair] (any order); the runs read only rhs and are the same for every thread (uniform
// branches around the strips' barriers). A run per expert present: sorted indices give few.
template <typename XT, typename OutT, int BM, int BK, bool MX>
inline void gather_gemm_tile(
    device const XT* x, device const uchar* w, device const uchar* scales, device OutT* out,
    constant GatherMetalParams& g, device const float* gscale, device const uchar* op0,
    device const uchar* op1, device const uchar* op2, device const uchar* op3, device const uint* lhs,
    device const uint* rhs, threadgroup half4* bs4, uint2 tg, uint tid, uint sgid, uint lane) {
  constexpr int kAcc = kMetalSgFrags * kMetalSgFrags;
  constant W4A16MetalParams& p = g.mm;
  const int m0 = int(tg.y) * BM;
  const int n0 = int(tg.x) * kMetalBN;
  const int count = min(BM, g.pairs - m0);
  const int sg_m = int(sgid) / kMetalSgN;
  const int sg_n = int(sgid) % kMetalSgN;
  // Fragment coordinates of this lane, as in the dense tile.
  const short qid = short(lane / 4u);
  const short fm = short((qid & 4) + short((lane / 2u) % 4u));
  const short fn = short((qid & 2) * 2 + short(lane % 2u) * 2);
  ARows a;
  int local[kMetalSgFrags];  // the fragment rows' pairs, from m0
  for (int i = 0; i < kMetalSgFrags; ++i) {
    local[i] = sg_m * kMetalSgTile + i * kMetalFrag + fm;
    const uint l = lhs[m0 + min(local[i], count - 1)];
    a.off[i] = long(l < uint(g.x_batches) ? l : 0u) * p.k;  // a bad lhs: row 0 read, NaN stored
  }
  a.live = live_frag_rows(sg_m * kMetalSgTile, count);
  simdgroup_float8x8 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) {
    acc[i] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
  }
  threadgroup typename GemmTile<MX>::T* bs = (threadgroup typename GemmTile<MX>::T*)bs4;
  const bool w_fast = (n0 + kMetalBN <= p.n) && fc_gemm_w_vec8;
  const int strips = (p.k + BK - 1) / BK;
  for (int i = 0; i < count;) {
    const uint e = rhs[m0 + i];
    int j = i + 1;
    while (j < count && rhs[m0 + j] == e) {
      ++j;
    }
    if (e < uint(g.experts)) {
      simdgroup_float8x8 run[kAcc];
      for (int f = 0; f < kAcc; ++f) {
        run[f] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
      }
      gemm_strips_double_buffered<XT, BK, MX>(run, bs, x, a, w + long(e) * g.w_expert_bytes,
                                              scales + long(e) * g.scale_expert_bytes, p, n0, 0, strips, w_fast,
                                              fc_gemm_x_vec2, tid, fm, fn, sg_n);
      for (int fi = 0; fi < kMetalSgFrags; ++fi) {
        if (local[fi] >= i && local[fi] < j) {
          for (int fj = 0; fj < kMetalSgFrags; ++fj) {
            acc[fi * kMetalSgFrags + fj].thread_elements()[0] += run[fi * kMetalSgFrags + fj].thread_elements()[0];
            acc[fi * kMetalSgFrags + fj].thread_elements()[1] += run[fi * kMetalSgFrags + fj].thread_elements()[1];
          }
        }
      }
    }
    i = j;
  }
  // Epilogue: the pair's output row (one row per pair), its expert's multiplier; NaN rows for
  // out-of-range pairs.
  const float nan = fp4_math::bits_to_float(0x7FC00000u);
  for (int fi = 0; fi < kMetalSgFrags; ++fi) {
    if (local[fi] >= count) {
      continue;
    }
    const int pair = m0 + local[fi];
    const uint e = rhs[pair];
    const bool ok = e < uint(g.experts) && lhs[pair] < uint(g.x_batches);
    device const float* mult = gscale + (ok && g.global_scale_per_expert != 0 ? e : 0u);
    for (int fj = 0; fj < kMetalSgFrags; ++fj) {
      const int col = n0 + sg_n * kMetalSgTile + fj * kMetalFrag + fn;
      if (col >= p.n) {
        continue;
      }
      const bool two = col + 1 < p.n;
      thread simdgroup_float8x8& r = acc[fi * kMetalSgFrags + fj];
      const float v0 = ok ? finish_value(r.thread_elements()[0], pair, col, p, mult, op0, op1, op2, op3) : nan;
      const float v1 = !two ? 0.0f
                       : ok ? finish_value(r.thread_elements()[1], pair, col + 1, p, mult, op0, op1, op2, op3)
                            : nan;
      store_lane_pair(out + long(pair) * p.n + col, v0, v1, two, fc_gemm_out_vec2);
    }
  }
}

template <typename XT, typename OutT, int BM, int BK>
[[max_total_threads_per_threadgroup(kMetalGemmMaxThreads)]] [[kernel]] void gather_w4a16_gemm(
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
    uint tid [[thread_index_in_threadgroup]],
    uint sgid [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]) {
  // Two B buffers (the double-buffered strips); 8-byte elements as in w4a16_gemm.
  threadgroup half4 bs4[2 * kMetalBN * (BK + kMetalBPad) / 4];
  if (fc_gemm_mxfp4) {  // resolved at pipeline creation
    gather_gemm_tile<XT, OutT, BM, BK, true>(x, w, scales, out, g, gscale, op0, op1, op2, op3, lhs, rhs, bs4, tg,
                                             tid, sgid, lane);
  } else {
    gather_gemm_tile<XT, OutT, BM, BK, false>(x, w, scales, out, g, gscale, op0, op1, op2, op3, lhs, rhs, bs4, tg,
                                              tid, sgid, lane);
  }
}
