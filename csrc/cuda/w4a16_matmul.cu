// CUDA W4A16 matmul: y[M, N] = epilogue(gs * (x[M, K] @ dequantize(w, scales)[N, K]^T)).
// w is NVFP4: [N, w_row_bytes] packed E2M1 (low nibble = even k), scales [N, ceil(K/16)] E4M3 bytes.
// This file: kernel handles, launch shapes and the dispatch plan_w4a16 (measured crossovers). The
// kernels, one file each, all in this translation unit:
//  - w4a16_tc_staged.cuh: tensor cores, weights through a cp.async ring (K % 128 == 0, M <= 64);
//  - w4a16_tc.cuh:        tensor cores, register prefetch (any K, M <= 32);
//  - w4a16_simt.cuh:      fp32 FMA for float32 x;
//  - w4a16_dequant.cuh:   exact decode of W for the cuBLASLt GEMM (large M) and the epilogue kernel;
//  - w4a16_device.cuh:    what they share (decode, epilogue, mma step, reduction).
// No MLX header here (nvcc rejects MLX's fmt-based headers); w4a16_matmul.cpp does the MLX glue.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <type_traits>
#include <string>

#include "../shared/tiling_cuda.h"
#include "w4a16_dequant.cuh"
#include "w4a16_kernels.h"
#include "w4a16_simt.cuh"
#include "w4a16_tc.cuh"
#include "w4a16_tc_staged.cuh"

