// Grouped tensor-core kernel of the gathered W4A16 matmul (prefill): the dense tensor-core step
// (tc_step of w4a16_device.cuh: FP4 decoded in registers, mma.sync m16n8k16, fp32 accumulators)
// on tiles of one expert's rows. The plan kernel lists the tiles (expert, first row of its group);
// x rows are gathered through the pair order, rows past the group are clamped (read, never stored).
// Included by gather_w4a16_matmul.cu only.
#pragma once
#include "gather_w4a16_plan.cuh"

namespace mlx_fp4 {
namespace cuda {
namespace {

using fp4::cuda_tiling::kMmaCols;
using fp4::cuda_tiling::kMmaRows;
using fp4::cuda_tiling::kStepK;

template <typename T, bool kVec>
__global__ void __launch_bounds__(kTcWarps * 32, kTcMinBlocksPerSm) gather_tc_kernel(const GatherArgs a) {
  constexpr int MT = kTcColTiles;
  constexpr int RT = kTcRowTiles;
  const PlanView v = plan_view(a.workspace, a.g.experts, a.g.pairs);
  const int64_t tile = blockIdx.x;
  if (tile >= *v.num_tiles) return;  // uniform per block: before any barrier
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int64_t M = a.g.mm.m, N = a.g.mm.n, K = a.g.mm.k;
  const int64_t wrb = a.g.mm.w_row_bytes, srb = a.g.mm.scale_row_bytes;
  const int64_t kbytes = (K + 1) / 2;
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

  __shared__ uint32_t s_scale[256];
  fill_scale_table<T>(s_scale);
  const int64_t nsteps = (K + kStepK - 1) / kStepK;
  int64_t s_begin, s_end;
  warp_step_range(nsteps, warp, kTcWarps, s_begin, s_end);
  float acc[RT][MT][4];
  zero_acc<MT, RT>(acc);

  // A step's weight words and scale bytes; those of step s + 1 are loaded while step s computes
  // (without it each warp waited a full memory latency per step).
  struct Frag {
    uint32_t w[RT][2][4];
    uint32_t sc[RT][2][2];
  };
  auto load_frag = [&](int64_t s, Frag& f) {
    const int64_t b0 = (s * kStepK + t * kLaneK) / 2;
    const int64_t blk0 = (s * kStepK + t * kLaneK) / fp4::kBlockSize;
    const bool full = kVec && (s * kStepK + kStepK <= K);
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (full) {
          const uint4 u = load_stream16(wrow[rt][h] + b0);
          f.w[rt][h][0] = u.x, f.w[rt][h][1] = u.y, f.w[rt][h][2] = u.z, f.w[rt][h][3] = u.w;
        } else {
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            uint32_t word = 0;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int64_t b = b0 + 4 * q + i;
              word |= (b < kbytes ? uint32_t(__ldg(wrow[rt][h] + b)) : 0u) << (8 * i);
            }
            f.w[rt][h][q] = word;
          }
        }
#pragma unroll
        for (int bk = 0; bk < 2; ++bk) f.sc[rt][h][bk] = blk0 + bk < srb ? uint32_t(__ldg(srow[rt][h] + blk0 + bk)) : 0u;
      }
  };
  auto compute = [&](int64_t s, const Frag& f) {
    const int64_t kb = s * kStepK + t * kLaneK;  // this lane's first k
    const bool full = kVec && (s * kStepK + kStepK <= K);
    uint32_t sp[RT][2][2];
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int bk = 0; bk < 2; ++bk) sp[rt][h][bk] = s_scale[f.sc[rt][h][bk]];
    uint4 X[MT][4];
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        if (full) {
          X[j][q] = load_cached16(xrow[j] + kb + 8 * q);
        } else {
          const uint16_t* xp = reinterpret_cast<const uint16_t*>(xrow[j]);
          uint32_t r[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int64_t k0 = kb + 8 * q + 2 * i;
            r[i] = (k0 < K ? uint32_t(xp[k0]) : 0u) | ((k0 + 1 < K ? uint32_t(xp[k0 + 1]) : 0u) << 16);
          }
          X[j][q] = make_uint4(r[0], r[1], r[2], r[3]);
        }
      }
    tc_step<T, MT, RT>(acc, f.w, sp, X);
  };
  if (s_begin < s_end) {
    Frag cur;
    load_frag(s_begin, cur);
#pragma unroll 1
    for (int64_t s = s_begin; s < s_end; ++s) {
      Frag nxt;
      if (s + 1 < s_end) load_frag(s + 1, nxt);
      compute(s, cur);
      cur = nxt;
    }
  }

  // Cross-warp reduction in a fixed order, then multiplier, chain and store at the pair's row.
  constexpr int kSlots = RT * MT * 4;
  __shared__ float red[kTcWarps * kSlots * 32];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) red[(warp * kSlots + (rt * MT + j) * 4 + c) * 32 + lane] = acc[rt][j][c];
  __syncthreads();
  W4A16Args ep{};
  ep.p = a.g.mm;
  for (int i = 0; i < fp4::kMaxEpilogueOperands; ++i) ep.operands[i] = a.operands[i];
  const float mult = a.g.mm.has_global_scale ? a.multiplier[a.g.multiplier_per_expert ? e : 0] : 1.0f;
  for (int idx = threadIdx.x; idx < kSlots * 32; idx += blockDim.x) {
    const int slot = idx >> 5;
    const int ln = idx & 31;
    float sum = 0.0f;
    for (int wi = 0; wi < kTcWarps; ++wi) sum += red[(wi * kSlots + slot) * 32 + ln];
    const int c = slot & 3;
    const int j = (slot >> 2) % MT;
    const int rt = (slot >> 2) / MT;
    const int64_t n = n_base + rt * kMmaRows + (ln >> 2) + (c >= 2 ? 8 : 0);
    const int64_t i = m_base + j * kMmaCols + 2 * (ln & 3) + (c & 1);
    if (n < N && i < rows) {
      const int64_t out_row = int64_t(v.order[first + i / M]) * M + i % M;
      store_from_float(a.out, a.g.mm.out_dtype, out_row * N + n, finish(ep, sum * kTcAccScale, out_row, n, mult));
    }
  }
}

}  // namespace
}  // namespace cuda
}  // namespace mlx_fp4
