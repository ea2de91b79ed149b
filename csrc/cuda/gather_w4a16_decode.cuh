// Decode GEMV of the gathered W4A16 matmul (one row of x per pair, bf16/fp16 x, K a multiple of
// 32, 16-byte aligned rows): no plan, grid (weight-row tiles, pairs). The launch shape is one of
// kDecodeShapes (gather_tiling_cuda.h): lane groups of `lanes` lanes own `rows` weight rows of the
// pair's expert, and each lane issues every load of `chunks` 32-value chunks (weights, scales, x)
// before any math, so that each SM keeps tens of kilobytes in flight: at one token the layer
// reads a few MB over a few thousand rows, and one chunk in flight per lane ran at ~15% of the
// read rate. Included by gather_w4a16_matmul.cu only.
#pragma once
#include "gather_w4a16_plan.cuh"

namespace mlx_fp4 {
namespace cuda {
namespace {

// The chunk's two NVFP4 scale bytes (low byte first) in one 2-byte load, or MXFP4's one byte
// (K % 32 == 0 keeps the NVFP4 pair 2-byte aligned).
template <int Mode>
__device__ __forceinline__ uint32_t chunk_scale_bits(const uint8_t* s, int64_t c) {
  if constexpr (fp4::block_size(Mode) == 16) return __ldg(reinterpret_cast<const uint16_t*>(s) + c);
  return __ldg(s + c);
}

template <typename XT, int Mode, int Shape>
__global__ void __launch_bounds__(fp4::cuda_gather_tiling::kDecodeShapes[Shape].warps * 32)
    gather_decode_kernel(const GatherArgs a) {
  constexpr fp4::cuda_gather_tiling::DecodeShape D = fp4::cuda_gather_tiling::kDecodeShapes[Shape];
  constexpr int L = D.lanes, RW = D.rows, J = D.chunks, kGroups = 32 / L;
  constexpr bool kTwoBlocks = fp4::block_size(Mode) == 16;  // two NVFP4 scales per chunk, one MXFP4
  const int64_t N = a.g.mm.n, K = a.g.mm.k;
  const int64_t wrb = a.g.mm.w_row_bytes, srb = a.g.mm.scale_row_bytes;
  const int lane = threadIdx.x & 31, sub = lane % L;
  const int64_t warp_row = (int64_t(blockIdx.x) * D.warps + (threadIdx.x >> 5)) * kGroups * RW;
  if (warp_row >= N) return;  // warp-uniform: the shuffles below need every lane of the warp
  const int64_t n0 = warp_row + int64_t(lane / L) * RW;
  const int64_t p = blockIdx.y;
  if (!pair_ok(a, p)) {  // out of range: NaN rows, nothing read
    if (sub < RW && n0 + sub < N) store_from_float(a.out, a.g.mm.out_dtype, p * N + n0 + sub, __int_as_float(0x7FC00000));
    return;
  }
  const int64_t e = a.rhs[p];
  const uint8_t* w = a.w + e * a.g.w_expert_bytes;
  const uint8_t* s = a.scales + e * a.g.scale_expert_bytes;
  const float mult = fp4::gather_multiplier(a.g, a.global_scale, e);
  const XT* x = static_cast<const XT*>(a.x) + int64_t(a.lhs[p]) * K;
  int64_t row[RW];  // rows past N repeat the last one (read, never stored)
#pragma unroll
  for (int r = 0; r < RW; ++r) row[r] = n0 + r < N ? n0 + r : N - 1;
  float acc[RW];
#pragma unroll
  for (int r = 0; r < RW; ++r) acc[r] = 0.0f;
  const int64_t nchunks = K / 32;
  for (int64_t c0 = 0; c0 < nchunks; c0 += L * J) {
    uint4 wv[RW][J];
    uint32_t sb[RW][J];
    uint4 xv[J][4];
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int64_t c = c0 + sub + L * j;
      const bool live = c < nchunks;
#pragma unroll
      for (int r = 0; r < RW; ++r) {
        wv[r][j] = live ? load_stream16(w + row[r] * wrb + c * 16) : make_uint4(0, 0, 0, 0);
        sb[r][j] = live ? chunk_scale_bits<Mode>(s + row[r] * srb, c) : 0u;
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) xv[j][q] = live ? load_cached16(x + c * 32 + 8 * q) : make_uint4(0, 0, 0, 0);
    }
    // The chunk's scales, decoded once: words 0-1 hold its first 16 values, words 2-3 the next
    // 16 (the second NVFP4 block; MXFP4 has one block per chunk).
    float sc[RW][J][2];
#pragma unroll
    for (int j = 0; j < J; ++j) {
#pragma unroll
      for (int r = 0; r < RW; ++r) {
        sc[r][j][0] = fp4::scale_to_float(Mode, sb[r][j] & 0xFFu);
        sc[r][j][1] = kTwoBlocks ? fp4::scale_to_float(Mode, sb[r][j] >> 8) : sc[r][j][0];
      }
    }
#pragma unroll
    for (int j = 0; j < J; ++j) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint32_t xw[4] = {xv[j][q].x, xv[j][q].y, xv[j][q].z, xv[j][q].w};
        float xf[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          xf[2 * i] = half_bits_to_float(xw[i] & 0xFFFFu, static_cast<XT*>(nullptr));
          xf[2 * i + 1] = half_bits_to_float(xw[i] >> 16, static_cast<XT*>(nullptr));
        }
#pragma unroll
        for (int r = 0; r < RW; ++r) {
          const uint32_t word = q == 0 ? wv[r][j].x : q == 1 ? wv[r][j].y : q == 2 ? wv[r][j].z : wv[r][j].w;
          float part = 0.0f;
#pragma unroll
          for (int i = 0; i < 8; ++i) part = fmaf(e2m1_fast(word >> (4 * i)), xf[i], part);
          acc[r] = fmaf(part, sc[r][j][q >> 1], acc[r]);
        }
      }
    }
  }
  // Sums within each lane group (aligned groups of L lanes: the xor stays inside).
#pragma unroll
  for (int r = 0; r < RW; ++r) {
#pragma unroll
    for (int off = L / 2; off > 0; off >>= 1) acc[r] += __shfl_xor_sync(0xFFFFFFFFu, acc[r], off);
  }
  // Lane r of a group stores its row r (every lane of the group holds every sum).
#pragma unroll
  for (int r = 0; r < RW; ++r) {
    if (sub == r && n0 + r < N) {
      store_from_float(a.out, a.g.mm.out_dtype, p * N + n0 + r, gather_finish(a, acc[r], p, n0 + r, mult));
    }
  }
}

}  // namespace
}  // namespace cuda
}  // namespace mlx_fp4
