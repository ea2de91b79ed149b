// Grouped tensor-core kernel of the gathered W4A16 matmul (prefill): the dense tensor-core step
// (tc_load_frag / tc_compute_step of w4a16_tc.cuh: FP4 decoded in registers, either scale format,
// mma.sync m16n8k16, fp32 accumulators)
// on tiles of one expert's rows. The plan kernel lists the tiles (expert, first row of its group);
// x rows are gathered through the pair order, rows past the group are clamped (read, never stored).
// Included by gather_w4a16_matmul.cu only.
#pragma once
#include "gather_w4a16_plan.cuh"
#include "w4a16_tc.cuh"

namespace mlx_fp4 {
namespace cuda {
namespace {

using fp4::cuda_tiling::kMmaCols;
using fp4::cuda_tiling::kMmaRows;
using fp4::cuda_tiling::kStepK;

// Mode: fp4::Mode of the scales (the dense step's TcLane layout).
template <typename T, bool kVec, int Mode>
__global__ void __launch_bounds__(kTcWarps * 32, kTcMinBlocksPerSm) gather_tc_kernel(const GatherArgs a) {
  constexpr int MT = kTcColTiles;
  constexpr int RT = kTcRowTiles;
  const PlanView v = plan_view(a.workspace, a.g.experts, a.g.pairs, fp4::gather_out_rows(a.g));
  const int64_t tile = blockIdx.x;
  if (tile >= *v.num_tiles) return;  // uniform per block: before any barrier
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int64_t M = a.g.mm.m, N = a.g.mm.n, K = a.g.mm.k;
  const int64_t wrb = a.g.mm.w_row_bytes, srb = a.g.mm.scale_row_bytes;
  const int64_t e = v.tiles[2 * tile];
  const int64_t m_base = v.tiles[2 * tile + 1];  // first row of the tile within the group
  const int64_t first = v.start[e];
  const int64_t rows = int64_t(v.start[e + 1] - first) * M;
  const int64_t n_base = int64_t(blockIdx.y) * (kMmaRows * RT);
  const uint8_t* w = a.w + e * a.g.w_expert_bytes;
  const uint8_t* sc = a.scales + e * a.g.scale_expert_bytes;

  const uint8_t* wrow[RT][2];
  const uint8_t* srow[RT][2];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int64_t n = n_base + rt * kMmaRows + g + 8 * h;
      n = n < N ? n : N - 1;
      wrow[rt][h] = w + n * wrb;
      srow[rt][h] = sc + n * srb;
    }
  const T* xrow[MT];
#pragma unroll
  for (int j = 0; j < MT; ++j) {
    int64_t i = m_base + j * kMmaCols + g;
    i = i < rows ? i : rows - 1;
    const int64_t pair = v.order[first + i / M];
    xrow[j] = static_cast<const T*>(a.x) + (int64_t(a.lhs[pair]) * M + i % M) * K;
  }

  __shared__ uint32_t s_scale[kScaleTableSize];
  fill_scale_table<T, Mode>(s_scale);
  const int64_t nsteps = (K + kStepK - 1) / kStepK;
  int64_t s_begin, s_end;
  warp_step_range(nsteps, warp, kTcWarps, s_begin, s_end);
  float acc[RT][MT][4];
  zero_acc<MT, RT>(acc);

  // The dense kernel's step (w4a16_tc.cuh); the weights of step s + 1 are loaded while step s
  // computes (without it each warp waited a full memory latency per step).
  if (s_begin < s_end) {
    TcFrag<T, MT, RT, Mode> cur;
    tc_load_frag<T, MT, RT, kVec, Mode>(s_begin, t, wrow, srow, K, cur);
#pragma unroll 1
    for (int64_t s = s_begin; s < s_end; ++s) {
      TcFrag<T, MT, RT, Mode> nxt;
      if (s + 1 < s_end) tc_load_frag<T, MT, RT, kVec, Mode>(s + 1, t, wrow, srow, K, nxt);
      tc_compute_step<T, MT, RT, kVec, Mode>(s, t, xrow, K, s_scale, cur, acc);
      cur = nxt;
    }
  }

  // The dense kernels' reduction (fixed order), then multiplier, chain and store at the pair's row.
  __shared__ float red[kTcWarps * RT * MT * 4 * 32];
  const float mult = fp4::gather_multiplier(a.g, a.global_scale, e);
  tc_reduce<MT, RT>(acc, red, m_base, n_base, [&](int64_t i, int64_t n, float sum) {
    if (n < N && i < rows) {
      const int64_t out_row = int64_t(v.order[first + i / M]) * M + i % M;
      store_from_float(a.out, a.g.mm.out_dtype, out_row * N + n, gather_finish(a, sum * tc_acc_scale(Mode), out_row, n, mult));
    }
  });
}

}  // namespace
}  // namespace cuda
}  // namespace mlx_fp4
