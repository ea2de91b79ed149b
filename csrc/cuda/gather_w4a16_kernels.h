// Framework-free interface of the CUDA gathered W4A16 kernels (gather_w4a16_matmul.cu), launched
// by the MLX glue (gather_w4a16_matmul.cpp) as CUfunction graph nodes. Decode with few rows: one
// launch, a pair kernel (each pair reads its expert directly; gather_pair_launch). Otherwise two: the plan groups the
// (token, expert) pairs by expert on the device, then one GEMV launch covers every (expert,
// weight-row tile) at once, each expert's rows streamed once for all its pairs, or (prefill) one
// grouped tensor-core launch covers the plan's tiles of each expert's rows.
#pragma once
#include <cstdint>

#include "../shared/gather_tiling_cuda.h"
#include "../shared/gather_w4a16_problem.h"
#include "w4a16_kernels.h"

namespace mlx_fp4 {
namespace cuda {

struct GatherArgs {
  const void* x;            // x_batches x [m, k], mm.x_dtype
  const uint8_t* w;         // experts x [n, w_row_bytes]
  const uint8_t* scales;    // experts x [n, scale_row_bytes]
  const uint32_t* lhs;      // [pairs]
  const uint32_t* rhs;      // [pairs]
  const float* global_scale;  // 1 or `experts` values (MLX amax), or null
  const void* operands[fp4::kMaxEpilogueOperands];
  void* out;                // [pairs * m, n], mm.out_dtype
  int32_t* workspace;       // plan_workspace_words(experts, pairs, rows) int32
  int use_tc;               // GatherTc: whether the plan lists tensor-core tiles (and row maps)
                            // for gather_tc_launch / tc_grouped_launch / wgmma_grouped_launch (the
                            // pair GEMV needs no workspace and no plan)
  int tile_rows;            // rows of one expert per tile (gather_tile_rows(use_tc))
  fp4::GatherW4A16Problem g;
};

using fp4::cuda_gather_tiling::GatherKernel;

// GatherArgs::use_tc: no tiles (grouped GEMV), tiles for the grouped register-prefetch kernel
// (gather_tc_launch), or tiles and row maps for the grouped staged kernel (tc_grouped_launch) or
// for the grouped wgmma kernel (wgmma_grouped_launch, after x is gathered and permuted).
enum GatherTc : int { kTcNone = 0, kTcRegister = 1, kTcStaged = 2, kTcWgmma = 3 };

// The plan's tile rows for a kernel choice: the wgmma kernel's x tile, else kTcTileRows.
inline int gather_tile_rows(int use_tc) {
  return use_tc == kTcWgmma ? int(fp4::cuda_gather_tiling::kWgmmaGroupTileRows)
                            : int(fp4::cuda_gather_tiling::kTcTileRows);
}

// gather_tc_for's wgmma argument: not available (device, build or MLX_FP4_CUDA_GATHER_WGMMA=0),
// by the rows rule, or forced wherever it can run (MLX_FP4_CUDA_GATHER_WGMMA=1; A/B timing).
enum GatherWgmma : int { kWgmmaOff = 0, kWgmmaAuto = 1, kWgmmaForced = 2 };

Launch gather_plan_launch(const fp4::GatherW4A16Problem& g);
// The plan: the pair GEMV for at most kPairsMaxRows rows of x (decode); else the plan kernel,
// then the grouped tensor-core kernel (bf16/fp16 x, either mode) or the grouped GEMV.
GatherKernel gather_kernel_for(const fp4::GatherW4A16Problem& g);
// Whether `k` can run `g` (the tensor-core kernel: bf16/fp16 x).
bool gather_kernel_supports(GatherKernel k, const fp4::GatherW4A16Problem& g);
// vec: 16-byte loads of weight and x rows (vector_loads_ok on a.g.mm and the base pointers).
using fp4::cuda_gather_tiling::PairKernel;
// The pair kernel of `a` and its launch: `forced` (a PairKernel, -1 for none) where it can run,
// else the first of PairKernel's order that can; `shape` indexes kDecodeShapes for the decode
// GEMV (-1: kDecodePlannedShape; the harness times each). The batched kernel takes
// batched_args(a), the others `a`. Measured (H200, Qwen3-30B-A3B experts, 1-16 tokens,
// gather_kernel_harness bench): the batched tensor-core kernel 6.4-47 us against the decode
// GEMV's 8.1-81 at K = 2048, the same time at K = 768
// (benchmarks/results/cuda/moe/gather_kernel_harness_no_local_copies.txt).
struct PairLaunch {
  PairKernel kernel;
  Launch launch;
};
PairLaunch gather_pair_launch(const GatherArgs& a, bool vec, const DeviceInfo& dev, int forced = -1, int shape = -1,
                              const char* tc_override = nullptr);
// Whether the decode GEMV (gather_w4a16_decode.cuh) takes `a` in `shape` (-1 as above): one row
// of x per pair, bf16/fp16 x, K a multiple of 32 and at least decode_min_k, 16-byte loads, the
// scales 2-byte aligned (NVFP4 reads a chunk's two scale bytes at once).
bool gather_decode_ok(const GatherArgs& a, bool vec, int shape = -1);
Launch gather_gemv_launch(const fp4::GatherW4A16Problem& g, bool vec);
Launch gather_tc_launch(const fp4::GatherW4A16Problem& g, bool vec);

// The dense kernels' arguments of every expert at once: x, stacked w/scales and their per-expert
// strides, multiplier, operands, out (the batched and grouped views below pick the products).
inline W4A16Args expert_args(const GatherArgs& a) {
  W4A16Args b{};
  b.x = a.x;
  b.w = a.w;
  b.scales = a.scales;
  b.global_scale = a.global_scale;
  for (int i = 0; i < fp4::kMaxEpilogueOperands; ++i) b.operands[i] = a.operands[i];
  b.out = a.out;
  b.p = a.g.mm;
  b.w_batch_bytes = a.g.w_expert_bytes;
  b.scale_batch_bytes = a.g.scale_expert_bytes;
  b.global_scale_per_expert = a.g.global_scale_per_expert;
  return b;
}

// The kernel of the plan's tensor-core tiles (GatherKernel::kTc, so bf16/fp16 x). NVFP4 with
// TMA-able rows, experts stacked without gaps (one tensor map over all experts' rows), and rows
// per expert by gather_wgmma_rows_ok: the grouped wgmma kernel. Else the dense staged kernel,
// grouped, where `staged` and its loads apply (either mode), else the register-prefetch kernel.
// Row maps and TMA coordinates are int32.
inline GatherTc gather_tc_for(const GatherArgs& a, bool staged, GatherWgmma wgmma = kWgmmaOff) {
  constexpr int64_t kMaxRow = 0x7FFFFFFF;
  const fp4::GatherW4A16Problem& g = a.g;
  const int64_t rows = fp4::gather_out_rows(g);
  const bool fits = rows <= kMaxRow && g.x_batches * g.mm.m <= kMaxRow;
  const bool nvfp4 = g.mm.mode == fp4::kModeNvfp4;
  const bool stacked = g.w_expert_bytes == g.mm.n * g.mm.w_row_bytes &&
                       g.scale_expert_bytes == g.mm.n * g.mm.scale_row_bytes && g.experts * g.mm.n <= kMaxRow;
  namespace gt = fp4::cuda_gather_tiling;
  const bool wgmma_rows = wgmma == kWgmmaForced ? gt::gather_wgmma_tiles_fit(rows, g.experts)
                                                : gt::gather_wgmma_rows_ok(rows, g.experts);
  if (wgmma != kWgmmaOff && nvfp4 && fits && stacked && wgmma_rows && wgmma_loads_ok(g.mm, a.w, a.scales)) {
    return kTcWgmma;
  }
  return staged && fits && staged_loads_ok(g.mm, a.x, a.w, a.scales) ? kTcStaged : kTcRegister;
}

// The plan's tiles as grouped dense products for the staged tensor-core kernel
// (W4A16Args::group_*, tc_grouped_launch), in the plan's workspace (a.workspace, plan_layout).
inline W4A16Args grouped_args(const GatherArgs& a) {
  using namespace fp4::cuda_gather_tiling;
  W4A16Args b = expert_args(a);
  const PlanLayout l = plan_layout(a.g.experts, a.g.pairs, fp4::gather_out_rows(a.g));
  b.group_start = a.workspace + l.start;
  b.group_num_tiles = a.workspace + l.num_tiles;
  b.group_tiles = a.workspace + l.tiles;
  b.x_rows = a.workspace + l.x_rows;
  b.out_rows = a.workspace + l.out_rows;
  return b;
}

// The pair GEMV as a batch of dense products for the staged tensor-core kernel
// (W4A16Args::batch_*, tc_batched_launch): one product per pair, grid z.
inline W4A16Args batched_args(const GatherArgs& a) {
  W4A16Args b = expert_args(a);
  b.batch_lhs = a.lhs;
  b.batch_rhs = a.rhs;
  b.batch_x_matrices = a.g.x_batches;
  b.batch_experts = a.g.experts;
  return b;
}

}  // namespace cuda
}  // namespace mlx_fp4
