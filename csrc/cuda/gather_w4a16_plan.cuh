// The plan kernel of the gathered W4A16 matmul: one block groups the (token, expert) pairs by
// expert (counting sort into the workspace: start offsets, active experts, pair order, and the
// tensor-core tile list); out-of-range pairs get NaN rows and are never read from.
// Included by gather_w4a16_matmul.cu only.
#pragma once
#include <cub/block/block_scan.cuh>

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
  int32_t* x_rows;    // [rows]: row r of the sorted order reads this x row (-1 past the valid
                      // pairs' rows; kTcStaged and kTcWgmma only)
  int32_t* out_rows;  // [rows]: ... and writes this out row
};

// The workspace layout of plan_layout (gather_tiling_cuda.h).
__device__ __forceinline__ PlanView plan_view(int32_t* ws, int64_t experts, int64_t pairs, int64_t rows) {
  const PlanLayout l = plan_layout(experts, pairs, rows);
  return PlanView{ws,           ws + l.start,  ws + l.active,  ws + l.num_active, ws + l.order,
                  ws + l.num_tiles, ws + l.tiles, ws + l.x_rows, ws + l.out_rows};
}

__device__ __forceinline__ bool pair_ok(const GatherArgs& a, int64_t p) {
  return a.lhs[p] < a.g.x_batches && a.rhs[p] < a.g.experts;
}

// The chain of a gathered kernel's output (row, col): from its parameters (finish).
__device__ __forceinline__ float gather_finish(const GatherArgs& a, float acc, int64_t row, int64_t col, float mult) {
  return finish(a.g.mm, a.operands, acc, row, col, mult);
}

__global__ void __launch_bounds__(kPlanThreads) gather_plan_kernel(const GatherArgs a) {
  using Scan = cub::BlockScan<int32_t, kPlanThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  const int64_t E = a.g.experts, P = a.g.pairs;
  const PlanView v = plan_view(a.workspace, E, P, fp4::gather_out_rows(a.g));
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) v.cursor[e] = 0;
  __syncthreads();
  for (int64_t p = threadIdx.x; p < P; p += blockDim.x) {
    if (pair_ok(a, p)) atomicAdd(&v.cursor[a.rhs[p]], 1);
  }
  __syncthreads();
  // Each thread owns a run of experts; three block-wide scans give its first pair slot, active
  // slot and tile slot (one thread walking all experts took tens of microseconds at E = 128).
  const int64_t per = (E + kPlanThreads - 1) / kPlanThreads;
  const int64_t e0 = threadIdx.x * per, e1 = e0 + per < E ? e0 + per : E;
  const int64_t M = a.g.mm.m;
  int32_t pairs = 0, active = 0, tiles = 0;
  for (int64_t e = e0; e < e1; ++e) {
    const int32_t c = v.cursor[e];
    pairs += c;
    active += c > 0;
    if (a.use_tc) tiles += static_cast<int32_t>((c * M + a.tile_rows - 1) / a.tile_rows);
  }
  int32_t pair_at, active_at, tile_at;
  Scan(scan_storage).ExclusiveSum(pairs, pair_at);
  __syncthreads();
  Scan(scan_storage).ExclusiveSum(active, active_at);
  __syncthreads();
  Scan(scan_storage).ExclusiveSum(tiles, tile_at);
  for (int64_t e = e0; e < e1; ++e) {
    const int32_t c = v.cursor[e];
    v.start[e] = pair_at;
    v.cursor[e] = pair_at;
    pair_at += c;
    if (c == 0) continue;
    v.active[active_at++] = static_cast<int32_t>(e);
    if (!a.use_tc) continue;
    for (int64_t r0 = 0; r0 < c * M; r0 += a.tile_rows, ++tile_at) {
      v.tiles[2 * tile_at] = static_cast<int32_t>(e);
      v.tiles[2 * tile_at + 1] = static_cast<int32_t>(r0);
    }
  }
  if (threadIdx.x == kPlanThreads - 1) {  // its exclusive sums plus its own runs: the totals
    v.start[E] = pair_at;
    *v.num_active = active_at;
    *v.num_tiles = tile_at;
  }
  __syncthreads();
  const int64_t N = a.g.mm.n;
  const float nan = __int_as_float(0x7FC00000);
  for (int64_t p = threadIdx.x; p < P; p += blockDim.x) {
    if (pair_ok(a, p)) {
      v.order[atomicAdd(&v.cursor[a.rhs[p]], 1)] = static_cast<int32_t>(p);
    } else {
      for (int64_t i = 0; i < M * N; ++i) store_from_float(a.out, a.g.mm.out_dtype, p * M * N + i, nan);
    }
  }
  if (a.use_tc != kTcStaged && a.use_tc != kTcWgmma) return;
  // The grouped staged and wgmma kernels read and write rows through these maps of the sorted
  // order; the wgmma kernel's x gather (wgmma_permute_launch) reads all `rows` entries.
  __syncthreads();
  const int64_t valid = int64_t(v.start[E]) * M, rows = fp4::gather_out_rows(a.g);
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    if (r >= valid) {
      v.x_rows[r] = -1;
      continue;
    }
    const int64_t pair = v.order[r / M];
    v.x_rows[r] = static_cast<int32_t>(int64_t(a.lhs[pair]) * M + r % M);
    v.out_rows[r] = static_cast<int32_t>(pair * M + r % M);
  }
}

}  // namespace
}  // namespace cuda
}  // namespace mlx_fp4
