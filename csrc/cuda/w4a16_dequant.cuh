// Dequantize kernel (W to a transient dense buffer for cuBLASLt) and the epilogue kernel that
// finishes cuBLASLt's fp32 products. Included by w4a16_matmul.cu only.
#pragma once
#include <type_traits>

#include "w4a16_device.cuh"

namespace mlx_fp4 {
namespace cuda {
namespace {

using namespace fp4::cuda_tiling;

// ------------------------------------------------------------------------------------------
// Dequantize W to [N, K] in OT (exact: at most 6 significant bits, in range for bf16/fp16/fp32).

template <typename OT>
__device__ __forceinline__ OT from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Grid: x = groups of kDequantThreads * kDequantWords words (8 values) along a row, y = rows
// (looping past 65535). Lane l of a block handles words base + u * kDequantThreads + l, so each
// load instruction reads 4 contiguous bytes per lane and each store writes 16 contiguous bytes per
// lane (ncu: with 64 bytes per thread, the strided 16-byte stores made L2 the bottleneck).
// kVec (K % 8 == 0, aligned rows) with 16-bit outputs: the register decode of the tensor-core
// kernel; otherwise the float decode with guarded accesses.
// Mode: fp4::Mode. The register decode scales in 16-bit pairs (value * scale * 2^-7), which
// holds E4M3's range only: MXFP4 (E8M0, 2^-127 .. 2^127) takes the float decode.
template <typename OT, bool kVec, int Mode>
__global__ void __launch_bounds__(kDequantThreads) w4a16_dequant_kernel(const DequantArgs d) {
  constexpr bool kHalf = !std::is_same_v<OT, float> && Mode == fp4::kModeNvfp4;
  if (d.global_scale && blockIdx.x == 0 && threadIdx.x == 0) *d.multiplier = fp4::decode_multiplier(*d.global_scale);
  const int64_t wpr = (d.k + 7) / 8;  // words of 8 values per row
  __shared__ uint32_t s_scale[256];
  uint32_t unscale = 0;
  if constexpr (kHalf) {
    // Scale pairs as in the tensor-core kernel (value * scale * 2^-7), and the pair 2^7.
    for (int i = threadIdx.x; i < 256; i += blockDim.x) s_scale[i] = Mma16<OT>::scale_pair(fp4::e4m3_to_float(i));
    unscale = std::is_same_v<OT, __half> ? Mma16<OT>::scale_pair(1.0f) : Mma16<OT>::scale_pair(0x1p-112f);
    __syncthreads();
  }
  constexpr int U = kDequantWords;
  for (int64_t n = blockIdx.y; n < d.n; n += gridDim.y) {
    const uint8_t* wrow = d.w + n * d.w_row_bytes;
    const uint8_t* srow = d.scales + n * d.scale_row_bytes;
    OT* orow = static_cast<OT*>(d.out) + n * d.k;
    for (int64_t base = int64_t(blockIdx.x) * (kDequantThreads * U); base < wpr;
         base += int64_t(gridDim.x) * (kDequantThreads * U)) {
      if constexpr (kVec && kHalf) {
        using Mma = Mma16<OT>;
        uint32_t wv[U], sv[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t j = base + u * kDequantThreads + threadIdx.x;
          if (j < wpr) {
            wv[u] = __ldg(reinterpret_cast<const uint32_t*>(wrow) + j);
            sv[u] = __ldg(srow + (j >> 1));
          }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t j = base + u * kDequantThreads + threadIdx.x;
          if (j >= wpr) continue;
          uint32_t pr[4];
          fp4_word<OT>(wv[u], pr);
          const uint32_t sp = s_scale[sv[u]];
#pragma unroll
          for (int i = 0; i < 4; ++i) pr[i] = Mma::mul(Mma::mul(pr[i], sp), unscale);
          // (k, k+4) pairs -> (k, k+1) pairs.
          reinterpret_cast<uint4*>(orow)[j] =
              make_uint4(__byte_perm(pr[0], pr[1], 0x5410), __byte_perm(pr[2], pr[3], 0x5410),
                         __byte_perm(pr[0], pr[1], 0x7632), __byte_perm(pr[2], pr[3], 0x7632));
        }
      } else {
        const int64_t kbytes = (d.k + 1) / 2;
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t j = base + u * kDequantThreads + threadIdx.x;
          if (j >= wpr) continue;
          for (int i = 0; i < 8; ++i) {
            const int64_t k = 8 * j + i;
            if (k >= d.k) break;
            const uint32_t byte = k / 2 < kbytes ? uint32_t(wrow[k / 2]) : 0u;
            const uint32_t code = (k & 1) ? (byte >> 4) : (byte & 0xFu);
            orow[k] = from_float<OT>(fp4::e2m1_to_float(code) *
                                     fp4::scale_to_float(Mode, srow[k / fp4::block_size(Mode)]));
          }
        }
      }
    }
  }
}

// fp32 products [M, N] (from cuBLAS) -> global scale (unless applied) -> epilogue -> out dtype.
__global__ void __launch_bounds__(kElementwiseThreads) w4a16_epilogue_kernel(const EpilogueArgs e) {
  const int64_t total = e.a.p.m * e.a.p.n;
  const float gs = e.scaled ? 1.0f : global_scale_of(e.a);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int64_t row = idx / e.a.p.n;
    const int64_t col = idx - row * e.a.p.n;
    store_from_float(e.a.out, e.a.p.out_dtype, idx, finish(e.a, e.acc[idx], row, col, gs));
  }
}

}  // namespace
}  // namespace cuda
}  // namespace mlx_fp4
