// Decode GEMV of the gathered W4A16 matmul (one row of x per pair, bf16/fp16 x, K a multiple of
// 32, 16-byte aligned rows): no plan, grid (weight-row tiles, pairs). A warp owns
// kDecodeRowsPerWarp weight rows of its pair's expert and issues every load of a group of
// kDecodeChunksPerLane 32-value chunks per lane (weights, scales, x) before any math, so each
// warp keeps several kilobytes in flight: at one token the layer reads a few MB spread over a few
// thousand rows, and the SIMT row pass (one chunk in flight per lane) ran at ~15% of the read rate.
// Included by gather_w4a16_matmul.cu only.
#pragma once
#include "gather_w4a16_plan.cuh"

namespace mlx_fp4 {
namespace cuda {
namespace {

using fp4::cuda_gather_tiling::kDecodeChunksPerLane;
using fp4::cuda_gather_tiling::kDecodeRowsPerWarp;
using fp4::cuda_gather_tiling::kDecodeWarps;

template <typename XT, int Mode>
__global__ void __launch_bounds__(kDecodeWarps * 32) gather_decode_kernel(const GatherArgs a) {
  constexpr int RW = kDecodeRowsPerWarp, J = kDecodeChunksPerLane;
  constexpr int kBlocksPerChunk = 16 / (fp4::block_size(Mode) / fp4::kValuesPerByte);  // 2 NVFP4, 1 MXFP4
  const int64_t N = a.g.mm.n, K = a.g.mm.k;
  const int64_t wrb = a.g.mm.w_row_bytes, srb = a.g.mm.scale_row_bytes;
  const int lane = threadIdx.x & 31;
  const int64_t n0 = (int64_t(blockIdx.x) * kDecodeWarps + (threadIdx.x >> 5)) * RW;
  if (n0 >= N) return;
  const int64_t p = blockIdx.y;
  const W4A16Args ep = epilogue_view(a);
  if (!pair_ok(a, p)) {  // out of range: NaN rows, nothing read
    if (lane < RW && n0 + lane < N) store_from_float(a.out, a.g.mm.out_dtype, p * N + n0 + lane, __int_as_float(0x7FC00000));
    return;
  }
  const int64_t e = a.rhs[p];
  const uint8_t* w = a.w + e * a.g.w_expert_bytes;
  const uint8_t* s = a.scales + e * a.g.scale_expert_bytes;
  const float mult = a.g.mm.has_global_scale ? a.multiplier[a.g.multiplier_per_expert ? e : 0] : 1.0f;
  const XT* x = static_cast<const XT*>(a.x) + int64_t(a.lhs[p]) * K;
  int64_t row[RW];  // rows past N repeat the last one (read, never stored)
#pragma unroll
  for (int r = 0; r < RW; ++r) row[r] = n0 + r < N ? n0 + r : N - 1;
  float acc[RW];
#pragma unroll
  for (int r = 0; r < RW; ++r) acc[r] = 0.0f;
  const int64_t nchunks = K / 32;
  for (int64_t c0 = 0; c0 < nchunks; c0 += 32 * J) {
    uint4 wv[RW][J];
    uint32_t sb[RW][J];  // the chunk's scale bytes (two NVFP4 blocks: low byte first)
    uint4 xv[J][4];
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int64_t c = c0 + lane + 32 * j;
      const bool live = c < nchunks;
#pragma unroll
      for (int r = 0; r < RW; ++r) {
        wv[r][j] = live ? load_stream16(w + row[r] * wrb + c * 16) : make_uint4(0, 0, 0, 0);
        const uint8_t* sr = s + row[r] * srb + kBlocksPerChunk * c;
        sb[r][j] = live ? (kBlocksPerChunk == 2 ? uint32_t(sr[0]) | (uint32_t(sr[1]) << 8) : uint32_t(sr[0])) : 0u;
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
        sc[r][j][1] = kBlocksPerChunk == 2 ? fp4::scale_to_float(Mode, sb[r][j] >> 8) : sc[r][j][0];
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
#pragma unroll
  for (int r = 0; r < RW; ++r) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc[r] += __shfl_xor_sync(0xFFFFFFFFu, acc[r], off);
  }
  // Lane r stores row r (every lane holds every sum).
#pragma unroll
  for (int r = 0; r < RW; ++r) {
    if (lane == r && n0 + r < N) {
      store_from_float(a.out, a.g.mm.out_dtype, p * N + n0 + r, finish(ep, acc[r], p, n0 + r, mult));
    }
  }
}

}  // namespace
}  // namespace cuda
}  // namespace mlx_fp4
