// CUDA gathered W4A16 (mixture-of-experts): out[p] = epilogue(mult[e] * x[lhs[p]] @ W[e]^T),
// e = rhs[p]. Two kernels, launched back to back in MLX's graph:
//  - gather_plan_kernel (one block): counting sort of the pairs by expert into a workspace
//    (start offsets, the active experts, the pair order); out-of-range pairs get NaN rows and are
//    never read from;
//  - gather_gemv_kernel: grid (weight-row tiles, active-expert slots); a warp streams one weight
//    row of its expert once per kRowsPerPass rows of x, fp32 FMA (the SIMT decode of
//    w4a16_simt.cuh), so at decode every active expert's bytes are read once for all its pairs.
// Framework-free (no MLX header); gather_w4a16_matmul.cpp does the MLX glue.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>

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
};

__device__ __forceinline__ PlanView plan_view(int32_t* ws, int64_t experts) {
  return PlanView{ws, ws + experts, ws + 2 * experts + 1, ws + 3 * experts + 1, ws + 3 * experts + 2};
}

__device__ __forceinline__ bool pair_ok(const GatherArgs& a, int64_t p) {
  return a.lhs[p] < a.g.x_batches && a.rhs[p] < a.g.experts;
}

__global__ void __launch_bounds__(kPlanThreads) gather_plan_kernel(const GatherArgs a) {
  const int64_t E = a.g.experts, P = a.g.pairs;
  const PlanView v = plan_view(a.workspace, E);
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

// R rows of x against one weight row: acc[r] = sum_k x_r[k] * w[k] (this lane's share).
template <typename XT, bool kVec, int R>
__device__ __forceinline__ void row_pass(const uint8_t* wrow, const uint8_t* srow, int64_t K, int64_t srb,
                                         const XT* const (&xr)[R], float (&acc)[R]) {
  const int lane = threadIdx.x & 31;
  const int64_t kbytes = (K + 1) / 2;
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  if constexpr (kVec) {
    // One 16-byte load = kLaneK values = two scale blocks per lane and chunk.
    for (int64_t c = lane; c * kLaneK < K; c += 32) {
      const int64_t k0 = c * kLaneK;
      const bool full = k0 + kLaneK <= K;
      uint32_t wv[4] = {0u, 0u, 0u, 0u};
      if (full) {
        const uint4 u = load_stream16(wrow + c * kLaneBytes);
        wv[0] = u.x, wv[1] = u.y, wv[2] = u.z, wv[3] = u.w;
      } else {
        for (int64_t b = c * kLaneBytes; b < kbytes; ++b) wv[(b - c * kLaneBytes) / 4] |= uint32_t(wrow[b]) << (8 * (b % 4));
      }
      const float s[2] = {fp4::e4m3_to_float(srow[2 * c]),
                          2 * c + 1 < srb ? fp4::e4m3_to_float(srow[2 * c + 1]) : 0.0f};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        float wq[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) wq[i] = e2m1_fast(wv[q] >> (4 * i)) * s[q / 2];
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
      const float sc = fp4::e4m3_to_float(srow[b / (fp4::kBlockSize / 2)]);
      const float lo = fp4::e2m1_to_float(byte & fp4::kNibbleMask) * sc;
      const float hi = 2 * b + 1 < K ? fp4::e2m1_to_float(byte >> fp4::kNibbleBits) * sc : 0.0f;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        acc[r] = fmaf(lo, to_float(xr[r][2 * b]), acc[r]);
        if (2 * b + 1 < K) acc[r] = fmaf(hi, to_float(xr[r][2 * b + 1]), acc[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc[r] += __shfl_xor_sync(0xFFFFFFFFu, acc[r], off);
  }
}

// Rows [r0, r0 + R) of one expert group (clamped to the last row; extra rows are not stored).
template <typename XT, bool kVec, int R>
__device__ __forceinline__ void group_pass(const GatherArgs& a, const W4A16Args& ep, const PlanView& v,
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
  float acc[R];
  row_pass<XT, kVec, R>(wrow, srow, K, a.g.mm.scale_row_bytes, xr, acc);
  if ((threadIdx.x & 31) == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r0 + r < rows) {
        store_from_float(a.out, a.g.mm.out_dtype, out_row[r] * a.g.mm.n + n, finish(ep, acc[r], out_row[r], n, mult));
      }
    }
  }
}

template <typename XT, bool kVec>
__global__ void __launch_bounds__(kWarps * 32) gather_gemv_kernel(const GatherArgs a) {
  const int64_t N = a.g.mm.n;
  const int64_t n = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (n >= N) return;
  const PlanView v = plan_view(a.workspace, a.g.experts);
  W4A16Args ep{};  // the epilogue's view: chain, operands, n (finish reads only these)
  ep.p = a.g.mm;
  for (int i = 0; i < fp4::kMaxEpilogueOperands; ++i) ep.operands[i] = a.operands[i];
  const int32_t na = *v.num_active;
  for (int64_t slot = blockIdx.y; slot < na; slot += gridDim.y) {
    const int64_t e = v.active[slot];
    const int64_t first = v.start[e];
    const int64_t rows = int64_t(v.start[e + 1] - first) * a.g.mm.m;
    const uint8_t* wrow = a.w + e * a.g.w_expert_bytes + n * a.g.mm.w_row_bytes;
    const uint8_t* srow = a.scales + e * a.g.scale_expert_bytes + n * a.g.mm.scale_row_bytes;
    const float mult = a.g.mm.has_global_scale ? a.multiplier[a.g.multiplier_per_expert ? e : 0] : 1.0f;
    int64_t r0 = 0;
    for (; r0 + kRowsPerPass <= rows; r0 += kRowsPerPass) {
      group_pass<XT, kVec, kRowsPerPass>(a, ep, v, first, rows, r0, wrow, srow, n, mult);
    }
    for (; r0 < rows; ++r0) group_pass<XT, kVec, 1>(a, ep, v, first, rows, r0, wrow, srow, n, mult);
  }
}

template <typename Kernel>
CUfunction gather_func(Kernel kernel) {
  cudaFunction_t f = nullptr;
  const cudaError_t e = cudaGetFuncBySymbol(&f, reinterpret_cast<const void*>(kernel));
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("[GatherW4A16Matmul] CUDA backend: cudaGetFuncBySymbol failed: ") +
                             cudaGetErrorString(e));
  }
  return reinterpret_cast<CUfunction>(f);
}

