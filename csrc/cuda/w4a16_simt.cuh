// SIMT kernel: fp32 FMA for float32 x (and small M without tensor cores). Included by
// w4a16_matmul.cu only.
#pragma once
#include "w4a16_device.cuh"

namespace mlx_fp4 {
namespace cuda {
namespace {

using namespace fp4::cuda_tiling;

// ------------------------------------------------------------------------------------------
// SIMT kernel: one warp per weight row n and kSimtRows rows of x per pass; fp32 FMA.
// kVec: lanes take 16-byte chunks (32 values); else single bytes. Exact decode through the shared
// format functions.

// Eight consecutive x values as float (16- or 32-byte aligned).
__device__ __forceinline__ void load8(const float* p, float (&v)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
  v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
__device__ __forceinline__ float half_bits_to_float(uint32_t b, __half*) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(b)));
}
__device__ __forceinline__ float half_bits_to_float(uint32_t b, __nv_bfloat16*) {
  return __uint_as_float(b << 16);
}
template <typename T>
__device__ __forceinline__ void load8(const T* p, float (&v)[8]) {
  const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = half_bits_to_float(w[i] & 0xFFFFu, static_cast<T*>(nullptr));
    v[2 * i + 1] = half_bits_to_float(w[i] >> 16, static_cast<T*>(nullptr));
  }
}

// Exact E2M1 value of a code: the magnitude bits as a float's low exponent / high mantissa bits
// give value * 2^-126 (subnormal for the codes 0 and 1), times 2^126.
__device__ __forceinline__ float e2m1_fast(uint32_t code) {
  return __uint_as_float(((code & 7u) << 22) | ((code & 8u) << 28)) * 0x1p126f;
}

// One weight row against R rows of x (pointers xr): acc[r] = sum_k x_r[k] * w[k], reduced over the
// warp (every lane holds the sum). Mode: fp4::Mode (the scale decode and its block); a chunk of 32
// values holds two NVFP4 blocks or one MXFP4 block. Shared with the gathered GEMVs.
template <typename XT, bool kVec, int R, int Mode>
__device__ __forceinline__ void simt_row_pass(const uint8_t* wrow, const uint8_t* srow, int64_t K,
                                              const XT* const (&xr)[R], float (&acc)[R]) {
  constexpr int kBlockBytes = fp4::block_size(Mode) / fp4::kValuesPerByte;
  const int64_t blocks = fp4::scale_blocks_for_k(K, Mode);  // a padded row's extra scale bytes are never read
  const int lane = threadIdx.x & 31;
  const int64_t kbytes = (K + 1) / 2;
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  if constexpr (kVec) {
    const int64_t nchunks = (K + 31) / 32;
    for (int64_t c = lane; c < nchunks; c += 32) {
      const int64_t k0 = c * 32;
      const bool full = k0 + 32 <= K;
      uint32_t wv[4];
      if (full) {
        const uint4 v = load_stream16(wrow + c * 16);
        wv[0] = v.x;
        wv[1] = v.y;
        wv[2] = v.z;
        wv[3] = v.w;
      } else {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          uint32_t word = 0;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int64_t b = c * 16 + 4 * q + i;
            word |= (b < kbytes ? uint32_t(wrow[b]) : 0u) << (8 * i);
          }
          wv[q] = word;
        }
      }
      // Scales of the chunk's two 16-value halves: blocks 2c, 2c + 1 (NVFP4) or c, c (MXFP4).
      constexpr int kBlocksPerChunk = 16 / kBlockBytes;
      const int64_t b0 = kBlocksPerChunk * c, b1 = b0 + kBlocksPerChunk - 1;
      const float s0 = fp4::scale_to_float(Mode, srow[b0]);
      const float s1 = b1 < blocks ? fp4::scale_to_float(Mode, srow[b1]) : 0.0f;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float sc = q < 2 ? s0 : s1;
        float wq[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) wq[i] = e2m1_fast(wv[q] >> (4 * i)) * sc;
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float xv[8];
          if (full) {
            load8(xr[r] + k0 + 8 * q, xv);
          } else {
#pragma unroll
            for (int i = 0; i < 8; ++i) xv[i] = k0 + 8 * q + i < K ? to_float(xr[r][k0 + 8 * q + i]) : 0.0f;
          }
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[r] = fmaf(wq[i], xv[i], acc[r]);
        }
      }
    }
  } else {
    for (int64_t b = lane; b < kbytes; b += 32) {
      const uint32_t byte = wrow[b];
      const float sc = fp4::scale_to_float(Mode, srow[b / kBlockBytes]);
      const int64_t k = 2 * b;
      const float lo = fp4::e2m1_to_float(byte & 0xFu) * sc;
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] = fmaf(lo, to_float(xr[r][k]), acc[r]);
      if (k + 1 < K) {
        const float hi = fp4::e2m1_to_float(byte >> 4) * sc;
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] = fmaf(hi, to_float(xr[r][k + 1]), acc[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc[r] += __shfl_xor_sync(0xFFFFFFFFu, acc[r], off);
  }
}

// Mode: fp4::Mode (the scale decode and its block); a chunk of 32 values holds two NVFP4 blocks or
// one MXFP4 block.
template <typename XT, bool kVec, int R, int Mode>
__global__ void __launch_bounds__(kSimtWarps * 32) w4a16_simt_kernel(const W4A16Args a) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t M = a.p.m, N = a.p.n, K = a.p.k;
  const int64_t n = int64_t(blockIdx.x) * kSimtWarps + warp;
  if (n >= N) return;
  const uint8_t* wrow = a.w + n * a.p.w_row_bytes;
  const uint8_t* srow = a.scales + n * a.p.scale_row_bytes;
  const XT* x = static_cast<const XT*>(a.x);
  const float gs = global_scale_of(a);

  for (int64_t m0 = int64_t(blockIdx.y) * R; m0 < M; m0 += int64_t(gridDim.y) * R) {
    const XT* xr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t m = m0 + r < M ? m0 + r : M - 1;
      xr[r] = x + m * K;
    }
    float acc[R];
    simt_row_pass<XT, kVec, R, Mode>(wrow, srow, K, xr, acc);
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int64_t m = m0 + r;
        if (m < M) store_from_float(a.out, a.p.out_dtype, m * N + n, finish(a, acc[r], m, n, gs));
      }
    }
  }
}

}  // namespace
}  // namespace cuda
}  // namespace mlx_fp4
