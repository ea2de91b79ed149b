// CUDA gathered W4A16 (mixture-of-experts): out[p] = epilogue(mult[e] * x[lhs[p]] @ W[e]^T),
// e = rhs[p]. Two launches in MLX's graph: the plan (gather_w4a16_plan.cuh: pairs grouped by
// expert on the device), then either the GEMV over every (active expert, weight-row tile)
// (gather_w4a16_gemv.cuh, decode and float32 x) or the grouped tensor-core kernel over the plan's
// tiles (gather_w4a16_tc.cuh, bf16/fp16 x with enough rows per expert). This file: kernel handles
// and launch shapes. Framework-free (no MLX header); gather_w4a16_matmul.cpp does the MLX glue.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>

#include "gather_w4a16_gemv.cuh"
#include "gather_w4a16_tc.cuh"

namespace mlx_fp4 {
namespace cuda {
namespace {

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

template <typename XT, int Mode>
CUfunction gemv_func(bool vec) {
  return vec ? gather_func(gather_gemv_kernel<XT, true, Mode>) : gather_func(gather_gemv_kernel<XT, false, Mode>);
}

template <int Mode>
CUfunction gemv_func_of_dtype(int x, bool vec) {
  return x == fp4::kDtypeF32 ? gemv_func<float, Mode>(vec)
         : x == fp4::kDtypeF16 ? gemv_func<__half, Mode>(vec)
                               : gemv_func<__nv_bfloat16, Mode>(vec);
}

template <typename T>
CUfunction tc_func(bool vec) {
  return vec ? gather_func(gather_tc_kernel<T, true>) : gather_func(gather_tc_kernel<T, false>);
}

}  // namespace

Launch gather_plan_launch(const fp4::GatherW4A16Problem&) {
  Launch l;
  l.func = gather_func(gather_plan_kernel);
  l.grid = dim3(1, 1, 1);
  l.block = dim3(kPlanThreads, 1, 1);
  return l;
}

bool gather_use_tc(const fp4::GatherW4A16Problem& g) {
  // The grouped tensor-core kernel reads NVFP4 scales only: MXFP4 takes the GEMV at every size.
  const bool half_x = (g.mm.x_dtype == fp4::kDtypeBF16 || g.mm.x_dtype == fp4::kDtypeF16) && g.mm.mode == fp4::kModeNvfp4;
  return half_x && fp4::gather_out_rows(g) >= int64_t(kTcMinRowsPerExpert) * g.experts;
}

Launch gather_tc_launch(const fp4::GatherW4A16Problem& g, bool vec) {
  using fp4::cuda_tiling::kMmaRows;
  Launch l;
  l.func = g.mm.x_dtype == fp4::kDtypeF16 ? tc_func<__half>(vec) : tc_func<__nv_bfloat16>(vec);
  const int64_t tiles = fp4::cuda_gather_tiling::max_tc_tiles(g.experts, fp4::gather_out_rows(g));
  const int64_t gy = (g.mm.n + kMmaRows * kTcRowTiles - 1) / (kMmaRows * kTcRowTiles);
  if (tiles > 0x7FFFFFFF || gy > 65535) throw std::runtime_error("[GatherW4A16Matmul] CUDA backend: grid too large");
  l.grid = dim3(static_cast<unsigned>(tiles > 0 ? tiles : 1), static_cast<unsigned>(gy), 1);
  l.block = dim3(kTcWarps * 32, 1, 1);
  return l;
}

Launch gather_gemv_launch(const fp4::GatherW4A16Problem& g, bool vec) {
  Launch l;
  l.func = g.mm.mode == fp4::kModeMxfp4 ? gemv_func_of_dtype<fp4::kModeMxfp4>(g.mm.x_dtype, vec)
                                        : gemv_func_of_dtype<fp4::kModeNvfp4>(g.mm.x_dtype, vec);
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