template <typename XT>
CUfunction gemv_func(bool vec) {
  return vec ? gather_func(gather_gemv_kernel<XT, true>) : gather_func(gather_gemv_kernel<XT, false>);
}

}  // namespace

Launch gather_plan_launch(const fp4::GatherW4A16Problem&) {
  Launch l;
  l.func = gather_func(gather_plan_kernel);
  l.grid = dim3(1, 1, 1);
  l.block = dim3(kPlanThreads, 1, 1);
  return l;
}

Launch gather_gemv_launch(const fp4::GatherW4A16Problem& g, bool vec) {
  Launch l;
  const int x = g.mm.x_dtype;
  l.func = x == fp4::kDtypeF32 ? gemv_func<float>(vec) : x == fp4::kDtypeF16 ? gemv_func<__half>(vec)
                                                                             : gemv_func<__nv_bfloat16>(vec);
  const int64_t gx = (g.mm.n + kWarps - 1) / kWarps;
  int64_t slots = g.pairs < g.experts ? g.pairs : g.experts;  // active experts <= both
  slots = slots < 1 ? 1 : (slots > 65535 ? 65535 : slots);     // the kernel loops over the rest
  if (gx > 0x7FFFFFFF) throw std::runtime_error("[GatherW4A16Matmul] CUDA backend: N too large");
  l.grid = dim3(static_cast<unsigned>(gx), static_cast<unsigned>(slots), 1);
  l.block = dim3(kWarps * 32, 1, 1);
  return l;
}

}  // namespace cuda
}  // namespace mlx_fp4
