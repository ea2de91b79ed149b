// The plan kernel of the gathered W4A16 matmul: one block groups the (token, expert) pairs by
// expert (counting sort into the workspace: start offsets, active experts, pair order, and the
// tensor-core tile list); out-of-range pairs get NaN rows and are never read from.
// Included by gather_w4a16_matmul.cu only.
#pragma once
#include "gather_w4a16_kernels.h"
#include "w4a16_simt.cuh"

namespace mlx_fp4 {
namespace cuda {
namespace {

using namespace fp4::cuda_gather_tiling;
using fp4::cuda_tiling::kLaneBytes;  // a lane's share of a row per step: 16 bytes = kLaneK values
using fp4::cuda_tiling::kLaneK;

struct PlanView {
  int32_t* cursor;  // [E]
  int32_t* start;   // [E + 1]
  int32_t* active;  // [E]: experts with pairs, ascending
  int32_t* num_active;
  int32_t* order;   // [P]: pair ids grouped by expert
  int32_t* num_tiles;
  int32_t* tiles;   // [max_tc_tiles] x (expert, first row of the tile in its group)
};

// The workspace layout of plan_workspace_words (gather_tiling_cuda.h).
__device__ __forceinline__ PlanView plan_view(int32_t* ws, int64_t experts, int64_t pairs) {
  int32_t* order = ws + 3 * experts + 2;
  return PlanView{ws, ws + experts, ws + 2 * experts + 1, ws + 3 * experts + 1, order, order + pairs,
                  order + pairs + 1};
}

__device__ __forceinline__ bool pair_ok(const GatherArgs& a, int64_t p) {
  return a.lhs[p] < a.g.x_batches && a.rhs[p] < a.g.experts;
}

__global__ void __launch_bounds__(kPlanThreads) gather_plan_kernel(const GatherArgs a) {
  const int64_t E = a.g.experts, P = a.g.pairs;
  const PlanView v = plan_view(a.workspace, E, P);
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) v.cursor[e] = 0;
  __syncthreads();
  for (int64_t p = threadIdx.x; p < P; p += blockDim.x) {
    if (pair_ok(a, p)) atomicAdd(&v.cursor[a.rhs[p]], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t sum = 0, na = 0;
    for (int64_t e = 0; e < E; ++e) {
      v.start[e] = sum;
      sum += v.cursor[e];
      if (v.cursor[e] > 0) v.active[na++] = static_cast<int32_t>(e);
      v.cursor[e] = v.start[e];
    }
    v.start[E] = sum;
    *v.num_active = na;
    // Tensor-core tiles: each active expert's rows in runs of kTcTileRows.
    int32_t nt = 0;
    if (a.use_tc) {
      for (int32_t s = 0; s < na; ++s) {
        const int32_t ex = v.active[s];
        const int64_t rows = int64_t(v.start[ex + 1] - v.start[ex]) * a.g.mm.m;
        for (int64_t r0 = 0; r0 < rows; r0 += kTcTileRows, ++nt) {
          v.tiles[2 * nt] = ex;
          v.tiles[2 * nt + 1] = static_cast<int32_t>(r0);
        }
      }
    }
    *v.num_tiles = nt;
  }
  __syncthreads();
  const int64_t M = a.g.mm.m, N = a.g.mm.n;
  const float nan = __int_as_float(0x7FC00000);
  for (int64_t p = threadIdx.x; p < P; p += blockDim.x) {
    if (pair_ok(a, p)) {
      v.order[atomicAdd(&v.cursor[a.rhs[p]], 1)] = static_cast<int32_t>(p);
    } else {
      for (int64_t i = 0; i < M * N; ++i) store_from_float(a.out, a.g.mm.out_dtype, p * M * N + i, nan);
    }
  }
}

}  // namespace
}  // namespace cuda
}  // namespace mlx_fp4