namespace mlx_fp4 {
namespace cuda {
namespace {

using namespace fp4::cuda_tiling;

__device__ float g_const_zero = 0.0f;
__device__ float g_const_one = 1.0f;

// ------------------------------------------------------------------------------------------
// Host side

void throw_cuda(cudaError_t e, const char* what) {
  throw std::runtime_error(std::string("[W4A16Matmul] CUDA backend: ") + what + " failed: " +
                           cudaGetErrorString(e));
}

template <typename Kernel>
CUfunction func_of(Kernel kernel) {
  cudaFunction_t f = nullptr;
  const cudaError_t e = cudaGetFuncBySymbol(&f, reinterpret_cast<const void*>(kernel));
  if (e != cudaSuccess) throw_cuda(e, "cudaGetFuncBySymbol");
  return reinterpret_cast<CUfunction>(f);
}

template <typename T, int MT, int RT>
CUfunction tc_func_rt(bool vec) {
  if (vec) return func_of(w4a16_tc_kernel<T, MT, RT, true>);
  return func_of(w4a16_tc_kernel<T, MT, 1, false>);  // guarded loads: one variant per MT is enough
}

template <typename T>
CUfunction staged_func_t(int mt, int rt) {
  switch (mt) {
    case 1: return rt == 1 ? func_of(w4a16_tc_staged_kernel<T, 1, 1>) : func_of(w4a16_tc_staged_kernel<T, 1, 2>);
    case 2: return rt == 1 ? func_of(w4a16_tc_staged_kernel<T, 2, 1>) : func_of(w4a16_tc_staged_kernel<T, 2, 2>);
    default: return rt == 1 ? func_of(w4a16_tc_staged_kernel<T, 4, 1>) : func_of(w4a16_tc_staged_kernel<T, 4, 2>);
  }
}

unsigned staged_smem_bytes(int rt, int kw) {
  return static_cast<unsigned>(kw * kStages * (rt == 1 ? staged_slot_bytes<1>() : staged_slot_bytes<2>()));
}

template <typename T>
CUfunction tc_func_t(int mt, int rt, bool vec) {
  switch (mt) {
    case 1: return rt == 1 ? tc_func_rt<T, 1, 1>(vec) : tc_func_rt<T, 1, 2>(vec);
    case 2: return rt == 1 ? tc_func_rt<T, 2, 1>(vec) : tc_func_rt<T, 2, 2>(vec);
    case 4: return rt == 1 ? tc_func_rt<T, 4, 1>(vec) : tc_func_rt<T, 4, 2>(vec);
    default: return tc_func_rt<T, 8, 1>(vec);
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

unsigned grid_for_elements(int64_t items) {
  int64_t blocks = ceil_div(items, kElementwiseThreads);
  const int64_t cap = 65535LL * 16;  // grid-stride loops cover the rest
  if (blocks > cap) blocks = cap;
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned>(blocks);
}

bool parse_tc(const char* s, TcConfig& cfg) {
  int mt = 0, rt = 0, kw = 0;
  if (!s || std::sscanf(s, "%d,%d,%d", &mt, &rt, &kw) != 3) return false;
  if (mt != 1 && mt != 2 && mt != 4 && mt != 8) return false;
  if (rt != 1 && rt != 2) return false;
  if (mt * rt > 8 || kw < 1 || kw > kMaxWarpsPerBlock) return false;
  cfg = TcConfig{mt, rt, kw};
  return true;
}

}  // namespace

bool vector_loads_ok(const fp4::W4A16Problem& p, const void* x, const void* w) {
  return p.k % 8 == 0 && p.w_row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

bool staged_loads_ok(const fp4::W4A16Problem& p, const void* x, const void* w, const void* scales) {
  return vector_loads_ok(p, x, w) && p.k % kStepK == 0 && p.scale_row_bytes % kStageScaleBytes == 0 &&
         reinterpret_cast<uintptr_t>(scales) % kStageScaleBytes == 0;
}

// Dispatch. Crossovers measured on an H200 (docs/cuda.md): tensor-core kernel up to
// kTcMaxM rows of x, then dequantize + cuBLAS; float32 x uses the SIMT kernel while M is small.
namespace {
constexpr int64_t kTcMaxM = 32;
constexpr int64_t kSimtMaxM = 32;

// Measured on the H200 (docs/cuda.md): about 2048 warps in flight is best; two weight-row tiles
// per warp (rt = 2, x fragments reused twice) when N still gives every SM a block, and warps per
// block (kw) splitting K up to 16 warps per SM, with at least 2 steps of K per warp.
// The staged kernel (its own measured optimum, docs/cuda.md): always two row tiles per warp, and
// warps per block doubled while the grid stays within about 8 warps per SM (8192^2: 4, 14336 x
// 4096: 2, 4096 x 14336: 8), since its ring already keeps 3 steps per warp in flight.
TcConfig auto_tc_config(const fp4::W4A16Problem& p, const DeviceInfo& dev, bool staged) {
  TcConfig c;
  const int64_t m = p.m;
  c.mt = m <= 8 ? 1 : m <= 16 ? 2 : m <= 32 ? 4 : 8;
  if (staged && m <= kStagedTcMaxM && c.mt > kMaxStagedColTiles) c.mt = kMaxStagedColTiles;
  const bool staged_tile = staged && c.mt <= kMaxStagedColTiles;
  c.rt = (c.mt * 2 <= 8 && (staged_tile || ceil_div(p.n, 2 * kMmaRows) >= dev.sm_count)) ? 2 : 1;
  const int64_t blocks = ceil_div(p.m, kMmaCols * c.mt) * ceil_div(p.n, kMmaRows * c.rt);
  const int64_t nsteps = ceil_div(p.k, kStepK);
  const int64_t warp_budget = int64_t(dev.sm_count) * (staged_tile ? kStagedWarpsPerSm : 2 * kStagedWarpsPerSm);
  int kw = 1;
  if (staged_tile) {
    while (kw < kMaxWarpsPerBlock && blocks * kw * 2 <= warp_budget && nsteps >= 4 * kw * 2) kw *= 2;
  } else {
    while (kw < kMaxWarpsPerBlock && blocks * kw * 2 <= warp_budget && nsteps >= 4 * kw) kw *= 2;
  }
  c.kw = kw;
  return c;
}
}  // namespace

Plan plan_w4a16(const fp4::W4A16Problem& p, const DeviceInfo& dev, bool vec, bool staged,
                const char* path_override, const char* tc_override) {
  Plan plan;
  plan.vec = vec;
  plan.staged = vec && staged;
  const bool half_x = p.x_dtype == fp4::kDtypeBF16 || p.x_dtype == fp4::kDtypeF16;
  plan.tc = auto_tc_config(p, dev, plan.staged);
  if (half_x) {
    // Past kTcMaxM the staged kernel (x tiles of 32 rows) still beats dequantize + cuBLASLt up
    // to kStagedTcMaxM when its grid gets at least 2 warps per block (measured, docs/cuda.md).
    const bool staged_mid = plan.staged && p.m <= kStagedTcMaxM && plan.tc.kw >= 2;
    plan.path = (p.m <= kTcMaxM || staged_mid) ? Path::kTensorCore : Path::kDequantGemm;
  } else {
    plan.path = p.m <= kSimtMaxM ? Path::kSimt : Path::kDequantGemm;
  }
  if (path_override && *path_override) {
    if (!std::strcmp(path_override, "simt")) plan.path = Path::kSimt;
    if (!std::strcmp(path_override, "dequant")) plan.path = Path::kDequantGemm;
    if (!std::strcmp(path_override, "tc") && half_x) plan.path = Path::kTensorCore;
  }
  TcConfig forced;
  if (parse_tc(tc_override, forced)) plan.tc = forced;
  return plan;
}

Launch tc_launch(const fp4::W4A16Problem& p, const TcConfig& cfg, bool vec, bool staged) {
  Launch l;
  staged = staged && vec && cfg.mt <= kMaxStagedColTiles;
  const int rt = vec ? cfg.rt : 1;
  if (staged) {
    l.func = p.x_dtype == fp4::kDtypeF16 ? staged_func_t<__half>(cfg.mt, rt) : staged_func_t<__nv_bfloat16>(cfg.mt, rt);
  } else {
    l.func = p.x_dtype == fp4::kDtypeF16 ? tc_func_t<__half>(cfg.mt, rt, vec)
                                         : tc_func_t<__nv_bfloat16>(cfg.mt, rt, vec);
  }
  const int64_t gx = ceil_div(p.m, kMmaCols * cfg.mt);
  const int64_t gy = ceil_div(p.n, kMmaRows * rt);
  if (gy > 65535 || gx > 0x7FFFFFFF) {
    throw std::runtime_error("[W4A16Matmul] CUDA backend: N too large for the tensor-core grid");
  }
  l.grid = dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy), 1);
  l.block = dim3(32 * cfg.kw, 1, 1);
  l.smem = staged ? staged_smem_bytes(rt, cfg.kw) : 0;
  return l;
}

template <typename XT>
CUfunction simt_func(bool vec, int rows) {
  if (rows == 1) return vec ? func_of(w4a16_simt_kernel<XT, true, 1>) : func_of(w4a16_simt_kernel<XT, false, 1>);
  return vec ? func_of(w4a16_simt_kernel<XT, true, kSimtRows>) : func_of(w4a16_simt_kernel<XT, false, kSimtRows>);
}

Launch simt_launch(const fp4::W4A16Problem& p, bool vec) {
  Launch l;
  const int rows = p.m == 1 ? 1 : kSimtRows;  // one row of x: no redundant passes
  l.func = p.x_dtype == fp4::kDtypeF32   ? simt_func<float>(vec, rows)
           : p.x_dtype == fp4::kDtypeF16 ? simt_func<__half>(vec, rows)
                                         : simt_func<__nv_bfloat16>(vec, rows);
  const int64_t gx = ceil_div(p.n, kSimtWarps);
  int64_t gy = ceil_div(p.m, rows);
  if (gy > 65535) gy = 65535;  // the kernel loops over the remaining rows of x
  if (gx > 0x7FFFFFFF) throw std::runtime_error("[W4A16Matmul] CUDA backend: N too large");
  l.grid = dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy), 1);
  l.block = dim3(kSimtWarps * 32, 1, 1);
  return l;
}

Launch dequant_launch(const DequantArgs& d, bool vec) {
  Launch l;
  switch (d.out_dtype) {
    case fp4::kDtypeF32:
      l.func = vec ? func_of(w4a16_dequant_kernel<float, true>) : func_of(w4a16_dequant_kernel<float, false>);
      break;
    case fp4::kDtypeF16:
      l.func = vec ? func_of(w4a16_dequant_kernel<__half, true>) : func_of(w4a16_dequant_kernel<__half, false>);
      break;
    default:
      l.func = vec ? func_of(w4a16_dequant_kernel<__nv_bfloat16, true>)
                   : func_of(w4a16_dequant_kernel<__nv_bfloat16, false>);
      break;
  }
  const int64_t gx = ceil_div(ceil_div(d.k, 8), int64_t(kDequantThreads) * kDequantWords);
  const int64_t gy = d.n < 65535 ? d.n : 65535;
  l.grid = dim3(static_cast<unsigned>(gx < 65535 ? gx : 65535), static_cast<unsigned>(gy > 0 ? gy : 1), 1);
  l.block = dim3(kDequantThreads, 1, 1);
  return l;
}

Launch epilogue_launch(const fp4::W4A16Problem& p) {
  Launch l;
  l.func = func_of(w4a16_epilogue_kernel);
  l.grid = dim3(grid_for_elements(p.m * p.n), 1, 1);
  l.block = dim3(kElementwiseThreads, 1, 1);
  return l;
}

void preload_kernels() {
  // With lazy module loading (the CUDA 12+ default) a kernel is loaded on first use, which costs
  // milliseconds; do it once for all of them instead of on the first call of each shape.
  for (int dt : {fp4::kDtypeBF16, fp4::kDtypeF16, fp4::kDtypeF32}) {
    fp4::W4A16Problem p{};
    p.m = p.n = p.k = 1;
    p.x_dtype = dt;
    for (bool vec : {true, false}) {
      if (dt != fp4::kDtypeF32) {
        for (int mt : {1, 2, 4, 8})
          for (int rt : {1, 2})
            if (mt * rt <= 8) {
              tc_launch(p, TcConfig{mt, rt, 1}, vec, false);
              if (!vec || mt > kMaxStagedColTiles) continue;
              // The staged kernels take more than the default 48 KB of dynamic shared memory.
              const Launch l = tc_launch(p, TcConfig{mt, rt, kMaxWarpsPerBlock}, true, true);
              const CUresult r = cuFuncSetAttribute(l.func, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                    static_cast<int>(l.smem));
              if (r != CUDA_SUCCESS) throw std::runtime_error("[W4A16Matmul] CUDA backend: cuFuncSetAttribute failed");
            }
      }
      simt_launch(p, vec);
      p.m = 2;
      simt_launch(p, vec);
      p.m = 1;
      DequantArgs d{};
      d.n = d.k = 1;
      d.out_dtype = dt;
      dequant_launch(d, vec);
    }
  }
  epilogue_launch(fp4::W4A16Problem{});
}

const float* device_constant_zero() {
  void* ptr = nullptr;
  const cudaError_t e = cudaGetSymbolAddress(&ptr, g_const_zero);
  if (e != cudaSuccess) throw_cuda(e, "cudaGetSymbolAddress");
  return static_cast<const float*>(ptr);
}

const float* device_constant_one() {
  void* ptr = nullptr;
  const cudaError_t e = cudaGetSymbolAddress(&ptr, g_const_one);
  if (e != cudaSuccess) throw_cuda(e, "cudaGetSymbolAddress");
  return static_cast<const float*>(ptr);
}

}  // namespace cuda
}  // namespace mlx_fp4
