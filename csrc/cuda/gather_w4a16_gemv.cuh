// GEMV kernels of the gathered W4A16 matmul (decode), fp32 FMA with the SIMT decode of
// w4a16_simt.cuh (simt_row_pass): the pair kernel (no plan; grid (weight-row tiles, pairs)) and the grouped one
// (after the plan; grid (weight-row tiles, active-expert slots): a warp streams one weight row of
// its expert once per kRowsPerPass rows of x, so each active expert's bytes are read once for all
// its pairs). Included by gather_w4a16_matmul.cu only.
#pragma once
#include "gather_w4a16_plan.cuh"

namespace mlx_fp4 {
namespace cuda {
namespace {

// R rows of x (pointers xr) against weight row n of one expert; lane 0 stores the first `live`
// rows at out_row.
template <typename XT, bool kVec, int R, int Mode>
__device__ __forceinline__ void rows_pass(const GatherArgs& a, const XT* const (&xr)[R],
                                          const int64_t (&out_row)[R], int live, const uint8_t* wrow,
                                          const uint8_t* srow, int64_t n, float mult) {
  float acc[R];
  simt_row_pass<XT, kVec, R, Mode>(wrow, srow, a.g.mm.k, xr, acc);
  if ((threadIdx.x & 31) == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r < live) {
        store_from_float(a.out, a.g.mm.out_dtype, out_row[r] * a.g.mm.n + n, gather_finish(a, acc[r], out_row[r], n, mult));
      }
    }
  }
}

// Rows [r0, r0 + R) of one expert group (clamped to the last row; extra rows are not stored).
template <typename XT, bool kVec, int R, int Mode>
__device__ __forceinline__ void group_pass(const GatherArgs& a, const PlanView& v,
                                           int64_t first, int64_t rows, int64_t r0, const uint8_t* wrow,
                                           const uint8_t* srow, int64_t n, float mult) {
  const int64_t M = a.g.mm.m, K = a.g.mm.k;
  const XT* xr[R];
  int64_t out_row[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t i = r0 + r < rows ? r0 + r : rows - 1;
    const int64_t pair = v.order[first + i / M];
    xr[r] = static_cast<const XT*>(a.x) + (int64_t(a.lhs[pair]) * M + i % M) * K;
    out_row[r] = pair * M + i % M;
  }
  const int64_t left = rows - r0;
  rows_pass<XT, kVec, R, Mode>(a, xr, out_row, left < R ? int(left) : R, wrow, srow, n, mult);
}

// Decode without a plan: grid (weight-row tiles, pairs); a warp computes one weight row of its
// pair's expert for the pair's M rows of x. Out-of-range pairs get NaN rows, nothing is read.
template <typename XT, bool kVec, int Mode>
__global__ void __launch_bounds__(kWarps * 32) gather_pairs_kernel(const GatherArgs a) {
  const int64_t N = a.g.mm.n, M = a.g.mm.m, K = a.g.mm.k;
  const int64_t n = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (n >= N) return;
  for (int64_t p = blockIdx.y; p < a.g.pairs; p += gridDim.y) {
    if (!pair_ok(a, p)) {
      if ((threadIdx.x & 31) == 0) {
        for (int64_t r = 0; r < M; ++r) store_from_float(a.out, a.g.mm.out_dtype, (p * M + r) * N + n, __int_as_float(0x7FC00000));
      }
      continue;
    }
    const int64_t e = a.rhs[p];
    const uint8_t* wrow = a.w + e * a.g.w_expert_bytes + n * a.g.mm.w_row_bytes;
    const uint8_t* srow = a.scales + e * a.g.scale_expert_bytes + n * a.g.mm.scale_row_bytes;
    const float mult = fp4::gather_multiplier(a.g, a.global_scale, e);
    const XT* x0 = static_cast<const XT*>(a.x) + int64_t(a.lhs[p]) * M * K;
    int64_t r0 = 0;
    for (; r0 + kRowsPerPass <= M; r0 += kRowsPerPass) {
      const XT* xr[kRowsPerPass];
      int64_t out_row[kRowsPerPass];
#pragma unroll
      for (int r = 0; r < kRowsPerPass; ++r) xr[r] = x0 + (r0 + r) * K, out_row[r] = p * M + r0 + r;
      rows_pass<XT, kVec, kRowsPerPass, Mode>(a, xr, out_row, kRowsPerPass, wrow, srow, n, mult);
    }
    for (; r0 < M; ++r0) {
      const XT* xr[1] = {x0 + r0 * K};
      const int64_t out_row[1] = {p * M + r0};
      rows_pass<XT, kVec, 1, Mode>(a, xr, out_row, 1, wrow, srow, n, mult);
    }
  }
}

template <typename XT, bool kVec, int Mode>
__global__ void __launch_bounds__(kWarps * 32) gather_gemv_kernel(const GatherArgs a) {
  const int64_t N = a.g.mm.n;
  const int64_t n = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (n >= N) return;
  const PlanView v = plan_view(a.workspace, a.g.experts, a.g.pairs, fp4::gather_out_rows(a.g));
  const int32_t na = *v.num_active;
  for (int64_t slot = blockIdx.y; slot < na; slot += gridDim.y) {
    const int64_t e = v.active[slot];
    const int64_t first = v.start[e];
    const int64_t rows = int64_t(v.start[e + 1] - first) * a.g.mm.m;
    const uint8_t* wrow = a.w + e * a.g.w_expert_bytes + n * a.g.mm.w_row_bytes;
    const uint8_t* srow = a.scales + e * a.g.scale_expert_bytes + n * a.g.mm.scale_row_bytes;
    const float mult = fp4::gather_multiplier(a.g, a.global_scale, e);
    int64_t r0 = 0;
    for (; r0 + kRowsPerPass <= rows; r0 += kRowsPerPass) {
      group_pass<XT, kVec, kRowsPerPass, Mode>(a, v, first, rows, r0, wrow, srow, n, mult);
    }
    for (; r0 < rows; ++r0) group_pass<XT, kVec, 1, Mode>(a, v, first, rows, r0, wrow, srow, n, mult);
  }
}

}  // namespace
}  // namespace cuda
}  // namespace mlx_fp4
