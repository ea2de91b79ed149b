// Host-side arithmetic of the gathered (MoE) Metal kernel, framework-free so that eval_gpu
// (gather_w4a16_matmul.cpp, macOS) and the metal_sim tests (Linux) run the same code: parameter
// block, grid, bindings, kernel name and the MSL line that instantiates it.
#pragma once
#include <string>

#include "../shared/gather_w4a16_problem.h"
#include "gather_kernel_abi.h"
#include "w4a16_dispatch.h"

namespace fp4 {

// Input order of the GatherW4A16Matmul primitive (csrc/gather_primitive.h, GatherInput).
FP4_CONST int kMetalGatherInputX = 0;
FP4_CONST int kMetalGatherInputW = 1;
FP4_CONST int kMetalGatherInputScales = 2;
FP4_CONST int kMetalGatherInputLhs = 3;
FP4_CONST int kMetalGatherInputRhs = 4;
FP4_CONST int kMetalGatherInputFirstOptional = 5;

struct GatherMetalLaunch {
  std::string kernel_name;
  std::string library_name;
  std::string instantiation;
  std::string pipeline_name;
  bool aligned = false;    // the kFcGemvAligned function constant
  uint32_t grid_x = 0;     // weight-row tiles
  uint32_t grid_y = 0;     // pairs
  uint32_t threads = 0;
  GatherMetalParams params{};
  int binding[kMetalGatherNumBuffers] = {};  // input index, kMetalBindOutput or kMetalBindParams
};

// `run`: pairs per threadgroup row, 1 or kMetalGatherRun (gather_metal_run).
inline std::string gather_metal_kernel_name(int x_dtype, int out_dtype, int run = 1) {
  return std::string("mlx_fp4_gather_gemv_x") + metal_dtype_tag(x_dtype) + "_o" + metal_dtype_tag(out_dtype) +
         (run > 1 ? "_run" + std::to_string(run) : "");
}

inline std::string gather_metal_instantiation(int x_dtype, int out_dtype, int run = 1) {
  const std::string fn = std::string("gather_w4a16_gemv<") + metal_type_name(x_dtype) + ", " +
      metal_type_name(out_dtype) + ", " + std::to_string(run) + ">";
  return "template [[host_name(\"" + gather_metal_kernel_name(x_dtype, out_dtype, run) + "\")]] [[kernel]] decltype(" +
      fn + ") " + fn + ";\n";
}

// Pairs per threadgroup row: kMetalGatherRun for sorted prefill with one row per pair
// (tiling_metal.h), else 1.
inline int gather_metal_run(const GatherW4A16Problem& g) {
  return g.sorted_rhs && g.mm.m == 1 && g.pairs >= kMetalGatherRunMinPairs ? kMetalGatherRun : 1;
}

// Everything eval_gpu needs. Requires pairs * m >= 1 and n >= 1 (the caller skips empty outputs).
inline GatherMetalLaunch gather_metal_plan(const GatherW4A16Problem& g, const MetalAddresses& addr) {
  const W4A16Problem& p = g.mm;
  metal_check_int32(p.m, "M");
  metal_check_int32(g.pairs, "pairs");
  metal_check_int32(g.w_expert_bytes, "bytes per expert");
  // The dense GEMV plan of one row fills the product's parameters (flags, chain, operand kinds,
  // weight-row tiles); the kernel loops over the pair's m rows itself.
  W4A16Problem row = p;
  row.m = 1;
  const MetalConfig gemv{MetalKernel::kGemv, 0, 0, false, 1};
  const MetalLaunch dense = metal_plan(row, addr, &gemv);
  GatherMetalLaunch l;
  l.params.mm = dense.params;
  l.params.mm.m = int(p.m);
  l.params.pairs = int(g.pairs);
  l.params.x_batches = int(g.x_batches < 0x7fffffff ? g.x_batches : 0x7fffffff);
  l.params.experts = int(g.experts < 0x7fffffff ? g.experts : 0x7fffffff);
  l.params.multiplier_per_expert = g.multiplier_per_expert;
  l.params.w_expert_bytes = int(g.w_expert_bytes);
  l.params.scale_expert_bytes = int(g.scale_expert_bytes);
  l.aligned = dense.constants[0].value;  // same loads as the GEMV: x and expert rows aligned alike
  // Weight-row tiles of the simdgroups' metal_gemv_rows(run) rows; pair runs.
  const int run = gather_metal_run(g);
  const int64_t cols = int64_t(kMetalGemvSimdgroups) * metal_gemv_rows(run);
  l.params.mm.tiles_n = int((p.n + cols - 1) / cols);
  l.grid_x = uint32_t(l.params.mm.tiles_n);
  l.grid_y = uint32_t((g.pairs + run - 1) / run);
  l.threads = uint32_t(kMetalGemvThreads);
  for (int s = 0; s < kMetalNumBuffers; ++s) l.binding[s] = dense.binding[s];
  // The dense binding counts optional inputs from its own first optional slot; shift them.
  const int shift = kMetalGatherInputFirstOptional - kMetalInputFirstOptional;
  for (int s = kMetalBufGlobalScale; s < kMetalNumBuffers; ++s) {
    if (l.binding[s] >= kMetalInputFirstOptional) l.binding[s] += shift;
  }
  l.binding[kMetalGatherBufLhs] = kMetalGatherInputLhs;
  l.binding[kMetalGatherBufRhs] = kMetalGatherInputRhs;
  l.kernel_name = gather_metal_kernel_name(p.x_dtype, p.out_dtype, run);
  l.library_name = l.kernel_name;
  l.pipeline_name = l.kernel_name + (l.aligned ? "_fc0t" : "_fc0f");
  l.instantiation = gather_metal_instantiation(p.x_dtype, p.out_dtype, run);
  return l;
}

}  // namespace fp4
