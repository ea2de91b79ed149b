// CUDA gathered W4A16 (mixture-of-experts): out[p] = epilogue(mult[e] * x[lhs[p]] @ W[e]^T),
// e = rhs[p]. Decode with few rows: one pair kernel alone (gather_pair_launch: the dense staged
// kernel over runs of one expert (sorted hint) or batched over the pairs, the decode GEMV of
// gather_w4a16_decode.cuh, or the SIMT pair GEMV of gather_w4a16_gemv.cuh). Otherwise two
// launches in MLX's graph: the plan (gather_w4a16_plan.cuh: pairs grouped by expert on the
// device), then the grouped GEMV over every (active expert, weight-row tile) (float32 x, or too
// few rows per expert) or the grouped tensor-core kernel over the plan's tiles
// (gather_w4a16_tc.cuh). This file: kernel handles and launch shapes. Framework-free (no MLX
// header); gather_w4a16_matmul.cpp does the MLX glue.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "gather_w4a16_decode.cuh"
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
CUfunction gemv_func(bool pairs, bool vec) {
  if (pairs) {
    return vec ? gather_func(gather_pairs_kernel<XT, true, Mode>) : gather_func(gather_pairs_kernel<XT, false, Mode>);
  }
  return vec ? gather_func(gather_gemv_kernel<XT, true, Mode>) : gather_func(gather_gemv_kernel<XT, false, Mode>);
}

template <int Mode>
CUfunction gemv_func_of_dtype(int x, bool pairs, bool vec) {
  return x == fp4::kDtypeF32 ? gemv_func<float, Mode>(pairs, vec)
         : x == fp4::kDtypeF16 ? gemv_func<__half, Mode>(pairs, vec)
                               : gemv_func<__nv_bfloat16, Mode>(pairs, vec);
}

CUfunction gemv_func_of_problem(const fp4::GatherW4A16Problem& g, bool pairs, bool vec) {
  return g.mm.mode == fp4::kModeMxfp4 ? gemv_func_of_dtype<fp4::kModeMxfp4>(g.mm.x_dtype, pairs, vec)
                                      : gemv_func_of_dtype<fp4::kModeNvfp4>(g.mm.x_dtype, pairs, vec);
}

unsigned grid_dim(int64_t v, int64_t most) { return static_cast<unsigned>(v < 1 ? 1 : (v > most ? most : v)); }

template <typename T, int Mode>
CUfunction tc_func(bool vec) {
  return vec ? gather_func(gather_tc_kernel<T, true, Mode>) : gather_func(gather_tc_kernel<T, false, Mode>);
}

template <typename T>
CUfunction tc_func_of_mode(int mode, bool vec) {
  return mode == fp4::kModeMxfp4 ? tc_func<T, fp4::kModeMxfp4>(vec) : tc_func<T, fp4::kModeNvfp4>(vec);
}

}  // namespace

Launch gather_plan_launch(const fp4::GatherW4A16Problem&) {
  Launch l;
  l.func = gather_func(gather_plan_kernel);
  l.grid = dim3(1, 1, 1);
  l.block = dim3(kPlanThreads, 1, 1);
  return l;
}

bool gather_kernel_supports(GatherKernel k, const fp4::GatherW4A16Problem& g) {
  // The grouped tensor-core kernel reads half-precision x only (either scale format).
  return k != GatherKernel::kTc || half_precision_x(g.mm);
}

GatherKernel gather_kernel_for(const fp4::GatherW4A16Problem& g) {
  // Past kPairsMaxRows the grouped tensor-core kernel beat the grouped GEMV at every measured
  // point (H200, Qwen3-30B-A3B experts, 8..2048 tokens: 2.5-12x, docs/moe.md).
  if (fp4::gather_out_rows(g) <= kPairsMaxRows) return GatherKernel::kPairs;
  return gather_kernel_supports(GatherKernel::kTc, g) ? GatherKernel::kTc : GatherKernel::kGemv;
}

Launch gather_tc_launch(const fp4::GatherW4A16Problem& g, bool vec) {
  using fp4::cuda_tiling::kMmaRows;
  Launch l;
  l.func = g.mm.x_dtype == fp4::kDtypeF16 ? tc_func_of_mode<__half>(g.mm.mode, vec)
                                        : tc_func_of_mode<__nv_bfloat16>(g.mm.mode, vec);
  const int64_t tiles = fp4::cuda_gather_tiling::max_tc_tiles(g.experts, fp4::gather_out_rows(g));
  const int64_t gy = (g.mm.n + kMmaRows * kTcRowTiles - 1) / (kMmaRows * kTcRowTiles);
  if (tiles > 0x7FFFFFFF || gy > 65535) throw std::runtime_error("[GatherW4A16Matmul] CUDA backend: grid too large");
  l.grid = dim3(static_cast<unsigned>(tiles > 0 ? tiles : 1), static_cast<unsigned>(gy), 1);
  l.block = dim3(kTcWarps * 32, 1, 1);
  return l;
}

namespace {

template <typename XT, int Mode, int... Shapes>
CUfunction decode_func_of(int shape, std::integer_sequence<int, Shapes...>) {
  CUfunction f = nullptr;
  ((f = Shapes == shape ? gather_func(gather_decode_kernel<XT, Mode, Shapes>) : f), ...);
  return f;
}

template <int Mode>
CUfunction decode_func(int x_dtype, int shape) {
  using All = std::make_integer_sequence<int, kNumDecodeShapes>;
  return x_dtype == fp4::kDtypeF16 ? decode_func_of<__half, Mode>(shape, All{})
                                   : decode_func_of<__nv_bfloat16, Mode>(shape, All{});
}

int decode_shape(const fp4::GatherW4A16Problem& g, int shape) {
  return shape >= 0 && shape < kNumDecodeShapes ? shape : fp4::cuda_gather_tiling::kDecodePlannedShape;
}

Launch decode_launch(const fp4::GatherW4A16Problem& g, int shape) {
  using namespace fp4::cuda_gather_tiling;
  Launch l;
  l.func = g.mm.mode == fp4::kModeMxfp4 ? decode_func<fp4::kModeMxfp4>(g.mm.x_dtype, shape)
                                        : decode_func<fp4::kModeNvfp4>(g.mm.x_dtype, shape);
  const DecodeShape& d = kDecodeShapes[shape];
  const int64_t rows_per_block = decode_rows_per_block(d);
  const int64_t gx = (g.mm.n + rows_per_block - 1) / rows_per_block;
  if (gx > 0x7FFFFFFF) throw std::runtime_error("[GatherW4A16Matmul] CUDA backend: N too large");
  l.grid = dim3(static_cast<unsigned>(gx), static_cast<unsigned>(g.pairs), 1);
  l.block = dim3(d.warps * 32, 1, 1);
  return l;
}

}  // namespace

bool gather_decode_ok(const GatherArgs& a, bool vec, int shape) {
  const fp4::GatherW4A16Problem& g = a.g;
  const bool scales_aligned = g.mm.mode != fp4::kModeNvfp4 || reinterpret_cast<uintptr_t>(a.scales) % 2 == 0;
  const int64_t min_k = fp4::cuda_gather_tiling::decode_min_k(kDecodeShapes[decode_shape(g, shape)]);
  return vec && half_precision_x(g.mm) && scales_aligned && g.mm.m == 1 && g.mm.k % 32 == 0 && g.mm.k >= min_k &&
         g.pairs <= 65535;
}

namespace {

// The SIMT pair GEMV: one warp per weight row, grid (row tiles, pairs).
Launch simt_pairs_launch(const fp4::GatherW4A16Problem& g, bool vec) {
  Launch l;
  l.func = gemv_func_of_problem(g, true, vec);
  const int64_t gx = (g.mm.n + kWarps - 1) / kWarps;
  if (gx > 0x7FFFFFFF) throw std::runtime_error("[GatherW4A16Matmul] CUDA backend: N too large");
  l.grid = dim3(static_cast<unsigned>(gx), grid_dim(g.pairs, 65535), 1);  // the kernel loops over the rest
  l.block = dim3(kWarps * 32, 1, 1);
  return l;
}

}  // namespace

PairLaunch gather_pair_launch(const GatherArgs& a, bool vec, const DeviceInfo& dev, int forced, int shape,
                              const char* tc_override) {
  const fp4::GatherW4A16Problem& g = a.g;
  const bool staged = half_precision_x(g.mm) && staged_loads_ok(g.mm, a.x, a.w, a.scales);
  // One of the staged kernel's two forms is planned (the plan is host time at every decode call):
  // runs where they apply (one row of x per pair) and are forced or hinted, unless batched is forced.
  const bool runs = g.mm.m == 1 && (forced == int(PairKernel::kRunsTc) ||
                                    (forced != int(PairKernel::kBatchedTc) && g.sorted_rhs));
  const Launch tc = staged ? tc_batched_launch(g.mm, dev, true, g.pairs, runs, tc_override) : Launch{};
  const PairKernel tc_kind = runs ? PairKernel::kRunsTc : PairKernel::kBatchedTc;
  auto can_run = [&](PairKernel k) {
    return k == PairKernel::kSimt ||
           (k == PairKernel::kDecode ? gather_decode_ok(a, vec, shape) : k == tc_kind && tc.func != nullptr);
  };
  const PairKernel k = forced >= 0 && can_run(static_cast<PairKernel>(forced)) ? static_cast<PairKernel>(forced)
                       : can_run(tc_kind)                                      ? tc_kind
                       : can_run(PairKernel::kDecode)                          ? PairKernel::kDecode
                                                                               : PairKernel::kSimt;
  const Launch l = k == tc_kind              ? tc
                   : k == PairKernel::kDecode ? decode_launch(g, decode_shape(g, shape))
                                              : simt_pairs_launch(g, vec);
  return PairLaunch{k, l};
}

Launch gather_gemv_launch(const fp4::GatherW4A16Problem& g, bool vec) {
  Launch l;
  l.func = gemv_func_of_problem(g, false, vec);
  const int64_t gx = (g.mm.n + kWarps - 1) / kWarps;
  if (gx > 0x7FFFFFFF) throw std::runtime_error("[GatherW4A16Matmul] CUDA backend: N too large");
  // Active experts <= both pairs and experts; the kernel loops over the rest.
  l.grid = dim3(static_cast<unsigned>(gx), grid_dim(g.pairs < g.experts ? g.pairs : g.experts, 65535), 1);
  l.block = dim3(kWarps * 32, 1, 1);
  return l;
}

}  // namespace cuda
}  // namespace mlx_fp4
